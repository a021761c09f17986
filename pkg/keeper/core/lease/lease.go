// Package lease is the keeper core's lease table: which held records are leased to a worker,
// under which token and until when. Tokens are handed out in sequence after a starting value (the
// service starts it at random, so tokens of an earlier process are not accepted by a later one).
// Expiries wait in a min-heap, so the leases that expired are found without a scan; an entry of a
// lease that was extended, released or handed out again is skipped when its time comes. Records
// are named by id; the table knows nothing else of them.
//
// The package is pure: no I/O, no clock, no goroutines (TestCoreIsPure in package core).
package lease

import "container/heap"

// Table is the lease table. It is not safe for concurrent use.
type Table struct {
	leases map[uint32]lease
	expiry expiryHeap // min-heap by expires; entries whose lease changed are skipped
	last   uint64     // the last token handed out
}

// lease is a claimed record's lease.
type lease struct {
	token   uint64
	expires int64 // ms
}

type leaseExpiry struct {
	expires int64
	id      uint32
	token   uint64
}

type expiryHeap []leaseExpiry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].expires < h[j].expires }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(leaseExpiry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// NewTable returns an empty table whose tokens follow after: the first handed out is after + 1.
func NewTable(after uint64) *Table {
	return &Table{leases: map[uint32]lease{}, last: after}
}

// Grant leases record id (not leased) until expiresMs and returns the lease's token.
func (t *Table) Grant(id uint32, expiresMs int64) uint64 {
	t.last++
	t.set(id, t.last, expiresMs)
	return t.last
}

// Extend makes record id's current lease (token) expire at expiresMs, sooner or later than it
// would have.
func (t *Table) Extend(id uint32, token uint64, expiresMs int64) { t.set(id, token, expiresMs) }

func (t *Table) set(id uint32, token uint64, expiresMs int64) {
	t.leases[id] = lease{token: token, expires: expiresMs}
	heap.Push(&t.expiry, leaseExpiry{expires: expiresMs, id: id, token: token})
}

// Current says whether token is record id's current lease.
func (t *Table) Current(id uint32, token uint64) bool {
	l, ok := t.leases[id]
	return ok && l.token == token
}

// Leased says whether record id is leased.
func (t *Table) Leased(id uint32) bool {
	_, ok := t.leases[id]
	return ok
}

// End ends record id's lease, if it has one.
func (t *Table) End(id uint32) { delete(t.leases, id) }

// Len returns the number of leases.
func (t *Table) Len() int { return len(t.leases) }

// Expire ends every lease that expired at or before nowMs and calls fn with each one's record id,
// after it has ended, in the order of their expiry.
func (t *Table) Expire(nowMs int64, fn func(id uint32)) {
	for len(t.expiry) > 0 && t.expiry[0].expires <= nowMs {
		e := heap.Pop(&t.expiry).(leaseExpiry)
		// an extended lease has a later entry of its own: only the current expiry ends it
		if l, ok := t.leases[e.id]; ok && l.token == e.token && l.expires <= nowMs {
			delete(t.leases, e.id)
			fn(e.id)
		}
	}
}
