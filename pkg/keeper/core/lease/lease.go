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
// A lease can be pinned while a completion under it is being written (Pin): it then leaves the
// expiry order and does not expire, whatever its expiry, until it ends (the write was applied) or
// is unpinned (the write failed), when it takes its place again and expires at once if its time
// has passed. So a row is never handed to a second worker while the first one's completion may
// still be written.
//
// A record can also be held back (Hold): a lease without a token, which no completion, release or
// extension can present, that keeps the record from being handed out until it expires. The core
// holds back the rows of a fenced slot this way (a slot whose earlier owner's leases are not
// known, or not yet: docs/design.md, "Leases across a handoff"). And a lease can be taken over
// from another table with its token (Put): the leases of a slot handed from one shard to
// another keep their tokens and expiries.
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
	held int              // how many of the leases are holds
}

// lease is a claimed record's lease.
type lease struct {
	id      uint32
	pos     int32 // its index in heap; pinned (-1) when it is out of the heap (Pin)
	token   uint64
	expires int64 // ms
	rev     int64 // the record's rev when the lease was granted
	since   int64 // ms: when this table granted it (Grant); 0 when not known (Put, Hold)
	hold    bool  // a hold (Hold): no token is current for it
}

// NewTable returns an empty table whose tokens follow after: the first handed out is after + 1.
func NewTable(after uint64) *Table {
	return &Table{byID: map[uint32]int32{}, last: after}
}

// Grant leases record id (not leased), as of its rev, from nowMs until expiresMs and returns the
// lease's token.
func (t *Table) Grant(id uint32, rev, nowMs, expiresMs int64) uint64 {
	t.last++
	t.Put(id, t.last, rev, expiresMs)
	t.slab[t.byID[id]].since = nowMs
	return t.last
}

// Put leases record id under token, as of its rev, until expiresMs: a lease granted by another
// table, taken over with its token (when it was granted is not known here: Since reports it so).
// A lease or hold id had is replaced.
func (t *Table) Put(id uint32, token uint64, rev, expiresMs int64) {
	l := &t.slab[t.set(id, token, expiresMs)]
	if l.hold {
		l.hold = false
		t.held--
	}
	l.rev, l.since = rev, 0
}

// Hold holds record id back until expiresMs: a lease no token is current for, which expires
// like any other. A hold id had already is moved to expiresMs; a lease id had is replaced.
func (t *Table) Hold(id uint32, expiresMs int64) {
	l := &t.slab[t.set(id, 0, expiresMs)]
	if !l.hold {
		l.hold = true
		t.held++
	}
	l.rev, l.since = 0, 0
}

// IsHold says whether record id is held back (Hold) rather than leased.
func (t *Table) IsHold(id uint32) bool {
	i, ok := t.byID[id]
	return ok && t.slab[i].hold
}

// Holds returns the number of holds among the leases.
func (t *Table) Holds() int { return t.held }

// Lease is one lease of the table as Each reports it.
type Lease struct {
	ID      uint32
	Token   uint64
	Expires int64 // ms; a pinned lease's expiry as it was when it was pinned (or extended since)
	Rev     int64
	// Since is when this table granted the lease (ms); 0 when not known (Put, Hold).
	Since  int64
	Pinned bool
	Hold   bool
}

// Each calls fn with every lease and hold, in no particular order. fn must not change the
// table.
func (t *Table) Each(fn func(Lease)) {
	for _, i := range t.byID {
		l := &t.slab[i]
		fn(l.public())
	}
}

// Get returns record id's lease or hold, and whether it has one.
func (t *Table) Get(id uint32) (Lease, bool) {
	i, ok := t.byID[id]
	if !ok {
		return Lease{}, false
	}
	return t.slab[i].public(), true
}

func (l *lease) public() Lease {
	return Lease{ID: l.id, Token: l.token, Expires: l.expires, Rev: l.rev, Since: l.since, Pinned: l.pos == pinned, Hold: l.hold}
}

// Extend makes record id's current lease (token) expire at expiresMs, sooner or later than it
// would have. The lease keeps its rev. A pinned lease keeps the new expiry for when it is
// unpinned.
func (t *Table) Extend(id uint32, token uint64, expiresMs int64) { t.set(id, token, expiresMs) }

// pinned is the heap position of a pinned lease.
const pinned = -1

// set makes record id's lease (token) expire at expiresMs, adding it when id has none, and
// returns its index in slab.
func (t *Table) set(id uint32, token uint64, expiresMs int64) int32 {
	if i, ok := t.byID[id]; ok {
		l := &t.slab[i]
		l.token, l.expires = token, expiresMs
		if l.pos != pinned {
			t.fix(int(l.pos))
		}
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
	if !ok || t.slab[i].token != token || t.slab[i].hold {
		return 0, false
	}
	return t.slab[i].rev, true
}

// Pin takes record id's current lease (token) out of the expiry order: it does not expire until
// it ends or is unpinned. It returns false, and changes nothing, when token is not id's current
// lease or the lease is pinned already.
func (t *Table) Pin(id uint32, token uint64) bool {
	i, ok := t.byID[id]
	if !ok || t.slab[i].token != token || t.slab[i].hold || t.slab[i].pos == pinned {
		return false
	}
	t.unheap(i)
	t.slab[i].pos = pinned
	return true
}

// Unpin puts record id's pinned lease (token) back in the expiry order, under its expiry: a lease
// whose time has passed ends at the next Expire. It returns false, and changes nothing, when
// token is not id's current lease or the lease is not pinned.
func (t *Table) Unpin(id uint32, token uint64) bool {
	i, ok := t.byID[id]
	if !ok || t.slab[i].token != token || t.slab[i].pos != pinned {
		return false
	}
	t.slab[i].pos = int32(len(t.heap))
	t.heap = append(t.heap, i)
	t.up(len(t.heap) - 1)
	return true
}

// Pinned says whether record id's lease is pinned.
func (t *Table) Pinned(id uint32) bool {
	i, ok := t.byID[id]
	return ok && t.slab[i].pos == pinned
}

// Expires returns when record id's lease or hold expires (ms), and whether it has one.
func (t *Table) Expires(id uint32) (int64, bool) {
	i, ok := t.byID[id]
	if !ok {
		return 0, false
	}
	return t.slab[i].expires, true
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

// remove takes lease i out of the heap (unless it is pinned) and the index and frees its place
// in slab.
func (t *Table) remove(i int32) {
	l := &t.slab[i]
	delete(t.byID, l.id)
	if l.hold {
		t.held--
	}
	if l.pos != pinned {
		t.unheap(i)
	}
	t.free = append(t.free, i)
}

// unheap takes lease i, which is in the heap, out of it.
func (t *Table) unheap(i int32) {
	pos, last := int(t.slab[i].pos), len(t.heap)-1
	if pos != last {
		t.swap(pos, last)
	}
	t.heap = t.heap[:last]
	if pos != last {
		t.fix(pos)
	}
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
