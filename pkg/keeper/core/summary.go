package core

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/duetree"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/rowstore"
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
}

// Coming counts held rows of owned slots not yet due, by how soon they come due: Next15m has
// due in (now, now+15m], ByHour[h] due in (now+h hours, now+h+1 hours].
type Coming struct {
	Next15m, Next60m, Next24h int
	ByHour                    [24]int
}

const hourMs = 3600_000

// dueCounts counts the held rows due at or before a cursor time: per slot (owned and incoming
// slots) and per route (owned slots only). Rows are counted as they are applied, moved and
// dropped; a summary moves the cursor to its own time, visiting only the rows whose due time lies
// between the two (in due order, from the trees). Everything else a summary reports comes from
// the trees' counts, so a summary costs time in the number of groups, slots and routes, not rows.
type dueCounts struct {
	cursor int64
	slot   [schedule.NumSlots]int32
	route  []int32
}

// reset moves the cursor without counting: only while no row is held.
func (d *dueCounts) reset(cursorMs int64) { d.cursor = cursorMs }

// countDue adds delta to the counts of held row r when it is due at or before the cursor.
func (c *Core) countDue(r *rowstore.Rec, delta int32) {
	if r.Due() > c.due.cursor {
		return
	}
	c.due.slot[r.Slot] += delta
	if c.slots[r.Slot] == SlotOwned {
		c.due.route[r.Route] += delta
	}
}

// crossing returns the number of held rows due in (min(a, b), max(a, b)].
func (c *Core) crossing(a, b int64) int {
	a, b = min(a, b), max(a, b)
	n := 0
	for _, g := range c.groups {
		n += c.trees.Rank(&g.owned, b) - c.trees.Rank(&g.owned, a)
		n += c.trees.Rank(&g.incoming, b) - c.trees.Rank(&g.incoming, a)
	}
	return n
}

// moveCursor moves the due counts' cursor to tMs, counting or uncounting the rows due between.
func (c *Core) moveCursor(tMs int64) {
	from := c.due.cursor
	if tMs == from {
		return
	}
	lo, hi, d := from, tMs, int32(1)
	if tMs < from {
		lo, hi, d = tMs, from, -1
	}
	for _, g := range c.groups {
		c.trees.Visit(&g.owned, c.trees.Rank(&g.owned, lo), c.trees.Rank(&g.owned, hi), func(e duetree.Entry) {
			r := c.rows.At(e.ID())
			c.due.slot[r.Slot] += d
			c.due.route[r.Route] += d
		})
		c.trees.Visit(&g.incoming, c.trees.Rank(&g.incoming, lo), c.trees.Rank(&g.incoming, hi), func(e duetree.Entry) {
			c.due.slot[c.rows.At(e.ID()).Slot] += d
		})
	}
	c.due.cursor = tMs
}

// CatchUp moves the due counts toward now, visiting at most about maxRows rows (more only when
// more than maxRows rows are due in one millisecond), and reports whether they reached now. The
// shard calls it in steps, releasing its lock between them, before a Summary at now, so rows that
// came due since the last summary are counted without holding claims up for long.
func (c *Core) CatchUp(now time.Time, maxRows int) bool {
	t := now.UnixMilli()
	if c.rows.Len() == 0 {
		c.due.reset(t)
		return true
	}
	from := c.due.cursor
	if c.crossing(from, t) <= maxRows {
		c.moveCursor(t)
		return true
	}
	// the farthest step from the cursor toward t that crosses at most maxRows rows (at least 1 ms)
	step := int64(1)
	if t < from {
		step = -1
	}
	lo, hi := from+step, t // lo is always taken; hi crosses too many
	for lo != hi && lo+step != hi {
		m := lo + (hi-lo)/2
		if c.crossing(from, m) <= maxRows {
			lo = m
		} else {
			hi = m
		}
	}
	c.moveCursor(lo)
	return false
}

// Summary computes the summary at now. It costs time in the rows that came due (or stopped being
// due) since the last summary, plus the number of groups, slots and routes; see dueCounts.
func (c *Core) Summary(now time.Time) Summary {
	sc := c.CountSummary(now)
	return sc.Build()
}

// SummaryCounts is a summary as counted from the core: the figures without the maps, which
// Build makes from the copied counts (the shard does that after releasing its lock).
type SummaryCounts struct {
	Summary
	slotDue   [schedule.NumSlots]int32
	slotState [schedule.NumSlots]SlotState
	walked    [schedule.NumSlots]bool
	routeDue  []int32
	routes    []string
}

// CountSummary counts the summary at now: everything but building the maps.
func (c *Core) CountSummary(now time.Time) SummaryCounts {
	nowMs := now.UnixMilli()
	c.expireLeases(nowMs)
	if c.rows.Len() == 0 {
		c.due.reset(nowMs)
	} else {
		c.moveCursor(nowMs)
	}
	sc := SummaryCounts{
		Summary:   Summary{AsOf: now, Held: c.rows.Len(), Invalid: len(c.invalid), Leased: len(c.leases)},
		slotDue:   c.due.slot,
		slotState: c.slots,
		walked:    c.walked,
		routeDue:  slices.Clone(c.due.route),
		routes:    c.routes[:len(c.routes):len(c.routes)], // routes are only ever appended
	}
	s := &sc.Summary
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
	for _, g := range c.groups {
		s.HeldIncoming += c.trees.Len(&g.incoming)
		t := &g.owned
		held := c.trees.Len(t)
		if held == 0 {
			continue
		}
		ck := classKey{g.cadenceMs, g.source}
		cl := classes[ck]
		if cl == nil {
			cl = &Class{Cadence: time.Duration(g.cadenceMs) * time.Millisecond, Source: g.source}
			classes[ck] = cl
		}
		c.trees.Ranks(t, points[:], ranks[:])
		for i, n := range ranks {
			at[i] += int64(n)
		}
		cl.Held += held
		cl.Due += ranks[0]
		s.Due += ranks[0]
		if n := ranks[0]; n > 0 {
			first, _ := c.trees.First(t)
			last := c.trees.Select(t, n-1)
			run := dueRun{t: t, n: n, cadenceMs: g.cadenceMs, first: first,
				firstMs: c.rows.At(first.ID()).Due(), lastMs: c.rows.At(last.ID()).Due()}
			runs = append(runs, run)
			c.classLateness(cl, nowMs, run)
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
		c.lateness(s, nowMs, runs)
	}
	return sc
}

// Walked says whether slot s had been read by a finished walk since it joined, as of the counts.
func (sc *SummaryCounts) Walked(s int) bool { return sc.walked[s] }

// Build builds the summary's maps from the counts.
func (sc *SummaryCounts) Build() Summary {
	s := sc.Summary
	owned, incoming := 0, 0
	for slot, n := range sc.slotDue {
		if n != 0 {
			switch sc.slotState[slot] {
			case SlotOwned:
				owned++
			case SlotIncoming:
				incoming++
			}
		}
	}
	s.DuePerSlot = make(map[int]int, owned)
	s.DuePerIncomingSlot = make(map[int]int, incoming)
	for slot, n := range sc.slotDue {
		if n == 0 {
			continue
		}
		switch sc.slotState[slot] {
		case SlotOwned:
			s.DuePerSlot[slot] = int(n)
		case SlotIncoming:
			s.DuePerIncomingSlot[slot] = int(n)
		}
	}
	s.ByRoute = map[string]int{}
	for ri, n := range sc.routeDue {
		if n > 0 {
			s.ByRoute[sc.routes[ri]] = int(n)
		}
	}
	return s
}

// classLateness adds the due rows of run (one group of class cl) to the class's lateness: its
// most overdue row and the LateBy buckets, counted from the tree at each bucket's bound.
func (c *Core) classLateness(cl *Class, nowMs int64, run dueRun) {
	cl.MaxLateSeconds = max(cl.MaxLateSeconds, float64(nowMs-run.firstMs)/1000)
	// above is the number of due rows later than bucket i's bound: (now − due) × den >
	// cadence × num, that is due < now − cadence × num ÷ den, or due ≤ floor((now × den −
	// cadence × num − 1) ÷ den) (all positive).
	prev := run.n
	for i := range shardapi.LateBuckets - 1 {
		num, den := shardapi.LateBound(i)
		above := c.trees.Rank(run.t, (nowMs*den-run.cadenceMs*num-1)/den)
		cl.LateBy[i] += prev - above
		prev = above
	}
	cl.LateBy[shardapi.LateBuckets-1] += prev
}

// dueRun is the due rows of one group's owned tree: its first n entries.
type dueRun struct {
	t         *duetree.Tree
	n         int
	cadenceMs int64
	first     duetree.Entry
	firstMs   int64 // the earliest due time of the run
	lastMs    int64 // the latest due time of the run (at or before now)
}

// lateness fills the lateness summary and the oldest row from the due rows of runs. The
// percentiles are exact nearest-rank values, found by binary search over the value with counts
// from the trees (no pass over the rows).
func (c *Core) lateness(s *Summary, nowMs int64, runs []dueRun) {
	total := 0
	oldest := runs[0]
	maxRel := 0.0
	for _, r := range runs {
		total += r.n
		if c.trees.Compare(r.first, oldest.first) < 0 {
			oldest = r
		}
		maxRel = max(maxRel, relLate(nowMs, r.firstMs, r.cadenceMs))
	}
	or := c.rows.At(oldest.first.ID())
	s.Oldest = &OldestRow{Key: string(c.rows.Key(or)), Due: time.UnixMilli(oldest.firstMs).UTC()}
	s.Lateness.MaxSeconds = float64(nowMs-oldest.firstMs) / 1000
	s.Lateness.MaxRelative = maxRel
	s.Lateness.P50Seconds = float64(nowMs-c.dueQuantile(runs, total, 0.50, oldest.firstMs, nowMs)) / 1000
	s.Lateness.P99Seconds = float64(nowMs-c.dueQuantile(runs, total, 0.99, oldest.firstMs, nowMs)) / 1000
	s.Lateness.P50Relative = c.relQuantile(runs, total, 0.50, nowMs, maxRel)
	s.Lateness.P99Relative = c.relQuantile(runs, total, 0.99, nowMs, maxRel)
}

func relLate(nowMs, dueMs, cadenceMs int64) float64 {
	return float64(nowMs-dueMs) / float64(cadenceMs)
}

// rankOf returns the nearest-rank position (1-based) of quantile q among n values.
func rankOf(q float64, n int) int {
	return max(1, min(n, int(math.Ceil(q*float64(n)))))
}

// quantileCandidates is how few rows a quantile search narrows down to before it reads them and
// picks the answer by sorting.
const quantileCandidates = 256

// dueQuantile returns the due time of the row whose lateness is the q-quantile (nearest rank) of
// the due rows: the k-th latest due time is the (total − k + 1)-th earliest. lo and hi bound the
// due rows' due times.
func (c *Core) dueQuantile(runs []dueRun, total int, q float64, lo, hi int64) int64 {
	j := total - rankOf(q, total) + 1
	// the answer is the smallest x with at least j rows due at or before it; bisect (lo, hi] with
	// count(lo) < j ≤ count(hi) until few rows lie between, then read those
	count := func(x int64) int {
		n := 0
		for _, r := range runs {
			n += c.trees.Rank(r.t, x)
		}
		return n
	}
	lo--
	nlo, nhi := 0, total
	for nhi-nlo > quantileCandidates && hi-lo > 1 {
		m := lo + (hi-lo)/2
		if n := count(m); n >= j {
			hi, nhi = m, n
		} else {
			lo, nlo = m, n
		}
	}
	var cand []int64
	for _, r := range runs {
		c.trees.Visit(r.t, c.trees.Rank(r.t, lo), c.trees.Rank(r.t, hi), func(e duetree.Entry) {
			cand = append(cand, c.rows.At(e.ID()).Due())
		})
	}
	slices.Sort(cand)
	return cand[j-nlo-1]
}

// relQuantile returns the q-quantile (nearest rank) of the due rows' relative lateness, computed
// as float64(now − due) / float64(cadence): the smallest value x with at least k rows at or below
// it. The search bisects over the ordered bit patterns of non-negative float64s until few rows lie
// between its bounds, then reads those.
func (c *Core) relQuantile(runs []dueRun, total int, q float64, nowMs int64, maxRel float64) float64 {
	k := rankOf(q, total)
	// positions of each run's rows with relative lateness ≤ x are its last cntLE(r, x) due rows
	cntLE := func(r *dueRun, x float64) int { return r.n - c.trees.Rank(r.t, c.relThreshold(r, nowMs, x)-1) }
	count := func(x float64) int {
		n := 0
		for i := range runs {
			n += cntLE(&runs[i], x)
		}
		return n
	}
	// the smallest value is the least late row of some run: start the search there
	minRel := maxRel
	for _, r := range runs {
		minRel = min(minRel, relLate(nowMs, r.lastMs, r.cadenceMs))
	}
	nlo := count(minRel)
	if nlo >= k {
		return minRel
	}
	lo, hi := math.Float64bits(minRel), math.Float64bits(maxRel) // count(lo) < k ≤ count(hi)
	nhi := total
	for nhi-nlo > quantileCandidates && hi-lo > 1 {
		m := lo + (hi-lo)/2
		if n := count(math.Float64frombits(m)); n >= k {
			hi, nhi = m, n
		} else {
			lo, nlo = m, n
		}
	}
	var cand []float64
	xlo, xhi := math.Float64frombits(lo), math.Float64frombits(hi)
	for i := range runs {
		r := &runs[i]
		c.trees.Visit(r.t, r.n-cntLE(r, xhi), r.n-cntLE(r, xlo), func(e duetree.Entry) {
			cand = append(cand, relLate(nowMs, c.rows.At(e.ID()).Due(), r.cadenceMs))
		})
	}
	slices.Sort(cand)
	return cand[k-nlo-1]
}

// relThreshold returns the earliest due time d in [r.firstMs, now] whose relative lateness is at
// most x (x ≥ 0): relative lateness does not increase with d, so the rows of r with relative
// lateness ≤ x are those due in [d, now]. It starts from now − x·cadence and corrects the float
// rounding by stepping, falling back to bisection.
func (c *Core) relThreshold(r *dueRun, nowMs int64, x float64) int64 {
	le := func(d int64) bool { return relLate(nowMs, d, r.cadenceMs) <= x }
	lo, hi := r.firstMs, nowMs // le(hi) holds: relative lateness 0
	if le(lo) {
		return lo
	}
	// le(lo) is false and le(hi) true: find the boundary, first near the estimate
	if est := float64(nowMs) - x*float64(r.cadenceMs); est > float64(lo) && est < float64(hi) {
		d := int64(est)
		for range 4 {
			if le(d) {
				hi = d
				if !le(d - 1) {
					return d
				}
				d--
			} else {
				lo = d
				d++
			}
			if d <= lo || d >= hi {
				break
			}
		}
	}
	for hi-lo > 1 {
		m := lo + (hi-lo)/2
		if le(m) {
			hi = m
		} else {
			lo = m
		}
	}
	return hi
}
