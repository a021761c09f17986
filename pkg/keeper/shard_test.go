package keeper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/changes"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

// fakeClock is a settable clock for deterministic shard tests.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// faultStore wraps a real store and makes walks fail on demand: every segment containing one of
// failSlots, or the whole walk when failAll is set.
type faultStore struct {
	store.Store
	mu        sync.Mutex
	failSlots map[int]bool
	failAll   bool
}

// BeginSession and EndSession pass the keeper's sessions through (store.Sessions).
func (f *faultStore) BeginSession(ctx context.Context, s store.Session) (store.Session, bool, error) {
	return f.Store.(store.Sessions).BeginSession(ctx, s)
}

func (f *faultStore) EndSession(ctx context.Context, shard, instance string, until time.Time) (bool, error) {
	return f.Store.(store.Sessions).EndSession(ctx, shard, instance, until)
}

// ReadRow passes reads of one row through (store.RowReader).
func (f *faultStore) ReadRow(ctx context.Context, key string) (schedule.Row, bool, error) {
	return f.Store.(store.RowReader).ReadRow(ctx, key)
}

func (f *faultStore) set(all bool, slots ...int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failAll = all
	f.failSlots = map[int]bool{}
	for _, s := range slots {
		f.failSlots[s] = true
	}
}

func (f *faultStore) Walk(ctx context.Context, slots []int, fn store.WalkFunc) (store.WalkResult, error) {
	f.mu.Lock()
	failAll, failSlots := f.failAll, f.failSlots
	f.mu.Unlock()
	if failAll {
		return store.WalkResult{}, errors.New("injected: the database is unreachable")
	}
	var res store.WalkResult
	var ok []int
	for _, s := range slots {
		if failSlots[s] {
			seg := schedule.Run{First: s, Last: s}
			err := fmt.Errorf("injected: segment %d failed", s)
			if err := fn(store.WalkItem{Segment: seg, End: true, Err: err}); err != nil {
				return res, err
			}
			res.Segments = append(res.Segments, store.SegmentResult{Segment: seg, Err: err})
			continue
		}
		ok = append(ok, s)
	}
	if len(ok) > 0 {
		r, err := f.Store.Walk(ctx, ok, fn)
		res.Segments = append(res.Segments, r.Segments...)
		res.Rows += r.Rows
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// t0 is the tests' fake clock's start.
var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

type shardEnv struct {
	t     testing.TB
	dsn   string
	st    *postgres.Store
	fs    *faultStore
	clock *fakeClock
	sh    *Shard
	ctx   context.Context
}

func allSlots(window time.Duration) Settings {
	return Settings{Window: window, VerifyInterval: time.Hour, LeaseDuration: time.Minute, SubmittedBoost: 2, UrgentMaxShare: 0.2, Owned: schedule.AllSlots()}
}

// newShardEnv opens a fresh database with a shard over it (subscribed, not yet loaded).
func newShardEnv(t testing.TB, settings Settings) *shardEnv {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := postgres.Open(ctx, dsn, postgres.Options{ReconnectMin: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond, QuietCompletions: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	e := &shardEnv{t: t, dsn: dsn, st: st, fs: &faultStore{Store: st}, clock: &fakeClock{now: t0}, ctx: ctx}
	e.sh, err = NewShard(Options{Name: "test-shard", Store: e.fs, Clock: e.clock.Now, Log: logr.Discard()}, settings)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.sh.Subscribe(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.sh.sub.Close() })
	return e
}

// upsert writes rows (due relative to t0) and returns them as stored.
func (e *shardEnv) upsert(rows ...schedule.Row) []schedule.Row {
	e.t.Helper()
	out, err := e.st.Upsert(e.ctx, rows)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// pumpUntil applies subscription batches until cond holds (or fails after 10 s).
func (e *shardEnv) pumpUntil(what string, cond func() bool) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	for !cond() {
		b, err := e.sh.sub.Next(ctx)
		if err != nil {
			e.t.Fatalf("waiting for %s: %v", what, err)
		}
		e.sh.HandleBatch(b)
	}
}

func (e *shardEnv) status() shardapi.Status { return e.sh.Status(e.clock.Now()) }

func srow(key string, due time.Time, cadence time.Duration) schedule.Row {
	return schedule.Row{Key: key, Due: due, HasDue: true, Cadence: cadence, Route: "product"}
}

func TestShardLoadEdgeAndAdmission(t *testing.T) {
	e := newShardEnv(t, allSlots(2*time.Hour))
	e.upsert(
		srow("overdue", t0.Add(-time.Hour), time.Hour),
		srow("soon", t0.Add(time.Hour), 96*time.Hour),
		srow("later", t0.Add(3*time.Hour), 96*time.Hour),
	)
	if st := e.status(); st.Status != shardapi.StatusUnready || st.Complete || st.Exact {
		t.Fatalf("before load: %s complete=%v exact=%v", st.Status, st.Complete, st.Exact)
	}
	rep := e.sh.Walk(e.ctx, true)
	if rep.Failed || rep.Partial || rep.Counts.Admitted != 2 || rep.Counts.OwnedNotHeld != 1 || rep.Counts.Repaired != 0 {
		t.Fatalf("load report %+v", rep)
	}
	st := e.status()
	if !st.Complete || !st.Exact || st.Status != shardapi.StatusQueued || st.Due != 1 || st.Rows.Held != 2 {
		t.Fatalf("after load: %+v", st)
	}
	// a finished walk advances the edge to its start + window
	if st.Edge == nil || !st.Edge.Equal(t0.Add(2*time.Hour)) || *st.EdgeAheadSeconds != 7200 {
		t.Fatalf("edge %v ahead %v", st.Edge, st.EdgeAheadSeconds)
	}
	if st.Rows.OwnedNotHeld != 1 || st.Rows.OwnedNotHeldByHour[3] != 1 {
		t.Fatalf("owned not held %d by hour %v", st.Rows.OwnedNotHeld, st.Rows.OwnedNotHeldByHour)
	}

	// an event moving a held row beyond the window drops it
	e.upsert(srow("soon", t0.Add(5*time.Hour), 96*time.Hour))
	e.pumpUntil("the row to leave", func() bool { return e.status().Rows.Held == 1 })

	// admissions are not counted as missing: an hour later "later" (t0+3h) is inside the window
	// (t0+1h+2h is not > t0+3h... so move the clock 90 minutes) and after the old edge
	e.clock.Set(t0.Add(90 * time.Minute))
	rep = e.sh.Walk(e.ctx, true)
	if rep.Counts.Admitted != 1 || rep.Counts.Repaired != 0 {
		t.Fatalf("second walk: %+v", rep.Counts)
	}
	if st := e.status(); !st.Exact || st.Rows.Held != 2 {
		t.Fatalf("after second walk: exact=%v held=%d", st.Exact, st.Rows.Held)
	}
}

func TestShardWindowZeroHoldsAllAndReportsEmpty(t *testing.T) {
	e := newShardEnv(t, allSlots(0))
	e.upsert(srow("far", t0.Add(1000*time.Hour), 96*time.Hour))
	e.sh.Walk(e.ctx, true)
	st := e.status()
	if st.Rows.Held != 1 || st.Edge != nil || !st.Complete || st.Status != shardapi.StatusEmpty {
		t.Fatalf("window 0: held %d edge %v complete %v status %s", st.Rows.Held, st.Edge, st.Complete, st.Status)
	}
}

func TestShardPartialWalk(t *testing.T) {
	e := newShardEnv(t, allSlots(2*time.Hour))
	rows := e.upsert(srow("a", t0.Add(-time.Hour), time.Hour))
	e.fs.set(false, rows[0].Slot())
	rep := e.sh.Walk(e.ctx, true)
	if !rep.Partial || rep.Failed || rep.UnreadSegments != 1 {
		t.Fatalf("report %+v", rep)
	}
	st := e.status()
	// a partial walk advances the edge too, but the shard is not exact
	if st.Edge == nil || !st.Edge.Equal(t0.Add(2*time.Hour)) || !st.Complete || st.Exact || !st.LastWalk.Partial {
		t.Fatalf("partial: edge %v complete %v exact %v", st.Edge, st.Complete, st.Exact)
	}
	// the unread row is not held, so the shard says unready rather than empty... it is complete
	// by the edge rule, yet not exact: status is empty only because nothing readable is due
	e.fs.set(false)
	e.clock.Set(t0.Add(time.Minute))
	if rep := e.sh.Walk(e.ctx, true); rep.Partial || rep.Counts.Admitted != 1 {
		t.Fatalf("full walk after partial: %+v", rep)
	}
	if st := e.status(); !st.Exact || st.Due != 1 {
		t.Fatalf("after full walk: exact %v due %d", st.Exact, st.Due)
	}
}

func TestShardFailedWalkPastTheEdge(t *testing.T) {
	e := newShardEnv(t, allSlots(3*time.Hour))
	e.upsert(srow("a", t0.Add(2*time.Hour), time.Hour))
	e.sh.Walk(e.ctx, true)
	if st := e.status(); st.Status != shardapi.StatusEmpty || !st.Complete {
		t.Fatalf("after load: %s", st.Status)
	}
	// the database goes away: walks fail, the clock passes the edge (t0+3h)
	e.fs.set(true)
	e.clock.Set(t0.Add(time.Hour))
	if rep := e.sh.Walk(e.ctx, true); !rep.Failed {
		t.Fatalf("walk should fail: %+v", rep)
	}
	e.clock.Set(t0.Add(3 * time.Hour))
	st := e.status()
	if st.Complete || st.Exact {
		t.Fatalf("past the edge: complete %v exact %v", st.Complete, st.Exact)
	}
	// "a" (due t0+2h) is held and due: queued while due rows are held
	if st.Status != shardapi.StatusQueued || *st.EdgeAheadSeconds != 0 {
		t.Fatalf("past the edge with due rows: %s ahead %v", st.Status, *st.EdgeAheadSeconds)
	}
	claimed, err := e.sh.Claim(e.clock.Now(), 1, time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	if _, err := e.sh.Complete(e.ctx, []CompleteItem{{Key: "a", Lease: claimed[0].Lease}}); err != nil {
		t.Fatal(err)
	}
	// nothing due is held any more, but work it cannot see may be due: unready, never empty
	// (the completion moved "a" to t0+4h, held but not yet due)
	e.clock.Set(t0.Add(210 * time.Minute))
	if st := e.status(); st.Status != shardapi.StatusUnready || *st.EdgeAheadSeconds != -1800 {
		t.Fatalf("past the edge, nothing held due: %s ahead %v", st.Status, *st.EdgeAheadSeconds)
	}
}

func TestWalkInterval(t *testing.T) {
	cases := []struct {
		window, verify, want time.Duration
	}{
		{0, time.Hour, time.Hour},                            // no window: the verify interval
		{0, 0, 0},                                            // neither: no periodic walks
		{24 * time.Hour, time.Hour, time.Hour},               // verify shorter than window/3
		{3 * time.Hour, 2 * time.Hour, time.Hour},            // clamped to window/3
		{6 * time.Hour, 0, 2 * time.Hour},                    // verify 0 does not disable walks
		{90 * time.Minute, 24 * time.Hour, 30 * time.Minute}, // clamped
	}
	for _, c := range cases {
		if got := (Settings{Window: c.window, VerifyInterval: c.verify}).WalkInterval(); got != c.want {
			t.Errorf("window %v verify %v: %v, want %v", c.window, c.verify, got, c.want)
		}
	}
}

// TestShardGapRepair cuts the listener off, writes while it is cut off, and checks the shard
// turns inexact at once and exact again after the walk that follows the resumption, with the
// missed write repaired and counted.
func TestShardGapRepair(t *testing.T) {
	e := newShardEnv(t, allSlots(24*time.Hour))
	e.upsert(srow("a", t0.Add(-time.Hour), time.Hour))
	e.sh.Walk(e.ctx, true)
	if !e.status().Exact {
		t.Fatal("not exact after load")
	}
	conn, err := pgx.Connect(e.ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(e.ctx) }()
	// keep the listener from coming back while we write, so the write's event is surely lost
	var db string
	if err := conn.QueryRow(e.ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	adminDSN, err := pgtest.WithDatabase(e.dsn, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(e.ctx, adminDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close(e.ctx) }()
	allow := func(on bool) {
		t.Helper()
		if _, err := admin.Exec(e.ctx, fmt.Sprintf(`ALTER DATABASE %s WITH ALLOW_CONNECTIONS %v`, pgx.Identifier{db}.Sanitize(), on)); err != nil {
			t.Fatal(err)
		}
	}
	allow(false)
	defer allow(true)
	if _, err := conn.Exec(e.ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, changes.ListenerApplicationName); err != nil {
		t.Fatal(err)
	}
	e.pumpUntil("the gap", func() bool { _, lasting := e.sh.cov.LastGap(); return lasting })
	if st := e.status(); st.Exact || st.Complete || st.Gap == nil {
		t.Fatalf("during the gap: exact %v complete %v gap %v", st.Exact, st.Complete, st.Gap)
	}
	// a write the shard cannot hear of: "b" is due now, before the edge
	if _, err := conn.Exec(e.ctx, `INSERT INTO render_schedule (key, due_at, cadence_ms, route) VALUES ('b', $1, 3600000, 'product')`, t0.Add(-30*time.Minute)); err != nil {
		t.Fatal(err)
	}
	allow(true)
	e.pumpUntil("the resumption", func() bool { _, lasting := e.sh.cov.LastGap(); return !lasting })
	if st := e.status(); st.Exact || st.Due != 1 {
		t.Fatalf("before the repair walk: exact %v due %d", st.Exact, st.Due)
	}
	e.clock.Set(t0.Add(time.Minute))
	rep := e.sh.Walk(e.ctx, true)
	held := e.status()
	if !held.Exact || held.Due != 2 || held.Gap != nil {
		t.Fatalf("after the repair walk: exact %v due %d gap %v (report %+v)", held.Exact, held.Due, held.Gap, rep.Counts)
	}
	if rep.Counts.Repaired != 1 {
		t.Fatalf("repaired %d, want 1 (the write made while cut off)", rep.Counts.Repaired)
	}
}
