package core_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/coretest"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// base is the benchmark cores' build time.
var base = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// BenchmarkKeeperMemory reports the live heap per held row, 64-byte keys, 8 groups, half the rows
// due.
func BenchmarkKeeperMemory(b *testing.B) {
	for _, n := range coretest.Sizes(b) {
		b.Run(coretest.SizeName(n), func(b *testing.B) {
			for b.Loop() {
				before := coretest.LiveHeap()
				c := coretest.Build(b, n, base, false)
				after := coretest.LiveHeap()
				b.ReportMetric(float64(after-before)/float64(n), "B/row")
				runtime.KeepAlive(c)
			}
		})
	}
}

// BenchmarkKeeperApply applies update events (a new rev and due time within the window) to
// random held rows.
func BenchmarkKeeperApply(b *testing.B) {
	for _, n := range coretest.Sizes(b) {
		now := base
		c := coretest.Build(b, n, now, false)
		rng := rand.New(rand.NewPCG(3, 4))
		const nEvents = 1 << 20
		events := make([]schedule.Row, nEvents)
		for i := range events {
			events[i] = coretest.Row(rng, rng.IntN(n), now, false)
			events[i].Rev = int64(n + i + 1)
		}
		next := 0
		// the core is built once; the sub-benchmark runs with growing N over it
		b.Run(coretest.SizeName(n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if next == nEvents {
					b.StopTimer()
					for j := range events {
						events[j].Rev += nEvents
					}
					next = 0
					b.StartTimer()
				}
				c.Apply(now, events[next])
				next++
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
		// as the shard applies a batch of events: 128 at a time, read ahead first or not
		for _, readAhead := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/step=128/readahead=%v", coretest.SizeName(n), readAhead), func(b *testing.B) {
				const step = 128
				for i := 0; i < b.N; i++ {
					if next+step > nEvents {
						b.StopTimer()
						for j := range events {
							events[j].Rev += nEvents
						}
						next = 0
						b.StartTimer()
					}
					evs := events[next : next+step]
					if readAhead {
						c.Prefetch(step, func(i int) string { return evs[i].Key })
					}
					for j := range evs {
						c.Apply(now, evs[j])
					}
					next += step
				}
				b.ReportMetric(float64(b.N*step)/b.Elapsed().Seconds(), "events/s")
			})
		}
	}
}

// BenchmarkKeeperClaim claims batches of 100 from rows in 8 groups, all due. The claimed rows are
// released after each batch so every batch sees the full core; us/claim times the claims alone
// (ns/op includes the releases).
func BenchmarkKeeperClaim(b *testing.B) {
	for _, n := range coretest.Sizes(b) {
		now := base
		c := coretest.Build(b, n, now, true)
		claim := func(b *testing.B) {
			var claiming time.Duration
			for i := 0; i < b.N; i++ {
				start := time.Now()
				got := c.Claim(now, 100, time.Minute)
				claiming += time.Since(start)
				if len(got) != 100 {
					b.Fatalf("claimed %d", len(got))
				}
				for _, g := range got {
					if err := c.Release(now, g.Key, g.Lease); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(claiming.Microseconds())/float64(b.N), "us/claim")
		}
		b.Run(coretest.SizeName(n)+"/batch=100", claim)
		// the same with the keeper's defaults: the Adaptive policy's pace measured at every claim,
		// the starvation bound looked at (every group is claimed often: it hands out nothing)
		if err := c.SetConfig(policy.Config{SubmittedBoost: 2, UrgentMaxShare: 0.2, Reschedule: policy.Adaptive,
			StarvationBound: policy.DefaultStarvationBound}); err != nil {
			b.Fatal(err)
		}
		b.Run(coretest.SizeName(n)+"/batch=100/adaptive+bound", claim)
		// the same with a floor on every group (8 floors of 0.05)
		var floors []policy.Floor
		for _, cad := range coretest.Cadences() {
			for _, src := range []schedule.Source{schedule.SourceDiscovered, schedule.SourceSubmitted} {
				floors = append(floors, policy.Floor{Cadence: cad, Source: src, Share: 0.05})
			}
		}
		if err := c.SetConfig(policy.Config{SubmittedBoost: 2, UrgentMaxShare: 0.2, Floors: floors}); err != nil {
			b.Fatal(err)
		}
		b.Run(coretest.SizeName(n)+"/batch=100/floors=8", claim)
	}
}

// BenchmarkKeeperComplete completes claimed batches of 500 as a shard does: each lease checked
// and the next due computed (Completing), then the written version applied and the lease ended
// (ApplyCompleted), given Completing's hint or not. The written due is 1 ms after the held one, so
// every row moves in its tree and stays due for the next claims. ns/row times the completions
// alone (the claims are untimed).
func BenchmarkKeeperComplete(b *testing.B) {
	for _, n := range coretest.Sizes(b) {
		now := base
		c := coretest.Build(b, n, now, true)
		rev := int64(1 << 40)
		for _, hinted := range []bool{true, false} {
			b.Run(fmt.Sprintf("%s/hint=%v", coretest.SizeName(n), hinted), func(b *testing.B) {
				var completing time.Duration
				rows := 0
				for i := 0; i < b.N; i++ {
					got := c.Claim(now, 500, time.Minute)
					start := time.Now()
					for _, g := range got {
						cp, _, err := c.Completing(now, g.Key, g.Lease)
						if err != nil {
							b.Fatal(err)
						}
						rev++
						hint := cp.Hint
						if !hinted {
							hint = core.Hint{}
						}
						c.ApplyCompleted(now, completedRow(g, cp.Due, rev), g.Lease, hint)
					}
					completing += time.Since(start)
					rows += len(got)
				}
				b.ReportMetric(float64(completing.Nanoseconds())/float64(rows), "ns/row")
			})
		}
	}
}

// BenchmarkKeeperCompleteInFlight completes claimed batches as a shard under load does: 32
// requests of 1,000 rows in flight (as 32 workers claiming 1,000 at a time keep), each completed
// after the 31 claimed after it, so that its rows have left the CPU's caches. As Shard.Complete
// does, every lease is checked (Completing), then the written versions are applied
// (ApplyCompleted, with Completing's hints), each in steps of 128 rows whose keys or hints are read
// ahead (prefetch=true, what the shard does) or not. ns/row times the completions alone (the
// claims are untimed).
func BenchmarkKeeperCompleteInFlight(b *testing.B) {
	const inFlight, batch, step = 32, 1000, 128
	for _, n := range coretest.Sizes(b) {
		now := base
		c := coretest.Build(b, n, now, true)
		rev := int64(1 << 41)
		for _, prefetch := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/prefetch=%v", coretest.SizeName(n), prefetch), func(b *testing.B) {
				queue := make([][]core.Claimed, 0, inFlight+1)
				for range inFlight {
					queue = append(queue, c.Claim(now, batch, time.Hour))
				}
				hints := make([]core.Hint, batch)
				dues := make([]time.Time, batch)
				var completing time.Duration
				rows := 0
				for b.Loop() {
					got := queue[0]
					queue = append(queue[:0], queue[1:]...)
					if len(got) != batch {
						b.Fatalf("claimed %d", len(got))
					}
					start := time.Now()
					for lo := 0; lo < len(got); lo += step {
						hi := min(lo+step, len(got))
						if prefetch {
							c.Prefetch(hi-lo, func(j int) string { return got[lo+j].Key })
						}
						for i := lo; i < hi; i++ {
							cp, _, err := c.Completing(now, got[i].Key, got[i].Lease)
							if err != nil {
								b.Fatal(err)
							}
							hints[i], dues[i] = cp.Hint, cp.Due
						}
					}
					for lo := 0; lo < len(got); lo += step {
						hi := min(lo+step, len(got))
						if prefetch {
							c.PrefetchHints(hi-lo, func(j int) core.Hint { return hints[lo+j] })
						}
						for i := lo; i < hi; i++ {
							g := got[i]
							rev++
							c.ApplyCompleted(now, completedRow(g, dues[i], rev), g.Lease, hints[i])
						}
					}
					completing += time.Since(start)
					rows += len(got)
					queue = append(queue, c.Claim(now, batch, time.Hour))
				}
				// every row claimable again for the next run
				for _, q := range queue {
					for _, g := range q {
						if err := c.Release(now, g.Key, g.Lease); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(completing.Nanoseconds())/float64(rows), "ns/row")
			})
		}
	}
}

// completedRow is the version a completion of claimed row g writes in these benchmarks: due 1 ms
// after the held due (so the row moves in its tree and stays due for the next claims), at rev.
func completedRow(g core.Claimed, heldDue time.Time, rev int64) schedule.Row {
	return schedule.Row{Key: g.Key, KeyHash: coretest.HashOf(g.Key), Due: heldDue.Add(time.Millisecond),
		HasDue: true, Cadence: g.Cadence, Route: g.Route, Source: g.Source, Rev: rev}
}

// BenchmarkKeeperSummary computes the core's summary, half the rows due, one second later each
// time (so the rows that came due in that second are counted as they would be).
func BenchmarkKeeperSummary(b *testing.B) {
	for _, n := range coretest.Sizes(b) {
		c := coretest.Build(b, n, base, false)
		now := base
		b.Run(coretest.SizeName(n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				now = now.Add(time.Second)
				if s := c.Summary(now); s.Held != n {
					b.Fatalf("held %d", s.Held)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/summary")
		})
	}
}

// BenchmarkCommit times Core.SetSlots at a handoff's commit, on a core of rows=N (all due): a
// giver whose slots leave, a quarter of them or all (a shard removed), and a receiver whose
// incoming slots become owned — a quarter of its slots beside the rows it owns already (a
// scale-in's receivers), or all of them on a shard that owned nothing (a scale-out's new shard).
// A claim waits for it: the shard's lock is held throughout. A giver's rows are removed after
// the commit by Core.Drain, in steps the shard takes with its lock released between them
// (drainStepRows rows each, as the shard's): drain-ms is their total and drain-step-max-ms the
// longest, both untimed by the benchmark's clock. Each iteration builds its core first, untimed;
// run it with -benchtime 3x.
func BenchmarkCommit(b *testing.B) {
	const drainStepRows = 256 // pkg/keeper's drainStepRows
	quarter := func(s int) bool { return s < schedule.NumSlots/4 }
	all := func(int) bool { return true }
	cases := []struct {
		name string
		// which slots change; from is their state before the commit (set untimed), to after
		which    func(s int) bool
		from, to core.SlotState
	}{
		{"give=quarter", quarter, core.SlotOwned, core.SlotNone},
		{"give=all", all, core.SlotOwned, core.SlotNone},
		{"receive=quarter", quarter, core.SlotIncoming, core.SlotOwned},
		{"receive=all-new", all, core.SlotIncoming, core.SlotOwned},
	}
	for _, n := range coretest.Sizes(b) {
		for _, tc := range cases {
			b.Run(fmt.Sprintf("%s/%s", coretest.SizeName(n), tc.name), func(b *testing.B) {
				var drain, stepMax time.Duration
				for b.Loop() {
					b.StopTimer()
					c := coretest.Build(b, n, base, true)
					var before, after [schedule.NumSlots]core.SlotState
					for s := range before {
						before[s], after[s] = core.SlotOwned, core.SlotOwned
						if tc.which(s) {
							before[s], after[s] = tc.from, tc.to
						}
					}
					c.SetSlots(&before)
					held := c.Held()
					b.StartTimer()
					c.SetSlots(&after)
					b.StopTimer()
					if tc.to == core.SlotNone && c.Held() >= held || tc.to != core.SlotNone && c.Held() != held {
						b.Fatalf("held %d after the commit, %d before", c.Held(), held)
					}
					for done := false; !done; {
						t := time.Now()
						done = c.Drain(drainStepRows)
						d := time.Since(t)
						drain += d
						stepMax = max(stepMax, d)
					}
					b.StartTimer()
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/commit")
				b.ReportMetric(float64(drain.Microseconds())/1000/float64(b.N), "drain-ms")
				b.ReportMetric(float64(stepMax.Microseconds())/1000, "drain-step-max-ms")
			})
		}
	}
}
