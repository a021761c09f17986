// Package lease is the keeper core's lease table: which held records are leased to a worker,
// under which token and until when. Tokens are handed out in sequence after a starting value (the
// service starts it at random, so tokens of an earlier process are not accepted by a later one).
// The leases wait in a min-heap by expiry, so the leases that expired are found without a scan;
// each lease knows its place in the heap, so a lease that ends (its render completed or
// released) or is extended leaves or moves in the heap at once. The table's size follows the
// leases in flight, not the leases granted over a lease duration: until December 2026 an ended
// lease stayed in the heap until its expiry, so at 40,000 claimed rows a second and a one-minute
// lease the heap held millions of dead entries and grew by copying tens of megabytes in the
// claim that outgrew it. Records are named by id; of a record the table knows only the rev its
// lease was granted for (the version a completion may write over: a row changed since its claim
// keeps the change, and the render is refused).
//
// The package is pure: no I/O, no clock, no goroutines (TestCoreIsPure in package core).
package lease

// Table is the lease table. It is not safe for concurrent use.
type Table struct {
	byID map[uint32]int32 // record id -> its lease's index in slab
	slab []lease          // the leases, and ended ones waiting in free to be reused
	free []int32          // indexes of slab not in use
	heap []int32          // indexes of slab, a min-heap by expires
	last uint64           // the last token handed out
}

// lease is a claimed record's lease.
type lease struct {
	id      uint32
	pos     int32 // its index in heap
	token   uint64
	expires int64 // ms
	rev     int64 // the record's rev when the lease was granted
}

// NewTable returns an empty table whose tokens follow after: the first handed out is after + 1.
func NewTable(after uint64) *Table {
	return &Table{byID: map[uint32]int32{}, last: after}
}

// Grant leases record id (not leased), as of its rev, until expiresMs and returns the lease's
// token.
func (t *Table) Grant(id uint32, rev, expiresMs int64) uint64 {
	t.last++
	t.slab[t.set(id, t.last, expiresMs)].rev = rev
	return t.last
}

// Extend makes record id's current lease (token) expire at expiresMs, sooner or later than it
// would have. The lease keeps its rev.
func (t *Table) Extend(id uint32, token uint64, expiresMs int64) { t.set(id, token, expiresMs) }

// set makes record id's lease (token) expire at expiresMs, adding it when id has none, and
// returns its index in slab.
func (t *Table) set(id uint32, token uint64, expiresMs int64) int32 {
	if i, ok := t.byID[id]; ok {
		l := &t.slab[i]
		l.token, l.expires = token, expiresMs
		t.fix(int(l.pos))
		return i
	}
	var i int32
	if n := len(t.free); n > 0 {
		i, t.free = t.free[n-1], t.free[:n-1]
	} else {
		i = int32(len(t.slab))
		t.slab = append(t.slab, lease{})
	}
	t.slab[i] = lease{id: id, pos: int32(len(t.heap)), token: token, expires: expiresMs}
	t.byID[id] = i
	t.heap = append(t.heap, i)
	t.up(len(t.heap) - 1)
	return i
}

// Current says whether token is record id's current lease.
func (t *Table) Current(id uint32, token uint64) bool {
	_, ok := t.Rev(id, token)
	return ok
}

// Rev returns the rev record id's lease was granted for, when token is its current lease.
func (t *Table) Rev(id uint32, token uint64) (rev int64, current bool) {
	i, ok := t.byID[id]
	if !ok || t.slab[i].token != token {
		return 0, false
	}
	return t.slab[i].rev, true
}

// Leased says whether record id is leased.
func (t *Table) Leased(id uint32) bool {
	_, ok := t.byID[id]
	return ok
}

// End ends record id's lease, if it has one.
func (t *Table) End(id uint32) {
	if i, ok := t.byID[id]; ok {
		t.remove(i)
	}
}

// Len returns the number of leases.
func (t *Table) Len() int { return len(t.byID) }

// Expire ends every lease that expired at or before nowMs and calls fn with each one's record id,
// after it has ended, in the order of their expiry.
func (t *Table) Expire(nowMs int64, fn func(id uint32)) {
	for len(t.heap) > 0 && t.slab[t.heap[0]].expires <= nowMs {
		id := t.slab[t.heap[0]].id
		t.remove(t.heap[0])
		fn(id)
	}
}

// remove takes lease i out of the heap and the index and frees its place in slab.
func (t *Table) remove(i int32) {
	l := &t.slab[i]
	delete(t.byID, l.id)
	pos, last := int(l.pos), len(t.heap)-1
	if pos != last {
		t.swap(pos, last)
	}
	t.heap = t.heap[:last]
	if pos != last {
		t.fix(pos)
	}
	t.free = append(t.free, i)
}

// fix moves the lease at heap position i to its place after its expiry changed.
func (t *Table) fix(i int) {
	t.down(i)
	t.up(i)
}

func (t *Table) less(a, b int) bool { return t.slab[t.heap[a]].expires < t.slab[t.heap[b]].expires }

func (t *Table) swap(a, b int) {
	t.heap[a], t.heap[b] = t.heap[b], t.heap[a]
	t.slab[t.heap[a]].pos = int32(a)
	t.slab[t.heap[b]].pos = int32(b)
}

func (t *Table) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !t.less(j, i) {
			return
		}
		t.swap(i, j)
		j = i
	}
}

func (t *Table) down(i int) {
	n := len(t.heap)
	for {
		j := 2*i + 1
		if j >= n {
			return
		}
		if r := j + 1; r < n && t.less(r, j) {
			j = r
		}
		if !t.less(j, i) {
			return
		}
		t.swap(i, j)
		i = j
	}
}
