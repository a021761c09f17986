// Package bench is `renderqueue bench`: the end-to-end throughput of one standalone keeper over
// HTTP against the queue a team writes by hand on one PostgreSQL table, on the same machine and
// the same rows.
//
// It creates a scratch database on the server it is given (and drops it after), writes the same
// due rows into the renderqueue schema and into a plain table with an index on due_at, then:
//
//   - starts a keeper (standalone, window 0) and, once it has loaded, drives it with N workers
//     that claim n rows and complete them at once, as fast as the keeper answers (no render time);
//     every acknowledged completion is then checked in SQL: the row's due time moved forward by a
//     whole number of cadences;
//   - measures what the change-event trigger and its NOTIFY add to a completion (the group
//     commit's UPDATE with the notify trigger enabled and disabled, alternately);
//   - measures the floor: render_schedule's rows completed by bare UPDATEs by key in batches,
//     every user trigger off, what PostgreSQL spends per row at the least (runFloor), and reports
//     the keeper's PostgreSQL CPU per completion over it (Report.FloorRatio; FloorTarget);
//   - drives the plain table with workers that each claim n rows with SELECT … ORDER BY due_at
//     LIMIT n FOR UPDATE SKIP LOCKED and complete them with one UPDATE in the same transaction, for
//     each shape (workers × batch) asked for, the queue written afresh (all due) before each;
//
// and reports rows/s, claim and complete latency (p50, p99), the CPU each process used per
// completed row (keeper, clients, PostgreSQL — when the server runs on this machine), the machine's
// load, and the keeper's rate over the best SKIP LOCKED shape's. RunRounds repeats all of it, each
// round on a scratch database of its own and the SKIP LOCKED queue first in every second round,
// and reports the median of the rounds' ratios: one run's ratio varies too much to be a verdict.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sys/unix"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// Keeper is a running keeper the benchmark drives.
type Keeper struct {
	// URL is its base URL; PID its process (0 when it runs inside this process: its CPU is then
	// counted with the clients').
	URL string
	PID int
	// Stop stops it.
	Stop func() error
	// Exited, when set, receives the keeper's exit (a process that ends before it is ready
	// fails the benchmark at once).
	Exited <-chan error
}

// Config is a benchmark run.
type Config struct {
	// ServerDSN names the PostgreSQL server; the benchmark creates (and drops) a scratch database
	// there, so the role needs CREATEDB.
	ServerDSN string
	// Rows is how many due rows each queue starts with. Default 1,000,000.
	Rows int
	// Duration is the length of each run. Default 10s.
	Duration time.Duration
	// Keeper is the shape of the keeper run. Default 32 × 1000.
	Keeper Shape
	// SkipLocked are the shapes of the SKIP LOCKED runs. Default 1 × 1000, 1 × 5000, 1 × 10000,
	// 1 × 20000, 2 × 1000, 2 × 5000, 4 × 1000: on the 2-core development machine one worker with a
	// batch of 5,000–20,000 was the best with PostgreSQL on a core of its own (PostgresCPUs), two
	// workers with the cores shared (docs/benchmarks.md, "SKIP LOCKED's best batch").
	SkipLocked []Shape
	// StartKeeper starts a standalone keeper (window 0) on the database dsn, requiring token.
	StartKeeper func(ctx context.Context, dsn, token string) (*Keeper, error)
	// TriggerRounds is how many batches the trigger measurement runs (half with the notify trigger
	// disabled); negative skips it. Default 40.
	TriggerRounds int
	// KeepDatabase keeps the scratch database (its name is in the report).
	KeepDatabase bool
	// SkipLockedFirst runs the SKIP LOCKED shapes before the keeper (default after it): whatever
	// a run leaves behind in the server that the vacuum before each run does not clear (dirty
	// buffers, WAL to checkpoint) then falls on the other queue's runs. RunRounds alternates it.
	SkipLockedFirst bool
	// PostgresCPUs, when set, is a Linux CPU list ("0", "0-1"): the runs place the PostgreSQL
	// server's processes on those CPUs and this process, its workers and the keeper on the other
	// CPUs this process may use, as if the database had a machine of its own (the server must run
	// on this machine, and this process must be allowed to set its CPUs). The placement is undone
	// after the runs. Empty: every process may use every CPU.
	PostgresCPUs string
	// Log, when set, receives progress lines.
	Log func(format string, args ...any)
}

func (c *Config) setDefaults() {
	if c.Rows == 0 {
		c.Rows = 1_000_000
	}
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Keeper == (Shape{}) {
		c.Keeper = Shape{Workers: 32, Batch: 1000}
	}
	if c.SkipLocked == nil {
		c.SkipLocked = []Shape{{1, 1000}, {1, 5000}, {1, 10000}, {1, 20000}, {2, 1000}, {2, 5000}, {4, 1000}}
	}
	if c.TriggerRounds == 0 {
		c.TriggerRounds = 40
	}
	if c.Log == nil {
		c.Log = func(string, ...any) {}
	}
}

// Validate says what is wrong with the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.ServerDSN == "" {
		errs = append(errs, errors.New("no PostgreSQL server DSN"))
	}
	if c.StartKeeper == nil {
		errs = append(errs, errors.New("no way to start a keeper"))
	}
	if c.Rows < 1000 {
		errs = append(errs, fmt.Errorf("rows %d: at least 1000", c.Rows))
	}
	if c.Duration < time.Second {
		errs = append(errs, fmt.Errorf("duration %v: at least 1s", c.Duration))
	}
	// the keeper's batch is a claim's (shardapi.MaxClaim); a SKIP LOCKED worker may take more at
	// once, and its best batch may be larger (docs/benchmarks.md, "SKIP LOCKED's best batch")
	checkShape := func(what string, s Shape, maxBatch int) {
		if s.Workers < 1 || s.Workers > 1024 || s.Batch < 1 || s.Batch > maxBatch {
			errs = append(errs, fmt.Errorf("%s shape %v: workers must be within 1..1024 and batch within 1..%d", what, s, maxBatch))
		}
	}
	checkShape("keeper", c.Keeper, shardapi.MaxClaim)
	for _, s := range c.SkipLocked {
		checkShape("SKIP LOCKED", s, maxSkipLockedBatch)
	}
	if len(c.SkipLocked) == 0 {
		errs = append(errs, errors.New("no SKIP LOCKED shape"))
	}
	if c.PostgresCPUs != "" {
		if _, err := parseCPUList(c.PostgresCPUs); err != nil {
			errs = append(errs, fmt.Errorf("PostgreSQL's CPUs: %w", err))
		}
	}
	if c.TriggerRounds == 1 || c.TriggerRounds == 2 {
		errs = append(errs, fmt.Errorf("trigger rounds %d: at least 3 (or none)", c.TriggerRounds))
	}
	return errors.Join(errs...)
}

// Report is what a benchmark measured.
type Report struct {
	Rows     int
	Duration time.Duration
	Database string
	// Server is the PostgreSQL version string.
	Server string
	// SharedMemory says how large the server's shared buffers are and whether they are on huge
	// pages (sharedMemory).
	SharedMemory string
	// LoadBefore and LoadAfter are the machine's 1-minute load averages around the runs.
	LoadBefore, LoadAfter float64
	// KeeperLoad is the time the keeper took to load the rows (subscribe, walk, ready).
	KeeperLoad time.Duration
	// SkipLockedFirst is set when the SKIP LOCKED runs came before the keeper's.
	SkipLockedFirst bool
	Keeper          RunResult
	SkipLocked      []RunResult
	// TriggerWith and TriggerWithout are the group commit's UPDATE time per row with the notify
	// trigger enabled and disabled (0 when not measured).
	TriggerWith, TriggerWithout time.Duration
	// Floor is the floor run: completions written as bare UPDATEs by key in batches, every user
	// trigger off (runFloor), after the keeper's run, over the rows in due order.
	Floor RunResult
	// WALSettings are the server's settings the runs' WAL depends on (wal_level,
	// full_page_writes): RunResult.WALPerCompletion.
	WALSettings string
	// TableBytesPerRow is render_schedule's size with its indexes and TOAST, per row, after the
	// keeper run.
	TableBytesPerRow float64
}

// BestSkipLocked returns the SKIP LOCKED run with the highest rate.
func (r Report) BestSkipLocked() RunResult {
	var best RunResult
	for _, s := range r.SkipLocked {
		if s.RowsPerSecond() > best.RowsPerSecond() {
			best = s
		}
	}
	return best
}

// maxSkipLockedBatch bounds the rows a SKIP LOCKED worker claims at once.
const maxSkipLockedBatch = 100_000

// Ratio is the keeper's rate over the best SKIP LOCKED rate.
func (r Report) Ratio() float64 {
	b := r.BestSkipLocked().RowsPerSecond()
	if b == 0 {
		return 0
	}
	return r.Keeper.RowsPerSecond() / b
}

// FloorRatio is PostgreSQL's CPU per completed row through the keeper over that of the floor
// run (the bare UPDATE): how far the keeper's completions are from the least any queue writing
// them to this table could cost. false when either was not measured.
func (r Report) FloorRatio() (float64, bool) {
	k, ok1 := r.Keeper.PostgresPerRow()
	f, ok2 := r.Floor.PostgresPerRow()
	if !ok1 || !ok2 || f == 0 {
		return 0, false
	}
	return float64(k) / float64(f), true
}

// WALPerCompletion is the WAL the run wrote per completed row (bytes; 0 when none completed).
func (r RunResult) WALPerCompletion() float64 {
	if r.Completed == 0 {
		return 0
	}
	return r.WAL / float64(r.Completed)
}

// PostgresPerRow is PostgreSQL's CPU per completed row of a run, and whether it was measured.
func (r RunResult) PostgresPerRow() (time.Duration, bool) {
	if !r.CPU.PostgresOK || r.Completed == 0 {
		return 0, false
	}
	return r.CPU.Postgres / time.Duration(r.Completed), true
}

// PostgresBusy is the share of the CPUs PostgreSQL's processes may run on (CPUs.Postgres) that
// they used during the run, and how many CPUs that is: near 1, the database was the run's limit,
// and a faster client would not have made the run faster. Not measured (ok false) when the
// server is not on this machine or its processes may run on different CPUs.
func (r RunResult) PostgresBusy() (share float64, cpus int, ok bool) {
	if !r.CPU.PostgresOK || r.CPU.Wall <= 0 || r.CPUs.Postgres == "" || strings.Contains(r.CPUs.Postgres, "/") {
		return 0, 0, false
	}
	list, err := parseCPUList(r.CPUs.Postgres)
	if err != nil || len(list) == 0 {
		return 0, 0, false
	}
	return float64(r.CPU.Postgres) / (float64(r.CPU.Wall) * float64(len(list))), len(list), true
}

// Run runs the benchmark.
func Run(ctx context.Context, cfg Config) (rep Report, err error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return rep, fmt.Errorf("bench: %w", err)
	}
	rep.Rows, rep.Duration, rep.LoadBefore, rep.SkipLockedFirst = cfg.Rows, cfg.Duration, loadAverage(), cfg.SkipLockedFirst
	db, err := createDatabase(ctx, cfg.ServerDSN)
	if err != nil {
		return rep, err
	}
	rep.Database = db.name
	if !cfg.KeepDatabase {
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			if e := db.drop(dctx); e != nil && err == nil {
				err = e
			}
		}()
	}
	pcfg, err := pgxpool.ParseConfig(db.dsn)
	if err != nil {
		return rep, fmt.Errorf("bench: %w", err)
	}
	pcfg.MaxConns = int32(maxWorkers(cfg.SkipLocked) + 4)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return rep, fmt.Errorf("bench: connecting: %w", err)
	}
	defer pool.Close()
	if err := pool.QueryRow(ctx, "SELECT version()").Scan(&rep.Server); err != nil {
		return rep, fmt.Errorf("bench: %w", err)
	}
	if rep.SharedMemory, err = sharedMemory(ctx, pool); err != nil {
		return rep, fmt.Errorf("bench: %w", err)
	}
	now := time.Now().Truncate(time.Millisecond)
	cfg.Log("writing %d due rows into render_schedule and bench_queue (%s)", cfg.Rows, db.name)
	if err := prepare(ctx, pool, cfg.Rows, now); err != nil {
		return rep, fmt.Errorf("bench: %w", err)
	}
	if cfg.PostgresCPUs != "" {
		cpus, _ := parseCPUList(cfg.PostgresCPUs) // checked by Validate
		cfg.Log("placing PostgreSQL on CPUs %s and this process (the workers, the keeper) on the others", cfg.PostgresCPUs)
		p, perr := pinCPUs(ctx, pool, cpus)
		if perr != nil {
			return rep, fmt.Errorf("bench: %w", perr)
		}
		defer func() { // err: Run's result
			if e := p.restore(); e != nil && err == nil {
				err = fmt.Errorf("bench: %w", e)
			}
		}()
	}

	if cfg.SkipLockedFirst {
		if rep.SkipLocked, err = runSkipLockedShapes(ctx, pool, cfg); err != nil {
			return rep, err
		}
	}
	if err := runKeeperPart(ctx, pool, db.dsn, cfg, &rep); err != nil {
		return rep, err
	}
	if !cfg.SkipLockedFirst {
		if rep.SkipLocked, err = runSkipLockedShapes(ctx, pool, cfg); err != nil {
			return rep, err
		}
	}
	rep.LoadAfter = loadAverage()
	return rep, nil
}

// runKeeperPart starts the keeper, measures its run (and the trigger's cost) into rep, and stops it.
func runKeeperPart(ctx context.Context, pool *pgxpool.Pool, dsn string, cfg Config, rep *Report) (err error) {
	var tok [16]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return err
	}
	token := hex.EncodeToString(tok[:])
	cfg.Log("starting the keeper")
	start := time.Now()
	k, err := cfg.StartKeeper(ctx, dsn, token)
	if err != nil {
		return fmt.Errorf("bench: starting the keeper: %w", err)
	}
	defer func() {
		if k != nil {
			_ = k.Stop()
		}
	}()
	client := &keeperClient{url: k.URL, token: token, http: &http.Client{
		Timeout:   time.Minute,
		Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Keeper.Workers + 8, MaxConnsPerHost: cfg.Keeper.Workers + 8},
	}}
	if err := waitReady(ctx, client, k.Exited, 30*time.Minute); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	rep.KeeperLoad = time.Since(start)
	cfg.Log("keeper ready after %v; %v workers claiming and completing for %v", rep.KeeperLoad.Round(time.Millisecond), cfg.Keeper, cfg.Duration)
	rep.Keeper, err = measure(ctx, pool, k.PID, cfg.Keeper, cfg.Duration, "render_schedule", func(deadline time.Time) []*workerLog {
		return runKeeper(ctx, client, cfg.Keeper, deadline)
	})
	if err != nil {
		return err
	}
	var tableBytes int64
	if err := pool.QueryRow(ctx, `SELECT
			(SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c WHERE c.oid = 'render_schedule'::regclass
			    OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'render_schedule'::regclass)),
			current_setting('wal_level') || ', full_page_writes ' || current_setting('full_page_writes')`,
	).Scan(&tableBytes, &rep.WALSettings); err != nil {
		return fmt.Errorf("bench: measuring the table's size: %w", err)
	}
	rep.TableBytesPerRow = float64(tableBytes) / float64(cfg.Rows)
	if cfg.TriggerRounds > 0 {
		cfg.Log("measuring the change-event trigger")
		rep.TriggerWith, rep.TriggerWithout, err = triggerCost(ctx, pool, cfg.Rows, 500, cfg.TriggerRounds)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
	}
	if err := k.Stop(); err != nil {
		return fmt.Errorf("bench: stopping the keeper: %w", err)
	}
	k = nil
	return runFloorPart(ctx, pool, cfg, rep)
}

// runFloorPart measures the floor run into rep, with render_schedule's user triggers disabled
// for it (and enabled again after, whatever happens).
func runFloorPart(ctx context.Context, pool *pgxpool.Pool, cfg Config, rep *Report) (err error) {
	f, err := readFloorRows(ctx, pool)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if _, err := pool.Exec(ctx, "ALTER TABLE render_schedule DISABLE TRIGGER USER"); err != nil {
		return fmt.Errorf("bench: disabling the triggers for the floor run: %w", err)
	}
	defer func() {
		if _, e := pool.Exec(context.WithoutCancel(ctx), "ALTER TABLE render_schedule ENABLE TRIGGER USER"); e != nil && err == nil {
			err = fmt.Errorf("bench: enabling the triggers after the floor run: %w", e)
		}
	}()
	cfg.Log("floor: bare UPDATEs of %d rows in batches of %d for %v", len(f.keys), floorBatch, cfg.Duration)
	rep.Floor, err = measure(ctx, pool, 0, Shape{Workers: 1, Batch: floorBatch}, cfg.Duration, "render_schedule", func(deadline time.Time) []*workerLog {
		return runFloor(ctx, pool, f, deadline)
	})
	return err
}

// runSkipLockedShapes measures the SKIP LOCKED queue in each shape, the queue reset to all due
// before each.
func runSkipLockedShapes(ctx context.Context, pool *pgxpool.Pool, cfg Config) ([]RunResult, error) {
	var out []RunResult
	for _, shape := range cfg.SkipLocked {
		if err := resetQueue(ctx, pool, cfg.Rows, time.Now().Truncate(time.Millisecond)); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		cfg.Log("SKIP LOCKED %v for %v", shape, cfg.Duration)
		r, err := measure(ctx, pool, 0, shape, cfg.Duration, "bench_queue", func(deadline time.Time) []*workerLog {
			return runSkipLocked(ctx, pool, shape, deadline)
		})
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func maxWorkers(shapes []Shape) int {
	n := 0
	for _, s := range shapes {
		n = max(n, s.Workers)
	}
	return n
}

// measure runs one load for d, with the CPU sampled around it, and verifies its completions.
func measure(ctx context.Context, pool *pgxpool.Pool, keeperPID int, shape Shape, d time.Duration, table string,
	run func(deadline time.Time) []*workerLog) (RunResult, error) {
	r := RunResult{Shape: shape}
	var err error
	if r.Settled, err = settle(ctx, pool); err != nil {
		return r, fmt.Errorf("bench: %w", err)
	}
	var walBefore, walAfter string
	if err := pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&walBefore); err != nil {
		return r, fmt.Errorf("bench: %w", err)
	}
	m0, mOK := maintenanceNow(ctx, pool)
	before := sampleCPU(ctx, pool, keeperPID)
	start := time.Now()
	logs := run(start.Add(d))
	r.Elapsed = time.Since(start)
	after := sampleCPU(ctx, pool, keeperPID)
	if err := pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&walAfter); err != nil {
		return r, fmt.Errorf("bench: %w", err)
	}
	if err := pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::float8", walBefore, walAfter).Scan(&r.WAL); err != nil {
		return r, fmt.Errorf("bench: measuring WAL: %w", err)
	}
	if m1, ok := maintenanceNow(ctx, pool); ok && mOK {
		r.Maintenance = m1.since(m0)
	}
	r.CPU = cpuBetween(before, after)
	r.CPUs = after.placement
	claim, complete, done, errs, lastErr, drained := merge(logs)
	r.Claim, r.Complete = summarize(claim), summarize(complete)
	r.Completed, r.Errors, r.LastError, r.Drained = len(done), errs, lastErr, drained
	if r.Verified, err = verify(ctx, pool, table, done); err != nil {
		return r, fmt.Errorf("bench: %w", err)
	}
	return r, nil
}

// maintenance is, by table of the database, how many vacuums and analyzes (autovacuum's or
// not) have ended, and how many are running.
type maintenance struct{ ended, running map[string]int }

// maintenanceNow reads the vacuums and analyzes of the database's tables. Those running in other
// roles' sessions (autovacuum's) show only to a role that may read every session's statistics
// (superuser, pg_read_all_stats); else only the ended ones are counted.
func maintenanceNow(ctx context.Context, pool *pgxpool.Pool) (maintenance, bool) {
	m := maintenance{ended: map[string]int{}, running: map[string]int{}}
	rows, err := pool.Query(ctx, `SELECT relname::text, vacuum_count + autovacuum_count + analyze_count + autoanalyze_count, 0
		FROM pg_stat_user_tables
		UNION ALL
		SELECT c.relname::text, 0, 1 FROM pg_stat_progress_vacuum p JOIN pg_class c ON c.oid = p.relid
		WHERE p.datname = current_database()
		UNION ALL
		SELECT c.relname::text, 0, 1 FROM pg_stat_progress_analyze p JOIN pg_class c ON c.oid = p.relid
		WHERE p.datname = current_database()`)
	if err != nil {
		return m, false
	}
	defer rows.Close()
	for rows.Next() {
		var (
			name           string
			ended, running int
		)
		if err := rows.Scan(&name, &ended, &running); err != nil {
			return m, false
		}
		m.ended[name] += ended
		m.running[name] += running
	}
	return m, rows.Err() == nil
}

// since is, by table, the vacuums and analyzes that ended after m0 or are running in m; nil when
// there were none.
func (m maintenance) since(m0 maintenance) map[string]int {
	var out map[string]int
	add := func(name string, n int) {
		if n > 0 {
			if out == nil {
				out = map[string]int{}
			}
			out[name] = n
		}
	}
	for name, ended := range m.ended {
		add(name, ended-m0.ended[name]+m.running[name])
	}
	for name, n := range m.running {
		if _, seen := m.ended[name]; !seen { // a table not in the statistics yet
			add(name, n)
		}
	}
	return out
}

// settle brings the machine and the database to the same state before every run and returns
// what it did, for the report: it vacuums and analyzes the two queues' tables, so that no
// autovacuum or autoanalyze of what an earlier run (or the seeding) wrote falls in the run (a run
// pays for the maintenance of its own writes only, and the report says when it did); it
// checkpoints, so that PostgreSQL's dirty buffers are written before the run, not evicted by it;
// and it writes this machine's dirty pages out (sync), so that the kernel does not spend the run
// writing back the seeding's gigabyte: a keeper run right after the seeding used to fall in that
// writeback and measured 10–20% slower than one after the SKIP LOCKED runs (docs/benchmarks.md,
// "Settling before each run"). A role that may not checkpoint (it needs superuser or
// pg_checkpoint) gets runs without one, and the report says so.
func settle(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE render_schedule, bench_queue"); err != nil {
		return "", fmt.Errorf("vacuuming the queues before a run: %w", err)
	}
	checkpointed := "PostgreSQL checkpointed"
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" { // insufficient_privilege
			return "", fmt.Errorf("checkpointing before a run: %w", err)
		}
		checkpointed = "NOT checkpointed (" + pgErr.Message + ": PostgreSQL may write the earlier writes' buffers during the run)"
	}
	unix.Sync()
	return "tables vacuumed and analyzed, " + checkpointed + ", this machine's dirty pages written out (sync)", nil
}

// waitReady polls the keeper's /readyz until it answers 200.
func waitReady(ctx context.Context, k *keeperClient, exited <-chan error, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.url+"/readyz", nil)
		if err != nil {
			return err
		}
		if resp, err := k.http.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the keeper was not ready within %v", limit)
		case err := <-exited:
			return fmt.Errorf("the keeper exited before it was ready: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
