package keeper

import "bytes"

// A group's claim heap is a 4-ary min-heap of entries (due second << 32 | record id), ordered by
// due then key: earliest due first, which within one (cadence, source, urgent) group is exactly
// highest score first. Entries carry the due second so most comparisons touch only the heap; ties
// within a second read the records. Every record in a heap knows its position (rec.heapIdx), so
// a row leaves its heap exactly when it is claimed, moved or dropped: no stale entries.

const heapArity = 4

func heapEntry(id uint32, due int64) uint64 { return uint64(due/1000)<<32 | uint64(id) }

func entryID(e uint64) uint32 { return uint32(e) }

// less orders two heap entries by due, then key.
func (c *Core) less(a, b uint64) bool {
	if sa, sb := a>>32, b>>32; sa != sb {
		return sa < sb
	}
	ra, rb := c.rows.at(entryID(a)), c.rows.at(entryID(b))
	if ra.due != rb.due {
		return ra.due < rb.due
	}
	return bytes.Compare(c.keys.get(ra.keyOff), c.keys.get(rb.keyOff)) < 0
}

func (c *Core) heapSet(g *group, i int, e uint64) {
	g.heap[i] = e
	c.rows.at(entryID(e)).heapIdx = int32(i)
}

func (c *Core) heapPush(g *group, id uint32) {
	r := c.rows.at(id)
	g.heap = append(g.heap, 0)
	c.heapUp(g, len(g.heap)-1, heapEntry(id, r.due))
}

// heapUp places e at i or above.
func (c *Core) heapUp(g *group, i int, e uint64) {
	for i > 0 {
		p := (i - 1) / heapArity
		if !c.less(e, g.heap[p]) {
			break
		}
		c.heapSet(g, i, g.heap[p])
		i = p
	}
	c.heapSet(g, i, e)
}

// heapDown places e at i or below.
func (c *Core) heapDown(g *group, i int, e uint64) {
	n := len(g.heap)
	for {
		first := i*heapArity + 1
		if first >= n {
			break
		}
		best := first
		last := min(first+heapArity, n)
		for j := first + 1; j < last; j++ {
			if c.less(g.heap[j], g.heap[best]) {
				best = j
			}
		}
		if !c.less(g.heap[best], e) {
			break
		}
		c.heapSet(g, i, g.heap[best])
		i = best
	}
	c.heapSet(g, i, e)
}

// heapRemove takes the record id out of its group's heap.
func (c *Core) heapRemove(g *group, id uint32) {
	r := c.rows.at(id)
	i := int(r.heapIdx)
	r.heapIdx = -1
	last := len(g.heap) - 1
	e := g.heap[last]
	g.heap = g.heap[:last]
	if i == last {
		return
	}
	if i > 0 && c.less(e, g.heap[(i-1)/heapArity]) {
		c.heapUp(g, i, e)
	} else {
		c.heapDown(g, i, e)
	}
}

// heapPeek returns the group's first record, or false when the heap is empty.
func (g *group) heapPeek() (uint32, bool) {
	if len(g.heap) == 0 {
		return 0, false
	}
	return entryID(g.heap[0]), true
}

// heapFix restores the heap order after the due time of the record id (in g's heap) changed.
func (c *Core) heapFix(g *group, id uint32) {
	r := c.rows.at(id)
	i := int(r.heapIdx)
	e := heapEntry(id, r.due)
	if i > 0 && c.less(e, g.heap[(i-1)/heapArity]) {
		c.heapUp(g, i, e)
	} else {
		c.heapDown(g, i, e)
	}
}
