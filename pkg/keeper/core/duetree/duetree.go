package duetree

import "slices"

// The layout of an entry: the record id in the low IDBits bits, the leased bit above it, and the
// due time in 16 ms steps above that.
const (
	// IDBits is the width of record ids: an id must be below 1<<IDBits.
	IDBits    = 25
	idMask    = 1<<IDBits - 1
	leasedBit = 1 << IDBits
	// dueShift places the due step above the leased bit; dueStepBits is the step (16 ms): 38 bits
	// of 16 ms steps reach past 2106.
	dueShift    = IDBits + 1
	dueStepBits = 4
)

const (
	leafCap  = 64
	innerCap = 64
	// maxHeight bounds the inner levels: merges keep nodes at least a quarter full on average,
	// and 1<<IDBits entries need far fewer levels.
	maxHeight = 12
	poolChunk = 256 // nodes per pool chunk
)

// Entry is one record's place in a tree: its due time (in 16 ms steps), whether it is leased and
// its id. Entries of the same step are ordered by Records.Compare.
type Entry uint64

// NewEntry returns the entry of record id (below 1<<IDBits), due at dueMs (ms since the Unix
// epoch, in [0, 2106)), leased or not.
func NewEntry(id uint32, dueMs int64, leased bool) Entry {
	e := Entry(dueMs>>dueStepBits)<<dueShift | Entry(id)
	if leased {
		e |= leasedBit
	}
	return e
}

// ID returns the entry's record id.
func (e Entry) ID() uint32 { return uint32(e) & idMask }

// Leased says whether the entry is leased (not claimable).
func (e Entry) Leased() bool { return e&leasedBit != 0 }

// sameStep says whether a and b are due in the same 16 ms step.
func sameStep(a, b Entry) bool { return a>>dueShift == b>>dueShift }

func claimable(e Entry) uint32 {
	if e&leasedBit != 0 {
		return 0
	}
	return 1
}

// Records is what a Forest reads of the records its entries name. Its methods must not change
// any tree of the forest.
type Records interface {
	// DueMs returns the due time of record id, in ms since the Unix epoch.
	DueMs(id uint32) int64
	// Compare orders distinct records a and b by due time, then by a tie-break that makes the
	// order total (the keeper core: the key).
	Compare(a, b uint32) int
	// Pending returns the entry of record id as it is now (its lease may have changed since it was
	// added) and true, if the record still waits to be built into t (see AddPending); false if it
	// has left t meanwhile.
	Pending(t *Tree, id uint32) (Entry, bool)
	// Built is told that record id's pending entry has been built into its tree.
	Built(id uint32)
}

// Forest holds the nodes of any number of trees over one set of records. It is not safe for
// concurrent use.
type Forest struct {
	pool nodePool
	rec  Records
}

// NewForest returns an empty forest whose entries name records of r.
func NewForest(r Records) *Forest { return &Forest{rec: r} }

type leaf struct {
	n int32
	e [leafCap]Entry
}

type inner struct {
	n     int32
	sep   [innerCap]Entry // first entry of each child
	child [innerCap]uint32
	cnt   [innerCap]uint32 // entries in each child's subtree
	clm   [innerCap]uint32 // claimable (not leased) entries in each child's subtree
}

// nodePool allocates the nodes of every tree of a forest.
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

// Tree is one order-statistic B+tree of entries; the zero value is empty. Its nodes live in the
// forest it is used with, always the same one.
type Tree struct {
	root   uint32
	height int // inner levels above the leaves; meaningful when n > 0
	n      int // entries
	clm    int // claimable entries
	// the first claimable entry and the path to it, cached until the tree changes
	headOK bool
	head   Entry
	hpath  [maxHeight + 1]uint16 // child index at each inner level (root first), then the leaf position
	hnodes [maxHeight + 1]uint32 // the node at each level, root first; the last is the leaf
	// pending holds entries added in bulk (AddPending), not yet in the tree: appended unsorted,
	// built into the tree (sorted, leaves packed) before the tree is next read. An entry whose
	// record left the tree meanwhile is stale and dropped then (Records.Pending).
	pending []Entry
}

// Compare orders entries by due time, then by Records.Compare; an entry equals only itself.
func (f *Forest) Compare(a, b Entry) int {
	if sa, sb := a>>dueShift, b>>dueShift; sa != sb {
		if sa < sb {
			return -1
		}
		return 1
	}
	ia, ib := a.ID(), b.ID()
	if ia == ib {
		return 0
	}
	return f.rec.Compare(ia, ib)
}

// DueMs returns the due time of entry e's record, in ms since the Unix epoch.
func (f *Forest) DueMs(e Entry) int64 { return f.rec.DueMs(e.ID()) }

// dueAtMost says whether entry e is due at or before tMs.
func (f *Forest) dueAtMost(e Entry, tMs int64) bool {
	if tMs < 0 {
		return false
	}
	step, tstep := int64(e>>dueShift), tMs>>dueStepBits
	if step != tstep {
		return step < tstep
	}
	return f.rec.DueMs(e.ID()) <= tMs
}

// innerChild returns the child of in whose range holds e: the last child whose first entry is
// at or before e (the first child when e precedes them all).
func (f *Forest) innerChild(in *inner, e Entry) int {
	lo, hi := 1, int(in.n) // find the first i ≥ 1 with sep[i] > e
	for lo < hi {
		m := (lo + hi) / 2
		if f.Compare(in.sep[m], e) <= 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo - 1
}

// leafPos returns the position of the first entry of l not before e.
func (f *Forest) leafPos(l *leaf, e Entry) int {
	lo, hi := 0, int(l.n)
	for lo < hi {
		m := (lo + hi) / 2
		if f.Compare(l.e[m], e) < 0 {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// nodeCounts returns the entries and claimable entries of a node at height h.
func (f *Forest) nodeCounts(node uint32, h int) (cnt, clm uint32) {
	if h == 0 {
		l := f.pool.leaf(node)
		for _, e := range l.e[:l.n] {
			clm += claimable(e)
		}
		return uint32(l.n), clm
	}
	in := f.pool.inner(node)
	for i := range int(in.n) {
		cnt += in.cnt[i]
		clm += in.clm[i]
	}
	return cnt, clm
}

func (f *Forest) nodeFirst(node uint32, h int) Entry {
	if h == 0 {
		return f.pool.leaf(node).e[0]
	}
	return f.pool.inner(node).sep[0]
}

// Insert adds entry e (not present) to t.
func (f *Forest) Insert(t *Tree, e Entry) {
	t.headOK = false
	if t.n == 0 {
		t.root, t.height = f.pool.newLeaf(), 0
	}
	t.n++
	t.clm += int(claimable(e))
	split, right := f.insertRec(t.root, t.height, e)
	if !split {
		return
	}
	if t.height+1 > maxHeight {
		panic("duetree: tree too high")
	}
	old := t.root
	t.root = f.pool.newInner()
	in := f.pool.inner(t.root)
	in.n = 2
	in.child[0], in.child[1] = old, right
	in.sep[0], in.sep[1] = f.nodeFirst(old, t.height), f.nodeFirst(right, t.height)
	in.cnt[0], in.clm[0] = f.nodeCounts(old, t.height)
	in.cnt[1], in.clm[1] = f.nodeCounts(right, t.height)
	t.height++
}

// insertRec inserts e below node (height h). When node splits it returns its new right sibling.
func (f *Forest) insertRec(node uint32, h int, e Entry) (bool, uint32) {
	if h == 0 {
		l := f.pool.leaf(node)
		p := f.leafPos(l, e)
		if l.n < leafCap {
			copy(l.e[p+1:l.n+1], l.e[p:l.n])
			l.e[p] = e
			l.n++
			return false, 0
		}
		ri := f.pool.newLeaf()
		l = f.pool.leaf(node) // the pool may have grown
		r := f.pool.leaf(ri)
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
	in := f.pool.inner(node)
	i := f.innerChild(in, e)
	if h == 1 && f.pool.leaf(in.child[i]).n == leafCap && f.shareLeaf(in, i) {
		i = f.innerChild(in, e) // e may now belong to the neighbour
	}
	split, right := f.insertRec(in.child[i], h-1, e)
	in = f.pool.inner(node)
	if f.Compare(e, in.sep[i]) < 0 {
		in.sep[i] = e
	}
	if !split {
		in.cnt[i]++
		in.clm[i] += claimable(e)
		return false, 0
	}
	in.cnt[i], in.clm[i] = f.nodeCounts(in.child[i], h-1)
	rc, rclm := f.nodeCounts(right, h-1)
	rsep := f.nodeFirst(right, h-1)
	if in.n < innerCap {
		f.innerInsertAt(in, i+1, right, rsep, rc, rclm)
		return false, 0
	}
	ni := f.pool.newInner()
	in = f.pool.inner(node)
	r := f.pool.inner(ni)
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
		f.innerInsertAt(in, i+1, right, rsep, rc, rclm)
	} else {
		f.innerInsertAt(r, i+1-int(half), right, rsep, rc, rclm)
	}
	return true, ni
}

// shareLeaf moves entries from the full leaf child i of in to a neighbour with room, so leaves
// split less often and stay fuller (about 0.8 full on random inserts instead of 0.7). It reports
// whether it moved any.
func (f *Forest) shareLeaf(in *inner, i int) bool {
	const room = leafCap / 8
	l := f.pool.leaf(in.child[i])
	if i+1 < int(in.n) {
		if r := f.pool.leaf(in.child[i+1]); r.n <= leafCap-room {
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
		if left := f.pool.leaf(in.child[i-1]); left.n <= leafCap-room {
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

func (f *Forest) innerInsertAt(in *inner, i int, child uint32, sep Entry, cnt, clm uint32) {
	n := int(in.n)
	copy(in.sep[i+1:n+1], in.sep[i:n])
	copy(in.child[i+1:n+1], in.child[i:n])
	copy(in.cnt[i+1:n+1], in.cnt[i:n])
	copy(in.clm[i+1:n+1], in.clm[i:n])
	in.sep[i], in.child[i], in.cnt[i], in.clm[i] = sep, child, cnt, clm
	in.n++
}

func (f *Forest) innerRemoveAt(in *inner, i int) {
	n := int(in.n)
	copy(in.sep[i:], in.sep[i+1:n])
	copy(in.child[i:], in.child[i+1:n])
	copy(in.cnt[i:], in.cnt[i+1:n])
	copy(in.clm[i:], in.clm[i+1:n])
	in.n--
	in.sep[n-1], in.child[n-1], in.cnt[n-1], in.clm[n-1] = 0, 0, 0, 0
}

// Delete removes entry e (present, compared by due and Records.Compare; its leased bit may differ) from t.
func (f *Forest) Delete(t *Tree, e Entry) {
	t.headOK = false
	gone := f.deleteRec(t.root, t.height, e)
	t.n--
	t.clm -= int(claimable(gone))
	if t.n == 0 {
		f.freeNode(t.root, t.height)
		t.root, t.height = 0, 0
		return
	}
	for t.height > 0 && f.pool.inner(t.root).n == 1 {
		old := t.root
		t.root = f.pool.inner(old).child[0]
		f.pool.freeInner(old)
		t.height--
	}
}

func (f *Forest) freeNode(node uint32, h int) {
	if h == 0 {
		f.pool.freeLeaf(node)
	} else {
		f.pool.freeInner(node)
	}
}

// deleteRec removes e below node (height h) and returns the entry as it was stored.
func (f *Forest) deleteRec(node uint32, h int, e Entry) Entry {
	if h == 0 {
		l := f.pool.leaf(node)
		p := f.leafPos(l, e)
		if p >= int(l.n) || l.e[p].ID() != e.ID() {
			panic("duetree: deleting an entry the tree does not hold")
		}
		gone := l.e[p]
		copy(l.e[p:], l.e[p+1:l.n])
		l.n--
		l.e[l.n] = 0
		return gone
	}
	in := f.pool.inner(node)
	i := f.innerChild(in, e)
	gone := f.deleteRec(in.child[i], h-1, e)
	in = f.pool.inner(node)
	in.cnt[i]--
	in.clm[i] -= claimable(gone)
	child := in.child[i]
	if in.cnt[i] == 0 {
		f.freeNode(child, h-1)
		f.innerRemoveAt(in, i)
		return gone
	}
	in.sep[i] = f.nodeFirst(child, h-1)
	f.maybeMerge(in, i, h-1)
	return gone
}

// maybeMerge merges child i of in (at height h) with a neighbour when it is under a quarter full
// and the two fit in three quarters of a node.
func (f *Forest) maybeMerge(in *inner, i, h int) {
	capacity := leafCap
	size := func(node uint32) int { return int(f.pool.leaf(node).n) }
	if h > 0 {
		capacity = innerCap
		size = func(node uint32) int { return int(f.pool.inner(node).n) }
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
		la, lb := f.pool.leaf(a), f.pool.leaf(b)
		copy(la.e[la.n:], lb.e[:lb.n])
		la.n += lb.n
		f.pool.freeLeaf(b)
	} else {
		ia, ib := f.pool.inner(a), f.pool.inner(b)
		n, m := int(ia.n), int(ib.n)
		copy(ia.sep[n:], ib.sep[:m])
		copy(ia.child[n:], ib.child[:m])
		copy(ia.cnt[n:], ib.cnt[:m])
		copy(ia.clm[n:], ib.clm[:m])
		ia.n += ib.n
		f.pool.freeInner(b)
	}
	in.cnt[j] += in.cnt[j+1]
	in.clm[j] += in.clm[j+1]
	f.innerRemoveAt(in, j+1)
}

// SetLeased sets or clears the leased bit of entry e (present) in t.
// An entry already in the wanted state is left as it is.
func (f *Forest) SetLeased(t *Tree, e Entry, leased bool) {
	f.Flush(t)
	var path [maxHeight]*uint32 // the claimable count of each inner level's child on the way
	node := t.root
	for h := t.height; h > 0; h-- {
		in := f.pool.inner(node)
		i := f.innerChild(in, e)
		path[t.height-h] = &in.clm[i]
		node = in.child[i]
	}
	l := f.pool.leaf(node)
	p := f.leafPos(l, e)
	if p >= int(l.n) || l.e[p].ID() != e.ID() {
		panic("duetree: leasing an entry the tree does not hold")
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

// Head returns t's first claimable entry.
func (f *Forest) Head(t *Tree) (Entry, bool) {
	f.Flush(t)
	if t.clm == 0 {
		return 0, false
	}
	if t.headOK {
		return t.head, true
	}
	node := t.root
	for h := t.height; h > 0; h-- {
		in := f.pool.inner(node)
		i := 0
		for in.clm[i] == 0 {
			i++
		}
		lvl := t.height - h
		t.hnodes[lvl], t.hpath[lvl] = node, uint16(i)
		node = in.child[i]
	}
	l := f.pool.leaf(node)
	p := 0
	for l.e[p]&leasedBit != 0 {
		p++
	}
	t.hnodes[t.height], t.hpath[t.height] = node, uint16(p)
	t.head, t.headOK = l.e[p], true
	return t.head, true
}

// LeaseHead leases t's first claimable entry (Head must have just returned it) and moves the
// cached head to the next claimable entry of the same leaf, if any.
func (f *Forest) LeaseHead(t *Tree) {
	for lvl := 0; lvl < t.height; lvl++ {
		f.pool.inner(t.hnodes[lvl]).clm[t.hpath[lvl]]--
	}
	t.clm--
	l := f.pool.leaf(t.hnodes[t.height])
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

// First returns t's first entry. Its leased bit may be out of date (it is read from a separator):
// it names the record and its due step.
func (f *Forest) First(t *Tree) (Entry, bool) {
	f.Flush(t)
	if t.n == 0 {
		return 0, false
	}
	return f.nodeFirst(t.root, t.height), true
}

// Rank returns the number of entries of t due at or before tMs.
func (f *Forest) Rank(t *Tree, tMs int64) int {
	f.Flush(t)
	if t.n == 0 {
		return 0
	}
	node, rank := t.root, 0
	for h := t.height; h > 0; h-- {
		in := f.pool.inner(node)
		lo, hi := 0, int(in.n) // the first child whose first entry is due after tMs
		for lo < hi {
			m := (lo + hi) / 2
			if f.dueAtMost(in.sep[m], tMs) {
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
	l := f.pool.leaf(node)
	lo, hi := 0, int(l.n)
	for lo < hi {
		m := (lo + hi) / 2
		if f.dueAtMost(l.e[m], tMs) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return rank + lo
}

// Ranks sets out[i] to the number of entries of t due at or before ts[i], for ascending ts, in
// one descent shared by all of them.
func (f *Forest) Ranks(t *Tree, ts []int64, out []int) {
	f.Flush(t)
	clear(out[:len(ts)])
	if t.n > 0 {
		f.ranksRec(t.root, t.height, ts, out, 0)
	}
}

func (f *Forest) ranksRec(node uint32, h int, ts []int64, out []int, base int) {
	if h == 0 {
		l := f.pool.leaf(node)
		p := 0
		for i, tMs := range ts {
			for p < int(l.n) && f.dueAtMost(l.e[p], tMs) {
				p++
			}
			out[i] = base + p
		}
		return
	}
	in := f.pool.inner(node)
	i, done := 0, base // child i is the last whose first entry is due at or before the threshold
	for j := 0; j < len(ts); {
		for i+1 < int(in.n) && f.dueAtMost(in.sep[i+1], ts[j]) {
			done += int(in.cnt[i])
			i++
		}
		if i == 0 && !f.dueAtMost(in.sep[0], ts[j]) {
			out[j] = base // due before everything below this node
			j++
			continue
		}
		// thresholds that fall into child i
		k := j + 1
		for k < len(ts) && (i+1 >= int(in.n) || !f.dueAtMost(in.sep[i+1], ts[k])) {
			k++
		}
		f.ranksRec(in.child[i], h-1, ts[j:k], out[j:k], done)
		j = k
	}
}

// Select returns t's entry at position k (0-based, k < Len(t)).
func (f *Forest) Select(t *Tree, k int) Entry {
	f.Flush(t)
	node := t.root
	for h := t.height; h > 0; h-- {
		in := f.pool.inner(node)
		i := 0
		for k >= int(in.cnt[i]) {
			k -= int(in.cnt[i])
			i++
		}
		node = in.child[i]
	}
	return f.pool.leaf(node).e[k]
}

// Prefix returns how many entries, and how many claimable ones, lie in t's longest prefix whose
// entries all satisfy in: in must hold for a prefix of t's order and for no entry after it (a
// threshold in claim order, say). It asks in about once per level and leaf binary-search step
// (O(height × log of a node's size)), never of every entry. in may read the entry's record; its
// leased bit may be out of date (a separator's). in must not change t.
func (f *Forest) Prefix(t *Tree, in func(e Entry) bool) (n, claimableN int) {
	f.Flush(t)
	if t.n == 0 {
		return 0, 0
	}
	node := t.root
	for h := t.height; h > 0; h-- {
		nd := f.pool.inner(node)
		// the children whose first entry is in the prefix: all of those before the last such
		// child lie in it whole (the prefix is contiguous); the last may hold its end
		lo, hi := 0, int(nd.n)
		for lo < hi {
			m := (lo + hi) / 2
			if in(nd.sep[m]) {
				lo = m + 1
			} else {
				hi = m
			}
		}
		if lo == 0 {
			return n, claimableN
		}
		for i := range lo - 1 {
			n += int(nd.cnt[i])
			claimableN += int(nd.clm[i])
		}
		node = nd.child[lo-1]
	}
	l := f.pool.leaf(node)
	lo, hi := 0, int(l.n)
	for lo < hi {
		m := (lo + hi) / 2
		if in(l.e[m]) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	for _, e := range l.e[:lo] {
		claimableN += int(claimable(e))
	}
	return n + lo, claimableN
}

// Visit calls fn for t's entries at positions [lo, hi), in order. fn must not change t.
func (f *Forest) Visit(t *Tree, lo, hi int, fn func(e Entry)) {
	f.Flush(t)
	if lo < hi && t.n > 0 {
		f.visitRec(t.root, t.height, lo, hi, fn)
	}
}

func (f *Forest) visitRec(node uint32, h, lo, hi int, fn func(e Entry)) {
	if h == 0 {
		l := f.pool.leaf(node)
		for _, e := range l.e[lo:hi] {
			fn(e)
		}
		return
	}
	in := f.pool.inner(node)
	off := 0
	for i := 0; i < int(in.n) && off < hi; i++ {
		n := int(in.cnt[i])
		if off+n > lo {
			f.visitRec(in.child[i], h-1, max(lo-off, 0), min(hi-off, n), fn)
		}
		off += n
	}
}

// AddPending adds entry e to t in bulk: it is appended to t's pending list and built into the
// tree, with the rest of the list, when t is next read or flushed. While it waits, its record may
// leave t (Records.Pending then says so) and be added again, by AddPending or Insert.
func (f *Forest) AddPending(t *Tree, e Entry) {
	if len(t.pending) == cap(t.pending) {
		// double it: append grows a long slice by about a quarter, so a load's list of millions
		// would be copied (and fresh memory touched) about four times over
		t.pending = slices.Grow(t.pending, max(len(t.pending), 1024))
	}
	t.pending = append(t.pending, e)
}

// Flush builds t's pending entries into it: the valid ones sorted, merged with the entries the tree
// holds, and the tree rebuilt bottom-up with its nodes packed 7/8 full (room for later inserts) —
// or, when they are few beside the tree (under 1/flushInsertRatio of it), inserted one by one: a
// status asked for during a load reads the trees, and rebuilding a tree of millions for the few
// thousand rows walked since the last one made the load's time grow with the square of its rows.
func (f *Forest) Flush(t *Tree) {
	if len(t.pending) == 0 {
		return
	}
	fresh := f.stillPending(t, t.pending[:0])
	f.sortEntries(fresh)
	fresh = slices.CompactFunc(fresh, func(a, b Entry) bool { return a.ID() == b.ID() })
	for _, e := range fresh {
		f.rec.Built(e.ID())
	}
	if t.n > 0 && len(fresh) < t.n/flushInsertRatio {
		for _, e := range fresh {
			f.Insert(t, e)
		}
		t.pending = nil
		return
	}
	all := fresh
	if t.n > 0 {
		old := f.entriesOf(t)
		f.freeTree(t.root, t.height)
		all = f.merge(old, fresh)
	}
	t.pending = nil
	f.build(t, all)
}

// flushInsertRatio: Flush inserts pending entries one by one when they are fewer than the tree's
// entries over this, and rebuilds the tree otherwise. An insert costs a descent (a few hundred ns
// in a tree of millions); a rebuild ~50 ns for each entry of the tree and of the batch.
const flushInsertRatio = 16

// entriesOf returns the entries of t's built tree (not its pending ones), in order.
func (f *Forest) entriesOf(t *Tree) []Entry {
	es := make([]Entry, 0, t.n)
	if t.n > 0 {
		f.visitRec(t.root, t.height, 0, t.n, func(e Entry) { es = append(es, e) })
	}
	return es
}

// merge returns the entries of a and b, each in order, merged in order.
func (f *Forest) merge(a, b []Entry) []Entry {
	all := make([]Entry, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		if j == len(b) || (i < len(a) && f.Compare(a[i], b[j]) < 0) {
			all = append(all, a[i])
			i++
		} else {
			all = append(all, b[j])
			j++
		}
	}
	return all
}

// Absorb moves every entry of src into dst, leaving src empty: the two trees' entries merged in
// order and dst rebuilt bottom-up, packed as Flush packs it, in time linear in the entries —
// without descending dst once per entry, nor src once per removal. Pending entries of both are
// built first (so Records.Pending must still place them in their own trees). When dst is empty
// the trees only change places.
func (f *Forest) Absorb(dst, src *Tree) {
	f.Flush(src)
	f.Flush(dst)
	if src.n == 0 {
		return
	}
	if dst.n == 0 {
		*dst, *src = *src, *dst
		return
	}
	all := f.merge(f.entriesOf(dst), f.entriesOf(src))
	f.freeTree(dst.root, dst.height)
	f.freeTree(src.root, src.height)
	f.build(dst, all)
	f.build(src, nil)
}

// sortEntries sorts es as Compare orders them, faster than a comparison sort when es is long (a
// load's pending list holds millions): by due step with a radix sort, least significant digit
// first and only over the bits the steps in es span, then each run of entries due in one step by
// Compare (runs are short: a step is 16 ms). The radix sort needs a scratch copy of es.
func (f *Forest) sortEntries(es []Entry) {
	if len(es) < radixMinEntries {
		slices.SortFunc(es, f.Compare)
		return
	}
	lo, hi := es[0]>>dueShift, es[0]>>dueShift
	for _, e := range es {
		lo, hi = min(lo, e>>dueShift), max(hi, e>>dueShift)
	}
	span := uint64(hi - lo)
	src, dst := es, make([]Entry, len(es))
	for shift := 0; span>>shift > 0; shift += radixBits {
		var at [1 << radixBits]int
		for _, e := range src {
			at[(uint64(e>>dueShift-lo)>>shift)&radixMask]++
		}
		sum := 0
		for d, c := range at {
			at[d], sum = sum, sum+c
		}
		for _, e := range src {
			d := (uint64(e>>dueShift-lo) >> shift) & radixMask
			dst[at[d]] = e
			at[d]++
		}
		src, dst = dst, src
	}
	if &src[0] != &es[0] {
		copy(es, src)
	}
	for i := 0; i < len(es); {
		j := i + 1
		for j < len(es) && sameStep(es[j], es[i]) {
			j++
		}
		if j-i > 1 {
			slices.SortFunc(es[i:j], f.Compare)
		}
		i = j
	}
}

// The radix sort of sortEntries: digits of radixBits bits, for lists of radixMinEntries or more.
const (
	radixBits       = 11
	radixMask       = 1<<radixBits - 1
	radixMinEntries = 4096
)

// stillPending appends to out the entries of t's pending list that still stand for their records
// (Records.Pending, and due in the same step as when added), each with its lease as it is now; an
// entry of a record that left t and came back is listed with the record's new one. out may be
// t.pending[:0].
func (f *Forest) stillPending(t *Tree, out []Entry) []Entry {
	for _, e := range t.pending {
		if cur, ok := f.rec.Pending(t, e.ID()); ok && sameStep(cur, e) {
			out = append(out, cur)
		}
	}
	return out
}

// Pending returns the entries waiting in t's pending list that still stand for their records, as
// Flush would build them (unsorted, a record possibly twice), without building them.
func (f *Forest) Pending(t *Tree) []Entry { return f.stillPending(t, nil) }

// PendingLen returns the length of t's pending list, stale entries included (0 once built).
func (t *Tree) PendingLen() int { return len(t.pending) }

// Len returns the number of entries of t (pending ones built first).
func (f *Forest) Len(t *Tree) int {
	f.Flush(t)
	return t.n
}

// freeTree frees the nodes of a subtree.
func (f *Forest) freeTree(node uint32, h int) {
	if h > 0 {
		in := f.pool.inner(node)
		for i := range int(in.n) {
			f.freeTree(in.child[i], h-1)
		}
	}
	f.freeNode(node, h)
}

// build makes t hold the sorted entries es (t's old nodes already freed).
func (f *Forest) build(t *Tree, es []Entry) {
	t.headOK = false
	t.n, t.clm = len(es), 0
	t.root, t.height = 0, 0
	if len(es) == 0 {
		return
	}
	const leafFill, innerFill = leafCap * 7 / 8, innerCap * 7 / 8
	type node struct {
		id       uint32
		first    Entry
		cnt, clm uint32
	}
	var level []node
	for lo := 0; lo < len(es); lo += leafFill {
		hi := min(lo+leafFill, len(es))
		if rest := len(es) - hi; rest > 0 && rest < leafCap/4 {
			hi = lo + (hi-lo+rest)/2 // no small last leaf: the last two share
		}
		id := f.pool.newLeaf()
		l := f.pool.leaf(id)
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
			id := f.pool.newInner()
			in := f.pool.inner(id)
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
