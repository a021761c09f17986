package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
)

func TestParseEntries(t *testing.T) {
	evs, err := parseEntries(
		"7,-5,1700000000000001,3600000,3,12:https://a,b:4:home"+
			"8,9,,1,4,3:k:10:",
		interner{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 {
		t.Fatalf("%d events", len(evs))
	}
	a, b := evs[0], evs[1]
	if a.Row.Rev != 7 || a.Row.KeyHash != -5 || !a.Row.HasDue || a.Row.Due.UnixMicro() != 1700000000000001 ||
		a.Row.Cadence != time.Hour || a.Row.Source != schedule.SourceSubmitted || !a.Row.Urgent || a.Deleted ||
		a.Row.Key != "https://a,b:" || a.Row.Route != "home" {
		t.Errorf("first event %+v", a)
	}
	if b.Row.Rev != 8 || b.Row.HasDue || b.Row.Cadence != time.Millisecond || b.Row.Source != schedule.SourceDiscovered ||
		b.Row.Urgent || !b.Deleted || b.Row.Key != "k:1" || b.Row.Route != "" {
		t.Errorf("second event %+v", b)
	}
	for _, bad := range []string{"x", "1x", "17,", "17,1,,1,0,5:abc", "17,1,,1,0,-1:", "17,1,,1,0,1:a", "17,1,,1,0,1:a3:ab"} {
		if _, err := parseEntries(bad, interner{}, nil); err == nil {
			t.Errorf("payload %q accepted", bad)
		}
	}
}

// FuzzParseEntries: no input makes the parser panic or return events with keys it did not read.
func FuzzParseEntries(f *testing.F) {
	f.Add("17,-5,1700000000000001,3600000,3,12:https://a,b:4:home")
	f.Add("18,9,,1,4,3:k:10:")
	f.Fuzz(func(t *testing.T, p string) {
		evs, _ := parseEntries(p, interner{}, nil)
		for _, e := range evs {
			if !strings.Contains(p, e.Row.Key) {
				t.Fatalf("key %q not in payload", e.Row.Key)
			}
		}
	})
}

// TestEventRoundTrip: keys and routes with separators, digits, newlines and non-ASCII text, due
// times before 1970 and far ahead, and NULL due survive the trigger's payload and the parser.
// The store refuses due times outside [1970, 2106) (pkg/schedule); a producer writing plain SQL
// is not held to that, so those rows are written by SQL.
func TestEventRoundTrip(t *testing.T) {
	st, _ := openTestStore(t, Options{})
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
	st, _ := openTestStore(t, Options{HealthInterval: 20 * time.Millisecond})
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
		if err := st.pool.QueryRow(ctx, `SELECT query FROM pg_stat_activity WHERE datname = current_database()
			AND application_name = $1`, ListenerApplicationName).Scan(&q); err != nil {
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
