package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/renderqueue/renderqueue/pkg/keeper"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

// startInProcess starts a standalone keeper inside the test process.
func startInProcess(ctx context.Context, dsn, token string) (*Keeper, error) {
	ctx, cancel := context.WithCancel(ctx)
	st, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		cancel()
		return nil, err
	}
	sh, err := keeper.NewShard(keeper.Options{Name: "bench", Store: st, Log: logr.Discard()}, keeper.Settings{
		VerifyInterval: time.Hour, LeaseDuration: 5 * time.Minute, SubmittedBoost: 2, UrgentMaxShare: 0.2,
		Owned: schedule.AllSlots(),
	})
	if err != nil {
		cancel()
		_ = st.Close()
		return nil, err
	}
	ran := make(chan error, 1)
	go func() { ran <- sh.Run(ctx, nil) }()
	srv := httptest.NewServer(sh.Handler(keeper.HandlerOptions{Token: token}))
	return &Keeper{URL: srv.URL, Stop: func() error {
		cancel()
		srv.Close()
		runErr := <-ran
		if errors.Is(runErr, context.Canceled) {
			runErr = nil
		}
		return errors.Join(runErr, st.Close())
	}}, nil
}

// TestRunSmall runs the whole benchmark on a few thousand rows with an in-process keeper, in two
// rounds: both queues complete rows, every acknowledged keeper completion is found in the
// database, the report says so, the second round runs the SKIP LOCKED queue first, and each
// round's scratch database is dropped.
func TestRunSmall(t *testing.T) {
	server := pgtest.DSN(t)
	ctx := context.Background()
	var (
		mu       sync.Mutex
		progress []string
	)
	rs, err := RunRounds(ctx, Config{
		ServerDSN: server, Rows: 5000, Duration: time.Second, Keeper: Shape{Workers: 4, Batch: 50},
		SkipLocked: []Shape{{2, 20}, {4, 50}}, TriggerRounds: 6, StartKeeper: startInProcess,
		Log: func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			progress = append(progress, fmt.Sprintf(format, args...))
		},
	}, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].SkipLockedFirst || !rs[1].SkipLockedFirst {
		t.Fatalf("%d rounds, SKIP LOCKED first: want 2, the second", len(rs))
	}
	// which queue each round ran first, from its progress lines
	var firsts []string
	for _, line := range progress {
		switch {
		case strings.HasPrefix(line, "writing "):
			firsts = append(firsts, "")
		case len(firsts) == 0 || firsts[len(firsts)-1] != "":
		case strings.HasPrefix(line, "starting the keeper"):
			firsts[len(firsts)-1] = "keeper"
		case strings.HasPrefix(line, "SKIP LOCKED "):
			firsts[len(firsts)-1] = "SKIP LOCKED"
		}
	}
	if !slices.Equal(firsts, []string{"keeper", "SKIP LOCKED"}) {
		t.Errorf("first runs of the rounds: %q, want keeper then SKIP LOCKED; progress:\n%s", firsts, strings.Join(progress, "\n"))
	}
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	for i, rep := range rs {
		if rep.Keeper.Completed == 0 || rep.Keeper.Verified != rep.Keeper.Completed || rep.Keeper.Errors > 0 {
			t.Fatalf("round %d, keeper run: %+v", i+1, rep.Keeper)
		}
		if len(rep.SkipLocked) != 2 {
			t.Fatalf("round %d: %d SKIP LOCKED runs, want 2", i+1, len(rep.SkipLocked))
		}
		for _, r := range rep.SkipLocked {
			if r.Completed == 0 || r.Verified != r.Completed || r.Errors > 0 {
				t.Fatalf("round %d, SKIP LOCKED run %v: %+v", i+1, r.Shape, r)
			}
		}
		// every run settled first, and its completions' WAL measured
		for _, r := range append([]RunResult{rep.Keeper}, rep.SkipLocked...) {
			if !strings.HasPrefix(r.Settled, "tables vacuumed and analyzed, ") || r.WAL <= 0 {
				t.Errorf("round %d, run %v: settled %q, WAL %v bytes", i+1, r.Shape, r.Settled, r.WAL)
			}
		}
		if rep.Ratio() <= 0 || rep.TriggerWith <= 0 {
			t.Fatalf("round %d: ratio %v, trigger %v", i+1, rep.Ratio(), rep.TriggerWith)
		}
		// the floor run: bare UPDATEs of the rows still due, each verified as a completion
		if f := rep.Floor; f.Completed == 0 || f.Verified != f.Completed || f.Errors > 0 {
			t.Fatalf("round %d, floor run: %+v", i+1, f)
		}
		if q, ok := rep.FloorRatio(); !ok || q <= 0 {
			t.Fatalf("round %d: keeper / floor %v (measured %v)", i+1, q, ok)
		}
		// the test's server runs here: whether its buffers are on huge pages is known
		sm := rep.SharedMemory
		known := strings.HasSuffix(sm, ": not on huge pages") || strings.Contains(sm, ": on huge pages (")
		if !strings.HasPrefix(sm, "shared_buffers ") || !known {
			t.Errorf("round %d: shared memory %q", i+1, sm)
		}
		var out bytes.Buffer
		if err := rep.Write(&out); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"keeper (HTTP)", "SKIP LOCKED", "keeper / best SKIP LOCKED", "PostgreSQL CPU per completed row", "change events of a completion", "CPUs allowed: PostgreSQL ", "PostgreSQL's shared memory: shared_buffers ", "before each run: ", "WAL written during the keeper run per completed row: ", "floor (bare UPDATE by key in batches of 5000, no triggers, "} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("round %d: report lacks %q:\n%s", i+1, want, out.String())
			}
		}
		if got := strings.Contains(out.String(), "the SKIP LOCKED runs came before the keeper's"); got != rep.SkipLockedFirst {
			t.Errorf("round %d: report says the SKIP LOCKED runs came first: %v, want %v", i+1, got, rep.SkipLockedFirst)
		}
		if testing.Verbose() {
			_, _ = os.Stdout.Write(out.Bytes())
		}
		// the scratch database is gone
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", rep.Database).Scan(&n); err != nil || n != 0 {
			t.Fatalf("round %d: scratch database %s: %d left (%v)", i+1, rep.Database, n, err)
		}
	}
	var out bytes.Buffer
	if err := rs.Write(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"keeper / best SKIP LOCKED, each round against its own: median ", "keeper / floor, each round against its own: median "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("rounds report lacks %q:\n%s", want, out.String())
		}
	}
	if testing.Verbose() {
		_, _ = os.Stdout.Write(out.Bytes())
	}
}

func TestConfigValidate(t *testing.T) {
	start := func(context.Context, string, string) (*Keeper, error) { return nil, nil }
	for _, c := range []Config{
		{},
		{ServerDSN: "x", StartKeeper: start, Rows: 10},
		{ServerDSN: "x", StartKeeper: start, Duration: time.Millisecond},
		{ServerDSN: "x", StartKeeper: start, Keeper: Shape{Workers: 0, Batch: 10}},
		{ServerDSN: "x", StartKeeper: start, SkipLocked: []Shape{}},
		{ServerDSN: "x", StartKeeper: start, TriggerRounds: 2},
		{ServerDSN: "x", StartKeeper: start, PostgresCPUs: "0-"},
		{ServerDSN: "x", StartKeeper: start, Keeper: Shape{Workers: 32, Batch: 10001}},          // over a claim's limit
		{ServerDSN: "x", StartKeeper: start, SkipLocked: []Shape{{Workers: 1, Batch: 100_001}}}, // over a SKIP LOCKED worker's
	} {
		c.setDefaults()
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v): no error", c)
		}
	}
	// a SKIP LOCKED worker may claim more at once than a keeper claim holds
	c := Config{ServerDSN: "x", StartKeeper: start, SkipLocked: []Shape{{Workers: 1, Batch: 100_000}}}
	c.setDefaults()
	if err := c.Validate(); err != nil {
		t.Errorf("Validate(SKIP LOCKED 1 × 100000): %v", err)
	}
}

// TestVerifyCountsEachCompletion: a key completed twice in a run (SKIP LOCKED claims a row again
// when its next due is still past) is checked once per completion, against the row as it stands;
// a completion the row does not reflect is not counted.
func TestVerifyCountsEachCompletion(t *testing.T) {
	pool := scratchPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE q (key text PRIMARY KEY, due_at timestamptz)`); err != nil {
		t.Fatal(err)
	}
	d := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	if _, err := pool.Exec(ctx, `INSERT INTO q VALUES ('twice', $1), ('other', $2)`, d.Add(2*time.Hour), d.Add(90*time.Minute)); err != nil {
		t.Fatal(err)
	}
	got, err := verify(ctx, pool, "q", []completed{
		{key: "twice", due: d, cadence: time.Hour},                  // +2 cadences: counted
		{key: "twice", due: d.Add(time.Hour), cadence: time.Hour},   // +1 cadence: counted
		{key: "other", due: d.Add(time.Hour), cadence: time.Hour},   // +30 min: not a whole cadence
		{key: "missing", due: d.Add(time.Hour), cadence: time.Hour}, // no row
	})
	if err != nil || got != 2 {
		t.Fatalf("verified %d (%v), want 2", got, err)
	}
}

// TestMaintenanceDuringARun: a vacuum or analyze of any table of the database between the
// samples is counted, by table, and the report names them in that run's row only.
func TestMaintenanceDuringARun(t *testing.T) {
	pool := scratchPool(t)
	ctx := context.Background()
	// the queues, which a run settles (vacuums) before it starts
	if err := prepare(ctx, pool, 10, time.Now().Truncate(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"q", "other"} {
		if _, err := pool.Exec(ctx, `CREATE TABLE `+name+` (key text PRIMARY KEY, due_at timestamptz) WITH (autovacuum_enabled = false)`); err != nil {
			t.Fatal(err)
		}
	}
	r, err := measure(ctx, pool, 0, Shape{1, 1}, time.Second, "q", func(time.Time) []*workerLog { return nil })
	if err != nil || r.Maintenance != nil {
		t.Fatalf("a run without maintenance: %v (%v), want none", r.Maintenance, err)
	}
	r, err = measure(ctx, pool, 0, Shape{1, 1}, time.Second, "q", func(time.Time) []*workerLog {
		for _, sql := range []string{`VACUUM q`, `ANALYZE other`, `VACUUM ANALYZE other`} {
			if _, err := pool.Exec(ctx, sql); err != nil {
				t.Error(err)
			}
		}
		return nil
	})
	if want := map[string]int{"q": 1, "other": 3}; err != nil || !maps.Equal(r.Maintenance, want) {
		t.Fatalf("a run with maintenance: %v (%v), want %v", r.Maintenance, err, want)
	}
	r.Settled = "" // the report's line on settling says "vacuumed" too: not the note looked for here
	var out bytes.Buffer
	if err := (Report{Keeper: RunResult{Shape: Shape{1, 1}}, SkipLocked: []RunResult{r}}).Write(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "vacuumed or analyzed during the run: other 3×, q 1×") || strings.Count(out.String(), "vacuumed") != 1 {
		t.Errorf("the report does not say which run shared the core with maintenance:\n%s", out.String())
	}
}

// TestMaintenanceSince: what ended between two readings and what is running at the second count,
// a table first seen running included.
func TestMaintenanceSince(t *testing.T) {
	m0 := maintenance{ended: map[string]int{"a": 2, "b": 5}, running: map[string]int{"a": 1}}
	m1 := maintenance{ended: map[string]int{"a": 3, "b": 5}, running: map[string]int{"b": 1, "new": 1}}
	if got, want := m1.since(m0), map[string]int{"a": 1, "b": 1, "new": 1}; !maps.Equal(got, want) {
		t.Errorf("since = %v, want %v", got, want)
	}
	if got := m0.since(m0); !maps.Equal(got, map[string]int{"a": 1}) { // still running
		t.Errorf("since itself = %v, want the one running", got)
	}
	quiet := maintenance{ended: map[string]int{"a": 2}, running: map[string]int{}}
	if got := quiet.since(quiet); got != nil {
		t.Errorf("since itself, nothing running = %v, want nil", got)
	}
}

// scratchPool opens a pool on a new database of the test server, closed with the test.
func scratchPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestResetQueueStartsAfresh: a reset leaves the SKIP LOCKED queue as seeded — every row due, its
// size that after the seeding (within a tenth: the free space and visibility maps' pages vary by
// one or two; an UPDATE of every row made it 2.6 times as large) — whatever the run before it
// wrote, so a shape measured later does not scan a queue grown by the runs before it.
func TestResetQueueStartsAfresh(t *testing.T) {
	pool := scratchPool(t)
	ctx := context.Background()
	const rows = 20_000
	now := time.Now().Truncate(time.Millisecond)
	if err := prepare(ctx, pool, rows, now); err != nil {
		t.Fatal(err)
	}
	size := func() (n int, bytes int64) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM bench_queue WHERE due_at <= $1), pg_total_relation_size('bench_queue')`, now).Scan(&n, &bytes); err != nil {
			t.Fatal(err)
		}
		return n, bytes
	}
	due0, seeded := size()
	if due0 != rows {
		t.Fatalf("%d of %d rows due after the seeding", due0, rows)
	}
	for round := range 3 {
		// what a run leaves: every row completed, some twice
		for range 2 {
			if _, err := pool.Exec(ctx, `UPDATE bench_queue SET due_at = due_at + cadence_ms * interval '1 millisecond'`); err != nil {
				t.Fatal(err)
			}
		}
		if err := resetQueue(ctx, pool, rows, now); err != nil {
			t.Fatal(err)
		}
		if due, bytes := size(); due != rows || bytes > seeded*11/10 {
			t.Fatalf("after reset %d: %d of %d rows due, %d bytes against %d as seeded", round+1, due, rows, bytes, seeded)
		}
	}
}

// TestSettleCheckpoints: settling before a run checkpoints (the server counts one more requested
// checkpoint) and says so; a role that may not checkpoint settles without one, and the note says
// that it did not.
func TestSettleCheckpoints(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx := context.Background()
	if err := prepare(ctx, pool, 1000, time.Now().Truncate(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	checkpoints := func() (n int64) {
		t.Helper()
		// the statistics snapshot is cleared first: a second read in one transaction would repeat the first
		if err := pool.QueryRow(ctx, `SELECT pg_stat_clear_snapshot() IS NULL, checkpoints_req FROM pg_stat_bgwriter`).Scan(new(bool), &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := checkpoints()
	did, err := settle(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if after := checkpoints(); after <= before {
		t.Errorf("checkpoints requested: %d before settling, %d after", before, after)
	}
	if !strings.Contains(did, "PostgreSQL checkpointed") || strings.Contains(did, "NOT") {
		t.Errorf("settle says %q", did)
	}

	_, roleDSN := pgtest.Role(t, dsn, "bench_settle_")
	rolePool, err := pgxpool.New(ctx, roleDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rolePool.Close)
	did, err = settle(ctx, rolePool)
	if err != nil {
		t.Fatalf("settling as a role that may not checkpoint: %v", err)
	}
	if !strings.Contains(did, "NOT checkpointed") {
		t.Errorf("settle as a role that may not checkpoint says %q", did)
	}
}
