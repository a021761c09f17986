package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
	"github.com/renderqueue/renderqueue/pkg/store/storetest"
)

// beforeUpdateRowTriggers counts render_schedule's BEFORE UPDATE row triggers (tgtype bits: 1 row,
// 2 before, 16 update). Any such trigger makes PostgreSQL lock every row an UPDATE writes, before
// it looks at the trigger's WHEN (migrations/0008_after_row_rev.sql).
const beforeUpdateRowTriggers = `SELECT count(*) FROM pg_trigger
	WHERE tgrelid = 'render_schedule'::regclass AND NOT tgisinternal AND tgtype & 19 = 19`

// TestRevAfterTheRow: on a one-table schema no BEFORE UPDATE row trigger is left, so completions
// lock no row; an update that leaves rev alone still ends with a fresh rev, and its change events
// carry that rev, once per row — also when it waited for another writer of the row.
func TestRevAfterTheRow(t *testing.T) {
	st, _ := openTestStore(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var n int
	if err := st.pool.QueryRow(ctx, beforeUpdateRowTriggers).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d BEFORE UPDATE row triggers on render_schedule (%v), want none", n, err)
	}
	now := time.Now()
	rows := []schedule.Row{storetest.Row("rev/a", now), storetest.Row("rev/b", now), storetest.Row("rev/c", now)}
	out, err := st.Upsert(ctx, rows)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := st.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	revOf := func(key string) int64 {
		t.Helper()
		var rev int64
		if err := st.pool.QueryRow(ctx, `SELECT rev FROM render_schedule WHERE key = $1`, key).Scan(&rev); err != nil {
			t.Fatal(err)
		}
		return rev
	}
	// events reads events up to the marker row's insert and returns them by key, in order.
	marker := 0
	events := func() map[string][]schedule.Row {
		t.Helper()
		marker++
		key := fmt.Sprintf("https://example.com/rev/marker-%d", marker)
		if _, err := st.pool.Exec(ctx, `INSERT INTO render_schedule (key, due_at, cadence_ms) VALUES ($1, now(), 1000)`, key); err != nil {
			t.Fatal(err)
		}
		got := map[string][]schedule.Row{}
		for {
			b, err := sub.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if b.Kind != store.KindEvents {
				continue
			}
			for _, e := range b.Events {
				if e.Row.Key == key {
					return got
				}
				got[e.Row.Key] = append(got[e.Row.Key], e.Row)
			}
		}
	}
	events() // the subscription is live

	// a producer's UPDATE of three rows, rev left alone, in one statement
	old := map[string]int64{}
	for _, r := range out {
		old[r.Key] = r.Rev
	}
	if _, err := st.pool.Exec(ctx, `UPDATE render_schedule SET cadence_ms = 7200000 WHERE key LIKE 'https://example.com/rev/_'`); err != nil {
		t.Fatal(err)
	}
	got := events()
	for _, r := range out {
		rev := revOf(r.Key)
		if rev <= old[r.Key] {
			t.Errorf("%s: rev %d after an update from %d, want a fresh one", r.Key, rev, old[r.Key])
		}
		if es := got[r.Key]; len(es) != 1 || es[0].Rev != rev || es[0].Cadence != 2*time.Hour {
			t.Errorf("%s: events %+v, want one with rev %d and the new cadence", r.Key, es, rev)
		}
	}
	if len(got) != len(out) {
		t.Errorf("events for %d keys, want %d: %v", len(got), len(out), got)
	}

	// an upsert that leaves rev alone, as producers' SQL may
	before := revOf(out[1].Key)
	if _, err := st.pool.Exec(ctx, `INSERT INTO render_schedule (key, due_at, cadence_ms) VALUES ($1, now(), 14400000)
		ON CONFLICT (key) DO UPDATE SET cadence_ms = EXCLUDED.cadence_ms`, out[1].Key); err != nil {
		t.Fatal(err)
	}
	got = events()
	if rev := revOf(out[1].Key); rev <= before || len(got) != 1 || len(got[out[1].Key]) != 1 ||
		got[out[1].Key][0].Rev != rev || got[out[1].Key][0].Cadence != 4*time.Hour {
		t.Errorf("upsert: rev %d after %d, events %+v: want one event with the fresh rev", rev, before, got)
	}

	// the same UPDATE waiting for a writer that stamped the row's rev (a completion): it compares
	// with that writer's rev, so it still takes a fresh one
	key := out[0].Key
	tx, err := st.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var stamped int64
	if err := tx.QueryRow(ctx, `UPDATE render_schedule SET due_at = now(), rev = nextval('render_schedule_rev_seq') WHERE key = $1 RETURNING rev`, key).Scan(&stamped); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := st.pool.Exec(ctx, `UPDATE render_schedule SET cadence_ms = 10800000 WHERE key = $1`, key)
		done <- err
	}()
	lockWaiter(t, st, "UPDATE render_schedule SET cadence_ms = 10800000%")
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rev := revOf(key)
	if rev <= stamped {
		t.Errorf("an update that waited for rev %d left rev %d, want a fresh one", stamped, rev)
	}
	es := events()[key]
	if len(es) != 2 || es[0].Rev != stamped || es[1].Rev != rev || es[1].Cadence != 3*time.Hour {
		t.Errorf("events %+v, want the stamped write's (rev %d), then the update's with rev %d and its cadence", es, stamped, rev)
	}
}

// TestPartitionedKeyChange: a partitioned schema keeps its BEFORE UPDATE rev trigger, because a
// key change that moves the row to another partition runs no AFTER UPDATE row trigger: every key
// change is refused, whichever partition the new key falls in, and a row's rev stays fresh.
func TestPartitionedKeyChange(t *testing.T) {
	st, _ := openTestStore(t, Options{Partitions: 4})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var n int
	if err := st.pool.QueryRow(ctx, beforeUpdateRowTriggers).Scan(&n); err != nil || n != 1 {
		t.Errorf("%d BEFORE UPDATE row triggers on the partitioned render_schedule (%v), want 1", n, err)
	}
	out, err := st.Upsert(ctx, []schedule.Row{storetest.Row("move/a", time.Now())})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 16 { // with 4 partitions, some new keys fall in another one
		_, err := st.pool.Exec(ctx, `UPDATE render_schedule SET key = $2 WHERE key = $1`, out[0].Key, fmt.Sprintf("https://example.com/moved/%d", i))
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || !strings.Contains(pgErr.Message, "cannot be changed") {
			t.Errorf("changing the key to moved/%d: %v, want a refusal", i, err)
		}
	}
	var rev int64
	if err := st.pool.QueryRow(ctx, `UPDATE render_schedule SET cadence_ms = 7200000 WHERE key = $1 RETURNING rev`, out[0].Key).Scan(&rev); err != nil {
		t.Fatal(err)
	}
	if rev <= out[0].Rev {
		t.Errorf("rev %d after an update from %d, want a fresh one", rev, out[0].Rev)
	}
	if err := st.pool.QueryRow(ctx, `SELECT count(*) FROM render_schedule`).Scan(&n); err != nil || n != 1 {
		t.Errorf("%d rows (%v), want 1", n, err)
	}
}

// TestRestampNeedsNoRevGrant: a producer role that may update some columns but not rev still
// updates rows without stamping rev, and they get fresh revs (the restamp runs as the schema's
// owner, as the BEFORE trigger it replaces needed no privilege to set rev).
func TestRestampNeedsNoRevGrant(t *testing.T) {
	st, dsn := openTestStore(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := st.Upsert(ctx, []schedule.Row{storetest.Row("grant/a", time.Now())})
	if err != nil {
		t.Fatal(err)
	}
	_, producerDSN := pgtest.Role(t, dsn, "rq_producer_",
		`GRANT SELECT, INSERT, DELETE ON render_schedule TO %s`,
		`GRANT UPDATE (due_at, cadence_ms, route, source, urgent) ON render_schedule TO %s`,
		`GRANT USAGE ON SEQUENCE render_schedule_rev_seq TO %s`)
	pc, err := pgx.Connect(ctx, producerDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pc.Close(context.Background()) }()
	if _, err := pc.Exec(ctx, `UPDATE render_schedule SET cadence_ms = 7200000 WHERE key = $1`, out[0].Key); err != nil {
		t.Fatalf("an update by a role without UPDATE on rev: %v", err)
	}
	var rev int64
	if err := st.pool.QueryRow(ctx, `SELECT rev FROM render_schedule WHERE key = $1`, out[0].Key).Scan(&rev); err != nil {
		t.Fatal(err)
	}
	if rev <= out[0].Rev {
		t.Errorf("rev %d after an update from %d, want a fresh one", rev, out[0].Rev)
	}
}
