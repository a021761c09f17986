package core

import (
	"math"
	"slices"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/duetree"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/rowstore"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/summary"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// dueCounts counts the held rows due at or before a cursor time: per slot (owned and incoming
// slots) and per route (owned slots only). Rows are counted as they are applied, moved and
// dropped; a summary moves the cursor to its own time, visiting only the rows whose due time lies
// between the two (in due order, from the trees). Everything else a summary reports comes from
// the trees' counts (summary.Count), so a summary costs time in the number of groups, slots and
// routes, not rows.
type dueCounts struct {
	cursor int64
	slot   [schedule.NumSlots]int32
	// route counts the due rows of owned slots by route, routeIncoming those of incoming slots
	// (so that a commit making every incoming slot owned moves them in one addition per route:
	// Core.commitIncoming)
	route, routeIncoming []int32
}

// reset moves the cursor without counting: only while no row is held.
func (d *dueCounts) reset(cursorMs int64) { d.cursor = cursorMs }

// countDue adds delta to the counts of held row r when it is due at or before the cursor.
func (c *Core) countDue(r *rowstore.Rec, delta int32) {
	if r.Due() > c.due.cursor {
		return
	}
	c.due.slot[r.Slot] += delta
	switch c.slots[r.Slot] {
	case SlotOwned:
		c.due.route[r.Route] += delta
	case SlotIncoming:
		c.due.routeIncoming[r.Route] += delta
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
			r := c.rows.At(e.ID())
			c.due.slot[r.Slot] += d
			c.due.routeIncoming[r.Route] += d
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
func (c *Core) Summary(now time.Time) summary.Summary {
	sc := c.CountSummary(now)
	return sc.Build()
}

// SummaryCounts is a summary as counted from the core: the figures without the maps, which
// Build makes from the copied counts (the shard does that after releasing its lock).
type SummaryCounts struct {
	summary.Summary
	slotDue   [schedule.NumSlots]int32
	slotState [schedule.NumSlots]SlotState
	walked    [schedule.NumSlots]bool
	routeDue  []int32
	routes    []string
}

// CountSummary counts the summary at now: everything but building the maps.
func (c *Core) CountSummary(now time.Time) SummaryCounts {
	nowMs := now.UnixMilli()
	c.Drain(math.MaxInt) // the figures count the trees' rows: departed ones go first
	c.expireLeases(nowMs)
	if c.rows.Len() == 0 {
		c.due.reset(nowMs)
	} else {
		c.moveCursor(nowMs)
	}
	sc := SummaryCounts{
		Summary: summary.Summary{AsOf: now, Held: c.rows.Len(), Invalid: len(c.invalid), Leased: c.leases.Len() - c.leases.Holds(),
			HeldBack: c.heldBackDue(&c.due.slot, nowMs)},
		slotDue:   c.due.slot,
		slotState: c.slots,
		walked:    c.walked,
		routeDue:  slices.Clone(c.due.route),
		routes:    c.routes[:len(c.routes):len(c.routes)], // routes are only ever appended
	}
	s := &sc.Summary
	groups := make([]summary.Group, 0, len(c.groups))
	c.allFenced = c.everyOwnedRowFenced(nowMs) // waitingSince's claimHead holds no row back then
	for _, g := range c.groups {
		s.HeldIncoming += c.trees.Len(&g.incoming)
		groups = append(groups, summary.Group{CadenceMs: g.cadenceMs, Source: g.source, Owned: &g.owned,
			WaitingSinceMs: c.waitingSince(g, nowMs)})
	}
	c.allFenced = false
	summary.Count(s, c.trees, nowMs, groups, func(id uint32) string { return string(c.rows.Key(c.rows.At(id))) })
	return sc
}

// Walked says whether slot s had been read by a finished walk since it joined, as of the counts.
func (sc *SummaryCounts) Walked(s int) bool { return sc.walked[s] }

// Build builds the summary's maps from the counts.
func (sc *SummaryCounts) Build() summary.Summary {
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

// waitingSince is since when non-urgent group g has had claimable due rows at nowMs and no claim
// (the later of its last claim and its most overdue claimable row's due time), in Unix
// milliseconds; 0 when it has none, or is urgent.
func (c *Core) waitingSince(g *group, nowMs int64) int64 {
	if g.urgent {
		return 0
	}
	e, ok := c.claimHead(g, nowMs)
	if !ok {
		return 0
	}
	due := c.rows.At(e.ID()).Due()
	if due > nowMs {
		return 0
	}
	return max(due, g.lastClaimMs)
}
