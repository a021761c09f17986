package changes_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/jackc/pgx/v5"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/changes"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
	"github.com/renderqueue/renderqueue/pkg/store/storetest"
)

// TestEventRoundTrip: keys and routes with separators, digits, newlines and non-ASCII text, due
// times before 1970 and far ahead, and NULL due survive the trigger's payload and the parser.
// The store refuses due times outside [1970, 2106) (pkg/schedule); a producer writing plain SQL
// is not held to that, so those rows are written by SQL.
func TestEventRoundTrip(t *testing.T) {
	st, _ := openTestStore(t, postgres.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sub, err := st.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	rows := []schedule.Row{
		{Key: "https://example.com/a,b:c?x=1&y=2#12:34", Cadence: 1500 * time.Millisecond, Route: "r,1:2",
			HasDue: true, Due: time.Date(1969, 7, 20, 20, 17, 40, 123456000, time.UTC)},
		{Key: "https://例え.jp/パス/ü\nnewline\ttab", Cadence: 96 * time.Hour, Route: "ルート", Source: schedule.SourceSubmitted,
			Urgent: true, HasDue: true, Due: time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)},
		{Key: "1:2,3", Cadence: time.Millisecond},
	}
	out := make([]schedule.Row, len(rows))
	for i, r := range rows[:2] { // outside what the store writes: by SQL
		src := r.Source.String()
		out[i] = r
		if err := st.Pool().QueryRow(ctx, `INSERT INTO render_schedule (key, due_at, cadence_ms, route, source, urgent)
			VALUES ($1, $2, $3, $4, $5, $6) RETURNING key_hash, rev`, r.Key, r.Due, r.Cadence.Milliseconds(), r.Route, src, r.Urgent,
		).Scan(&out[i].KeyHash, &out[i].Rev); err != nil {
			t.Fatal(err)
		}
	}
	stored, err := st.Upsert(ctx, rows[2:])
	if err != nil {
		t.Fatal(err)
	}
	out[2] = stored[0]
	got := map[string]store.Event{}
	for len(got) < len(rows) {
		b, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range b.Events {
			got[e.Row.Key] = e
		}
	}
	for i, r := range out {
		e, ok := got[r.Key]
		if !ok {
			t.Errorf("no event for %q", r.Key)
			continue
		}
		if e.Row != r {
			t.Errorf("row %d: event %+v, upsert result %+v", i, e.Row, r)
		}
		if r.HasDue != rows[i].HasDue || (r.HasDue && !r.Due.Equal(rows[i].Due)) || r.Route != rows[i].Route || r.Cadence != rows[i].Cadence {
			t.Errorf("row %d: stored %+v, written %+v", i, r, rows[i])
		}
	}
}

// TestIdleHealthChecks: with a short health interval the listener's idle waits time out and it
// checks the connection with a round trip, without losing continuity or events.
func TestIdleHealthChecks(t *testing.T) {
	st, _ := openTestStore(t, postgres.Options{HealthInterval: 20 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sub, err := st.Subscribe(ctx, []int{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	// The listener's last statement becomes the health check's once one has run.
	for {
		var q string
		if err := st.Pool().QueryRow(ctx, `SELECT query FROM pg_stat_activity WHERE datname = current_database()
			AND application_name = $1`, changes.ListenerApplicationName).Scan(&q); err != nil {
			t.Fatal(err)
		}
		if q == "SELECT 1" {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("no health check ran")
		}
		poll := time.NewTimer(10 * time.Millisecond)
		<-poll.C
	}
	if err := sub.SetSlots(ctx, schedule.AllSlots().Slots()); err != nil {
		t.Fatal(err)
	}
	out, err := st.Upsert(ctx, []schedule.Row{{Key: "https://example.com/health", Cadence: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := sub.Next(ctx)
	if err != nil || b.Kind != store.KindEvents || len(b.Events) != 1 || b.Events[0].Row != out[0] {
		t.Fatalf("after health checks: %+v, %v", b, err)
	}
}

// TestReconnectBackoff: while the database refuses connections the listener keeps retrying with
// backoff; a SetSlots call made meanwhile returns once it is back, with the new set active.
func TestReconnectBackoff(t *testing.T) {
	var failed atomic.Int32
	attempt := make(chan struct{}, 1)
	logger := funcr.New(func(prefix, args string) {
		if strings.Contains(args, "reconnect failed") {
			failed.Add(1)
			select {
			case attempt <- struct{}{}:
			default:
			}
		}
	}, funcr.Options{})
	st, _ := openTestStore(t, postgres.Options{Logger: logger, ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var db string
	if err := st.Pool().QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	sub, err := st.Subscribe(ctx, []int{1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	admin, err := pgx.Connect(ctx, pgtest.DSN(t)) // a database cannot refuse connections from itself
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(context.Background()) }()
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+db+" WITH ALLOW_CONNECTIONS false"); err != nil {
		t.Fatal(err)
	}
	breakListeners(t, st)
	b, err := sub.Next(ctx)
	if err != nil || b.Kind != store.KindGap {
		t.Fatalf("after the listener was ended: %+v, %v; want a gap", b, err)
	}
	setDone := make(chan error, 1)
	go func() { setDone <- sub.SetSlots(ctx, schedule.AllSlots().Slots()) }()
	// Let several reconnect attempts fail (the store logs each one).
	deadline := time.After(30 * time.Second)
	for failed.Load() < 3 {
		select {
		case err := <-setDone:
			t.Fatalf("SetSlots returned (%v) while the database refused connections", err)
		case <-attempt:
		case <-deadline:
			t.Fatalf("only %d failed reconnect attempts logged", failed.Load())
		}
	}
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+db+" WITH ALLOW_CONNECTIONS true"); err != nil {
		t.Fatal(err)
	}
	if err := <-setDone; err != nil {
		t.Fatalf("SetSlots: %v", err)
	}
	b, err = sub.Next(ctx)
	if err != nil || b.Kind != store.KindResumed {
		t.Fatalf("after connections are allowed again: %+v, %v; want resumed", b, err)
	}
	out, err := st.Upsert(ctx, []schedule.Row{storetest.Row("backoff/after", time.Now())})
	if err != nil {
		t.Fatal(err)
	}
	b, err = sub.Next(ctx)
	if err != nil || b.Kind != store.KindEvents || b.Events[0].Row != out[0] {
		t.Fatalf("event after resuming on all slots: %+v, %v", b, err)
	}
}

// TestEventQueueOverflow: a flood of 20,000 events that nobody takes fills the subscription's
// queue to MaxQueuedEvents and no further — the rest are dropped and signalled as one gap — and
// once the consumer has taken the queue it is resumed and later writes flow again.
func TestEventQueueOverflow(t *testing.T) {
	const max, n = 500, 20000
	st, _ := openTestStore(t, postgres.Options{MaxQueuedEvents: max})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := st.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	sub := s.(*changes.Subscription)
	rows := make([]schedule.Row, n)
	for i := range rows {
		rows[i] = storetest.Row(fmt.Sprintf("flood/%d", i), time.Now())
	}
	for i := 0; i < n; i += 1000 { // 20 statements
		if _, err := st.Upsert(ctx, rows[i:i+1000]); err != nil {
			t.Fatal(err)
		}
	}
	// every event is either queued or dropped, and the queue never held more than max
	for deadline := time.Now().Add(30 * time.Second); ; {
		queued, _, dropped := sub.QueueStats()
		if queued > max {
			t.Fatalf("%d events queued, more than %d", queued, max)
		}
		if int64(queued)+dropped == n {
			t.Logf("%d events queued, %d dropped", queued, dropped)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d queued and %d dropped of %d events", queued, dropped, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	got := storetest.ExpectOverflow(t, s, max, changes.ErrOverflow, func() schedule.Row {
		out, err := st.Upsert(ctx, []schedule.Row{storetest.Row("after", time.Now())})
		if err != nil {
			t.Fatal(err)
		}
		return out[0]
	})
	if got != max {
		t.Fatalf("%d events before the gap, want %d", got, max)
	}
}

// TestEventQueueByteBound: with long keys the queue's byte bound is reached first.
func TestEventQueueByteBound(t *testing.T) {
	const maxBytes = 100 << 10
	st, _ := openTestStore(t, postgres.Options{MaxQueuedBytes: maxBytes})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := st.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	sub := s.(*changes.Subscription)
	rows := make([]schedule.Row, 1000)
	for i := range rows {
		rows[i] = storetest.Row(fmt.Sprintf("long/%04d/%s", i, strings.Repeat("k", 2000)), time.Now())
	}
	if _, err := st.Upsert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	perEvent := store.EventBytes(&store.Event{Row: rows[0]})
	for deadline := time.Now().Add(30 * time.Second); ; {
		queued, bytes, dropped := sub.QueueStats()
		if bytes > maxBytes {
			t.Fatalf("%d bytes queued, more than %d", bytes, maxBytes)
		}
		if int64(queued)+dropped == int64(len(rows)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d queued and %d dropped", queued, dropped)
		}
		time.Sleep(10 * time.Millisecond)
	}
	want := int(maxBytes / perEvent)
	if got := storetest.ExpectOverflow(t, s, want, changes.ErrOverflow, func() schedule.Row {
		out, err := st.Upsert(ctx, []schedule.Row{storetest.Row("after", time.Now())})
		if err != nil {
			t.Fatal(err)
		}
		return out[0]
	}); got != want {
		t.Fatalf("%d events before the gap, want %d (%d bytes each)", got, want, perEvent)
	}
}
