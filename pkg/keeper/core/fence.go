package core

import (
	"math"
	"strings"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/duetree"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/lease"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/rowstore"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// Fences and the leases that travel with a slot (docs/design.md, "Leases across a handoff").
//
// A slot is fenced while the leases its earlier owner may have granted are not known: the shard
// that gave it has not handed them over yet, or it died and they are lost. A fenced slot hands
// out none of its rows until the fence ends: a row that reaches the head of its claim tree is
// held back (lease.Table.Hold) until then, so a fence costs nothing until claims meet its rows,
// and it ends on its own at its time. While every owned slot holding rows is fenced (a new
// shard awaiting its givers' leases) claims and summaries skip the trees instead of holding
// millions of rows back one by one (everyOwnedRowFenced). Held-back rows are still held, due and
// counted: the due count does not change with a fence.
//
// A fence's end is either a time (until then the earlier owner's leases may still run) or not
// known yet (fenceLifted: until the shard ends it, once it has the earlier owner's leases).

// fenceLifted is the fence of a slot whose end is not known yet: it lasts until Fence ends it.
const fenceLifted = math.MaxInt64

// Lease is a lease as it travels with its slot from one shard to another: the row's key and
// slot, its token, when it expires and the rev it was granted for.
type Lease struct {
	Key     string
	Slot    int
	Token   uint64
	Expires time.Time
	Rev     int64
}

// SlotFence is one fence: its slots and its end (the zero time: until it is lifted).
type SlotFence struct {
	Slots schedule.SlotSet
	Until time.Time
}

// fenced says whether slot s hands out nothing at nowMs.
func (c *Core) fenced(s uint16, nowMs int64) bool { return c.fence[s] > nowMs }

// HoldSlots fences slots until Fence ends their fence: none of their rows is handed out
// meanwhile. A slot fenced already has its fence made open-ended. Only owned and incoming slots
// are fenced (a slot that leaves drops its fence).
func (c *Core) HoldSlots(now time.Time, slots []int) {
	c.setFence(now.UnixMilli(), slots, fenceLifted)
}

// Fence sets the end of the fence of slots to until: their rows are handed out again from then
// on. An until not after now lifts the fences at once (the held-back rows are claimable); a later
// one fences slots that were not fenced too. Rows held back already wait until the new end.
func (c *Core) Fence(now time.Time, slots []int, until time.Time) {
	c.setFence(now.UnixMilli(), slots, until.UnixMilli())
}

func (c *Core) setFence(nowMs int64, slots []int, untilMs int64) {
	if untilMs <= nowMs {
		untilMs = 0
	}
	var which [schedule.NumSlots]bool
	for _, s := range slots {
		if c.slots[s] == SlotNone {
			continue // a slot not held is not fenced (one that arrives is fenced when it does)
		}
		c.fence[s] = untilMs
		which[s] = true
	}
	// the holds of these slots wait until the new end, or end now
	var ending, moving []uint32
	c.leases.Each(func(l lease.Lease) {
		if l.Hold && which[c.rows.At(l.ID).Slot] {
			if untilMs == 0 {
				ending = append(ending, l.ID)
			} else {
				moving = append(moving, l.ID)
			}
		}
	})
	for _, id := range moving {
		c.leases.Hold(id, untilMs)
	}
	for _, id := range ending {
		c.endLease(id)
	}
	c.expireLeases(nowMs)
}

// SlotFenceUntil returns when slot s's fence ends: the zero time when the slot is not fenced at
// now, and lifted true when it lasts until Fence ends it.
func (c *Core) SlotFenceUntil(now time.Time, s int) (until time.Time, lifted bool) {
	f := c.fence[s]
	switch {
	case f <= now.UnixMilli():
		return time.Time{}, false
	case f == fenceLifted:
		return time.Time{}, true
	}
	return time.UnixMilli(f).UTC(), false
}

// Fences returns the fences of the owned and incoming slots at now, by end (lifted ones, with
// the zero Until, first).
func (c *Core) Fences(now time.Time) []SlotFence {
	nowMs := now.UnixMilli()
	var out []SlotFence
	idx := map[int64]int{}
	for s, f := range c.fence {
		if f <= nowMs || c.slots[s] == SlotNone {
			continue
		}
		i, ok := idx[f]
		if !ok {
			i = len(out)
			idx[f] = i
			sf := SlotFence{}
			if f != fenceLifted {
				sf.Until = time.UnixMilli(f).UTC()
			}
			out = append(out, sf)
		}
		out[i].Slots.Add(s)
	}
	sortFences(out)
	return out
}

func sortFences(fs []SlotFence) {
	for i := 1; i < len(fs); i++ {
		for j := i; j > 0 && fs[j].Until.Before(fs[j-1].Until); j-- {
			fs[j], fs[j-1] = fs[j-1], fs[j]
		}
	}
}

// claimHead returns the first claimable row of g's owned tree at nowMs, holding back the rows
// of fenced slots it meets on the way (until their fence ends) and removing departed ones.
func (c *Core) claimHead(g *group, nowMs int64) (duetree.Entry, bool) {
	if c.allFenced {
		return 0, false // nothing is claimable: no need to hold every row back
	}
	for {
		e, ok := c.trees.Head(&g.owned)
		if !ok {
			return e, false
		}
		id := e.ID()
		r := c.rows.At(id)
		if c.slots[r.Slot] == SlotNone {
			c.removeDeparted(id, r) // its slot left (drain.go): it goes now
			continue
		}
		if !c.fenced(r.Slot, nowMs) || r.Due() > nowMs {
			return e, true
		}
		c.trees.LeaseHead(&g.owned)
		r.Set(flagLeased)
		c.leases.Hold(id, c.fence[r.Slot])
	}
}

// ExportLeases returns the leases of the rows of slots at now, for the shard that takes the
// slots over: every current lease with its token, expiry and rev. A lease whose completion is
// being written (BeginCompleting) goes with an expiry of at least now + pinnedFor, so that the
// row is handed to nobody else while that write may still land. Holds do not travel: the
// fences do (SlotFenceUntil).
func (c *Core) ExportLeases(now time.Time, slots []int, pinnedFor time.Duration) []Lease {
	nowMs := now.UnixMilli()
	c.expireLeases(nowMs)
	c.expireAwaiting(nowMs)
	var which [schedule.NumSlots]bool
	for _, s := range slots {
		which[s] = true
	}
	var out []Lease
	c.leases.Each(func(l lease.Lease) {
		r := c.rows.At(l.ID)
		if l.Hold || !which[r.Slot] {
			return
		}
		exp := l.Expires
		if l.Pinned {
			exp = max(exp, nowMs+pinnedFor.Milliseconds())
		}
		out = append(out, Lease{Key: string(c.rows.Key(r)), Slot: int(r.Slot), Token: l.Token, Expires: time.UnixMilli(exp).UTC(), Rev: l.Rev})
	})
	for _, l := range c.awaitingRow {
		if which[l.Slot] {
			out = append(out, l) // still waiting for its row: it goes on waiting there
		}
	}
	return out
}

// ImportLeases takes over leases another shard granted on rows of slots now owned or incoming
// here: each row held here is leased under the lease's token until its expiry, as of its rev,
// so it is handed to nobody else meanwhile and a completion, release or extension under that
// token is accepted. A lease of a row not held here yet (the giver read a version this shard has
// not: an event not applied yet, a walk not done) waits for its row: the row is leased the moment
// it is admitted, until the lease's expiry, and a completion, release or extension under it gets
// ErrRowNotRead meanwhile (send it again). A lease that expired, of a slot not held here, or
// whose row is held here in another slot, is skipped. It returns how many leases it took over.
func (c *Core) ImportLeases(now time.Time, ls []Lease) int {
	nowMs := now.UnixMilli()
	c.expireLeases(nowMs)
	c.expireAwaiting(nowMs)
	n := 0
	for i := range ls {
		l := &ls[i]
		exp := l.Expires.UnixMilli()
		if exp <= nowMs {
			continue
		}
		id, ok := c.find(l.Key)
		if !ok {
			if c.awaitRow(*l) {
				n++
			}
			continue
		}
		r := c.rows.At(id)
		if int(r.Slot) != l.Slot {
			continue // not the row the lease was granted on
		}
		if r.Has(flagLeased) && !c.leases.IsHold(id) {
			// leased here already (the same lease handed over twice): the later expiry stands
			if rev, cur := c.leases.Rev(id, l.Token); cur {
				old, _ := c.leases.Expires(id)
				c.leases.Put(id, l.Token, rev, max(exp, old))
				n++
			}
			continue
		}
		if !r.Has(flagLeased) {
			c.lease(id, r)
		}
		c.leases.Put(id, l.Token, l.Rev, exp)
		n++
	}
	return n
}

// LeasesUntil returns when the last current lease ends (holds aside; a lease whose completion is
// being written counts until now at least), the zero time when there is none.
func (c *Core) LeasesUntil(now time.Time) time.Time {
	nowMs := now.UnixMilli()
	c.expireLeases(nowMs)
	c.expireAwaiting(nowMs)
	var until int64
	c.leases.Each(func(l lease.Lease) {
		if l.Hold {
			return
		}
		exp := l.Expires
		if l.Pinned {
			exp = max(exp, nowMs)
		}
		until = max(until, exp)
	})
	for _, l := range c.awaitingRow {
		until = max(until, l.Expires.UnixMilli())
	}
	if until == 0 {
		return time.Time{}
	}
	return time.UnixMilli(until).UTC()
}

// awaitRow keeps lease l (not expired), of a row not held here, until its row is admitted
// (attachAwaited) or it expires; it says whether it took l over. A lease of a slot not held here
// is not taken, nor one of a key another lease already waits for; the same lease handed over
// twice keeps the later expiry.
func (c *Core) awaitRow(l Lease) bool {
	if l.Slot < 0 || l.Slot >= schedule.NumSlots || c.slots[l.Slot] == SlotNone {
		return false
	}
	if old, ok := c.awaitingRow[l.Key]; ok {
		if old.Token != l.Token || old.Slot != l.Slot {
			return false
		}
		if old.Expires.After(l.Expires) {
			l.Expires = old.Expires
		}
	}
	if c.awaitingRow == nil {
		c.awaitingRow = map[string]Lease{}
	}
	l.Key = strings.Clone(l.Key)
	c.awaitingRow[l.Key] = l
	return true
}

// attachAwaited leases record id (r, of key), just admitted and not yet placed, under the lease
// that waited for it, if one did and has not expired.
func (c *Core) attachAwaited(nowMs int64, id uint32, r *rowstore.Rec, key string) {
	l, ok := c.awaitingRow[key]
	if !ok {
		return
	}
	delete(c.awaitingRow, key)
	exp := l.Expires.UnixMilli()
	if exp <= nowMs || int(r.Slot) != l.Slot {
		return
	}
	r.Set(flagLeased)
	c.leases.Put(id, l.Token, l.Rev, exp)
}

// expireAwaiting forgets the leases waiting for their row that expired at or before nowMs.
func (c *Core) expireAwaiting(nowMs int64) {
	for k, l := range c.awaitingRow {
		if l.Expires.UnixMilli() <= nowMs {
			delete(c.awaitingRow, k)
		}
	}
}

// AwaitsRow says whether token is a current lease of key that waits for its row here
// (ImportLeases): a request under it is to be sent again once the row is read.
func (c *Core) AwaitsRow(now time.Time, key string, token uint64) bool {
	if len(c.awaitingRow) == 0 {
		return false
	}
	l, ok := c.awaitingRow[key]
	return ok && l.Token == token && l.Expires.After(now)
}

// LeasesAwaitingRows returns how many leases taken over wait for their row (ImportLeases).
func (c *Core) LeasesAwaitingRows(now time.Time) int {
	c.expireAwaiting(now.UnixMilli())
	return len(c.awaitingRow)
}

// SlotOfHeld returns the slot of key's held row, and whether the core holds it.
func (c *Core) SlotOfHeld(key string) (int, bool) {
	id, ok := c.find(key)
	if !ok {
		return 0, false
	}
	return int(c.rows.At(id).Slot), true
}

// lease marks held record id, not leased, leased in its tree.
func (c *Core) lease(id uint32, r *rowstore.Rec) {
	c.trees.SetLeased(c.treeOf(r), makeEntry(id, r), true)
	r.Set(flagLeased)
}

// heldBackDue returns the due rows of the owned slots fenced at nowMs, from the due counts per
// slot: the rows a fence keeps from being handed out (leased or not).
func (c *Core) heldBackDue(slotDue *[schedule.NumSlots]int32, nowMs int64) int {
	n := 0
	for s, f := range c.fence {
		if f > nowMs && c.slots[s] == SlotOwned {
			n += int(slotDue[s])
		}
	}
	return n
}
