package core

import (
	"errors"
	"math"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/rowstore"
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
	// seen counts, per walked slot, the held rows the walk has seen (read, or touched by an event).
	seen   [schedule.NumSlots]int32
	counts WalkCounts
	// sweep is set once the walk is closing and rows must be visited: sweepSlot says what to do
	// with each slot's rows (drop the unseen ones, or mark them all seen), sweepNext is the next
	// record chunk to visit.
	sweep     bool
	sweepSlot [schedule.NumSlots]sweepAction
	sweepNext int
	// read marks the walked slots read completely (set when closing).
	read [schedule.NumSlots]bool
	// beyond is, per slot, the demand of the rows read beyond the window (see Core.beyond).
	beyond [schedule.NumSlots]float64
}

// leave takes slot s, which left the shard while the walk ran (its rows are dropped), out of the
// walk: finishing, the walk vouches for nothing in it. Rows held in s again later are marked seen
// as they come, so the slot's rows are all alike when the walk ends, as between walks. No-op on a
// nil walk.
func (w *walkState) leave(s int) {
	if w == nil {
		return
	}
	w.slots[s], w.read[s] = false, false
	w.seen[s], w.sweepSlot[s] = 0, sweepNone
}

type sweepAction uint8

const (
	sweepNone sweepAction = iota
	// sweepDrop: the slot was read completely; its unseen rows are proven deleted.
	sweepDrop
	// sweepMark: the slot was not read completely; its rows are marked seen, so all of them are
	// alike again for the next walk.
	sweepMark
)

// The walk mark. A row of slot s counts as seen when its flagSeen bit equals parity[s]. Between
// walks every row of a slot is seen; starting a walk flips the parity of the walked slots, which
// unmarks all their rows at once (no pass over the rows), and the walk counts per slot how many
// rows it has seen since. Closing the walk needs a pass over the rows only when some slot has
// rows left unseen: a read slot with rows the walk proved deleted, or an unread slot whose rows
// must be made alike again. The service makes that pass in bounded steps (SweepWalk).

func (c *Core) isSeen(r *rowstore.Rec) bool { return r.Has(flagSeen) == c.parity[r.Slot] }

func (c *Core) setSeen(r *rowstore.Rec) {
	if c.parity[r.Slot] {
		r.Set(flagSeen)
	} else {
		r.Clear(flagSeen)
	}
}

// markSeen marks a held row seen by the running walk.
func (c *Core) markSeen(r *rowstore.Rec) {
	if !c.isSeen(r) {
		c.setSeen(r)
		if c.walk.slots[r.Slot] {
			c.walk.seen[r.Slot]++
		}
	}
}

// newSeen marks a newly held row seen (by the running walk, if any).
func (c *Core) newSeen(r *rowstore.Rec) {
	c.setSeen(r)
	if c.walk != nil && c.walk.slots[r.Slot] {
		c.walk.seen[r.Slot]++
	}
}

// unseen takes a row that is being dropped out of the running walk's count.
func (c *Core) unseen(r *rowstore.Rec) {
	if c.walk != nil && c.walk.slots[r.Slot] && c.isSeen(r) {
		c.walk.seen[r.Slot]--
	}
}

// ErrWalking is returned by BeginWalk while a walk is running.
var ErrWalking = errors.New("a walk is already running")

// BeginWalk starts a verification walk of slots at now. prevEdge is the edge of the last
// finished walk: rows found missing before it are repairs, rows after it are admissions. It takes
// time in the number of slots, not rows.
func (c *Core) BeginWalk(now time.Time, prevEdge Edge, slots []int) error {
	if c.walk != nil {
		return ErrWalking
	}
	w := &walkState{startMs: now.UnixMilli(), prevEdge: prevEdge}
	for _, s := range slots {
		if !w.slots[s] {
			w.slots[s] = true
			c.parity[s] = !c.parity[s]
		}
	}
	c.walk = w
	c.tombstones = map[string]known{}
	return nil
}

// Walking says whether a walk is running (closing included).
func (c *Core) Walking() bool { return c.walk != nil }

// WalkRow applies one walked row at now and counts it.
func (c *Core) WalkRow(now time.Time, row schedule.Row) Outcome {
	w := c.walk
	if w == nil || w.sweep {
		return c.Apply(now, row)
	}
	w.counts.Scanned++
	o := c.apply(now.UnixMilli(), &row, noRecord)
	dueMs := row.Due.UnixMilli()
	switch o.Result {
	case Invalid:
		w.counts.Invalid++
	case Held:
		switch {
		case o.WasHeld:
			w.counts.Repaired++ // the held version was stale
		case c.WalkedBefore(row.Slot()) && w.prevEdge.covers(dueMs):
			w.counts.Repaired++
		default:
			w.counts.Admitted++
		}
	case Dropped:
		w.counts.Repaired++ // held, but a missed write had moved it beyond the window
		w.countNotHeld(dueMs)
		w.beyond[row.Slot()] += 1 / float64(row.Cadence.Milliseconds())
	case NotHeld:
		w.countNotHeld(dueMs)
		w.beyond[row.Slot()] += 1 / float64(row.Cadence.Milliseconds())
	}
	return o
}

func (w *walkState) countNotHeld(dueMs int64) {
	w.counts.OwnedNotHeld++
	if d := dueMs - w.startMs; d >= 0 && d < 24*3600_000 {
		w.counts.OwnedNotHeldByHour[d/3600_000]++
	}
}

// WalkedBefore says whether slot s has been read by a finished walk since it joined the shard.
func (c *Core) WalkedBefore(s int) bool { return c.walked[s] }

// EndWalk finishes the running walk. unread lists the walked slots whose rows could not all be
// read: held rows of every other walked slot that the walk did not see and no event touched are
// proven deleted and dropped. Returns the walk's counts. It visits every held row when some are
// left unseen; CloseWalk and SweepWalk do the same in bounded steps.
func (c *Core) EndWalk(unread []int) WalkCounts {
	if c.walk == nil {
		return WalkCounts{}
	}
	c.CloseWalk(unread, false)
	for {
		if counts, done := c.SweepWalk(math.MaxInt); done {
			return counts
		}
	}
}

// AbortWalk abandons the running walk without proving anything deleted.
func (c *Core) AbortWalk() {
	if c.walk == nil {
		return
	}
	c.CloseWalk(nil, true)
	for {
		if _, done := c.SweepWalk(math.MaxInt); done {
			return
		}
	}
}

// CloseWalk starts closing the running walk: like EndWalk (or AbortWalk when abort is set), but
// the rows left to visit are visited by SweepWalk, in steps. Until the sweep is done the walk is
// still running: rows applied meanwhile are marked seen, and WalkRow applies rows without
// counting them. It takes time in the number of slots.
func (c *Core) CloseWalk(unread []int, abort bool) {
	w := c.walk
	if w == nil || w.sweep {
		return
	}
	w.sweep = true
	read := w.slots
	if abort {
		read = [schedule.NumSlots]bool{}
	}
	for _, s := range unread {
		read[s] = false
	}
	for s := range w.slots {
		if !w.slots[s] {
			continue
		}
		held, seen := c.slotHeld[s], w.seen[s]
		switch {
		case seen == held:
			// every row seen: nothing to do
		case read[s]:
			w.sweepSlot[s] = sweepDrop
		case seen == 0:
			c.parity[s] = !c.parity[s] // every row unseen: flipping back marks them all seen
		default:
			w.sweepSlot[s] = sweepMark
		}
	}
	w.read = read
}

// SweepWalk visits up to about maxRows held rows of the closing walk (see CloseWalk) and reports
// whether the walk is finished; then it returns the walk's counts.
func (c *Core) SweepWalk(maxRows int) (WalkCounts, bool) {
	w := c.walk
	if w == nil {
		return WalkCounts{}, true
	}
	if !w.sweep {
		return WalkCounts{}, false
	}
	needed := false
	for _, a := range w.sweepSlot {
		if a != sweepNone {
			needed = true
			break
		}
	}
	visited := 0
	for needed && w.sweepNext < c.rows.Chunks() && visited < maxRows {
		visited += c.rows.EachInChunk(w.sweepNext, func(id uint32, r *rowstore.Rec) {
			if c.isSeen(r) {
				return
			}
			switch w.sweepSlot[r.Slot] {
			case sweepDrop:
				c.removeRow(id)
				w.counts.Repaired++
				w.counts.Deleted++
			case sweepMark:
				c.setSeen(r)
			}
		})
		w.sweepNext++
	}
	if needed && w.sweepNext < c.rows.Chunks() {
		return WalkCounts{}, false
	}
	for s, ok := range w.read {
		if ok {
			c.walked[s] = true
			c.beyond[s] = w.beyond[s]
		}
	}
	c.sumBeyond()
	c.walk = nil
	c.tombstones = nil
	return w.counts, true
}
