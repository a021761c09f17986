package core

import (
	"bytes"
	"slices"
)

// Each group keeps its held rows in two order-statistic B+trees: one for the rows of owned slots
// (claimed and counted) and one for the rows of incoming slots (held only). A tree orders its
// entries by due time, then key — within one (cadence, source, urgent) group that is exactly
// claim order (highest score first) — and every inner node knows, for each child, how many
// entries its subtree holds and how many of them are claimable (not leased). One structure so
// serves both the claims and the status:
//
//   - the first claimable entry is found in O(height) by skipping subtrees without claimable
//     entries, so leased rows stay in place (counted as due) without slowing claims;
//   - rank (how many rows are due at or before t) and select (the k-th row by due time) take
//     O(height), so the status counts, coming-due bins and lateness percentiles are exact without
//     visiting every row (summary.go).
//
// An entry is (due time in 16 ms steps << 26 | leased bit << 25 | record id). Entries compare by
// that step, then (reading the records, only for rows due within the same 16 ms) by due
// millisecond, then key, so most comparisons touch only the tree.
// Separators in inner nodes are the exact first entry of each child, so they always name a live
// record (their leased bits mean nothing). Nodes live in chunked pools without pointers (nothing for the garbage collector to
// trace); leaves hold up to 64 entries (≈ 0.7 full on random inserts: ≈ 11 bytes per row).

const (
	leafCap   = 64
	innerCap  = 64
	leasedBit = 1 << idBits
	// dueShift places the due step above the leased bit; dueStepBits is the step (16 ms): 38 bits
	// of 16 ms steps reach past 2106.
	dueShift    = idBits + 1
	dueStepBits = 4
	// maxHeight bounds the inner levels: merges keep nodes at least a quarter full on average,
	// and MaxRows entries need far fewer levels.
	maxHeight = 12
	poolChunk = 256 // nodes per pool chunk
)

type leaf struct {
	n int32
	e [leafCap]uint64
}

type inner struct {
	n     int32
	sep   [innerCap]uint64 // first entry of each child
	child [innerCap]uint32
	cnt   [innerCap]uint32 // entries in each child's subtree
	clm   [innerCap]uint32 // claimable (not leased) entries in each child's subtree
}

// nodePool allocates the nodes of every tree of a core.
type nodePool struct {
	leaves    [][]leaf
	leafFree  []uint32
	leafN     uint32
	inners    [][]inner
	innerFree []uint32
	innerN    uint32
}

func (p *nodePool) leaf(i uint32) *leaf   { return &p.leaves[i/poolChunk][i%poolChunk] }
func (p *nodePool) inner(i uint32) *inner { return &p.inners[i/poolChunk][i%poolChunk] }

func (p *nodePool) newLeaf() uint32 {
	if k := len(p.leafFree); k > 0 {
		i := p.leafFree[k-1]
		p.leafFree = p.leafFree[:k-1]
		return i
	}
	if p.leafN%poolChunk == 0 {
		p.leaves = append(p.leaves, make([]leaf, poolChunk))
	}
	p.leafN++
	return p.leafN - 1
}

func (p *nodePool) newInner() uint32 {
	if k := len(p.innerFree); k > 0 {
		i := p.innerFree[k-1]
		p.innerFree = p.innerFree[:k-1]
		return i
	}
	if p.innerN%poolChunk == 0 {
		p.inners = append(p.inners, make([]inner, poolChunk))
	}
	p.innerN++
	return p.innerN - 1
}

func (p *nodePool) freeLeaf(i uint32) {
	*p.leaf(i) = leaf{}
	p.leafFree = append(p.leafFree, i)
}

func (p *nodePool) freeInner(i uint32) {
	*p.inner(i) = inner{}
	p.innerFree = append(p.innerFree, i)
}

// tree is one order-statistic B+tree of entries.
type tree struct {
	root   uint32
	height int // inner levels above the leaves; meaningful when n > 0
	n      int // entries
	clm    int // claimable entries
	// the first claimable entry and the path to it, cached until the tree changes
	headOK bool
	head   uint64
	hpath  [maxHeight + 1]uint16 // child index at each inner level (root first), then the leaf position
	hnodes [maxHeight + 1]uint32 // the node at each level, root first; the last is the leaf
	// pending holds entries placed in bulk mode (Core.BeginBulk), not yet in the tree: appended
	// unsorted, built into the tree (sorted, leaves packed) before the tree is next read. An entry
	// whose record was unplaced meanwhile is stale and dropped then (see pendingValid).
	pending []uint64
}

func makeEntry(id uint32, r *rec) uint64 {
	e := uint64(r.due()>>dueStepBits)<<dueShift | uint64(id)
	if r.has(flagLeased) {
		e |= leasedBit
	}
	return e
}

func entryID(e uint64) uint32 { return uint32(e) & idMask }

func claimable(e uint64) uint32 {
	if e&leasedBit != 0 {
		return 0
	}
	return 1
}

// cmpEntry orders entries by due, then key; an entry equals only itself.
func (c *Core) cmpEntry(a, b uint64) int {
	if sa, sb := a>>dueShift, b>>dueShift; sa != sb {
		if sa < sb {
			return -1
		}
		return 1
	}
	ia, ib := entryID(a), entryID(b)
	if ia == ib {
		return 0
	}
	return c.cmpDueKey(ia, ib)
}

// cmpDueKey is the one tie-break of the core: held records a and b in due order, equal dues by
// key (bytes). It orders the trees, and so claims of equal score, the oldest row and everything
// else the core reports first.
func (c *Core) cmpDueKey(a, b uint32) int {
	ra, rb := c.rows.at(a), c.rows.at(b)
	if da, db := ra.due(), rb.due(); da != db {
		if da < db {
			return -1
		}
		return 1
	}
	return bytes.Compare(c.keys.get(ra.keyOff), c.keys.get(rb.keyOff))
}

// dueAtMost says whether entry e is due at or before tMs.
func (c *Core) dueAtMost(e uint64, tMs int64) bool {
	if tMs < 0 {
		return false
	}
	step, tstep := int64(e>>dueShift), tMs>>dueStepBits
	if step != tstep {
		return step < tstep
	}
	return c.rows.at(entryID(e)).due() <= tMs
}

// innerChild returns the child of in whose range holds e: the last child whose first entry is
// at or before e (the first child when e precedes them all).
func (c *Core) innerChild(in *inner, e uint64) int {
	lo, hi := 1, int(in.n) // find the first i ≥ 1 with sep[i] > e
	for lo < hi {
		m := (lo + hi) / 2
		if c.cmpEntry(in.sep[m], e) <= 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo - 1
}

// leafPos returns the position of the first entry of l not before e.
func (c *Core) leafPos(l *leaf, e uint64) int {
	lo, hi := 0, int(l.n)
	for lo < hi {
		m := (lo + hi) / 2
		if c.cmpEntry(l.e[m], e) < 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// nodeCounts returns the entries and claimable entries of a node at height h.
func (c *Core) nodeCounts(node uint32, h int) (cnt, clm uint32) {
	if h == 0 {
		l := c.pool.leaf(node)
		for _, e := range l.e[:l.n] {
			clm += claimable(e)
		}
		return uint32(l.n), clm
	}
	in := c.pool.inner(node)
	for i := range int(in.n) {
		cnt += in.cnt[i]
		clm += in.clm[i]
	}
	return cnt, clm
}

func (c *Core) nodeFirst(node uint32, h int) uint64 {
	if h == 0 {
		return c.pool.leaf(node).e[0]
	}
	return c.pool.inner(node).sep[0]
}

// tInsert adds entry e (not present) to t.
func (c *Core) tInsert(t *tree, e uint64) {
	t.headOK = false
	if t.n == 0 {
		t.root, t.height = c.pool.newLeaf(), 0
	}
	t.n++
	t.clm += int(claimable(e))
	split, right := c.insertRec(t.root, t.height, e)
	if !split {
		return
	}
	if t.height+1 > maxHeight {
		panic("keeper: claim tree too high")
	}
	old := t.root
	t.root = c.pool.newInner()
	in := c.pool.inner(t.root)
	in.n = 2
	in.child[0], in.child[1] = old, right
	in.sep[0], in.sep[1] = c.nodeFirst(old, t.height), c.nodeFirst(right, t.height)
	in.cnt[0], in.clm[0] = c.nodeCounts(old, t.height)
	in.cnt[1], in.clm[1] = c.nodeCounts(right, t.height)
	t.height++
}

// insertRec inserts e below node (height h). When node splits it returns its new right sibling.
func (c *Core) insertRec(node uint32, h int, e uint64) (bool, uint32) {
	if h == 0 {
		l := c.pool.leaf(node)
		p := c.leafPos(l, e)
		if l.n < leafCap {
			copy(l.e[p+1:l.n+1], l.e[p:l.n])
			l.e[p] = e
			l.n++
			return false, 0
		}
		ri := c.pool.newLeaf()
		l = c.pool.leaf(node) // the pool may have grown
		r := c.pool.leaf(ri)
		half := int32(leafCap / 2)
		copy(r.e[:], l.e[half:])
		r.n = leafCap - half
		l.n = half
		clear(l.e[half:])
		if p <= int(half) {
			copy(l.e[p+1:l.n+1], l.e[p:l.n])
			l.e[p] = e
			l.n++
		} else {
			p -= int(half)
			copy(r.e[p+1:r.n+1], r.e[p:r.n])
			r.e[p] = e
			r.n++
		}
		return true, ri
	}
	in := c.pool.inner(node)
	i := c.innerChild(in, e)
	if h == 1 && c.pool.leaf(in.child[i]).n == leafCap && c.shareLeaf(in, i) {
		i = c.innerChild(in, e) // e may now belong to the neighbour
	}
	split, right := c.insertRec(in.child[i], h-1, e)
	in = c.pool.inner(node)
	if c.cmpEntry(e, in.sep[i]) < 0 {
		in.sep[i] = e
	}
	if !split {
		in.cnt[i]++
		in.clm[i] += claimable(e)
		return false, 0
	}
	in.cnt[i], in.clm[i] = c.nodeCounts(in.child[i], h-1)
	rc, rclm := c.nodeCounts(right, h-1)
	rsep := c.nodeFirst(right, h-1)
	if in.n < innerCap {
		c.innerInsertAt(in, i+1, right, rsep, rc, rclm)
		return false, 0
	}
	ni := c.pool.newInner()
	in = c.pool.inner(node)
	r := c.pool.inner(ni)
	half := int32(innerCap / 2)
	copy(r.sep[:], in.sep[half:])
	copy(r.child[:], in.child[half:])
	copy(r.cnt[:], in.cnt[half:])
	copy(r.clm[:], in.clm[half:])
	r.n = innerCap - half
	in.n = half
	clear(in.sep[half:])
	clear(in.child[half:])
	clear(in.cnt[half:])
	clear(in.clm[half:])
	if i+1 <= int(half) {
		c.innerInsertAt(in, i+1, right, rsep, rc, rclm)
	} else {
		c.innerInsertAt(r, i+1-int(half), right, rsep, rc, rclm)
	}
	return true, ni
}

// shareLeaf moves entries from the full leaf child i of in to a neighbour with room, so leaves
// split less often and stay fuller (about 0.8 full on random inserts instead of 0.7). It reports
// whether it moved any.
func (c *Core) shareLeaf(in *inner, i int) bool {
	const room = leafCap / 8
	l := c.pool.leaf(in.child[i])
	if i+1 < int(in.n) {
		if r := c.pool.leaf(in.child[i+1]); r.n <= leafCap-room {
			k := (leafCap - r.n) / 2
			moved := l.e[l.n-k : l.n]
			copy(r.e[k:r.n+k], r.e[:r.n])
			copy(r.e[:k], moved)
			clm := uint32(0)
			for _, e := range moved {
				clm += claimable(e)
			}
			clear(moved)
			l.n -= k
			r.n += k
			in.cnt[i] -= uint32(k)
			in.clm[i] -= clm
			in.cnt[i+1] += uint32(k)
			in.clm[i+1] += clm
			in.sep[i+1] = r.e[0]
			return true
		}
	}
	if i > 0 {
		if left := c.pool.leaf(in.child[i-1]); left.n <= leafCap-room {
			k := (leafCap - left.n) / 2
			clm := uint32(0)
			for _, e := range l.e[:k] {
				clm += claimable(e)
			}
			copy(left.e[left.n:left.n+k], l.e[:k])
			copy(l.e[:], l.e[k:l.n])
			clear(l.e[l.n-k : l.n])
			l.n -= k
			left.n += k
			in.cnt[i] -= uint32(k)
			in.clm[i] -= clm
			in.cnt[i-1] += uint32(k)
			in.clm[i-1] += clm
			in.sep[i] = l.e[0]
			return true
		}
	}
	return false
}

func (c *Core) innerInsertAt(in *inner, i int, child uint32, sep uint64, cnt, clm uint32) {
	n := int(in.n)
	copy(in.sep[i+1:n+1], in.sep[i:n])
	copy(in.child[i+1:n+1], in.child[i:n])
	copy(in.cnt[i+1:n+1], in.cnt[i:n])
	copy(in.clm[i+1:n+1], in.clm[i:n])
	in.sep[i], in.child[i], in.cnt[i], in.clm[i] = sep, child, cnt, clm
	in.n++
}

func (c *Core) innerRemoveAt(in *inner, i int) {
	n := int(in.n)
	copy(in.sep[i:], in.sep[i+1:n])
	copy(in.child[i:], in.child[i+1:n])
	copy(in.cnt[i:], in.cnt[i+1:n])
	copy(in.clm[i:], in.clm[i+1:n])
	in.n--
	in.sep[n-1], in.child[n-1], in.cnt[n-1], in.clm[n-1] = 0, 0, 0, 0
}

// tDelete removes entry e (present, compared by due and key; its leased bit may differ) from t.
func (c *Core) tDelete(t *tree, e uint64) {
	t.headOK = false
	gone := c.deleteRec(t.root, t.height, e)
	t.n--
	t.clm -= int(claimable(gone))
	if t.n == 0 {
		c.freeNode(t.root, t.height)
		t.root, t.height = 0, 0
		return
	}
	for t.height > 0 && c.pool.inner(t.root).n == 1 {
		old := t.root
		t.root = c.pool.inner(old).child[0]
		c.pool.freeInner(old)
		t.height--
	}
}

func (c *Core) freeNode(node uint32, h int) {
	if h == 0 {
		c.pool.freeLeaf(node)
	} else {
		c.pool.freeInner(node)
	}
}

// deleteRec removes e below node (height h) and returns the entry as it was stored.
func (c *Core) deleteRec(node uint32, h int, e uint64) uint64 {
	if h == 0 {
		l := c.pool.leaf(node)
		p := c.leafPos(l, e)
		if p >= int(l.n) || entryID(l.e[p]) != entryID(e) {
			panic("keeper: deleting an entry the claim tree does not hold")
		}
		gone := l.e[p]
		copy(l.e[p:], l.e[p+1:l.n])
		l.n--
		l.e[l.n] = 0
		return gone
	}
	in := c.pool.inner(node)
	i := c.innerChild(in, e)
	gone := c.deleteRec(in.child[i], h-1, e)
	in = c.pool.inner(node)
	in.cnt[i]--
	in.clm[i] -= claimable(gone)
	child := in.child[i]
	if in.cnt[i] == 0 {
		c.freeNode(child, h-1)
		c.innerRemoveAt(in, i)
		return gone
	}
	in.sep[i] = c.nodeFirst(child, h-1)
	c.maybeMerge(in, i, h-1)
	return gone
}

// maybeMerge merges child i of in (at height h) with a neighbour when it is under a quarter full
// and the two fit in three quarters of a node.
func (c *Core) maybeMerge(in *inner, i, h int) {
	capacity := leafCap
	size := func(node uint32) int { return int(c.pool.leaf(node).n) }
	if h > 0 {
		capacity = innerCap
		size = func(node uint32) int { return int(c.pool.inner(node).n) }
	}
	if size(in.child[i]) >= capacity/4 {
		return
	}
	var j int // merge child j+1 into child j
	switch {
	case i+1 < int(in.n) && size(in.child[i])+size(in.child[i+1]) <= capacity*3/4:
		j = i
	case i > 0 && size(in.child[i-1])+size(in.child[i]) <= capacity*3/4:
		j = i - 1
	default:
		return
	}
	a, b := in.child[j], in.child[j+1]
	if h == 0 {
		la, lb := c.pool.leaf(a), c.pool.leaf(b)
		copy(la.e[la.n:], lb.e[:lb.n])
		la.n += lb.n
		c.pool.freeLeaf(b)
	} else {
		ia, ib := c.pool.inner(a), c.pool.inner(b)
		n, m := int(ia.n), int(ib.n)
		copy(ia.sep[n:], ib.sep[:m])
		copy(ia.child[n:], ib.child[:m])
		copy(ia.cnt[n:], ib.cnt[:m])
		copy(ia.clm[n:], ib.clm[:m])
		ia.n += ib.n
		c.pool.freeInner(b)
	}
	in.cnt[j] += in.cnt[j+1]
	in.clm[j] += in.clm[j+1]
	c.innerRemoveAt(in, j+1)
}

// tSetLeased sets or clears the leased bit of entry e (present) in t.
// An entry already in the wanted state is left as it is.
func (c *Core) tSetLeased(t *tree, e uint64, leased bool) {
	c.flush(t)
	var path [maxHeight]*uint32 // the claimable count of each inner level's child on the way
	node := t.root
	for h := t.height; h > 0; h-- {
		in := c.pool.inner(node)
		i := c.innerChild(in, e)
		path[t.height-h] = &in.clm[i]
		node = in.child[i]
	}
	l := c.pool.leaf(node)
	p := c.leafPos(l, e)
	if p >= int(l.n) || entryID(l.e[p]) != entryID(e) {
		panic("keeper: leasing an entry the claim tree does not hold")
	}
	if (l.e[p]&leasedBit != 0) == leased {
		return
	}
	t.headOK = false
	d := uint32(1) // change of the claimable count (wrapping: +1 or −1)
	if leased {
		d = ^uint32(0)
		l.e[p] |= leasedBit
	} else {
		l.e[p] &^= leasedBit
	}
	for _, clm := range path[:t.height] {
		*clm += d
	}
	t.clm += int(int32(d))
}

// tHead returns t's first claimable entry.
func (c *Core) tHead(t *tree) (uint64, bool) {
	c.flush(t)
	if t.clm == 0 {
		return 0, false
	}
	if t.headOK {
		return t.head, true
	}
	node := t.root
	for h := t.height; h > 0; h-- {
		in := c.pool.inner(node)
		i := 0
		for in.clm[i] == 0 {
			i++
		}
		lvl := t.height - h
		t.hnodes[lvl], t.hpath[lvl] = node, uint16(i)
		node = in.child[i]
	}
	l := c.pool.leaf(node)
	p := 0
	for l.e[p]&leasedBit != 0 {
		p++
	}
	t.hnodes[t.height], t.hpath[t.height] = node, uint16(p)
	t.head, t.headOK = l.e[p], true
	return t.head, true
}

// tLeaseHead leases t's first claimable entry (tHead must have just returned it) and moves the
// cached head to the next claimable entry of the same leaf, if any.
func (c *Core) tLeaseHead(t *tree) {
	for lvl := 0; lvl < t.height; lvl++ {
		c.pool.inner(t.hnodes[lvl]).clm[t.hpath[lvl]]--
	}
	t.clm--
	l := c.pool.leaf(t.hnodes[t.height])
	p := int(t.hpath[t.height])
	l.e[p] |= leasedBit
	t.headOK = false
	for p++; p < int(l.n); p++ {
		if l.e[p]&leasedBit == 0 {
			t.head, t.headOK = l.e[p], true
			t.hpath[t.height] = uint16(p)
			return
		}
	}
}

// tFirst returns t's first entry.
func (c *Core) tFirst(t *tree) (uint64, bool) {
	c.flush(t)
	if t.n == 0 {
		return 0, false
	}
	return c.nodeFirst(t.root, t.height), true
}

// tRank returns the number of entries of t due at or before tMs.
func (c *Core) tRank(t *tree, tMs int64) int {
	c.flush(t)
	if t.n == 0 {
		return 0
	}
	node, rank := t.root, 0
	for h := t.height; h > 0; h-- {
		in := c.pool.inner(node)
		lo, hi := 0, int(in.n) // the first child whose first entry is due after tMs
		for lo < hi {
			m := (lo + hi) / 2
			if c.dueAtMost(in.sep[m], tMs) {
				lo = m + 1
			} else {
				hi = m
			}
		}
		if lo == 0 {
			return rank
		}
		for i := range lo - 1 {
			rank += int(in.cnt[i])
		}
		node = in.child[lo-1]
	}
	l := c.pool.leaf(node)
	lo, hi := 0, int(l.n)
	for lo < hi {
		m := (lo + hi) / 2
		if c.dueAtMost(l.e[m], tMs) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return rank + lo
}

// tRanks sets out[i] to the number of entries of t due at or before ts[i], for ascending ts, in
// one descent shared by all of them.
func (c *Core) tRanks(t *tree, ts []int64, out []int) {
	c.flush(t)
	clear(out[:len(ts)])
	if t.n > 0 {
		c.ranksRec(t.root, t.height, ts, out, 0)
	}
}

func (c *Core) ranksRec(node uint32, h int, ts []int64, out []int, base int) {
	if h == 0 {
		l := c.pool.leaf(node)
		p := 0
		for i, tMs := range ts {
			for p < int(l.n) && c.dueAtMost(l.e[p], tMs) {
				p++
			}
			out[i] = base + p
		}
		return
	}
	in := c.pool.inner(node)
	i, done := 0, base // child i is the last whose first entry is due at or before the threshold
	for j := 0; j < len(ts); {
		for i+1 < int(in.n) && c.dueAtMost(in.sep[i+1], ts[j]) {
			done += int(in.cnt[i])
			i++
		}
		if i == 0 && !c.dueAtMost(in.sep[0], ts[j]) {
			out[j] = base // due before everything below this node
			j++
			continue
		}
		// thresholds that fall into child i
		k := j + 1
		for k < len(ts) && (i+1 >= int(in.n) || !c.dueAtMost(in.sep[i+1], ts[k])) {
			k++
		}
		c.ranksRec(in.child[i], h-1, ts[j:k], out[j:k], done)
		j = k
	}
}

// tSelect returns t's entry at position k (0-based, k < t.n).
func (c *Core) tSelect(t *tree, k int) uint64 {
	c.flush(t)
	node := t.root
	for h := t.height; h > 0; h-- {
		in := c.pool.inner(node)
		i := 0
		for k >= int(in.cnt[i]) {
			k -= int(in.cnt[i])
			i++
		}
		node = in.child[i]
	}
	return c.pool.leaf(node).e[k]
}

// tVisit calls fn for t's entries at positions [lo, hi), in order. fn must not change t.
func (c *Core) tVisit(t *tree, lo, hi int, fn func(e uint64)) {
	c.flush(t)
	if lo < hi && t.n > 0 {
		c.visitRec(t.root, t.height, lo, hi, fn)
	}
}

func (c *Core) visitRec(node uint32, h, lo, hi int, fn func(e uint64)) {
	if h == 0 {
		l := c.pool.leaf(node)
		for _, e := range l.e[lo:hi] {
			fn(e)
		}
		return
	}
	in := c.pool.inner(node)
	off := 0
	for i := 0; i < int(in.n) && off < hi; i++ {
		n := int(in.cnt[i])
		if off+n > lo {
			c.visitRec(in.child[i], h-1, max(lo-off, 0), min(hi-off, n), fn)
		}
		off += n
	}
}

// flush builds t's pending entries into it: the valid ones sorted, merged with the entries the tree
// holds, and the tree rebuilt bottom-up with its nodes packed 7/8 full (room for later inserts).
func (c *Core) flush(t *tree) {
	if len(t.pending) == 0 {
		return
	}
	fresh := t.pending[:0]
	for _, e := range t.pending {
		if c.pendingValid(t, e) {
			fresh = append(fresh, makeEntry(entryID(e), c.rows.at(entryID(e)))) // the lease as it is now
		}
	}
	slices.SortFunc(fresh, c.cmpEntry)
	fresh = slices.CompactFunc(fresh, func(a, b uint64) bool { return entryID(a) == entryID(b) })
	for _, e := range fresh {
		c.rows.at(entryID(e)).clear(flagPending)
	}
	all := fresh
	if t.n > 0 {
		old := make([]uint64, 0, t.n)
		c.visitRec(t.root, t.height, 0, t.n, func(e uint64) { old = append(old, e) })
		c.freeTree(t.root, t.height)
		all = make([]uint64, 0, len(old)+len(fresh))
		i, j := 0, 0
		for i < len(old) || j < len(fresh) {
			if j == len(fresh) || (i < len(old) && c.cmpEntry(old[i], fresh[j]) < 0) {
				all = append(all, old[i])
				i++
			} else {
				all = append(all, fresh[j])
				j++
			}
		}
	}
	t.pending = nil
	c.build(t, all)
}

// pendingValid says whether pending entry e of t still stands for its record: the record is
// held, marked pending, belongs in t, and is due in e's step (its lease may have changed since).
func (c *Core) pendingValid(t *tree, e uint64) bool {
	r := c.rows.at(entryID(e))
	return r.has(flagHeld) && r.has(flagPending) && c.treeOf(r) == t && e&^leasedBit == makeEntry(entryID(e), r)&^leasedBit
}

// freeTree frees the nodes of a subtree.
func (c *Core) freeTree(node uint32, h int) {
	if h > 0 {
		in := c.pool.inner(node)
		for i := range int(in.n) {
			c.freeTree(in.child[i], h-1)
		}
	}
	c.freeNode(node, h)
}

// build makes t hold the sorted entries es (t's old nodes already freed).
func (c *Core) build(t *tree, es []uint64) {
	t.headOK = false
	t.n, t.clm = len(es), 0
	t.root, t.height = 0, 0
	if len(es) == 0 {
		return
	}
	const leafFill, innerFill = leafCap * 7 / 8, innerCap * 7 / 8
	type node struct {
		id       uint32
		first    uint64
		cnt, clm uint32
	}
	var level []node
	for lo := 0; lo < len(es); lo += leafFill {
		hi := min(lo+leafFill, len(es))
		if rest := len(es) - hi; rest > 0 && rest < leafCap/4 {
			hi = lo + (hi-lo+rest)/2 // no small last leaf: the last two share
		}
		id := c.pool.newLeaf()
		l := c.pool.leaf(id)
		l.n = int32(copy(l.e[:], es[lo:hi]))
		var clm uint32
		for _, e := range es[lo:hi] {
			clm += claimable(e)
		}
		t.clm += int(clm)
		level = append(level, node{id, es[lo], uint32(hi - lo), clm})
		lo = hi - leafFill
	}
	for len(level) > 1 {
		var up []node
		for lo := 0; lo < len(level); lo += innerFill {
			hi := min(lo+innerFill, len(level))
			if rest := len(level) - hi; rest > 0 && rest < innerCap/4 {
				hi = lo + (hi-lo+rest)/2
			}
			id := c.pool.newInner()
			in := c.pool.inner(id)
			n := node{id: id, first: level[lo].first}
			for i, ch := range level[lo:hi] {
				in.child[i], in.sep[i], in.cnt[i], in.clm[i] = ch.id, ch.first, ch.cnt, ch.clm
				n.cnt += ch.cnt
				n.clm += ch.clm
			}
			in.n = int32(hi - lo)
			up = append(up, n)
			lo = hi - innerFill
		}
		level = up
		t.height++
	}
	t.root = level[0].id
}
