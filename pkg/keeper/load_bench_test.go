package keeper

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"

	"github.com/renderqueue/renderqueue/internal/procstat"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/coretest"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

// loadBenchTable fills render_schedule with n rows as a fleet looks: 64-byte keys, 97% 96 h and 3%
// 24 h, half submitted, due spread over the past cadence (so every row is due). The change-event
// trigger is off while it inserts (nobody listens yet; it would only build notifications of
// millions of rows), in steps of a million rows, then the table is vacuumed and analyzed (and,
// with BENCH_CLUSTER set, clustered in the walks' order: benchClusterEnv).
func loadBenchTable(tb testing.TB, ctx context.Context, dsn string, n int) {
	tb.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	start := time.Now()
	if _, err := conn.Exec(ctx, `ALTER TABLE render_schedule DISABLE TRIGGER render_schedule_notify_insert`); err != nil {
		tb.Fatal(err)
	}
	const step = 1_000_000
	for lo := 1; lo <= n; lo += step {
		if _, err := conn.Exec(ctx, `
			INSERT INTO render_schedule (key, due_at, cadence_ms, route, source)
			SELECT format('https://shop.example.com/product/%s', lpad(i::text, 31, '0')),
			       now() - (random() * CASE WHEN i % 33 = 0 THEN 86400 ELSE 345600 END) * interval '1 second',
			       CASE WHEN i % 33 = 0 THEN 86400000 ELSE 345600000 END,
			       'product', CASE WHEN i % 2 = 0 THEN 'submitted' ELSE 'discovered' END
			FROM generate_series($1::int, $2::int) AS i`, lo, min(lo+step-1, n)); err != nil {
			tb.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `ALTER TABLE render_schedule ENABLE TRIGGER render_schedule_notify_insert`); err != nil {
		tb.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `VACUUM ANALYZE render_schedule`); err != nil {
		tb.Fatal(err)
	}
	tb.Logf("%d rows written and analyzed in %v", n, time.Since(start).Round(time.Second))
	if os.Getenv(benchClusterEnv) != "" {
		// the rows in the order the walks read them (docs/scale.md, "The table's order")
		start := time.Now()
		if _, err := conn.Exec(ctx, `SET maintenance_work_mem = '1GB'`); err != nil {
			tb.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `CLUSTER render_schedule USING render_schedule_hash_key`); err != nil {
			tb.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `ANALYZE render_schedule`); err != nil {
			tb.Fatal(err)
		}
		tb.Logf("%s: the table clustered by (key_hash, key) in %v", benchClusterEnv, time.Since(start).Round(time.Second))
	}
}

// benchClusterEnv, when set, has loadBenchTable put the table in the walks' order (CLUSTER by its
// (key_hash, key) index) after writing it: written in key order, its rows are scattered over the
// heap in the order a walk reads them (by key hash), and a walk's reads of a table that is not in
// memory are then random.
const benchClusterEnv = "BENCH_CLUSTER"

// BenchmarkShardLoad measures a standalone shard (all slots, window 0: every row held) loading
// its rows from PostgreSQL to ready: subscribe, then the first walk (the key index sized from the
// table's estimate). It reports the load time, rows/s and the live heap per held row. Then
// .../rewalk walks all the rows again while the load of BenchmarkClaimLatency runs (claims and
// completions, /v1/status every 100 ms, 20,000 events/s) and reports the walk's time and the claim
// latency during it. The re-walk verifies, so it is paced as the keeper command paces it
// (DefaultVerifyWalkRate; BENCH_WALK_RATE=0 for an unpaced one). Run it with -cpu 1, as
// hack/bench.sh does: the keeper runs Go code on one thread (its --procs).
func BenchmarkShardLoad(b *testing.B) {
	for _, n := range coretest.Sizes(b) {
		b.Run(coretest.SizeName(n), func(b *testing.B) {
			dsn := pgtest.NewDatabase(b)
			ctx := context.Background()
			st, err := postgres.Open(ctx, dsn, postgres.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = st.Close() }()
			if err := st.Migrate(ctx); err != nil {
				b.Fatal(err)
			}
			loadBenchTable(b, ctx, dsn, n)
			var sh *Shard
			b.Run("load", func(b *testing.B) {
				var total, cpu time.Duration
				var heap float64
				var machine procstat.Times
				machineOK := true
				for b.Loop() {
					if sh != nil {
						_ = sh.sub.Close()
						sh = nil
					}
					before := coretest.LiveHeap()
					settings := allSlots(0)
					settings.VerifyWalkRate = benchWalkRate(b)
					sh, err = NewShard(Options{Name: "bench", Store: st, Log: logr.Discard()}, settings)
					if err != nil {
						b.Fatal(err)
					}
					start, cpu0 := time.Now(), processCPU()
					m0, ok0 := procstat.Machine()
					if err := sh.Subscribe(ctx); err != nil {
						b.Fatal(err)
					}
					rep := sh.Walk(ctx, true)
					took := time.Since(start)
					total += took
					cpu += processCPU() - cpu0
					m1, ok1 := procstat.Machine()
					machine = machine.Add(m1.Sub(m0))
					machineOK = machineOK && ok0 && ok1
					if rep.Failed || rep.Partial || rep.Counts.Scanned != n || !sh.Ready() || sh.core.Held() != n {
						b.Fatalf("load: %+v held %d", rep, sh.core.Held())
					}
					heap = float64(coretest.LiveHeap()-before) / float64(n)
				}
				secs := total.Seconds() / float64(b.N)
				b.ReportMetric(secs, "s/load")
				b.ReportMetric(float64(n)/secs, "rows/s")
				b.ReportMetric(heap, "heap-B/row")
				// this process: the keeper and the store's decoding of the rows (PostgreSQL apart)
				b.ReportMetric(cpu.Seconds()/float64(b.N), "keeper-cpu-s")
				if machineOK {
					// the machine's CPU time the hypervisor gave to others meanwhile
					b.ReportMetric(100*machine.StealShare(), "steal-%")
					// the machine's CPU time outside this process: PostgreSQL's walk backends, mostly
					b.ReportMetric((machine.Busy-cpu).Seconds()/float64(b.N), "other-cpu-s")
					// how busy the machine's CPUs were: below 100, the load waited on something
					b.ReportMetric(100*machine.BusyShare(), "busy-%")
				}
			})
			if sh == nil {
				return
			}
			defer func() { _ = sh.sub.Close() }()
			b.Run("rewalk", func(b *testing.B) {
				walks := 0
				for b.Loop() {
					walks++
					stop := make(chan struct{})
					statsc := make(chan *claimStats, 1)
					go func() { statsc <- defaultClaimLoad(sh, n).run(stop) }()
					start := time.Now()
					rep := sh.Walk(ctx, true)
					took := time.Since(start)
					close(stop)
					stats := <-statsc
					if rep.Failed || rep.Partial || rep.Counts.Scanned != n {
						b.Fatalf("rewalk: %+v", rep)
					}
					b.ReportMetric(took.Seconds(), "s/walk")
					stats.report(b, took.Seconds())
					// the metrics are the last walk's; with -benchtime Nx each walk is logged (the
					// first after the load has been the slower one)
					b.Logf("re-walk %d: %.1f s, claim p99 %v (p50 %v, max %v)", walks, took.Seconds(),
						stats.quantile(stats.claims, 0.99), stats.quantile(stats.claims, 0.50), stats.quantile(stats.claims, 1))
				}
			})
			runtime.KeepAlive(sh)
		})
	}
}

// benchWalkRate is the verification walks' rate of BenchmarkShardLoad's shard: the keeper
// command's default, or BENCH_WALK_RATE (rows/s; 0: unpaced).
func benchWalkRate(tb testing.TB) int {
	v := os.Getenv("BENCH_WALK_RATE")
	if v == "" {
		return DefaultVerifyWalkRate
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		tb.Fatalf("BENCH_WALK_RATE=%q: want a number of rows a second (0: unpaced)", v)
	}
	return n
}

// processCPU returns the CPU time this process has used (user + system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
