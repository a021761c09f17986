package core

import (
	"math"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/duetree"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// Explanation is what the core knows of one key at a time (Explain): whether it holds the key's
// row and, for a held row, its lease or fence and its place in claim order, with a rough estimate
// of when a claim takes it.
type Explanation struct {
	// Held says the core holds the key's row (in an owned or an incoming slot). The fields up to
	// Estimate describe a held row; a key not held has Invalid and KnownRev only.
	Held bool
	// Slot is the held row's slot, SlotState what the shard does with it.
	Slot      int
	SlotState SlotState
	// The held row as the core holds it.
	Due     time.Time
	Cadence time.Duration
	Route   string
	Source  schedule.Source
	Urgent  bool
	Rev     int64
	// IsDue says the row is due (Due at or before now); Lateness is now − Due (negative: not
	// due yet) and Score the claim score at now (policy.Score: lateness ÷ cadence × the source's
	// boost; negative before it is due).
	IsDue    bool
	Lateness time.Duration
	Score    float64

	// Leased says a worker holds the row under a lease (a hold of a fenced slot is not one: see
	// Fenced). LeaseToken is the lease's token — it authorises completions: never show it —
	// LeasedSince when this shard granted it (zero when the lease was taken over from the slot's
	// earlier owner: not known here), LeaseExpires when it ends unless extended, and Completing
	// says a completion under it is being written (the row stays leased until that write
	// resolves, whatever the expiry).
	Leased       bool
	LeaseToken   uint64
	LeasedSince  time.Time
	LeaseExpires time.Time
	Completing   bool

	// Fenced says the row's slot hands out none of its rows at now (docs/design.md, "Leases
	// across a handoff"): until FenceUntil, or, with FenceOpen, until the slot's earlier owner's
	// leases are known.
	Fenced     bool
	FenceUntil time.Time
	FenceOpen  bool

	// Ranked says the row is due, in an owned slot and not leased: it waits for a claim.
	// Ahead is then how many claimable due rows of the owned slots come before it in claim
	// order — urgent rows first, then by score, equal scores by due time, then key — and
	// AheadUrgent how many of those are urgent rows ahead of a row that is not. DueClaimable is
	// every claimable due row of the owned slots (this one included). The order is the one the
	// claims follow when nothing else decides: the urgent share of a batch
	// (policy.Config.UrgentMaxShare), the starvation bound and the floors hand some rows out
	// of it, so a claim may take the row earlier or later than Ahead says. Rows of fenced slots
	// count as ahead until a claim meets them (OwnedFenced says whether any owned slot is
	// fenced).
	Ranked       bool
	Ahead        int
	AheadUrgent  int
	DueClaimable int
	OwnedFenced  bool

	// ClaimRate is the rows a second the claims handed out over ClaimRateOver (the last minute,
	// or the time since the first claim: pace.Recent).
	ClaimRate     float64
	ClaimRateOver time.Duration
	// Estimate is when a claim may take the row, at ClaimRate.
	Estimate Estimate

	// Invalid says the key's latest version the core knows is invalid (never held); KnownRev is
	// the newest rev the core knows of a key it does not hold (0: none; the invalid version's,
	// or while a walk runs, that of a version it keeps out).
	Invalid  bool
	KnownRev int64
}

// Estimate is a rough estimate of when a claim takes a waiting row: at the claims' recent rate,
// after the rows ahead of it.
type Estimate struct {
	// OK says an estimate was made: At. Otherwise Why says why there is none.
	OK  bool
	At  time.Time
	Why string
}

// Explain says what the core knows of key at now (Explanation). Like a claim, it ends the leases
// that expired by now first; otherwise it changes nothing. It costs a key lookup plus, for a due
// row, a descent of each group's tree (Forest.Prefix): time in the groups and the trees' height,
// not in the rows held.
func (c *Core) Explain(now time.Time, key string) Explanation {
	nowMs := now.UnixMilli()
	c.Drain(math.MaxInt) // the ranks count the trees' rows: departed ones go first
	c.expireLeases(nowMs)
	var x Explanation
	x.ClaimRate, x.ClaimRateOver = c.recent.Rate(nowMs)
	id, held := c.find(key)
	if !held {
		if k, ok := c.invalid[key]; ok {
			x.Invalid, x.KnownRev = true, k.rev
		} else if k, ok := c.tombstones[key]; ok {
			x.KnownRev = k.rev
		}
		x.Estimate.Why = "the row is not held by this shard"
		return x
	}
	r := c.rows.At(id)
	g := c.groups[r.Group]
	due := r.Due()
	x.Held = true
	x.Slot, x.SlotState = int(r.Slot), c.slots[r.Slot]
	x.Due = time.UnixMilli(due).UTC()
	x.Cadence = time.Duration(g.cadenceMs) * time.Millisecond
	x.Route, x.Source, x.Urgent, x.Rev = c.routes[r.Route], g.source, g.urgent, r.Rev
	x.IsDue = due <= nowMs
	x.Lateness = time.Duration(nowMs-due) * time.Millisecond
	x.Score = policy.Score(nowMs, due, g.cadenceMs, g.source == schedule.SourceSubmitted, c.cfg.SubmittedBoost)
	if l, ok := c.leases.Get(id); ok && !l.Hold {
		x.Leased, x.LeaseToken, x.Completing = true, l.Token, l.Pinned
		x.LeaseExpires = time.UnixMilli(l.Expires).UTC()
		if l.Since != 0 {
			x.LeasedSince = time.UnixMilli(l.Since).UTC()
		}
	}
	if c.fenced(r.Slot, nowMs) {
		x.Fenced = true
		if f := c.fence[r.Slot]; f == fenceLifted {
			x.FenceOpen = true
		} else {
			x.FenceUntil = time.UnixMilli(f).UTC()
		}
	}
	for s, st := range c.slots {
		if st == SlotOwned && c.fenced(uint16(s), nowMs) {
			x.OwnedFenced = true
			break
		}
	}
	x.Ranked = x.SlotState == SlotOwned && x.IsDue && !x.Leased
	if x.Ranked {
		c.rank(nowMs, id, g, x.Score, &x)
	}
	x.Estimate = estimate(now, &x)
	return x
}

// rank counts the rows ahead of held, due record id of group g (score s at nowMs) in claim order,
// and the claimable due rows, into x. In each group the rows ahead of it are a prefix of the
// group's tree (within a group score order is due order), so each group costs one descent.
func (c *Core) rank(nowMs int64, id uint32, g *group, s float64, x *Explanation) {
	isDue := func(e duetree.Entry) bool { return c.rows.At(e.ID()).Due() <= nowMs }
	for _, h := range c.groups {
		_, due := c.trees.Prefix(&h.owned, isDue)
		x.DueClaimable += due
		switch {
		case h.urgent && !g.urgent:
			// every due urgent row comes before a row that is not urgent
			x.Ahead += due
			x.AheadUrgent += due
			continue
		case h.urgent != g.urgent:
			continue // a row that is not urgent comes after an urgent one
		}
		submitted := h.source == schedule.SourceSubmitted
		ahead := func(e duetree.Entry) bool {
			y := e.ID()
			sy := policy.Score(nowMs, c.rows.At(y).Due(), h.cadenceMs, submitted, c.cfg.SubmittedBoost)
			if sy != s {
				return sy > s
			}
			return c.cmpDueKey(y, id) < 0
		}
		_, n := c.trees.Prefix(&h.owned, ahead)
		x.Ahead += n
	}
}

// maxEstimate is the longest wait estimate gives a time for.
const maxEstimate = 365 * 24 * time.Hour

// estimate is when a claim may take the row x explains, at now: for a waiting row, now +
// (Ahead + 1) ÷ ClaimRate (the rows ahead and the row itself, at the rate of the last minute's
// claims), or the end of its slot's fence when that is later. It assumes the order stays as it
// is and the rate holds: rows that come due meanwhile and overtake it, the urgent share, the
// starvation bound and the floors, and a change of pace all make it wrong.
func estimate(now time.Time, x *Explanation) Estimate {
	switch {
	case x.SlotState != SlotOwned:
		return Estimate{Why: "its slot is incoming: this shard holds the row but does not hand it out until the handoff commits"}
	case x.Leased:
		return Estimate{Why: "leased: handed out again only if the lease ends without a completion"}
	case !x.IsDue:
		return Estimate{Why: "not due yet: no claim takes it before its due time"}
	case x.FenceOpen:
		return Estimate{Why: "its slot is fenced until the leases of its earlier owner are known"}
	case x.ClaimRate <= 0:
		return Estimate{Why: "no rows were claimed in the last minute: no rate to estimate from"}
	}
	secs := float64(x.Ahead+1) / x.ClaimRate
	if secs > maxEstimate.Seconds() {
		return Estimate{Why: "at the last minute's claim rate the rows ahead of it take more than a year"}
	}
	at := now.Add(time.Duration(secs * float64(time.Second))).UTC()
	if x.Fenced && x.FenceUntil.After(at) {
		at = x.FenceUntil
	}
	return Estimate{OK: true, At: at.Truncate(time.Millisecond)}
}
