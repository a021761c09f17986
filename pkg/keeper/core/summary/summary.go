package summary

import (
	"cmp"
	"slices"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/duetree"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// Summary is the exact state of the held rows of owned slots at one instant. Rows of incoming
// slots are counted only in Held and HeldIncoming.
type Summary struct {
	AsOf time.Time
	// Held is every held row, owned and incoming slots; HeldIncoming the incoming part.
	Held, HeldIncoming int
	// Invalid is the number of keys whose latest known version is invalid.
	Invalid int
	// Due counts rows with due ≤ AsOf (leased ones included); Leased the rows under lease.
	Due, Leased int
	// HeldBack counts the due rows of owned slots that are fenced at AsOf (core.Core.Fence):
	// handed out to nobody until their fence ends, and counted in Due.
	HeldBack int
	// DuePerSlot has an entry for every owned slot with due rows.
	DuePerSlot map[int]int
	// DuePerIncomingSlot has an entry for every incoming slot with due rows (held, not counted in
	// Due: the operator uses it for slots whose new owner has not adopted a commit yet).
	DuePerIncomingSlot map[int]int
	Lateness           Lateness
	// Oldest is the due row with the earliest due time (ties: smallest key); nil when none.
	Oldest  *OldestRow
	ByRoute map[string]int
	// Classes is due and held per (cadence, source), sorted by cadence then source.
	Classes []Class
	Coming  Coming
}

// Lateness of the due rows: absolute (seconds late) and relative (seconds late ÷ cadence).
// Percentiles are nearest-rank: the smallest value with at least q of the rows at or below it.
type Lateness struct {
	MaxSeconds, P50Seconds, P99Seconds    float64
	MaxRelative, P50Relative, P99Relative float64
}

// OldestRow is the longest-due row.
type OldestRow struct {
	Key string
	Due time.Time
}

// Class is one (cadence, source) class.
type Class struct {
	Cadence   time.Duration
	Source    schedule.Source
	Due, Held int
	// MaxLateSeconds is the lateness of the class's most overdue due row (0 when none).
	MaxLateSeconds float64
	// LateBy counts the due rows by relative lateness, in the buckets of shardapi.LateBound.
	LateBy [shardapi.LateBuckets]int
	// WaitingSince is when the class last had a row claimed or, if later, when its most overdue
	// claimable row came due: it has had due rows and no render since (its non-urgent rows).
	// Zero when it has no claimable due row. The starvation bound serves a class once it has
	// waited half its cadence; one waiting a whole cadence is starving — claims are not being
	// made, or more classes are past their bound than the claims have room for.
	WaitingSince time.Time
}

// Waiting is how long the class has had due rows and no render at now (0 when it is not
// waiting).
func (c Class) Waiting(now time.Time) time.Duration {
	if c.WaitingSince.IsZero() || now.Before(c.WaitingSince) {
		return 0
	}
	return now.Sub(c.WaitingSince)
}

// Coming counts held rows of owned slots not yet due, by how soon they come due: Next15m has
// due in (now, now+15m], ByHour[h] due in (now+h hours, now+h+1 hours].
type Coming struct {
	Next15m, Next60m, Next24h int
	ByHour                    [24]int
}

const hourMs = 3600_000

// Group is one group of held rows of one class (the core's: one (cadence, source, urgent) group):
// the tree of its rows of owned slots.
type Group struct {
	CadenceMs int64
	Source    schedule.Source
	Owned     *duetree.Tree
	// WaitingSinceMs is Class.WaitingSince of a non-urgent group, in Unix milliseconds; 0 when
	// it has no claimable due row, or is urgent.
	WaitingSinceMs int64
}

// Count fills in the figures of s (zero until then) about the held rows of owned slots at nowMs —
// Due, Classes, Coming, Lateness and Oldest — from the groups' trees in forest f, without visiting
// the rows:
// in time in the number of groups and the trees' height (and a few hundred rows for each
// percentile). key returns the key of a held record (for Oldest).
func Count(s *Summary, f *duetree.Forest, nowMs int64, groups []Group, key func(id uint32) string) {
	type classKey struct {
		cadenceMs int64
		source    schedule.Source
	}
	classes := map[classKey]*Class{}
	var runs []dueRun
	// rows due at or before now, now + 15 min, now + h hours (h = 1..24)
	var points, at [26]int64
	points[0], points[1] = nowMs, nowMs+15*60_000
	for h := 1; h <= 24; h++ {
		points[h+1] = nowMs + int64(h)*hourMs
	}
	var ranks [26]int
	for _, g := range groups {
		t := g.Owned
		held := f.Len(t)
		if held == 0 {
			continue
		}
		ck := classKey{g.CadenceMs, g.Source}
		cl := classes[ck]
		if cl == nil {
			cl = &Class{Cadence: time.Duration(g.CadenceMs) * time.Millisecond, Source: g.Source}
			classes[ck] = cl
		}
		f.Ranks(t, points[:], ranks[:])
		for i, n := range ranks {
			at[i] += int64(n)
		}
		cl.Held += held
		cl.Due += ranks[0]
		if g.WaitingSinceMs != 0 {
			cl.WaitingSince = time.UnixMilli(g.WaitingSinceMs).UTC()
		}
		s.Due += ranks[0]
		if n := ranks[0]; n > 0 {
			first, _ := f.First(t)
			last := f.Select(t, n-1)
			run := dueRun{t: t, n: n, cadenceMs: g.CadenceMs, first: first,
				firstMs: f.DueMs(first), lastMs: f.DueMs(last)}
			runs = append(runs, run)
			classLateness(f, cl, nowMs, run)
		}
	}
	for _, cl := range classes {
		s.Classes = append(s.Classes, *cl)
	}
	slices.SortFunc(s.Classes, func(a, b Class) int {
		if a.Cadence != b.Cadence {
			return cmp.Compare(a.Cadence, b.Cadence)
		}
		return cmp.Compare(a.Source, b.Source)
	})
	s.Coming.Next15m = int(at[1] - at[0])
	s.Coming.ByHour[0] = int(at[2] - at[0])
	for h := 1; h < 24; h++ {
		s.Coming.ByHour[h] = int(at[h+2] - at[h+1])
	}
	s.Coming.Next60m = int(at[2] - at[0])
	s.Coming.Next24h = int(at[25] - at[0])
	if len(runs) > 0 {
		lateness(f, s, nowMs, runs, key)
	}
}
