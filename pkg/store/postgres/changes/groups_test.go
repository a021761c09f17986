package changes_test

import (
	"context"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/changes"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
	"github.com/renderqueue/renderqueue/pkg/store/storetest"
)

// keyInSlot returns a key named after prefix whose row falls in slot (the database computes the
// hash).
func keyInSlot(tb testing.TB, st *postgres.Store, prefix string, slot int) string {
	tb.Helper()
	var k string
	if err := st.Pool().QueryRow(context.Background(), `SELECT k FROM (SELECT $1 || i AS k FROM generate_series(1, 200000) AS i) s
		WHERE (hashtextextended(k, 0) >> 54) + 512 = $2 LIMIT 1`, prefix, slot).Scan(&k); err != nil {
		tb.Fatalf("a key in slot %d: %v", slot, err)
	}
	return k
}

// writer upserts one row per call into a given slot, each with a fresh key, and returns it.
type writer struct {
	tb testing.TB
	st *postgres.Store
	n  int
}

func (w *writer) in(slot int) schedule.Row {
	w.tb.Helper()
	w.n++
	r := storetest.Row("", time.Now())
	r.Key = keyInSlot(w.tb, w.st, r.Key+"w"+strconv.Itoa(w.n)+"/", slot)
	out, err := w.st.Upsert(context.Background(), []schedule.Row{r})
	if err != nil {
		w.tb.Fatal(err)
	}
	if out[0].Slot() != slot {
		w.tb.Fatalf("row %q in slot %d, want %d", r.Key, out[0].Slot(), slot)
	}
	return out[0]
}

// eventsUntil reads batches until the event of row last arrives and returns the rows of the
// events before it and last's own; a gap or resumed fails the test.
func eventsUntil(t *testing.T, sub store.Subscription, last schedule.Row) []schedule.Row {
	t.Helper()
	var got []schedule.Row
	nextUntil(t, sub, func(b store.Batch) bool {
		if b.Kind != store.KindEvents {
			t.Fatalf("%v (%v) while waiting for the event of %q", b.Kind, b.Err, last.Key)
		}
		for _, e := range b.Events {
			got = append(got, e.Row)
			if e.Row.Key == last.Key && e.Row.Rev == last.Rev {
				return true
			}
		}
		return false
	})
	return got
}

func slotsOf(rows []schedule.Row) []int {
	out := make([]int, len(rows))
	for i, r := range rows {
		out[i] = r.Slot()
	}
	return out
}

// TestGroupFiltering: a subscription to slot 5 listens on the channel of slots 0-15 but queues
// no event of slot 6; after SetSlots adds slot 6 (a slot of a group already listened to: no
// LISTEN), a write to slot 6 committed after it returns is delivered, one read before it never
// (as with LISTEN on a channel of slot 6's own, not even when it was read but not yet taken).
func TestGroupFiltering(t *testing.T) {
	st, _ := openTestStore(t, postgres.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if changes.GroupOf(5) != changes.GroupOf(6) {
		t.Fatal("slots 5 and 6 are in different groups")
	}
	s, err := st.Subscribe(ctx, []int{5})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	sub := s.(*changes.Subscription)
	w := &writer{tb: t, st: st}
	w.in(6)
	w.in(5)
	w.in(5) // committed after slot 6's write: once both of slot 5 are queued, slot 6's was read
	for deadline := time.Now().Add(20 * time.Second); ; {
		queued, _, _ := sub.QueueStats()
		if queued >= 2 {
			if queued != 2 {
				t.Fatalf("%d events queued, want slot 5's 2", queued)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events queued", queued)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := sub.SetSlots(ctx, []int{5, 6}); err != nil {
		t.Fatal(err)
	}
	after := w.in(6)
	if got := slotsOf(eventsUntil(t, sub, after)); len(got) != 3 || got[0] != 5 || got[1] != 5 {
		t.Fatalf("after adding slot 6: events of slots %v, want 5, 5 then the write after SetSlots", got)
	}
	// and once slot 6 is removed again (group 0 still listened to for slot 5), its events stop
	if err := sub.SetSlots(ctx, []int{5}); err != nil {
		t.Fatal(err)
	}
	w.in(6)
	mark := w.in(5)
	if got := eventsUntil(t, sub, mark); len(got) != 1 {
		t.Fatalf("after removing slot 6: events of slots %v, want only slot 5's", slotsOf(got))
	}
}

// TestSetSlotsAcrossGroups: SetSlots keeping one group, adding another and dropping all but a
// third delivers exactly the subscribed slots' events at each step, with no gap.
func TestSetSlotsAcrossGroups(t *testing.T) {
	st, _ := openTestStore(t, postgres.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sub, err := st.Subscribe(ctx, []int{5})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	w := &writer{tb: t, st: st}
	for _, step := range []struct {
		slots  []int
		writes []int // the last one is subscribed: its event ends the step
		want   []int
	}{
		{[]int{5}, []int{6, 40, 5}, []int{5}},
		{[]int{6, 40}, []int{5, 6, 41, 300, 40}, []int{6, 40}},                   // group 0 kept, group 2 added
		{[]int{300, 1023}, []int{6, 40, 301, 1022, 300, 1023}, []int{300, 1023}}, // groups 0 and 2 dropped
		{[]int{}, nil, nil},
		{[]int{0, 15, 16}, []int{1, 17, 300, 15, 16, 0}, []int{15, 16, 0}},
	} {
		if err := sub.SetSlots(ctx, step.slots); err != nil {
			t.Fatal(err)
		}
		if len(step.writes) == 0 {
			continue
		}
		var last schedule.Row
		for _, s := range step.writes {
			last = w.in(s)
		}
		got := slotsOf(eventsUntil(t, sub, last))
		if len(got) != len(step.want) {
			t.Fatalf("slots %v: events of slots %v, want %v", step.slots, got, step.want)
		}
		for i := range got {
			if got[i] != step.want[i] {
				t.Fatalf("slots %v: events of slots %v, want %v", step.slots, got, step.want)
			}
		}
	}
}

// openAtVersion opens a store on a fresh database whose schema is migrated to version v only.
func openAtVersion(t *testing.T, v int, opts postgres.Options) (*postgres.Store, string) {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := postgres.Open(ctx, dsn, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	res, err := postgres.MigratePoolWith(ctx, st.Pool(), postgres.MigrateOptions{Partitions: opts.Partitions, Version: v})
	if err != nil || res.To != v {
		t.Fatalf("migrating to version %d: %+v, %v", v, res, err)
	}
	return st, dsn
}

// TestSwitchToGroupChannels: a subscription connected while the schema is at version 2 or 3
// listens on slot channels; migrating to version 4 is one gap (the migration's payload on rq_schema; the
// "T" on every slot channel that follows it is part of it), after which the subscription is
// resumed on the group channels and events flow again. A keeper of an older binary, listening on
// a slot channel, sees the signed "T" (a gap), and can no longer read the key. Both layouts.
func TestSwitchToGroupChannels(t *testing.T) {
	for _, tc := range []struct {
		name        string
		from, parts int
	}{{"from-2/table", 2, 0}, {"from-3/partitions-4", 3, 4}} {
		t.Run(tc.name, func(t *testing.T) {
			st, dsn := openAtVersion(t, tc.from, postgres.Options{Partitions: tc.parts})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			sub, err := st.Subscribe(ctx, []int{5, 6, 700})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Close() }()
			// an older keeper: listening on slot 5's channel, with the key read before version 4
			old, oldGot := listen(t, dsn, changes.SlotChannel(5))
			var oldKey string
			if err := st.Pool().QueryRow(ctx, `SELECT renderqueue_event_key()`).Scan(&oldKey); err != nil {
				t.Fatalf("reading the key at version %d without declaring group channels: %v", tc.from, err)
			}

			w := &writer{tb: t, st: st}
			before := w.in(700)
			if got := eventsUntil(t, sub, before); len(got) != 1 {
				t.Fatalf("at version %d: %+v", tc.from, got)
			}

			res, err := postgres.MigratePool(ctx, st.Pool())
			if err != nil || res.From != tc.from || res.To < changes.GroupChannelsVersion {
				t.Fatalf("migrating from version %d: %+v, %v", tc.from, res, err)
			}
			bs := nextUntil(t, sub, func(b store.Batch) bool { return b.Kind == store.KindResumed })
			if len(bs) != 2 || bs[0].Kind != store.KindGap || !errors.Is(bs[0].Err, changes.ErrSchemaChanged) {
				t.Fatalf("after the migration: %+v, want one gap (the schema changed) then resumed", bs)
			}
			after := w.in(6)
			if got := eventsUntil(t, sub, after); len(got) != 1 {
				t.Fatalf("after the migration: %+v", got)
			}

			// the older keeper got the migration's "T", signed for its channel; nothing since
			for len(*oldGot) == 0 {
				if err := old.WaitForNotification(ctx); err != nil {
					t.Fatal(err)
				}
			}
			n := (*oldGot)[0]
			k, err := hex.DecodeString(oldKey)
			if err != nil {
				t.Fatal(err)
			}
			body, _, authentic, err := changes.OpenPayload(k, n.Channel, n.Payload)
			if err != nil || !authentic || body != "T" || n.Channel != changes.SlotChannel(5) || len(*oldGot) != 1 {
				t.Fatalf("the older keeper's notifications: %d, first %q on %s: %q %v %v", len(*oldGot), n.Payload, n.Channel, body, authentic, err)
			}
			_, err = st.Pool().Exec(ctx, `SELECT renderqueue_event_key()`)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "0A000" || !strings.Contains(pgErr.Message, "upgrade the keepers") {
				t.Fatalf("an older keeper reading the key at version 4: %v", err)
			}
		})
	}
}

// TestSchemaPayloadChecks: a payload on rq_schema is verified like any other (a forged one is a
// gap, not a reconnect); a signed one naming a version not newer than the subscription's changes
// nothing; the search_path of the functions version 4 replaced is still pinned.
func TestSchemaPayloadChecks(t *testing.T) {
	st, _ := openTestStore(t, postgres.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sub, err := st.Subscribe(ctx, []int{5})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	key := eventKey(t, st)
	w := &writer{tb: t, st: st}
	if _, err := st.Pool().Exec(ctx, `SELECT pg_notify('rq_schema', $1)`, signedPayload(key, changes.SchemaChannel, time.Now(), "4")); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `SELECT pg_notify('rq_schema', renderqueue_sign('rq_schema', '3'))`); err != nil {
		t.Fatal(err)
	}
	mark := w.in(5)
	if got := eventsUntil(t, sub, mark); len(got) != 1 {
		t.Fatalf("after payloads of versions 4 and 3: %+v", got)
	}
	otherKey := append([]byte(nil), key...)
	otherKey[0] ^= 1
	if _, err := st.Pool().Exec(ctx, `SELECT pg_notify('rq_schema', $1)`, signedPayload(otherKey, changes.SchemaChannel, time.Now(), "99")); err != nil {
		t.Fatal(err)
	}
	bs := nextUntil(t, sub, func(b store.Batch) bool { return b.Kind == store.KindResumed })
	if len(bs) != 2 || bs[0].Kind != store.KindGap || !errors.Is(bs[0].Err, changes.ErrBadSignature) {
		t.Fatalf("a forged schema payload: %+v, want a gap (bad signature) then resumed", bs)
	}
	mark = w.in(5)
	if got := eventsUntil(t, sub, mark); len(got) != 1 {
		t.Fatalf("after a forged schema payload: %+v", got)
	}

	rows, err := st.Pool().Query(ctx, `SELECT p.proname, p.prosecdef, coalesce(array_to_string(p.proconfig, ';'), '')
		FROM pg_proc p WHERE p.proname IN ('render_schedule_notify', 'render_schedule_notify_truncate',
			'renderqueue_event_key', 'renderqueue_schema_version', 'renderqueue_sign', 'renderqueue_rotate_event_key')`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var name, config string
		var definer bool
		if err := rows.Scan(&name, &definer, &config); err != nil {
			t.Fatal(err)
		}
		n++
		if !strings.HasPrefix(config, "search_path=pg_catalog, ") || !strings.HasSuffix(config, ", pg_temp") {
			t.Errorf("%s: settings %q, want search_path pinned", name, config)
		}
		if definer != (name != "renderqueue_sign" && name != "renderqueue_rotate_event_key") {
			t.Errorf("%s: SECURITY DEFINER %v", name, definer)
		}
	}
	if err := rows.Err(); err != nil || n != 6 {
		t.Fatalf("%d functions, %v", n, err)
	}
}

// listen opens a raw connection LISTENing on channel and collects its payloads.
func listen(t *testing.T, dsn, channel string) (*pgconn.PgConn, *[]*pgconn.Notification) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	var got []*pgconn.Notification
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) { got = append(got, n) }
	conn, err := pgconn.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(context.Background(), "LISTEN "+pgx.Identifier{channel}.Sanitize()).ReadAll(); err != nil {
		t.Fatal(err)
	}
	return conn, &got
}
