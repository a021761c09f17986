package core

import (
	"math"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/duetree"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/lease"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/rowstore"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// Departed rows. When slots leave (SetSlots: a giver's commit gives a quarter of its rows away, a
// shard being removed all of them), their rows are gone at once for everything the core does and
// reports: they are not held (Held, lookups by key), claimed (claimHead removes one it meets at a
// tree's head), counted (summaries and Explain remove what is left first), nor leased (their
// leases end at the commit). But their records, keys and tree entries stay in place until Drain
// removes them, a bounded number per call, so that the commit costs time in the slots and leases,
// not in the rows held: under the shard's lock, removing millions of rows at once stalled every
// claim for as long (docs/benchmarks.md, BenchmarkCommit). Until removed, a departed row stays in
// the tree of the state its slot left from and counts in the due counts as it did then (so that
// removing it undoes exactly what placing it did); no report reads those counts before the last
// one has gone.

// drainScanPerRow bounds the records Drain looks at per row it may remove: a call costs time in
// maxRows even where few departed rows are left.
const drainScanPerRow = 16

// depart makes the rows of the slots that leave in states departed rows (SetSlots, under the old
// states): the freshness events they end are decided, their leases end, and they are counted for
// Drain. When every row held departs, everything is dropped at once instead (dropAll).
func (c *Core) depart(states *[schedule.NumSlots]SlotState) {
	leaving := func(s uint16) bool { return c.slots[s] != SlotNone && states[s] == SlotNone }
	c.objDepart(leaving)
	var ended []uint32
	c.leases.Each(func(l lease.Lease) {
		if leaving(c.rows.At(l.ID).Slot) {
			ended = append(ended, l.ID)
		}
	})
	for _, id := range ended {
		// the row keeps its leased marks (its tree entry is not claimable) until it goes
		c.leases.End(id)
	}
	for s := range c.slots {
		if leaving(uint16(s)) && c.slotHeld[s] > 0 {
			c.departedFrom[s] = c.slots[s]
			c.departed += int(c.slotHeld[s])
			if c.slots[s] == SlotOwned {
				c.departedOwned += int(c.slotHeld[s])
				c.departedDemand += c.slotDemand[s]
			}
		}
	}
	// the new departed rows may be anywhere: the walk starts again
	c.drainNext, c.drainTree, c.drainAt, c.drainKey = 0, 0, false, ""
	if c.departed == c.rows.Len() {
		c.dropAll()
	}
}

// objDepart decides the freshness events of the rows of owned slots that leave as removing them
// does (objVersionEnds at the last operation's time): those due after an objective's cursor whose
// X has passed. It visits only the rows due in that span (none once the shard has caught up).
func (c *Core) objDepart(leaving func(slot uint16) bool) {
	for i := range c.objs {
		s := &c.objs[i]
		lo, hi := s.cursor, c.opNowMs-s.maxMs
		if hi <= lo {
			continue
		}
		for _, g := range c.groups {
			if g.obj != i {
				continue
			}
			c.trees.Visit(&g.owned, c.trees.Rank(&g.owned, lo), c.trees.Rank(&g.owned, hi), func(e duetree.Entry) {
				if r := c.rows.At(e.ID()); leaving(r.Slot) {
					c.objVersionEnds(c.opNowMs, e.ID(), r)
				}
			})
		}
	}
}

// dropAll drops every held row at once, all of them departed: a new store and forest, every count
// zero. The leases have ended already (depart).
func (c *Core) dropAll() {
	c.rows = rowstore.New()
	c.trees = duetree.NewForest((*treeRecords)(c))
	for _, g := range c.groups {
		g.owned, g.incoming = duetree.Tree{}, duetree.Tree{}
	}
	c.slotHeld = [schedule.NumSlots]int32{}
	c.due.slot = [schedule.NumSlots]int32{}
	clear(c.due.route)
	clear(c.due.routeIncoming)
	c.unleasing = noRecord
	c.departed = 0
	c.endDrain()
}

// Draining says whether departed rows are left for Drain to remove.
func (c *Core) Draining() bool { return c.departed > 0 }

// Drain removes up to maxRows departed rows (the rows of slots that left: see SetSlots), looking
// at no more than drainScanPerRow entries or records per row, and reports whether none are left.
// The service calls it in steps after a commit that gives slots away, releasing its lock between
// them, and before a summary or an Explain, which remove what is left first.
//
// It walks the trees in their order, a window of entries at a time, and removes the departed rows
// among them: consecutive removals then descend to the same or the next leaf, in the CPU's caches,
// where removals in the records' order each missed on a leaf of their own (twice the time at 10M
// rows). Departed rows do not move, so one walk of each tree meets every one of them; the records
// are looked at after the walk only if some are left (they are not: it is a safety net).
func (c *Core) Drain(maxRows int) bool {
	if c.departed == 0 {
		return true
	}
	budget := maxRows
	if budget < math.MaxInt/drainScanPerRow {
		budget *= drainScanPerRow
	}
	removed := 0
	for c.departed > 0 && removed < maxRows && budget > 0 && c.drainTree < 2*len(c.groups) {
		n, visited := c.drainWindow(min(maxRows-removed, budget))
		if visited == 0 {
			c.drainTree++ // walked to its end
			c.drainAt = false
			continue
		}
		budget -= visited
		removed += n
	}
	ids := c.rows.IDs()
	for ; c.departed > 0 && c.drainNext < ids && removed < maxRows && budget > 0; budget-- {
		// left after the trees' walk (none, unless the bookkeeping is off): the records, in order
		id := c.drainNext
		c.drainNext++
		if r := c.rows.At(id); r.Has(rowstore.Held) && c.slots[r.Slot] == SlotNone {
			c.removeDeparted(id, r)
			removed++
		}
	}
	if c.departed > 0 && (c.drainTree < 2*len(c.groups) || c.drainNext < ids) {
		return false
	}
	// every tree walked and every record looked at: none is left (departed counts what there is
	// to find)
	c.departed = 0
	c.endDrain()
	return true
}

// drainVisit is the most entries one window of Drain's walk reads.
const drainVisit = 256

// drainWindow removes the departed rows among the next up to min(max, drainVisit) entries of the
// tree Drain walks (drainTree), from where it got to (after drainDue, drainKey), and returns how
// many it removed and how many entries it read: none when the walk of that tree is at its end.
func (c *Core) drainWindow(max int) (removed, visited int) {
	g := c.groups[c.drainTree/2]
	t := &g.owned
	if c.drainTree%2 == 1 {
		t = &g.incoming
	}
	start := 0
	if c.drainAt {
		// the entries at or before the last one the walk read (it may have gone since: its due
		// and key, not its record, say where it was)
		start, _ = c.trees.Prefix(t, func(e duetree.Entry) bool {
			r := c.rows.At(e.ID())
			if d := r.Due(); d != c.drainDue {
				return d < c.drainDue
			}
			return string(c.rows.Key(r)) <= c.drainKey
		})
	}
	end := min(c.trees.Len(t), start+min(max, drainVisit))
	if start >= end {
		return 0, 0
	}
	var window [drainVisit]duetree.Entry
	es := window[:0]
	c.trees.Visit(t, start, end, func(e duetree.Entry) { es = append(es, e) })
	var slots [drainVisit]uint16
	for i, e := range es { // the records first, their misses overlapping
		slots[i] = c.rows.At(e.ID()).Slot
	}
	var batch [drainVisit]uint32
	n := 0
	for i, e := range es {
		if c.slots[slots[i]] == SlotNone {
			batch[n] = e.ID()
			n++
		}
	}
	last := c.rows.At(es[len(es)-1].ID())
	c.drainAt, c.drainDue, c.drainKey = true, last.Due(), string(c.rows.Key(last))
	c.prefetched += c.rows.PrefetchRemove(n, func(i int) uint32 { return batch[i] })
	for _, id := range batch[:n] {
		c.removeDeparted(id, c.rows.At(id))
	}
	return n, len(es)
}

// endDrain forgets the departed rows' bookkeeping once none are left.
func (c *Core) endDrain() {
	for s, from := range c.departedFrom {
		if from != SlotNone {
			c.slotDemand[s] = 0 // what the float sums left
		}
	}
	c.departedFrom = [schedule.NumSlots]SlotState{}
	c.drainNext, c.drainTree, c.drainAt, c.drainKey = 0, 0, false, ""
	c.departedOwned, c.departedDemand = 0, 0
}

// removeDeparted removes departed record id (r): out of its tree (a pending entry is left to go
// stale) and the counts it is in as its slot's state was when it left, and out of the store.
func (c *Core) removeDeparted(id uint32, r *rowstore.Rec) {
	from := c.departedFrom[r.Slot]
	if r.Has(flagPending) {
		r.Clear(flagPending)
	} else {
		c.trees.Delete(c.treeOf(r), makeEntry(id, r))
	}
	if r.Due() <= c.due.cursor {
		c.due.slot[r.Slot]--
		if from == SlotOwned {
			c.due.route[r.Route]--
		} else {
			c.due.routeIncoming[r.Route]--
		}
	}
	perMs := c.groups[r.Group].perMs
	c.slotDemand[r.Slot] -= perMs
	if from == SlotOwned {
		c.departedOwned--
		c.departedDemand -= perMs
	}
	c.slotHeld[r.Slot]--
	c.departed--
	c.rows.Remove(id)
	if c.departed == 0 {
		c.endDrain()
	}
}

// find returns the record holding key when the core holds it: not a departed row's.
func (c *Core) find(key string) (uint32, bool) { return c.held(c.rows.Find(key)) }

// findFrom is find with a guess (rowstore.Store.FindFrom).
func (c *Core) findFrom(key string, guess uint32) (uint32, bool) {
	return c.held(c.rows.FindFrom(key, guess))
}

// held passes on a record the store found (id, ok) unless it is a departed row's.
func (c *Core) held(id uint32, ok bool) (uint32, bool) {
	if ok && c.isDeparted(c.rows.At(id)) {
		return 0, false
	}
	return id, ok
}

// isDeparted says whether held row r is a departed row: its slot left, and Drain has not removed
// it yet.
func (c *Core) isDeparted(r *rowstore.Rec) bool {
	return c.departed > 0 && c.slots[r.Slot] == SlotNone
}
