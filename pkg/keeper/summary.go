package keeper

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
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
func (c *Core) countDue(r *rec, delta int32) {
	if r.due() > c.due.cursor {
		return
	}
	c.due.slot[r.slot] += delta
	if c.slots[r.slot] == SlotOwned {
		c.due.route[r.route] += delta
	}
}

// crossing returns the number of held rows due in (min(a, b), max(a, b)].
func (c *Core) crossing(a, b int64) int {
	a, b = min(a, b), max(a, b)
	n := 0
	for _, g := range c.groups {
		n += c.tRank(&g.owned, b) - c.tRank(&g.owned, a)
		n += c.tRank(&g.incoming, b) - c.tRank(&g.incoming, a)
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
		c.tVisit(&g.owned, c.tRank(&g.owned, lo), c.tRank(&g.owned, hi), func(e uint64) {
			r := c.rows.at(entryID(e))
			c.due.slot[r.slot] += d
			c.due.route[r.route] += d
		})
		c.tVisit(&g.incoming, c.tRank(&g.incoming, lo), c.tRank(&g.incoming, hi), func(e uint64) {
			c.due.slot[c.rows.at(entryID(e)).slot] += d
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
	if c.rows.n == 0 {
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
	nowMs := now.UnixMilli()
	c.expireLeases(nowMs)
	if c.rows.n == 0 {
		c.due.reset(nowMs)
	} else {
		c.moveCursor(nowMs)
	}
	s := Summary{
		AsOf:               now,
		Held:               c.rows.n,
		Invalid:            len(c.invalid),
		Leased:             len(c.leases),
		DuePerSlot:         map[int]int{},
		DuePerIncomingSlot: map[int]int{},
		ByRoute:            map[string]int{},
	}
	for slot, n := range c.due.slot {
		if n == 0 {
			continue
		}
		switch c.slots[slot] {
		case SlotOwned:
			s.Due += int(n)
			s.DuePerSlot[slot] = int(n)
		case SlotIncoming:
			s.DuePerIncomingSlot[slot] = int(n)
		}
	}
	for ri, n := range c.due.route {
		if n > 0 {
			s.ByRoute[c.routes[ri]] = int(n)
		}
	}
	type classKey struct {
		cadenceMs int64
		source    schedule.Source
	}
	classes := map[classKey]*Class{}
	var runs []dueRun
	var at [25]int // rows due at or before now + h hours, h = 0..24
	in15m := 0
	for _, g := range c.groups {
		s.HeldIncoming += g.incoming.n
		t := &g.owned
		if t.n == 0 {
			continue
		}
		ck := classKey{g.cadenceMs, g.source}
		cl := classes[ck]
		if cl == nil {
			cl = &Class{Cadence: time.Duration(g.cadenceMs) * time.Millisecond, Source: g.source}
			classes[ck] = cl
		}
		dueNow := c.tRank(t, nowMs)
		cl.Held += t.n
		cl.Due += dueNow
		at[0] += dueNow
		for h, prev := 1, dueNow; h <= 24; h++ {
			n := t.n // once every row is counted, the later bins need no lookup
			if prev < t.n {
				n = c.tRank(t, nowMs+int64(h)*hourMs)
			}
			at[h] += n
			prev = n
		}
		in15m += c.tRank(t, nowMs+15*60_000)
		if n := dueNow; n > 0 {
			first, _ := c.tFirst(t)
			runs = append(runs, dueRun{t: t, n: n, cadenceMs: g.cadenceMs, first: first, firstMs: c.rows.at(entryID(first)).due()})
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
	for h := range 24 {
		s.Coming.ByHour[h] = at[h+1] - at[h]
	}
	s.Coming.Next15m = in15m - at[0]
	s.Coming.Next60m = at[1] - at[0]
	s.Coming.Next24h = at[24] - at[0]
	if len(runs) > 0 {
		c.lateness(&s, nowMs, runs)
	}
	return s
}

// dueRun is the due rows of one group's owned tree: its first n entries.
type dueRun struct {
	t         *tree
	n         int
	cadenceMs int64
	first     uint64
	firstMs   int64
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
		if c.cmpEntry(r.first, oldest.first) < 0 {
			oldest = r
		}
		maxRel = max(maxRel, relLate(nowMs, r.firstMs, r.cadenceMs))
	}
	or := c.rows.at(entryID(oldest.first))
	s.Oldest = &OldestRow{Key: string(c.keys.get(or.keyOff)), Due: time.UnixMilli(oldest.firstMs).UTC()}
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

// dueQuantile returns the due time of the row whose lateness is the q-quantile (nearest rank) of
// the due rows: the k-th latest due time is the (total − k + 1)-th earliest.
func (c *Core) dueQuantile(runs []dueRun, total int, q float64, lo, hi int64) int64 {
	j := total - rankOf(q, total) + 1
	// the smallest x in [lo, hi] with at least j rows due at or before it
	for lo < hi {
		m := lo + (hi-lo)/2
		n := 0
		for _, r := range runs {
			n += c.tRank(r.t, m)
		}
		if n >= j {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

// relQuantile returns the q-quantile (nearest rank) of the due rows' relative lateness: the
// smallest value x (searched over the ordered bit patterns of non-negative float64s) with at least
// k rows whose relative lateness, computed as float64(now − due) / float64(cadence), is at most x.
func (c *Core) relQuantile(runs []dueRun, total int, q float64, nowMs int64, maxRel float64) float64 {
	k := rankOf(q, total)
	lo, hi := uint64(0), math.Float64bits(maxRel)
	for lo < hi {
		m := lo + (hi-lo)/2
		x := math.Float64frombits(m)
		n := 0
		for _, r := range runs {
			// rows due in [thr, now] have relative lateness ≤ x: thr is the earliest such due time
			a, b := r.firstMs, nowMs
			for a < b {
				d := a + (b-a)/2
				if relLate(nowMs, d, r.cadenceMs) <= x {
					b = d
				} else {
					a = d + 1
				}
			}
			n += r.n - c.tRank(r.t, a-1)
		}
		if n >= k {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return math.Float64frombits(lo)
}
