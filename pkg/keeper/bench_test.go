package keeper

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

const benchRows = 1_000_000

// benchKey returns a 64-byte key.
func benchKey(i int) string {
	return fmt.Sprintf("https://shop.example.com/product/%031d", i)
}

// benchCadences are 4 cadences × 2 sources = 8 groups.
var benchCadences = [...]time.Duration{time.Hour, 24 * time.Hour, 96 * time.Hour, 7 * 24 * time.Hour}

// benchRow makes row i: due spread over the past cadence (all due at now) or over ±cadence.
func benchRow(rng *rand.Rand, i int, now time.Time, allDue bool) schedule.Row {
	cad := benchCadences[i%len(benchCadences)]
	off := time.Duration(rng.Int64N(int64(cad)))
	due := now.Add(-off)
	if !allDue {
		due = now.Add(cad/2 - off)
	}
	return schedule.Row{
		Key:     benchKey(i),
		KeyHash: int64(rng.Uint64()),
		Due:     due,
		HasDue:  true,
		Cadence: cad,
		Route:   []string{"product", "category", "home"}[i%3],
		Source:  schedule.Source(i / len(benchCadences) % 2),
		Rev:     int64(i + 1),
	}
}

func benchCore(tb testing.TB, now time.Time, allDue bool) *Core {
	tb.Helper()
	c, err := New(Config{SubmittedBoost: 2, UrgentMaxShare: 0.2})
	if err != nil {
		tb.Fatal(err)
	}
	for s := 0; s < schedule.NumSlots; s++ {
		c.SetSlot(s, SlotOwned)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < benchRows; i++ {
		if o := c.Apply(now, benchRow(rng, i, now, allDue)); o.Result != Held {
			tb.Fatalf("row %d: %v", i, o.Result)
		}
	}
	return c
}

func liveHeap() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkKeeperMemory reports the live heap per held row at 1,000,000 rows with 64-byte keys.
func BenchmarkKeeperMemory(b *testing.B) {
	now := base
	for b.Loop() {
		before := liveHeap()
		c := benchCore(b, now, false)
		after := liveHeap()
		b.ReportMetric(float64(after-before)/benchRows, "B/row")
		runtime.KeepAlive(c)
	}
}

// BenchmarkKeeperApply applies update events (a new rev and due time within the window) to
// random held rows of a 1,000,000-row core.
func BenchmarkKeeperApply(b *testing.B) {
	now := base
	c := benchCore(b, now, false)
	rng := rand.New(rand.NewPCG(3, 4))
	const nEvents = 1 << 20
	events := make([]schedule.Row, nEvents)
	for i := range events {
		k := rng.IntN(benchRows)
		events[i] = benchRow(rng, k, now, false)
		events[i].Rev = int64(benchRows + i + 1)
	}
	next := 0
	// the core is built once; the sub-benchmark runs with growing N over it
	b.Run("rows=1M", func(b *testing.B) {
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
}

// BenchmarkKeeperClaim claims batches of 100 from 1,000,000 held rows in 8 groups, all due. The
// claimed rows are released after each batch so every batch sees the full core; us/claim times
// the claims alone (ns/op includes the releases).
func BenchmarkKeeperClaim(b *testing.B) {
	now := base
	c := benchCore(b, now, true)
	b.Run("rows=1M/batch=100", func(b *testing.B) {
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
	})
	// the same with a floor on every group (8 floors of 0.05)
	var floors []Floor
	for _, cad := range benchCadences {
		for _, src := range []schedule.Source{schedule.SourceDiscovered, schedule.SourceSubmitted} {
			floors = append(floors, Floor{Cadence: cad, Source: src, Share: 0.05})
		}
	}
	if err := c.SetConfig(Config{SubmittedBoost: 2, UrgentMaxShare: 0.2, Floors: floors}); err != nil {
		b.Fatal(err)
	}
	b.Run("rows=1M/batch=100/floors=8", func(b *testing.B) {
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
	})
}

// BenchmarkKeeperSummary computes the summary of 1,000,000 held rows, half of them due.
func BenchmarkKeeperSummary(b *testing.B) {
	now := base
	c := benchCore(b, now, false)
	b.Run("rows=1M", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			s := c.Summary(now)
			if s.Held != benchRows {
				b.Fatalf("held %d", s.Held)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/summary")
	})
}
