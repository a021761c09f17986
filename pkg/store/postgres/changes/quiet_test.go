package changes_test

import (
	"context"
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
)

// complete completes rows through st (due an hour on) and returns the rows as written.
func complete(t *testing.T, st *postgres.Store, rows ...schedule.Row) []schedule.Row {
	t.Helper()
	items := make([]store.Completion, len(rows))
	for i, r := range rows {
		items[i] = store.Completion{Key: r.Key, Due: time.Now().Add(time.Hour)}
	}
	res, err := st.Complete(context.Background(), items)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]schedule.Row, len(res))
	for i, r := range res {
		if !r.Found {
			t.Fatalf("completing %q: not found", rows[i].Key)
		}
		out[i] = r.Row
	}
	return out
}

// keysOf lists the keys and revs of rows, for messages and comparisons.
func keysOf(rows []schedule.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.Key + "@" + strconv.FormatInt(r.Rev, 10)
	}
	return out
}

// rowThenSubscription writes a row into slot 5, then subscribes st to every slot (closed with the
// test), and returns the writer, the row and the subscription.
func rowThenSubscription(ctx context.Context, t *testing.T, st *postgres.Store) (*writer, schedule.Row, store.Subscription) {
	t.Helper()
	w := &writer{tb: t, st: st}
	a := w.in(5)
	sub, err := st.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return w, a, sub
}

// listenerPID is the backend pid a subscription recorded its slots under.
func listenerPID(t *testing.T, sub store.Subscription) uint32 {
	t.Helper()
	pid := sub.(*changes.Subscription).ListenerPID()
	if pid == 0 {
		t.Fatal("the subscription recorded no slots")
	}
	return pid
}

// waitGone waits until the backend pid has ended.
func waitGone(t *testing.T, st *postgres.Store, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		if err := st.Pool().QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int64(pid)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend %d still there", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestQuietCompletions: with QuietCompletions, a store's completions send no change events while
// its own subscription is the only listener holding their slots; the rows of slots another
// listener holds are sent (and only those); once that listener's connection is gone its slots
// are quiet again, and the next registration removes its record. Writes of a store without the
// option, and producers' writes, are always sent.
func TestQuietCompletions(t *testing.T) {
	st, dsn := openTestStore(t, postgres.Options{QuietCompletions: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := &writer{tb: t, st: st}
	a, b := w.in(5), w.in(700)
	sub, err := st.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	// nothingBut: the events up to a producer's write (the sentinel) are the sentinel's and want's
	nothingBut := func(step string, want ...schedule.Row) {
		t.Helper()
		sentinel := w.in(5)
		got := eventsUntil(t, sub, sentinel)
		if wantKeys := keysOf(append(want, sentinel)); strings.Join(keysOf(got), " ") != strings.Join(wantKeys, " ") {
			t.Fatalf("%s: events %v, want %v", step, keysOf(got), wantKeys)
		}
	}

	complete(t, st, a, b)
	nothingBut("the only listener's own completions")

	loud, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = loud.Close() }()
	written := complete(t, loud, a)
	nothingBut("a completion by a store without the option", written[0])

	// another listener holds slot 5: a's row is sent (to both), b's (slot 700) is not
	other, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Close() }()
	osub, err := other.Subscribe(ctx, []int{5})
	if err != nil {
		t.Fatal(err)
	}
	written = complete(t, st, a, b)
	nothingBut("another listener holds slot 5", written[0])
	if got := eventsUntil(t, osub, written[0]); len(got) != 1 {
		t.Fatalf("the other listener: %v", keysOf(got))
	}

	// the other listener gone: quiet again, and its record is removed by the next registration
	opid := listenerPID(t, osub)
	if err := osub.Close(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, st, opid)
	complete(t, st, a, b)
	nothingBut("the other listener's connection is gone")
	if err := sub.SetSlots(ctx, schedule.AllSlots().Slots()[1:]); err != nil {
		t.Fatal(err)
	}
	var pids []int32
	rows, err := st.Pool().Query(ctx, `SELECT pid FROM renderqueue_listeners ORDER BY pid`)
	if err != nil {
		t.Fatal(err)
	}
	pids, err = pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(pids) != 1 || uint32(pids[0]) != listenerPID(t, sub) {
		t.Fatalf("recorded listeners %v (%v), want only %d", pids, err, listenerPID(t, sub))
	}
}

// TestQuietSettingEndsWithTheGroup: a quiet group commit's setting lasts for its own transaction
// only (its statements go to the server as one pipeline, committed by the Sync that ends it): no
// connection of the pool keeps it afterwards, where a later write would go quiet with it.
func TestQuietSettingEndsWithTheGroup(t *testing.T) {
	st, _ := openTestStore(t, postgres.Options{QuietCompletions: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, a, sub := rowThenSubscription(ctx, t, st)
	listenerPID(t, sub)
	for range 3 {
		complete(t, st, a, w.in(700))
	}
	conns := st.Pool().AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	if len(conns) == 0 {
		t.Fatal("no idle connection in the pool")
	}
	for _, c := range conns {
		var v *string
		if err := c.QueryRow(ctx, `SELECT current_setting('renderqueue.quiet_for', true)`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v != nil && *v != "" {
			t.Fatalf("backend %d: renderqueue.quiet_for is %q after the group commits", c.Conn().PgConn().PID(), *v)
		}
	}
}

// TestRegistrationWaitsForQuietWrites: a listener recording its slots waits until a quiet write
// that decided, before the record, to send no events has committed — so a walk that starts after
// the registration reads that write — and the write indeed sent no event.
func TestRegistrationWaitsForQuietWrites(t *testing.T) {
	st, dsn := openTestStore(t, postgres.Options{QuietCompletions: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w, a, sub := rowThenSubscription(ctx, t, st)

	// a keeper's completion, held open after its statement (and its trigger) ran
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('renderqueue.quiet_for', $1, true)`, strconv.FormatUint(uint64(listenerPID(t, sub)), 10)); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE render_schedule SET due_at = now() + interval '1 hour', rev = nextval('render_schedule_rev_seq') WHERE key = $1`, a.Key); err != nil {
		t.Fatal(err)
	}

	other, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Close() }()
	subscribed := make(chan error, 1)
	go func() {
		osub, err := other.Subscribe(ctx, []int{5})
		if err == nil {
			defer func() { _ = osub.Close() }()
		}
		subscribed <- err
	}()
	// the registration waits for the lock the quiet write holds
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting int
		if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE relation = 'renderqueue_listeners'::regclass AND NOT granted`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		select {
		case err := <-subscribed:
			t.Fatalf("Subscribe returned (%v) while a quiet write was uncommitted", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the registration never waited for the quiet write")
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-subscribed:
		t.Fatalf("Subscribe returned (%v) while a quiet write was uncommitted", err)
	default:
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-subscribed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Subscribe did not return after the quiet write committed")
	}
	sentinel := w.in(5)
	if got := eventsUntil(t, sub, sentinel); len(got) != 1 {
		t.Fatalf("the quiet write sent events: %v", keysOf(got))
	}
}

// TestQuietNeedsTheKeepersRole: a role that may not read the signing key (a producer) cannot go
// quiet — its writes are sent even with renderqueue.quiet_for set — and may neither record
// slots nor read the listeners' records.
func TestQuietNeedsTheKeepersRole(t *testing.T) {
	st, dsn := openTestStore(t, postgres.Options{QuietCompletions: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, producerDSN := pgtest.Role(t, dsn, "rq_producer_",
		`GRANT SELECT, INSERT, UPDATE, DELETE ON render_schedule TO %s`,
		`GRANT USAGE ON SEQUENCE render_schedule_rev_seq TO %s`)
	pc, err := pgx.Connect(ctx, producerDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pc.Close(context.Background()) }()

	_, a, sub := rowThenSubscription(ctx, t, st)
	if _, err := pc.Exec(ctx, `SELECT set_config('renderqueue.quiet_for', $1, false)`, strconv.FormatUint(uint64(listenerPID(t, sub)), 10)); err != nil {
		t.Fatal(err)
	}
	var rev int64
	if err := pc.QueryRow(ctx, `UPDATE render_schedule SET due_at = now(), rev = nextval('render_schedule_rev_seq') WHERE key = $1 RETURNING rev`, a.Key).Scan(&rev); err != nil {
		t.Fatal(err)
	}
	a.Rev = rev
	if got := eventsUntil(t, sub, a); len(got) != 1 {
		t.Fatalf("events %v", keysOf(got))
	}
	var pgErr *pgconn.PgError
	if _, err := pc.Exec(ctx, `SELECT renderqueue_listen_slots(repeat('1', 1024)::bit(1024))`); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("a producer recording slots: %v, want insufficient_privilege", err)
	}
	if _, err := pc.Exec(ctx, `SELECT count(*) FROM renderqueue_listeners`); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("a producer reading the listeners: %v, want insufficient_privilege", err)
	}
}

// TestMigrationToQuietCompletions: a subscription connected at schema version 6 records no slots
// and its store's completions send their events; migrating to version 7 makes it reconnect (one
// gap: the schema changed), record its slots, and from then on the completions are quiet.
func TestMigrationToQuietCompletions(t *testing.T) {
	st, _ := openAtVersion(t, changes.ListenerSlotsVersion-1, postgres.Options{QuietCompletions: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, a, sub := rowThenSubscription(ctx, t, st)
	if pid := sub.(*changes.Subscription).ListenerPID(); pid != 0 {
		t.Fatalf("at version %d the listener recorded its slots (pid %d)", changes.ListenerSlotsVersion-1, pid)
	}
	written := complete(t, st, a)
	if got := eventsUntil(t, sub, written[0]); len(got) != 1 {
		t.Fatalf("before the migration: %v", keysOf(got))
	}
	if res, err := postgres.MigratePoolWith(ctx, st.Pool(), postgres.MigrateOptions{Version: changes.ListenerSlotsVersion}); err != nil || res.To != changes.ListenerSlotsVersion {
		t.Fatalf("migrating: %+v, %v", res, err)
	}
	bs := nextUntil(t, sub, func(b store.Batch) bool { return b.Kind == store.KindResumed })
	if len(bs) != 2 || bs[0].Kind != store.KindGap || !errors.Is(bs[0].Err, changes.ErrSchemaChanged) {
		t.Fatalf("after the migration: %+v, want one gap (the schema changed) then resumed", bs)
	}
	listenerPID(t, sub)
	complete(t, st, a)
	sentinel := w.in(5)
	if got := eventsUntil(t, sub, sentinel); len(got) != 1 {
		t.Fatalf("after the migration: events %v, want only the producer's", keysOf(got))
	}
}
