package summary

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/duetree"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// testRecords are the records of the test trees: record id i has key keys[i].
type testRecords struct {
	due  []int64
	keys []string
}

func (m *testRecords) DueMs(id uint32) int64 { return m.due[id] }

func (m *testRecords) Compare(a, b uint32) int {
	return cmp.Or(cmp.Compare(m.due[a], m.due[b]), cmp.Compare(m.keys[a], m.keys[b]))
}

func (m *testRecords) Pending(*duetree.Tree, uint32) (duetree.Entry, bool) { return 0, false }
func (m *testRecords) Built(uint32)                                        {}

// lateBucket returns the shardapi.LateBy bucket of one row lateMs late with cadence cadenceMs,
// row by row.
func lateBucket(lateMs, cadenceMs int64) int {
	for i := range shardapi.LateBuckets - 1 {
		if num, den := shardapi.LateBound(i); lateMs*den <= cadenceMs*num {
			return i
		}
	}
	return shardapi.LateBuckets - 1
}

// TestCountMatchesScan fills trees of several groups (two share a class) with rows due around
// now at millisecond precision with many ties, some leased, and checks Count against a scan of
// the rows: due, classes with their lateness and buckets, coming-due bins, the exact nearest-rank
// percentiles and the oldest row, at several times.
func TestCountMatchesScan(t *testing.T) {
	const hour = int64(3600_000)
	m := &testRecords{}
	f := duetree.NewForest(m)
	rng := rand.New(rand.NewPCG(3, 4))
	now := int64(1796040000000)
	groups := []*testGroup{
		{cadenceMs: hour, source: schedule.SourceDiscovered},
		{cadenceMs: hour, source: schedule.SourceSubmitted},
		{cadenceMs: 24 * hour, source: schedule.SourceDiscovered},
		{cadenceMs: 24 * hour, source: schedule.SourceDiscovered}, // the same class (urgent, in the core)
		{cadenceMs: 96 * hour, source: schedule.SourceSubmitted},
		{cadenceMs: 7, source: schedule.SourceDiscovered}, // relative lateness in the millions
	}
	for i := range 20000 {
		g := groups[rng.IntN(len(groups))]
		id := uint32(len(m.due))
		// due from 3 days before to 2 days after now, on a coarse grid (ties) or to the millisecond
		due := now - 3*24*hour + rng.Int64N(5*24*hour)
		if i%3 == 0 {
			due -= due % 60_000
		}
		m.due = append(m.due, due)
		m.keys = append(m.keys, fmt.Sprintf("k%06d", rng.IntN(1_000_000)))
		f.Insert(&g.tree, duetree.NewEntry(id, due, i%5 == 0))
		g.ids = append(g.ids, id)
	}
	var in []Group
	for _, g := range groups {
		in = append(in, Group{CadenceMs: g.cadenceMs, Source: g.source, Owned: &g.tree})
	}
	in = append(in, Group{CadenceMs: hour, Source: schedule.SourceSubmitted, Owned: &duetree.Tree{}}) // an empty group
	for _, at := range []int64{now, now - 24*hour, now + 36*hour, now - 4*24*hour} {
		var got Summary
		Count(&got, f, at, in, func(id uint32) string { return m.keys[id] })
		want := scan(m, at, groups)
		if (got.Oldest == nil) != (want.Oldest == nil) || (got.Oldest != nil && *got.Oldest != *want.Oldest) {
			t.Fatalf("at now%+dh: oldest %v, want %v", (at-now)/hour, got.Oldest, want.Oldest)
		}
		got.Oldest, want.Oldest = nil, nil
		if g, w := fmt.Sprintf("%+v", got), fmt.Sprintf("%+v", want); g != w {
			t.Fatalf("at now%+dh:\n got %s\nwant %s", (at-now)/hour, g, w)
		}
	}
}

// testGroup is one group of the test: its class, its tree and its records.
type testGroup struct {
	cadenceMs int64
	source    schedule.Source
	tree      duetree.Tree
	ids       []uint32
}

// scan computes what Count fills in by visiting every row and sorting.
func scan(m *testRecords, nowMs int64, groups []*testGroup) Summary {
	var s Summary
	type classKey struct {
		cadenceMs int64
		source    schedule.Source
	}
	classes := map[classKey]*Class{}
	var abs []int64
	var rel []float64
	oldest := -1
	for _, g := range groups {
		cadenceMs, source, ids := g.cadenceMs, g.source, g.ids
		ck := classKey{cadenceMs, source}
		if classes[ck] == nil {
			classes[ck] = &Class{Cadence: time.Duration(cadenceMs) * time.Millisecond, Source: source}
		}
		cl := classes[ck]
		for _, id := range ids {
			due := m.due[id]
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
				continue
			}
			s.Due++
			cl.Due++
			cl.MaxLateSeconds = max(cl.MaxLateSeconds, float64(nowMs-due)/1000)
			cl.LateBy[lateBucket(nowMs-due, cadenceMs)]++
			abs = append(abs, nowMs-due)
			rel = append(rel, float64(nowMs-due)/float64(cadenceMs))
			if oldest < 0 || m.Compare(id, uint32(oldest)) < 0 {
				oldest = int(id)
			}
		}
	}
	for _, cl := range classes {
		s.Classes = append(s.Classes, *cl)
	}
	slices.SortFunc(s.Classes, func(a, b Class) int {
		return cmp.Or(cmp.Compare(a.Cadence, b.Cadence), cmp.Compare(a.Source, b.Source))
	})
	if oldest >= 0 {
		s.Oldest = &OldestRow{Key: m.keys[oldest], Due: time.UnixMilli(m.due[oldest]).UTC()}
	}
	if len(abs) > 0 {
		slices.Sort(abs)
		slices.Sort(rel)
		at := func(q float64, n int) int { return max(0, int(math.Ceil(q*float64(n)))-1) }
		s.Lateness = Lateness{
			MaxSeconds: float64(abs[len(abs)-1]) / 1000, P50Seconds: float64(abs[at(0.5, len(abs))]) / 1000,
			P99Seconds: float64(abs[at(0.99, len(abs))]) / 1000, MaxRelative: rel[len(rel)-1],
			P50Relative: rel[at(0.5, len(rel))], P99Relative: rel[at(0.99, len(rel))],
		}
	}
	return s
}
