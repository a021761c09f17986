package keeper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/coretest"
	"github.com/renderqueue/renderqueue/pkg/membership"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// claimRecorder records the latency of every claim a shard answers, with when it was asked.
type claimRecorder struct {
	mu  sync.Mutex
	obs map[string][]claimObs // by shard
}

type claimObs struct {
	at   time.Time
	took time.Duration
}

func (r *claimRecorder) add(shard string, at time.Time, took time.Duration) {
	r.mu.Lock()
	r.obs[shard] = append(r.obs[shard], claimObs{at: at, took: took})
	r.mu.Unlock()
}

// slowest returns the n longest claims of shards asked in [from, to), longest first, each with
// its shard.
func (r *claimRecorder) slowest(shards []string, from, to time.Time, n int) []slowClaim {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []slowClaim
	for _, s := range shards {
		for _, o := range r.obs[s] {
			if !o.at.Before(from) && o.at.Before(to) {
				out = append(out, slowClaim{shard: s, claimObs: o})
			}
		}
	}
	slices.SortFunc(out, func(a, b slowClaim) int { return cmp.Compare(b.took, a.took) })
	return out[:min(n, len(out))]
}

type slowClaim struct {
	shard string
	claimObs
}

// p99 returns the 99th percentile of the claims of shards asked in [from, to), and how many
// there were.
func (r *claimRecorder) p99(shards []string, from, to time.Time) (time.Duration, int) {
	p, _, n := r.stats(shards, from, to)
	return p, n
}

// stats returns the 99th percentile and the longest of the claims of shards asked in [from, to),
// and how many there were: a handoff stalls a shard once, which the p99 of hundreds of claims
// hides.
func (r *claimRecorder) stats(shards []string, from, to time.Time) (p99, longest time.Duration, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var d []time.Duration
	for _, s := range shards {
		for _, o := range r.obs[s] {
			if !o.at.Before(from) && o.at.Before(to) {
				d = append(d, o.took)
			}
		}
	}
	if len(d) == 0 {
		return 0, 0, 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, len(d)*99/100)], d[len(d)-1], len(d)
}

// BenchmarkHandoff measures a rebalance from 3 to 4 shards over real PostgreSQL, each of the 3
// holding rows=N (window 0: every row held), with a render worker per shard claiming 100 rows
// every 10 ms and completing them (due an hour on) throughout: the time from the spec change (the
// plan) to the commit published and to every shard exact again with nothing held back, the rows
// moved per second (the receiver's rows over the time to exact), and the claims' p99 on the
// giving and on the receiving shards from the spec change until exact (claims answered "still
// loading" aside: the new receiver serves nothing until its first walk, a load, has ended). In-process shards, each
// with its own store (pool and listener), as TestRebalanceKeepsDueExact runs them; the operator's
// part is played as there (pkg/membership's plan, prepare, commit), polling every 20 ms. Then a
// sample checks the due count against SQL (not timed). It logs the givers' three longest claims
// with when they were asked, from the commit's publication (a commit that stalls a giver shows
// as claims asked just after it). Issue 42's targets: committed and exact ≤ 20 s at 10M rows a
// shard, claim p99 ≤ 5 ms throughout. Then back from 4 to 3 (a scale-in:
// the three receive from s3 while they own rows): its time from the plan to exact, and the three's
// claim p99 meanwhile (back-...). BENCH_ROWS=10M for the large run (coretest.Sizes); its table
// takes minutes to write.
func BenchmarkHandoff(b *testing.B) {
	for _, n := range coretest.Sizes(b) {
		b.Run(coretest.SizeName(n), func(b *testing.B) {
			three, four := []string{"s0", "s1", "s2"}, []string{"s0", "s1", "s2", "s3"}
			c, rec, stop := startBenchCluster(b, n, nil, four)
			defer stop()

			var committed, exact time.Duration
			var p99Givers, p99Receiver time.Duration
			var claimsGivers, claimsReceiver, moved int
			var backExact, p99Back, maxGivers, maxReceiver, maxBack time.Duration
			var claimsBack int
			for b.Loop() {
				var committedAt time.Time
				c.onPhase = func(kind membership.ActionKind, _ int64) {
					if kind == membership.ActionCommit {
						committedAt = time.Now()
					}
				}
				t0 := time.Now()
				if state := c.rebalance(four, 30*time.Minute, nil); state != membership.HandoffCommitted {
					b.Fatalf("3 → 4: %s", state)
				}
				waitExact(b, c, 30*time.Minute)
				t1 := time.Now()
				committed += committedAt.Sub(t0)
				exact += t1.Sub(t0)
				d, m, k := rec.stats(three, t0, t1)
				p99Givers, maxGivers, claimsGivers = max(p99Givers, d), max(maxGivers, m), claimsGivers+k
				for _, sc := range rec.slowest(three, t0, t1, 3) {
					// where the givers' longest claims fell, from the commit's publication
					b.Logf("giver %s: a claim of %v asked %v after the commit", sc.shard, sc.took.Round(10*time.Microsecond), sc.at.Sub(committedAt).Round(time.Millisecond))
				}
				d, m, k = rec.stats([]string{"s3"}, t0, t1)
				p99Receiver, maxReceiver, claimsReceiver = max(p99Receiver, d), max(maxReceiver, m), claimsReceiver+k
				c.shardsMu.Lock()
				moved += c.shards["s3"].sh.Status(time.Now()).Rows.Held
				c.shardsMu.Unlock()

				b.StopTimer()
				c.onPhase = nil
				c.sample("3 → 4")
				b.StartTimer()
				// and back: s3 gives its rows to the three, which own rows already
				t0 = time.Now()
				if state := c.rebalance(three, 30*time.Minute, nil); state != membership.HandoffCommitted {
					b.Fatalf("4 → 3: %s", state)
				}
				waitExact(b, c, 30*time.Minute)
				t1 = time.Now()
				backExact += t1.Sub(t0)
				d, m, k = rec.stats(three, t0, t1)
				p99Back, maxBack, claimsBack = max(p99Back, d), max(maxBack, m), claimsBack+k
				b.StopTimer()
				c.sample("4 → 3")
				b.StartTimer()
			}
			runs := float64(b.N)
			b.ReportMetric(committed.Seconds()/runs, "s-to-committed")
			b.ReportMetric(exact.Seconds()/runs, "s-to-exact")
			b.ReportMetric(float64(moved)/exact.Seconds(), "rows-moved/s")
			b.ReportMetric(float64(p99Givers.Microseconds())/1000, "giver-claim-p99-ms")
			b.ReportMetric(float64(p99Receiver.Microseconds())/1000, "receiver-claim-p99-ms")
			b.ReportMetric(float64(maxGivers.Microseconds())/1000, "giver-claim-max-ms")
			b.ReportMetric(float64(maxReceiver.Microseconds())/1000, "receiver-claim-max-ms")
			b.ReportMetric(float64(maxBack.Microseconds())/1000, "back-receivers-claim-max-ms")
			b.ReportMetric(backExact.Seconds()/runs, "back-s-to-exact")
			b.ReportMetric(float64(p99Back.Microseconds())/1000, "back-receivers-claim-p99-ms")
			b.Logf("%d rows moved; %d claims on the givers and %d on the receiver during 3 → 4, %d on the receivers during 4 → 3", moved, claimsGivers, claimsReceiver, claimsBack)
		})
	}
}

// startBenchCluster writes 3n rows (loadBenchTable), runs three shards s0–s2 over them (configure
// adjusts the cluster first), waits until they are exact, and starts a render worker (benchWorker)
// for each of workers (a shard not running yet is claimed from once it runs); after a couple of
// seconds, leases are out. stop ends the workers.
func startBenchCluster(b *testing.B, n int, configure func(*cluster), workers []string) (*cluster, *claimRecorder, func()) {
	b.Helper()
	c := newCluster(b)
	if configure != nil {
		configure(c)
	}
	loadBenchTable(b, c.ctx, c.dsn, 3*n)
	c.noSample = true
	start := time.Now()
	if state := c.rebalance([]string{"s0", "s1", "s2"}, 30*time.Minute, nil); state != membership.HandoffCommitted {
		b.Fatalf("first assignment: %s", state)
	}
	waitExact(b, c, 30*time.Minute)
	b.Logf("3 shards loaded %d rows in %v", 3*n, time.Since(start).Round(time.Millisecond))
	rec := &claimRecorder{obs: map[string][]claimObs{}}
	wctx, cancel := context.WithCancel(c.ctx)
	var wg sync.WaitGroup
	for _, name := range workers {
		wg.Go(func() { benchWorker(wctx, c, name, rec) })
	}
	time.Sleep(2 * time.Second)
	return c, rec, func() { cancel(); wg.Wait() }
}

// benchWorker claims 100 rows of shard name every 10 ms (whenever the shard runs) and completes
// them, due an hour on, recording each claim's latency, until ctx ends.
func benchWorker(ctx context.Context, c *cluster, name string, rec *claimRecorder) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.writeMu.RLock()
		c.shardsMu.Lock()
		cs := c.shards[name]
		c.shardsMu.Unlock()
		if cs == nil {
			c.writeMu.RUnlock()
			continue
		}
		at := time.Now()
		claimed, err := cs.sh.Claim(at, 100, 0)
		if !errors.Is(err, ErrLoading) { // a shard still loading serves nothing yet
			rec.add(name, at, time.Since(at))
		}
		if err == nil && len(claimed) > 0 {
			next := time.Now().Add(time.Hour)
			items := make([]CompleteItem, len(claimed))
			for i, cl := range claimed {
				items[i] = CompleteItem{Key: cl.Key, Lease: cl.Lease, NextDue: &next}
			}
			_, _ = cs.sh.Complete(ctx, items)
		}
		c.writeMu.RUnlock()
	}
}

// waitExact waits until every shard of the assignment has adopted it, is exact and holds nothing
// back, and the due counts sum exactly over the assignment.
func waitExact(tb testing.TB, c *cluster, timeout time.Duration) {
	tb.Helper()
	waitCounted(tb, c, timeout, true)
}

// waitCounted waits until every shard of the assignment has adopted it and is exact, and the due
// counts sum exactly over the assignment; with served, until nothing is held back either.
func waitCounted(tb testing.TB, c *cluster, timeout time.Duration, served bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		reports := map[string]membership.ShardDue{}
		ok := true
		c.shardsMu.Lock()
		for name, cs := range c.shards {
			st := cs.sh.Status(time.Now())
			owned, err := schedule.ParseSlots(st.Membership.Owned)
			if err != nil {
				c.shardsMu.Unlock()
				tb.Fatal(err)
			}
			d := membership.ShardDue{Owned: owned, DuePerSlot: map[int]int{}}
			for k, v := range st.DuePerSlot {
				var sl int
				_, _ = fmt.Sscan(k, &sl)
				d.DuePerSlot[sl] = v
			}
			reports[name] = d
			ok = ok && st.Exact && (!served || st.HeldBack == 0) && st.Membership.Epoch == c.assign.Epoch
		}
		c.shardsMu.Unlock()
		if _, exact := membership.SumDue(c.assign, reports); ok && exact {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("not exact within %v of epoch %d", timeout, c.assign.Epoch)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BenchmarkFailover measures a shard's failover: three shards over real PostgreSQL holding
// rows=N each, render workers claiming on all of them (100 rows every 10 ms, completed at once),
// leases of 20 s; one shard's process is killed (its Run ends: no drain, no clean end of its
// session) and another process of the shard starts at once in the same "Pod" (it finds the state
// file, as a restarted container does). Reported: from the kill to the shard exact again (its
// load) and to its rows served again (its fence ends: the dead process's lease horizon, a quarter
// of the longest lease past its last lease's end — not the load — so that no row its worker may
// still render is handed out twice), and the other shards' claim p99 meanwhile. A Pod replaced on
// another node holds back for the longest lease from its start instead (docs/design.md, "A keeper
// that dies"). The new process is started at once: the kubelet's restart and the Pod's scheduling
// come on top in a cluster.
func BenchmarkFailover(b *testing.B) {
	const lease = 20 * time.Second
	for _, n := range coretest.Sizes(b) {
		b.Run(coretest.SizeName(n), func(b *testing.B) {
			c, rec, stop := startBenchCluster(b, n, func(c *cluster) {
				c.stateDir = b.TempDir()
				c.settings = func(st *Settings) { st.LeaseDuration = lease }
			}, []string{"s0", "s1", "s2"})
			defer stop()

			var toExact, toServed time.Duration
			var p99 time.Duration
			for b.Loop() {
				t0 := time.Now()
				c.kill("s1")
				c.publish() // s1 is in the assignment and not running: a new process starts
				waitCounted(b, c, 30*time.Minute, false)
				t1 := time.Now()
				for {
					c.shardsMu.Lock()
					st := c.shards["s1"].sh.Status(time.Now())
					c.shardsMu.Unlock()
					if st.HeldBack == 0 && len(st.Fences) == 0 {
						break
					}
					if time.Since(t0) > 10*lease {
						b.Fatalf("s1 still holds %d rows back %v after the kill: %+v", st.HeldBack, time.Since(t0), st.Fences)
					}
					time.Sleep(10 * time.Millisecond)
				}
				t2 := time.Now()
				toExact += t1.Sub(t0)
				toServed += t2.Sub(t0)
				d, _ := rec.p99([]string{"s0", "s2"}, t0, t2)
				p99 = max(p99, d)
			}
			runs := float64(b.N)
			b.ReportMetric(toExact.Seconds()/runs, "s-to-exact")
			b.ReportMetric(toServed.Seconds()/runs, "s-to-served")
			b.ReportMetric(float64(p99.Microseconds())/1000, "others-claim-p99-ms")
		})
	}
}
