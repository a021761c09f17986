package core

import (
	"fmt"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/duetree"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/rowstore"
)

// Freshness objectives (policy.Objective): the core counts, per objective, the events of the rows
// of its owned slots. An event is one due time d of one row (a version: a write that moves the
// due time, or a completion, starts the next), decided at most once, with X = d + MaxLateness:
//
//   - a completion under a lease decides it: good when the lease was granted before X (the render
//     started in time: within MaxLateness, to the millisecond), late otherwise;
//   - the crossing of X decides it late when no render of it had started before X (the row is not
//     leased, or leased by a lease granted at or after X): ObjectivesCatchUp moves a cursor per
//     objective to now − MaxLateness and visits the rows whose due time it passes, in due order
//     from the trees (so it costs time in those rows only), as CatchUp does for the due counts;
//   - a row being rendered at X is decided by that render: good when it completes, late when its
//     lease ends without a completion (released, expired, refused because the row changed, a
//     hold lifted);
//   - a version applied behind the cursor (due so far back that X has passed and been visited:
//     a producer's write, a row a walk found that events had missed) is decided late at once
//     unless a render of it had started by X;
//   - a version replaced or removed (a producer's write, a delete, a drop beyond the window, its
//     slot leaving) after X but before its crossing was visited is decided late if it was not
//     being rendered at X (not leased, or leased by a lease granted after X); one replaced while
//     a render that started by X is still in progress, undecided, is not counted: the write made
//     it another event.
//
// The flag flagDecided marks a version decided (one bit: a row counts for at most one objective,
// policy.ValidateObjectives). A lease handed over with its slot (ImportLeases) is completed here
// without knowing when it was granted: the completion time stands in for it. Counts start when
// an objective is set (SetObjectives): the events whose X is at or before then are not counted,
// however they end (a keeper that starts with a backlog does not count again what the keeper
// before it counted); a changed definition starts again from 0.

// objState is one objective's counting.
type objState struct {
	o     policy.Objective
	maxMs int64
	// cursor: the crossings of the rows due at or before it are decided (it is the last
	// ObjectivesCatchUp's now − MaxLateness).
	cursor int64
	// from is the cursor when counting began: the events with X at or before the objective was
	// set are not counted, however they end.
	from       int64
	good, late uint64
	since      time.Time
}

// ObjectiveCount is what the core counted for one objective since Since.
type ObjectiveCount struct {
	Name       string
	Good, Late uint64
	Since      time.Time
}

// SetObjectives sets the objectives the core counts from now. An objective with the same
// definition as one counted before keeps its counts; any other starts from 0 at now.
func (c *Core) SetObjectives(now time.Time, objs []policy.Objective) error {
	if err := policy.ValidateObjectives(objs); err != nil {
		return fmt.Errorf("keeper objectives: %w", err)
	}
	nowMs := now.UnixMilli()
	next := make([]objState, len(objs))
	for i, o := range objs {
		from := nowMs - o.MaxLateness.Milliseconds()
		next[i] = objState{o: o, maxMs: o.MaxLateness.Milliseconds(), cursor: from, from: from, since: now.UTC()}
		for _, p := range c.objs {
			if p.o.SameAs(o) {
				next[i] = p
			}
		}
	}
	c.objs = next
	for _, g := range c.groups {
		g.obj = c.objectiveOf(g)
	}
	return nil
}

// objectiveOf returns the index of g's objective, or -1.
func (c *Core) objectiveOf(g *group) int {
	for i := range c.objs {
		if c.objs[i].o.Matches(time.Duration(g.cadenceMs)*time.Millisecond, g.source, g.urgent) {
			return i
		}
	}
	return -1
}

// ObjectiveCounts returns the counts of the objectives, in their order.
func (c *Core) ObjectiveCounts() []ObjectiveCount {
	out := make([]ObjectiveCount, len(c.objs))
	for i, s := range c.objs {
		out[i] = ObjectiveCount{Name: s.o.Name, Good: s.good, Late: s.late, Since: s.since}
	}
	return out
}

// ObjectivesCatchUp moves every objective's cursor toward now − MaxLateness, deciding late the
// rows whose due time it passes that are not leased, visiting at most about maxRows rows (more
// only when more come due in one millisecond), and reports whether every cursor arrived. The
// shard calls it in steps, releasing its lock between them, every second and before applying
// writes (a version replaced after X is still decided, but its crossing is not visited in due
// order then).
func (c *Core) ObjectivesCatchUp(now time.Time, maxRows int) bool {
	nowMs := now.UnixMilli()
	done := true
	for i := range c.objs {
		s := &c.objs[i]
		target := nowMs - s.maxMs
		if target <= s.cursor {
			continue
		}
		to := target
		if n := c.objCrossing(i, s.cursor, to); n > maxRows {
			// the farthest step toward target that crosses at most maxRows rows (at least 1 ms)
			lo, hi := s.cursor+1, target
			for lo+1 < hi {
				m := lo + (hi-lo)/2
				if c.objCrossing(i, s.cursor, m) <= maxRows {
					lo = m
				} else {
					hi = m
				}
			}
			to, done = lo, false
		}
		c.objVisit(i, s.cursor, to)
		s.cursor = to
	}
	return done
}

// objCrossing counts the owned rows of objective i's groups due in (a, b].
func (c *Core) objCrossing(i int, a, b int64) int {
	n := 0
	for _, g := range c.groups {
		if g.obj == i {
			n += c.trees.Rank(&g.owned, b) - c.trees.Rank(&g.owned, a)
		}
	}
	return n
}

// objVisit decides late the owned rows of objective i's groups due in (a, b] that are neither
// leased nor decided.
func (c *Core) objVisit(i int, a, b int64) {
	s := &c.objs[i]
	for _, g := range c.groups {
		if g.obj != i {
			continue
		}
		c.trees.Visit(&g.owned, c.trees.Rank(&g.owned, a), c.trees.Rank(&g.owned, b), func(e duetree.Entry) {
			// (a departed row is not the shard's: its version ended when its slot left)
			if r := c.rows.At(e.ID()); c.slots[r.Slot] != SlotNone && !r.Has(flagDecided) && !c.renderingAt(e.ID(), r, r.Due()+s.maxMs) {
				r.Set(flagDecided)
				s.late++
			}
		})
	}
}

// renderingAt reports whether held record id (r) is leased by a lease granted before xMs (one
// granted at an unknown time, handed over or a hold, counts as granted before). Before, not at:
// whether a claim in the millisecond of X came before the crossing's visit must not matter.
func (c *Core) renderingAt(id uint32, r *rowstore.Rec, xMs int64) bool {
	if !r.Has(flagLeased) {
		return false
	}
	l, ok := c.leases.Get(id)
	return !ok || l.Since == 0 || l.Since < xMs
}

// objOf returns the state of the objective of held row r in an owned slot, or nil.
func (c *Core) objOf(r *rowstore.Rec) *objState {
	if len(c.objs) == 0 || c.slots[r.Slot] != SlotOwned {
		return nil
	}
	if i := c.groups[r.Group].obj; i >= 0 {
		return &c.objs[i]
	}
	return nil
}

// objCompleted decides row r's event at its completion at nowMs under a lease granted at sinceMs
// (0: not known, a handed-over lease: nowMs stands in).
func (c *Core) objCompleted(nowMs, sinceMs int64, r *rowstore.Rec) {
	s := c.objOf(r)
	if s == nil || r.Has(flagDecided) || r.Due() <= s.from {
		return
	}
	r.Set(flagDecided)
	if sinceMs == 0 {
		sinceMs = nowMs
	}
	if sinceMs-r.Due() < s.maxMs {
		s.good++
	} else {
		s.late++
	}
}

// objLeaseEnded decides late row r, whose lease ended without a completion, when its crossing
// was visited while it was leased.
func (c *Core) objLeaseEnded(r *rowstore.Rec) {
	if s := c.objOf(r); s != nil && !r.Has(flagDecided) && r.Due() > s.from && r.Due() <= s.cursor {
		r.Set(flagDecided)
		s.late++
	}
}

// objPlaced decides record id's new version (r), applied at a due time whose crossing the cursor
// has passed already (a write that made the row due further back than MaxLateness, a row a walk
// found that events had missed): late when no render of it had started by X.
func (c *Core) objPlaced(id uint32, r *rowstore.Rec) {
	if s := c.objOf(r); s != nil && r.Due() > s.from && r.Due() <= s.cursor && !c.renderingAt(id, r, r.Due()+s.maxMs) {
		r.Set(flagDecided)
		s.late++
	}
}

// objVersionEnds decides record id's version, about to be replaced or removed at nowMs, when it
// passed X before its crossing was visited and was not being rendered then (renderingAt). It
// clears flagDecided for the next version.
func (c *Core) objVersionEnds(nowMs int64, id uint32, r *rowstore.Rec) {
	if s := c.objOf(r); s != nil && !r.Has(flagDecided) && r.Due() > s.cursor && r.Due()+s.maxMs <= nowMs &&
		!c.renderingAt(id, r, r.Due()+s.maxMs) {
		s.late++
	}
	r.Clear(flagDecided)
}
