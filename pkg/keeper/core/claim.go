package core

import (
	"errors"
	"math"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/pace"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// Errors of the lease operations.
var (
	// ErrNotHeld: the key is not held by this shard (never was, or was dropped, deleted or moved).
	ErrNotHeld = errors.New("row is not held by this shard")
	// ErrLeaseLost: the key is held but not under the presented lease (it expired, was released,
	// or the token is wrong).
	ErrLeaseLost = errors.New("lease is not current: it expired, was released or never existed")
	// ErrCompletionInFlight: a completion under the lease is being written (BeginCompleting);
	// until its write resolves the lease can be neither released nor completed again, and the
	// row is not handed out. The first completion's answer says whether it was written.
	// ErrRowNotRead: the lease was taken over from the shard that gave the row's slot, and the
	// row has not been read here yet (ImportLeases); nothing was done. Send the request again in
	// a moment.
	ErrRowNotRead         = errors.New("the lease came with its slot from the shard that gave it, and its row has not been read here yet: send the request again in a moment")
	ErrCompletionInFlight = errors.New("a completion under this lease is being written: the row stays leased until the write resolves, and that completion's answer says whether it was written")
)

// Claimed is one claimed row.
type Claimed struct {
	Key          string
	Slot         int
	Due          time.Time
	Cadence      time.Duration
	Route        string
	Source       schedule.Source
	Urgent       bool
	Rev          int64
	Score        float64
	Lease        uint64
	LeaseExpires time.Time
}

// floorState is one floor's claim state: its credit (rows owed, fractions included) and, during
// a claim, the rows it may still reserve and the rows of its class the claim handed out.
type floorState struct {
	credit float64
	quota  int
	taken  int
}

// claim phases: which groups claimBest looks at.
type phase uint8

const (
	phaseUrgent phase = iota // urgent groups
	phaseStarve              // non-urgent groups past their starvation bound
	phaseFloor               // non-urgent groups whose floor has quota left
	phaseScore               // non-urgent groups
)

// Claim leases up to n due rows (due ≤ now) for leaseFor, most overdue first: urgent rows first
// but at most floor(UrgentMaxShare × n) of them while other due rows exist, then the most overdue
// row of each class past its StarvationBound (longest waiting in its cadences first), then the
// floors' reserved rows (see Floor; among them by score), then by score, ties by due then key.
// Rows in incoming slots, leased rows and the rows of fenced slots (HoldSlots, Fence) are never
// claimed. Every claim is measured for the Adaptive reschedule policy (Pace).
func (c *Core) Claim(now time.Time, n int, leaseFor time.Duration) []Claimed {
	var out []Claimed
	if n > 0 {
		out = make([]Claimed, 0, min(n, 1024))
	}
	return c.ClaimInto(now, n, leaseFor, out, func(k []byte) string { return string(k) })
}

// ClaimInto claims as Claim does, appending the claimed rows to out, and makes each row's key
// with keyString (from bytes the core owns: keyString must copy them). So a caller can claim
// under a lock without allocating under it: out with room enough, and keyString copying into a
// buffer made beforehand. (Under a lock others wait for, an allocation may fault on fresh heap
// pages or assist the garbage collector.) It returns out with the claimed rows appended.
func (c *Core) ClaimInto(now time.Time, n int, leaseFor time.Duration, out []Claimed, keyString func([]byte) string) []Claimed {
	nowMs := now.UnixMilli()
	c.expireLeases(nowMs)
	if n <= 0 {
		return out
	}
	co := claimOut{rows: out, keyString: keyString}
	c.claimRows(nowMs, n, leaseFor, &co)
	return co.rows
}

// claimOut is where a claim puts its rows, and how it makes their keys.
type claimOut struct {
	rows      []Claimed
	keyString func([]byte) string
}

// claimRows claims up to n rows into co.
func (c *Core) claimRows(nowMs int64, n int, leaseFor time.Duration, co *claimOut) {
	c.allFenced = c.everyOwnedRowFenced(nowMs)
	base := len(co.rows)
	taken := func() int { return len(co.rows) - base }
	urgentCap := int(math.Floor(c.cfg.UrgentMaxShare * float64(n)))
	for taken() < urgentCap {
		if !c.claimBest(nowMs, phaseUrgent, leaseFor, co) {
			break
		}
	}
	if len(c.floors) > 0 {
		m := float64(n - taken())
		for i := range c.floors {
			f := &c.floors[i]
			f.credit += c.cfg.Floors[i].Share * m
			f.quota = int(min(math.Floor(f.credit), float64(n)))
			f.taken = 0
		}
	}
	if c.cfg.StarvationBound > 0 {
		for taken() < n {
			if !c.claimBest(nowMs, phaseStarve, leaseFor, co) {
				break
			}
		}
	}
	if len(c.floors) > 0 {
		for taken() < n {
			if !c.claimBest(nowMs, phaseFloor, leaseFor, co) {
				break
			}
		}
	}
	for taken() < n {
		if !c.claimBest(nowMs, phaseScore, leaseFor, co) {
			break
		}
	}
	for taken() < n {
		if !c.claimBest(nowMs, phaseUrgent, leaseFor, co) {
			break
		}
	}
	if len(c.floors) > 0 {
		c.settleFloors(nowMs)
	}
	c.allFenced = false // only for this claim
	c.pace.Claimed(nowMs, n, taken())
	c.recent.Claimed(nowMs, taken())
	if c.cfg.Reschedule == policy.Adaptive {
		c.paced = pace.Decide(c.pace.Reading(nowMs, c.demand()))
	}
}

// everyOwnedRowFenced says whether every owned slot that holds rows is fenced at nowMs: then a
// claim finds nothing, and claimHead need not hold back the rows it meets one by one (a new
// shard's first handoff fences all it owns until the giver's leases arrive: millions of rows).
func (c *Core) everyOwnedRowFenced(nowMs int64) bool {
	for s := range c.slots {
		if c.slots[s] == SlotOwned && c.slotHeld[s] > 0 && !c.fenced(uint16(s), nowMs) {
			return false
		}
	}
	return true
}

// Pace is the Adaptive reschedule policy's decision at the last claim, and what it was decided
// from (the zero Decision, keeping phase, before the first claim; not kept up to date under
// another policy).
func (c *Core) Pace() pace.Decision { return c.paced }

// demand is the renders an hour the owned rows need: Σ rows / cadence over the held rows, and
// over the rows beyond the window as the last walks found them (Core.beyond).
func (c *Core) demand() float64 {
	d := c.beyondOwned
	owned := 0
	for _, g := range c.groups {
		if n := c.trees.Len(&g.owned); n > 0 {
			d += float64(n) / float64(g.cadenceMs)
			owned += n
		}
	}
	// departed rows still in the owned trees (drain.go) are not the shard's
	switch c.departedOwned {
	case 0:
	case owned:
		d = c.beyondOwned // exactly: no float sum's remainder
	default:
		d -= c.departedDemand
	}
	return d * float64(time.Hour.Milliseconds())
}

// settleFloors charges each floor's credit with the rows its class got in the claim just made:
// never below 0, and a class left without due rows keeps only the fraction (an unused floor is
// not saved up).
func (c *Core) settleFloors(nowMs int64) {
	due := make([]bool, len(c.floors))
	for _, g := range c.groups {
		if g.floor < 0 {
			continue
		}
		if e, ok := c.claimHead(g, nowMs); ok && c.rows.At(e.ID()).Due() <= nowMs {
			due[g.floor] = true
		}
	}
	for i := range c.floors {
		f := &c.floors[i]
		f.credit = max(0, f.credit-float64(f.taken))
		if !due[i] {
			f.credit -= math.Floor(f.credit)
		}
		f.quota, f.taken = 0, 0
	}
}

// claimBest claims the best due row among the groups of phase p: by score, or in phaseStarve by
// the time the group has waited, in its cadences.
func (c *Core) claimBest(nowMs int64, p phase, leaseFor time.Duration, co *claimOut) bool {
	var best *group
	var bestID uint32
	var bestScore, bestKey float64
	for _, g := range c.groups {
		if g.urgent != (p == phaseUrgent) {
			continue
		}
		if p == phaseFloor && (g.floor < 0 || c.floors[g.floor].quota == 0) {
			continue
		}
		e, ok := c.claimHead(g, nowMs)
		if !ok {
			continue
		}
		id := e.ID()
		r := c.rows.At(id)
		due := r.Due()
		if due > nowMs {
			continue
		}
		s := policy.Score(nowMs, due, g.cadenceMs, g.source == schedule.SourceSubmitted, c.cfg.SubmittedBoost)
		key := s
		if p == phaseStarve {
			// waiting since its last claim or its head came due, whichever is later
			waited := float64(nowMs-max(due, g.lastClaimMs)) / float64(g.cadenceMs)
			if waited < c.cfg.StarvationBound {
				continue
			}
			key = waited
		}
		if best == nil || key > bestKey || (key == bestKey && c.before(id, bestID)) {
			best, bestID, bestScore, bestKey = g, id, s, key
		}
	}
	if best == nil {
		return false
	}
	if best.floor >= 0 {
		f := &c.floors[best.floor]
		f.taken++
		if p == phaseFloor || p == phaseStarve && f.quota > 0 {
			f.quota-- // a row the bound hands out is one of the floor's reserved rows
		}
	}
	best.lastClaimMs = nowMs
	c.trees.LeaseHead(&best.owned)
	r := c.rows.At(bestID)
	r.Set(flagLeased)
	expires := nowMs + leaseFor.Milliseconds()
	token := c.leases.Grant(bestID, r.Rev, nowMs, expires)
	co.rows = append(co.rows, Claimed{
		Key:          co.keyString(c.rows.Key(r)),
		Slot:         int(r.Slot),
		Due:          time.UnixMilli(r.Due()).UTC(),
		Cadence:      time.Duration(best.cadenceMs) * time.Millisecond,
		Route:        c.routes[r.Route],
		Source:       best.source,
		Urgent:       best.urgent,
		Rev:          r.Rev,
		Score:        bestScore,
		Lease:        token,
		LeaseExpires: time.UnixMilli(expires).UTC(),
	})
	return true
}

// before says whether record a sorts before b on ties of score (cmpDueKey).
func (c *Core) before(a, b uint32) bool { return c.cmpDueKey(a, b) < 0 }

// expireLeases ends every lease that expired at or before now.
func (c *Core) expireLeases(nowMs int64) { c.leases.Expire(nowMs, c.unlease) }

// endLease ends record id's lease.
func (c *Core) endLease(id uint32) {
	c.leases.End(id)
	c.unlease(id)
}

// unlease makes record id, whose lease has ended, claimable again.
func (c *Core) unlease(id uint32) {
	r := c.rows.At(id)
	c.trees.SetLeased(c.treeOf(r), makeEntry(id, r), false)
	r.Clear(flagLeased)
	c.objLeaseEnded(r)
}

// leaseOf finds key's record and checks that token is its current lease.
func (c *Core) leaseOf(nowMs int64, key string, token uint64) (uint32, error) {
	c.expireLeases(nowMs)
	id, ok := c.find(key)
	if !ok {
		if c.AwaitsRow(time.UnixMilli(nowMs), key, token) {
			return 0, ErrRowNotRead
		}
		return 0, ErrNotHeld
	}
	if !c.leases.Current(id, token) {
		return 0, ErrLeaseLost
	}
	return id, nil
}

// CheckLease reports whether token is key's current lease at now.
func (c *Core) CheckLease(now time.Time, key string, token uint64) error {
	_, err := c.leaseOf(now.UnixMilli(), key, token)
	return err
}

// Release ends key's lease without rendering: the row is claimable again at once.
// Completing a row is Release after applying the row's new version from the store. A lease whose
// completion is being written (BeginCompleting) is not released: ErrCompletionInFlight.
func (c *Core) Release(now time.Time, key string, token uint64) error {
	id, err := c.leaseOf(now.UnixMilli(), key, token)
	if err != nil {
		return err
	}
	if c.leases.Pinned(id) {
		return ErrCompletionInFlight
	}
	c.endLease(id)
	return nil
}

// Extend sets key's current lease (token) to expire leaseFor after now, later or sooner than it
// would have: for a render that outlasts its lease, or to hand the row out again sooner. A lease
// that is no longer current is refused (ErrLeaseLost, ErrNotHeld) and nothing changes. A lease
// whose completion is being written keeps the new expiry for when the write fails (AbortCompleting).
func (c *Core) Extend(now time.Time, key string, token uint64, leaseFor time.Duration) (time.Time, error) {
	nowMs := now.UnixMilli()
	id, err := c.leaseOf(nowMs, key, token)
	if err != nil {
		return time.Time{}, err
	}
	expires := nowMs + leaseFor.Milliseconds()
	c.leases.Extend(id, token, expires)
	return time.UnixMilli(expires).UTC(), nil
}

// Completion is what completing a leased row writes, as of the completion time.
type Completion struct {
	// Cadence and Source are the row's class.
	Cadence time.Duration
	Source  schedule.Source
	// Due is the due time the row is held with.
	Due time.Time
	// NextDue is the next due time by the configured Reschedule policy (policy.Config).
	NextDue time.Time
	// ClaimedRev is the row's rev when the lease was granted (valid when the lease is current):
	// the version that was rendered, which the completion may write over.
	ClaimedRev int64
	// Route is the route the row is held with.
	Route string
	// AsClaimed says the row is still held as the version claimed (at ClaimedRev, under the
	// current lease): Cadence, Source and Route are the rendered version's.
	AsClaimed bool
	// Hint is where the row was found, for ApplyCompleted.
	Hint Hint
}

// Hint is where Completing found a row: given to ApplyCompleted, it spares the key's second
// index lookup while the row is still held there. Any hint is safe: one that no longer holds the
// key is ignored. The zero Hint is none.
type Hint struct {
	rec uint32 // record id + 1; 0: none
}

// Completing checks that token is key's current lease at now, like CheckLease, and returns what
// completing the row at now writes: its next due time by the Reschedule policy, with its class and
// the due time it is held with. held reports whether the key is held: the class and due are valid
// whenever it is, lease or not (one index lookup for what a completion needs). A lease whose
// completion is being written already (BeginCompleting) gets ErrCompletionInFlight. Completing
// changes nothing but expiring leases: a caller that writes the completion asynchronously uses
// BeginCompleting.
func (c *Core) Completing(now time.Time, key string, token uint64) (cp Completion, held bool, err error) {
	return c.completing(now, key, token)
}

// BeginCompleting is Completing for a completion that is written after it returns (a group
// commit): when the lease is current, it is pinned until the write resolves — it does not expire,
// cannot be released or completed again, and the row is not handed out — so that no second worker
// is given the row while the first one's completion may still be written. The write's outcome
// then ends it (ApplyCompleted: written, or refused because the row changed) or puts it back
// under its expiry (AbortCompleting: not written). Without a current lease nothing is pinned.
func (c *Core) BeginCompleting(now time.Time, key string, token uint64) (cp Completion, held bool, err error) {
	cp, held, err = c.completing(now, key, token)
	if err == nil {
		c.leases.Pin(cp.Hint.rec-1, token)
	}
	return cp, held, err
}

// AbortCompleting ends the completion BeginCompleting began under key's lease (token) without
// applying anything: its write failed, so the row is as it was. The lease takes its place under
// its expiry again; one whose time passed meanwhile ends at once, and the row is claimable. It
// returns ErrNotHeld or ErrLeaseLost when the row or the lease went meanwhile (an event dropped
// the row, its slot left), and nothing changes.
func (c *Core) AbortCompleting(now time.Time, key string, token uint64, hint Hint) error {
	id, ok := c.findFrom(key, hint.rec-1)
	if !ok {
		return ErrNotHeld
	}
	if !c.leases.Unpin(id, token) && !c.leases.Current(id, token) {
		return ErrLeaseLost
	}
	c.expireLeases(now.UnixMilli())
	return nil
}

// completing is Completing.
func (c *Core) completing(now time.Time, key string, token uint64) (cp Completion, held bool, err error) {
	nowMs := now.UnixMilli()
	c.expireLeases(nowMs)
	id, held := c.find(key)
	if !held {
		if c.AwaitsRow(now, key, token) {
			return Completion{}, false, ErrRowNotRead
		}
		return Completion{}, false, ErrNotHeld
	}
	r := c.rows.At(id)
	g := c.groups[r.Group]
	cp = Completion{
		Cadence: time.Duration(g.cadenceMs) * time.Millisecond,
		Source:  g.source,
		Due:     time.UnixMilli(r.Due()).UTC(),
		NextDue: policy.NextDue(c.cfg.Reschedule.Resolve(c.paced.Stretch), now, time.UnixMilli(r.Due()), time.Duration(g.cadenceMs)*time.Millisecond),
		Hint:    Hint{rec: id + 1},
		Route:   c.routes[r.Route],
	}
	rev, current := c.leases.Rev(id, token)
	if !current {
		return cp, true, ErrLeaseLost
	}
	if c.leases.Pinned(id) {
		return cp, true, ErrCompletionInFlight
	}
	cp.ClaimedRev = rev
	cp.AsClaimed = rev != 0 && r.Rev == rev
	return cp, true, nil
}
