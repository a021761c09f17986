package keeper

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/internal/procstat"
	"github.com/renderqueue/renderqueue/pkg/keeper/core"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/coretest"
	"github.com/renderqueue/renderqueue/pkg/keeper/coverage"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/memstore"
)

// benchShard returns a loaded standalone shard (all slots, window 0) holding a core of n rows
// built at now, half of them due (all of them with allDue). Its store is an empty memstore: the
// benchmarks drive the shard directly, not through a store.
func benchShard(tb testing.TB, n int, now time.Time, allDue bool) *Shard {
	tb.Helper()
	sh, err := NewShard(Options{Name: "bench", Store: memstore.New(memstore.Options{})}, allSlots(0))
	if err != nil {
		tb.Fatal(err)
	}
	sh.core = coretest.Build(tb, n, now, allDue)
	sh.cov.OnWalkFinished(sh.cov.WalkStarting(now, true), coverage.WalkEnd{}) // loaded; window 0: unbounded edge
	sh.loaded.Store(true)
	return sh
}

// BenchmarkStatus computes the shard's whole /v1/status (Shard.Status and its JSON), half the
// rows due, 100 ms later each time: what a reader polling every 100 ms causes.
func BenchmarkStatus(b *testing.B) {
	for _, n := range coretest.Sizes(b) {
		now := time.Now()
		sh := benchShard(b, n, now, false)
		b.Run(coretest.SizeName(n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				now = now.Add(100 * time.Millisecond)
				st := sh.Status(now)
				if st.Rows.Held != n || st.Due == 0 {
					b.Fatalf("held %d due %d", st.Rows.Held, st.Due)
				}
				if _, err := json.Marshal(st); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/status")
		})
	}
}

// claimLoad is the concurrent load of BenchmarkClaimLatency: claimers claiming and completing,
// a status reader and a stream of change events, all against one shard on the real clock.
type claimLoad struct {
	sh *Shard
	n  int // rows of the benchmark core: event keys are drawn from them
	// Claimers goroutines each claim Batch rows every Every and complete them (the core side of
	// Shard.Complete: the new version applied, the lease ended, under the lock, as one batch).
	Claimers int
	Batch    int
	Every    time.Duration
	// StatusEvery is the interval of status reads (Shard.Status plus JSON, not shared).
	StatusEvery time.Duration
	// EventsPerSec change events (new rev, new due of random rows) are applied through
	// HandleBatch in batches every 10 ms.
	EventsPerSec int
}

// claimStats is what a claimLoad run measured.
type claimStats struct {
	claims     []time.Duration // latency of each Shard.Claim call
	status     []time.Duration // duration of each status read
	events     int
	claimed    int
	overruns   int // claim rounds that started late because the previous one overran Every
	maxLockGap time.Duration
	// machine is the machine's CPU time over the run (ok: it was read): the time stolen by the
	// hypervisor shows in the latencies, whatever the code does.
	machine   procstat.Times
	machineOK bool
	// runtime0 and runtime1 are the Go runtime's metrics at the run's start and end (readRuntime).
	runtime0, runtime1 runtimeSample
}

func (s *claimStats) quantile(v []time.Duration, q float64) time.Duration {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[max(0, min(len(v)-1, int(q*float64(len(v)))-1))]
}

// run drives the load until stop is closed and returns what it measured.
func (l claimLoad) run(stop <-chan struct{}) *claimStats {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		stats = &claimStats{}
	)
	m0, ok0 := procstat.Machine()
	stats.runtime0 = readRuntime()
	defer func() {
		m1, ok1 := procstat.Machine()
		stats.machine, stats.machineOK = m1.Sub(m0), ok0 && ok1
		stats.runtime1 = readRuntime()
	}()
	// Above every rev of the core, and above every rev of an earlier run on the same shard (a run
	// uses well under a million revs a second): a run that replayed revs the core already holds
	// would have its events ignored, at almost no cost (the second re-walk of BenchmarkShardLoad
	// did, until this was fixed).
	rev := int64(1<<40) + time.Now().UnixMicro()
	seed := uint64(rev)
	var revMu sync.Mutex
	nextRev := func(k int) int64 {
		revMu.Lock()
		defer revMu.Unlock()
		rev += int64(k)
		return rev - int64(k)
	}
	for range l.Claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			claimed, overruns := 0, 0
			tick := time.NewTicker(l.Every)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					mu.Lock()
					stats.claims = append(stats.claims, lat...)
					stats.claimed += claimed
					stats.overruns += overruns
					mu.Unlock()
					return
				case <-tick.C:
				}
				start := time.Now()
				rows, err := l.sh.Claim(time.Now(), l.Batch, time.Minute)
				lat = append(lat, time.Since(start))
				if err != nil {
					panic(err)
				}
				claimed += len(rows)
				r0 := nextRev(len(rows))
				// as Shard.Complete does: the leases checked under the lock, the written versions
				// applied (and the leases ended) in steps
				written := make([]schedule.Row, 0, len(rows))
				hints := make([]core.Hint, len(rows))
				l.sh.mu.Lock()
				now := time.Now()
				for i, c := range rows {
					cp, _, err := l.sh.core.Completing(now, c.Key, c.Lease)
					if err != nil {
						continue
					}
					hints[i] = cp.Hint
					written = append(written, schedule.Row{Key: c.Key, KeyHash: coretest.HashOf(c.Key), Due: cp.NextDue, HasDue: true,
						Cadence: c.Cadence, Route: c.Route, Source: c.Source, Rev: r0 + int64(i)})
				}
				l.sh.mu.Unlock()
				for lo := 0; lo < len(written); lo += walkStepRows {
					l.sh.mu.Lock()
					now := time.Now()
					for _, row := range written[lo:min(lo+walkStepRows, len(written))] {
						lease := rows[row.Rev-r0].Lease
						l.sh.core.ApplyCompleted(now, row, lease, hints[row.Rev-r0])
					}
					l.sh.mu.Unlock()
				}
				if time.Since(start) > l.Every {
					overruns++
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // status reads
		defer wg.Done()
		tick := time.NewTicker(l.StatusEvery)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			start := time.Now()
			st := l.sh.Status(time.Now())
			if _, err := json.Marshal(st); err != nil {
				panic(err)
			}
			mu.Lock()
			stats.status = append(stats.status, time.Since(start))
			mu.Unlock()
		}
	}()
	wg.Add(1)
	go func() { // change events
		defer wg.Done()
		const every = 10 * time.Millisecond
		per := l.EventsPerSec * int(every) / int(time.Second)
		tick := time.NewTicker(every)
		defer tick.Stop()
		rng := rand.New(rand.NewPCG(seed, 6)) // other rows than an earlier run's
		sent := 0
		for {
			select {
			case <-stop:
				mu.Lock()
				stats.events += sent
				mu.Unlock()
				return
			case <-tick.C:
			}
			now := time.Now()
			r0 := nextRev(per)
			evs := make([]store.Event, per)
			for i := range evs {
				evs[i].Row = coretest.Row(rng, rng.IntN(l.n), now, false)
				evs[i].Row.Rev = r0 + int64(i)
			}
			l.sh.HandleBatch(store.Batch{Kind: store.KindEvents, Events: evs})
			sent += per
		}
	}()
	wg.Add(1)
	go func() { // how long the lock can be held: a probe taking it every millisecond
		defer wg.Done()
		var worst time.Duration
		for {
			select {
			case <-stop:
				mu.Lock()
				stats.maxLockGap = worst
				mu.Unlock()
				return
			case <-time.After(time.Millisecond):
			}
			start := time.Now()
			l.sh.mu.Lock()
			l.sh.mu.Unlock() //nolint:staticcheck // an empty critical section: the probe measures the wait
			worst = max(worst, time.Since(start))
		}
	}()
	<-stop
	wg.Wait()
	return stats
}

// report adds the load's figures to b.
func (s *claimStats) report(b *testing.B, secs float64) {
	b.ReportMetric(float64(s.quantile(s.claims, 0.50).Microseconds()), "p50-us")
	b.ReportMetric(float64(s.quantile(s.claims, 0.99).Microseconds()), "p99-us")
	b.ReportMetric(float64(s.quantile(s.claims, 1).Microseconds()), "max-us")
	b.ReportMetric(float64(s.quantile(s.status, 0.99).Microseconds())/1000, "status-p99-ms")
	b.ReportMetric(float64(s.claimed)/secs, "claimed/s")
	b.ReportMetric(float64(s.events)/secs, "events/s")
	b.ReportMetric(float64(s.maxLockGap.Microseconds())/1000, "max-lock-wait-ms")
	b.ReportMetric(float64(s.overruns), "overruns")
	if s.machineOK {
		b.ReportMetric(100*s.machine.StealShare(), "steal-%")
		b.ReportMetric(100*s.machine.BusyShare(), "busy-%")
	}
	s.runtime0.report(b, s.runtime1)
}

// benchClaimSeconds is how long each BenchmarkClaimLatency run lasts (BENCH_CLAIM_SECONDS,
// default 10).
func benchClaimSeconds(tb testing.TB) time.Duration {
	if v := os.Getenv("BENCH_CLAIM_SECONDS"); v != "" {
		s, err := strconv.Atoi(v)
		if err != nil || s <= 0 {
			tb.Fatalf("BENCH_CLAIM_SECONDS=%q: want a whole number of seconds", v)
		}
		return time.Duration(s) * time.Second
	}
	return 10 * time.Second
}

// defaultClaimLoad is the load of BenchmarkClaimLatency: 2 claimers taking 100 rows every 5 ms
// each (40,000 rows/s claimed and completed), /v1/status every 100 ms, 20,000 events/s.
func defaultClaimLoad(sh *Shard, n int) claimLoad {
	return claimLoad{sh: sh, n: n, Claimers: 2, Batch: 100, Every: 5 * time.Millisecond,
		StatusEvery: 100 * time.Millisecond, EventsPerSec: 20_000}
}

// BenchmarkClaimLatency measures Shard.Claim latency (lock wait included) on a shard whose rows
// are all due, while claimers complete what they claim, /v1/status is computed every 100 ms and
// change events are applied at 20,000/s (defaultClaimLoad), for BENCH_CLAIM_SECONDS. Run it
// with -cpu 1, as hack/bench.sh does: the keeper runs Go code on one thread (its --procs).
func BenchmarkClaimLatency(b *testing.B) {
	for _, n := range coretest.Sizes(b) {
		sh := benchShard(b, n, time.Now(), true)
		dur := benchClaimSeconds(b)
		b.Run(coretest.SizeName(n), func(b *testing.B) {
			for b.Loop() {
				stop := make(chan struct{})
				time.AfterFunc(dur, func() { close(stop) })
				stats := defaultClaimLoad(sh, n).run(stop)
				stats.report(b, dur.Seconds())
			}
		})
	}
}
