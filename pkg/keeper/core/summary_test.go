package core

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/rowstore"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/summary"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

const hourMs = 3600_000

// summaryScan computes a summary the direct way: one pass over every held record, percentiles by
// sorting. It is the reference for summary.Summary on cores too large for the reference model.
func summaryScan(c *Core, nowMs int64) summary.Summary {
	s := summary.Summary{Held: c.rows.Len(), Invalid: len(c.invalid), Leased: c.leases.Len(), DuePerSlot: map[int]int{},
		DuePerIncomingSlot: map[int]int{}, ByRoute: map[string]int{}}
	type classKey struct {
		cadenceMs int64
		source    schedule.Source
	}
	classes := map[classKey]*summary.Class{}
	head := map[classKey]int64{} // the earliest due of each class's claimable due non-urgent rows
	var abs []int64
	var rel []float64
	var oldest *rowstore.Rec
	c.rows.Each(func(_ uint32, r *rowstore.Rec) {
		due := r.Due()
		if c.slots[r.Slot] != SlotOwned {
			s.HeldIncoming++
			if due <= nowMs {
				s.DuePerIncomingSlot[int(r.Slot)]++
			}
			return
		}
		g := c.groups[r.Group]
		ck := classKey{g.cadenceMs, g.source}
		if classes[ck] == nil {
			classes[ck] = &summary.Class{Cadence: time.Duration(g.cadenceMs) * time.Millisecond, Source: g.source}
		}
		cl := classes[ck]
		cl.Held++
		if d := due - nowMs; d > 0 {
			if d <= 24*hourMs {
				s.Coming.ByHour[(d-1)/hourMs]++
				s.Coming.Next24h++
			}
			if d <= hourMs {
				s.Coming.Next60m++
			}
			if d <= 15*60_000 {
				s.Coming.Next15m++
			}
			return
		}
		s.Due++
		cl.Due++
		if h, ok := head[ck]; !g.urgent && !r.Has(flagLeased) && (!ok || due < h) {
			head[ck] = due
		}
		cl.MaxLateSeconds = max(cl.MaxLateSeconds, float64(nowMs-due)/1000)
		cl.LateBy[lateBucket(nowMs-due, g.cadenceMs)]++
		s.DuePerSlot[int(r.Slot)]++
		s.ByRoute[c.routes[r.Route]]++
		abs = append(abs, nowMs-due)
		rel = append(rel, float64(nowMs-due)/float64(g.cadenceMs))
		if oldest == nil || due < oldest.Due() || (due == oldest.Due() && string(c.rows.Key(r)) < string(c.rows.Key(oldest))) {
			oldest = r
		}
	})
	for ck, cl := range classes {
		if h, ok := head[ck]; ok {
			// since its head came due, or its last claim (the core's record of it)
			g := c.groups[c.groupIdx[groupKey{ck.cadenceMs, ck.source, false}]]
			cl.WaitingSince = time.UnixMilli(max(h, g.lastClaimMs)).UTC()
		}
		s.Classes = append(s.Classes, *cl)
	}
	slices.SortFunc(s.Classes, func(a, b summary.Class) int {
		return cmp.Or(cmp.Compare(a.Cadence, b.Cadence), cmp.Compare(a.Source, b.Source))
	})
	if oldest != nil {
		s.Oldest = &summary.OldestRow{Key: string(c.rows.Key(oldest)), Due: time.UnixMilli(oldest.Due()).UTC()}
	}
	if len(abs) > 0 {
		slices.Sort(abs)
		slices.Sort(rel)
		at := func(q float64, n int) int { return max(0, int(math.Ceil(q*float64(n)))-1) }
		s.Lateness = summary.Lateness{
			MaxSeconds: float64(abs[len(abs)-1]) / 1000, P50Seconds: float64(abs[at(0.5, len(abs))]) / 1000,
			P99Seconds: float64(abs[at(0.99, len(abs))]) / 1000, MaxRelative: rel[len(rel)-1],
			P50Relative: rel[at(0.5, len(rel))], P99Relative: rel[at(0.99, len(rel))],
		}
	}
	return s
}

// TestSummaryMatchesScan checks summary.Summary against a scan of the records on a core large enough for
// trees several levels deep: 24 groups (cadences × sources × urgent), leases, incoming slots,
// millisecond due times with many ties, summaries at moving times in both directions, in steps.
func TestSummaryMatchesScan(t *testing.T) {
	c, err := New(policy.Config{SubmittedBoost: 2, UrgentMaxShare: 0.3, Window: 30 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for s := range schedule.NumSlots {
		st := SlotOwned
		if s%7 == 0 {
			st = SlotIncoming
		}
		c.SetSlot(s, st)
	}
	rng := rand.New(rand.NewPCG(11, 12))
	cadences := []time.Duration{90 * time.Second, time.Hour, 24 * time.Hour, 96 * time.Hour}
	now := t0
	key := func(i int) string { return fmt.Sprintf("https://example.com/p/%06d", i) }
	mk := func(i int, rev int64) schedule.Row {
		cad := cadences[rng.IntN(len(cadences))]
		// due within −2 cadences .. +26 h, on a 100 ms grid
		span := 2*cad + 26*time.Hour
		due := now.Add(-2*cad + time.Duration(rng.Int64N(int64(span/(100*time.Millisecond))))*100*time.Millisecond)
		return schedule.Row{Key: key(i), KeyHash: int64(rng.Uint64()), Due: due, HasDue: true, Cadence: cad,
			Route:  []string{"home", "product", "category", "blog", "search"}[rng.IntN(5)],
			Source: schedule.Source(rng.IntN(2)), Urgent: rng.IntN(10) == 0, Rev: rev}
	}
	compare := func(what string, at time.Time) {
		t.Helper()
		got, want := c.Summary(at), summaryScan(c, at.UnixMilli())
		want.AsOf = at
		if g, w := summaryString(got), summaryString(want); g != w {
			t.Fatalf("%s: summary\n got %s\nwant %s", what, g, w)
		}
		if err := checkCore(c); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	const n = 60_000
	hashes := make([]int64, n)
	rev := int64(0)
	c.BeginBulk() // loaded as a shard loads, then built
	for i := range n {
		rev++
		r := mk(i, rev)
		hashes[i] = r.KeyHash
		c.Apply(now, r)
		if i == n/2 {
			compare("half loaded in bulk", now) // builds the pending rows into the trees
		}
	}
	c.EndBulk()
	compare("loaded", now)
	for round := range 12 {
		// claims, releases, updates, deletions; then summaries forward, backward and in steps
		for _, cl := range c.Claim(now, 800, time.Duration(1+rng.IntN(20))*time.Minute) {
			if rng.IntN(4) == 0 {
				if err := c.Release(now, cl.Key, cl.Lease); err != nil {
					t.Fatal(err)
				}
			}
		}
		for range 3000 {
			i := rng.IntN(n)
			rev++
			if rng.IntN(10) == 0 {
				c.Delete(now, key(i), schedule.SlotOf(hashes[i]), rev)
				continue
			}
			r := mk(i, rev)
			r.KeyHash = hashes[i]
			c.Apply(now, r)
		}
		now = now.Add(time.Duration(rng.IntN(40)) * time.Minute)
		compare(fmt.Sprintf("round %d forward", round), now)
		compare(fmt.Sprintf("round %d back", round), now.Add(-time.Duration(rng.IntN(300)+1)*time.Minute))
		steps := 0
		for !c.CatchUp(now, 500) {
			steps++
		}
		compare(fmt.Sprintf("round %d after %d catch-up steps", round, steps), now)
	}
	if h := c.groups[0].owned.Height(); h < 1 {
		t.Fatalf("tree height %d: the test does not reach inner nodes", h)
	}
}

// lateBucket returns the shardapi.LateBy bucket of one row lateMs late with cadence cadenceMs,
// row by row: the scans' way to the counts the core reads from its trees.
func lateBucket(lateMs, cadenceMs int64) int {
	for i := range shardapi.LateBuckets - 1 {
		if num, den := shardapi.LateBound(i); lateMs*den <= cadenceMs*num {
			return i
		}
	}
	return shardapi.LateBuckets - 1
}
