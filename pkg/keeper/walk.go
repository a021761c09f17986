package keeper

import (
	"errors"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// Edge is the time before which every owned row is held, as of the last finished walk.
type Edge struct {
	// Known is false before any walk finished.
	Known bool
	// Unbounded: the window is 0, so every owned row is held.
	Unbounded bool
	// At is the edge when Known and not Unbounded.
	At time.Time
}

// covers says whether a row due at dueMs lies before the edge.
func (e Edge) covers(dueMs int64) bool {
	return e.Known && (e.Unbounded || dueMs < e.At.UnixMilli())
}

// WalkCounts is the accounting of one verification walk.
type WalkCounts struct {
	// Scanned is every row the walk read.
	Scanned int
	// Admitted: rows newly held that were due at or after the previous edge (or whose slot had
	// never been walked): the window moving forward, not misses.
	Admitted int
	// Repaired: the true misses — owned rows due before the previous edge that were missing,
	// held rows that were stale, and held rows the walk proved deleted (Deleted).
	Repaired int
	// Deleted: held rows the walk proved deleted (included in Repaired).
	Deleted int
	// Invalid rows read.
	Invalid int
	// OwnedNotHeld: valid owned rows beyond the window, in total and by hour from the walk's
	// start out to 24 h (bin h counts due in [start + h hours, start + h+1 hours)).
	OwnedNotHeld       int
	OwnedNotHeldByHour [24]int
}

type walkState struct {
	startMs  int64
	prevEdge Edge
	slots    [schedule.NumSlots]bool
	counts   WalkCounts
}

// ErrWalking is returned by BeginWalk while a walk is running.
var ErrWalking = errors.New("a walk is already running")

// BeginWalk starts a verification walk of slots at now. prevEdge is the edge of the last
// finished walk: rows found missing before it are repairs, rows after it are admissions.
func (c *Core) BeginWalk(now time.Time, prevEdge Edge, slots []int) error {
	if c.walk != nil {
		return ErrWalking
	}
	w := &walkState{startMs: now.UnixMilli(), prevEdge: prevEdge}
	for _, s := range slots {
		w.slots[s] = true
	}
	c.forEachHeld(func(_ uint32, r *rec) {
		if w.slots[r.slot] {
			r.flags &^= flagSeen
		}
	})
	c.walk = w
	c.tombstones = map[string]known{}
	return nil
}

// Walking says whether a walk is running.
func (c *Core) Walking() bool { return c.walk != nil }

// WalkRow applies one walked row at now and counts it.
func (c *Core) WalkRow(now time.Time, row schedule.Row) Outcome {
	w := c.walk
	if w == nil {
		return c.Apply(now, row)
	}
	w.counts.Scanned++
	o := c.apply(now.UnixMilli(), &row)
	dueMs := row.Due.UnixMilli()
	switch o.Result {
	case Invalid:
		w.counts.Invalid++
	case Held:
		switch {
		case o.WasHeld:
			w.counts.Repaired++ // the held version was stale
		case c.walkedBefore(row.Slot()) && w.prevEdge.covers(dueMs):
			w.counts.Repaired++
		default:
			w.counts.Admitted++
		}
	case Dropped:
		w.counts.Repaired++ // held, but a missed write had moved it beyond the window
		w.countNotHeld(dueMs)
	case NotHeld:
		w.countNotHeld(dueMs)
	}
	return o
}

func (w *walkState) countNotHeld(dueMs int64) {
	w.counts.OwnedNotHeld++
	if d := dueMs - w.startMs; d >= 0 && d < 24*3600_000 {
		w.counts.OwnedNotHeldByHour[d/3600_000]++
	}
}

// walkedBefore says whether slot s has been read by a finished walk since it joined the shard.
func (c *Core) walkedBefore(s int) bool { return c.walked[s] }

// EndWalk finishes the running walk. unread lists the walked slots whose rows could not all be
// read: held rows of every other walked slot that the walk did not see and no event touched are
// proven deleted and dropped. Returns the walk's counts.
func (c *Core) EndWalk(unread []int) WalkCounts {
	w := c.walk
	if w == nil {
		return WalkCounts{}
	}
	skip := w.slots
	for _, s := range unread {
		skip[s] = false
	}
	c.forEachHeld(func(id uint32, r *rec) {
		if skip[r.slot] && r.flags&flagSeen == 0 {
			c.removeRow(id)
			w.counts.Repaired++
			w.counts.Deleted++
		}
	})
	for s, read := range skip {
		if read {
			c.walked[s] = true
		}
	}
	c.walk = nil
	c.tombstones = nil
	return w.counts
}

// AbortWalk abandons the running walk without proving anything deleted.
func (c *Core) AbortWalk() {
	c.walk = nil
	c.tombstones = nil
}
