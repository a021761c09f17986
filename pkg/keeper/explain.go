package keeper

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core"
	"github.com/renderqueue/renderqueue/pkg/keeper/httpserve"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/store"
)

// Explaining a row (GET /v1/rows/{key}): the core says what it holds (core.Core.Explain: the
// rank, the lease, the fence, the estimate); a key it does not hold is read from the store, to
// say why not; the shard adds its slot's owner from the membership and words for people.

// EstimateMethod says how a claim time is estimated (shardapi.ClaimEstimate.Method).
const EstimateMethod = "rough: now + (rows ahead + 1) ÷ the rows a second this shard's claims handed out over the last minute. " +
	"It assumes the order and the rate hold: rows that come due meanwhile and overtake it, the urgent share, " +
	"the starvation bound, floors and a change in the workers' pace make it wrong (docs/design.md, \"Explaining a row\")"

// RankNote says where claims depart from the rank's order (shardapi.RowRank.Note).
const RankNote = "claim order when nothing else decides: the urgent share of a batch, the starvation bound and floors " +
	"hand some rows out of it"

// rankNoteFenced is added to RankNote while an owned slot is fenced.
const rankNoteFenced = "; rows of fenced slots count as ahead until a claim meets them"

// readRowTimeout bounds the store read of a key the shard does not hold.
const readRowTimeout = 5 * time.Second

// NoRowError says that no row has the key (GET /v1/rows/{key} answers 404 with it).
type NoRowError struct {
	// Slot is the slot the key's row would be in; Owner its owner ("" when none).
	Slot  int
	Owner string
}

func (e *NoRowError) Error() string {
	owner := "no shard"
	if e.Owner != "" {
		owner = "shard " + e.Owner
	}
	return fmt.Sprintf("no row has this key in PostgreSQL (its slot would be %d, owned by %s)", e.Slot, owner)
}

// rowView is what the shard knows of a key at one moment, copied under its lock.
type rowView struct {
	x        core.Explanation
	slot     int
	state    core.SlotState
	epoch    int64
	owner    string
	ownerURL string
	giver    string
	window   time.Duration
	interval time.Duration
	edge     core.Edge
	gap      bool
	fenceWhy string
}

// viewRow explains key at now under the lock; slot is the key's slot when the caller knows it
// (the store's hash), -1 when not (then the held row's, if any).
func (s *Shard) viewRow(now time.Time, key string, slot int) (rowView, error) {
	s.drain() // a due row's rank counts the trees' rows: those of slots that left go first
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.cov.Loaded() {
		return rowView{}, ErrLoading
	}
	v := rowView{x: s.core.Explain(now, key), slot: slot}
	if v.x.Held {
		v.slot = v.x.Slot
	}
	if v.slot < 0 {
		return v, nil
	}
	v.state = s.core.SlotState(v.slot)
	v.epoch = s.settings.Epoch
	v.owner, v.ownerURL = s.ownerOf(v.slot)
	if g := s.giverOf[v.slot]; g.known {
		v.giver = g.from
	}
	v.window, v.interval = s.settings.Window, s.settings.WalkInterval()
	v.edge = s.cov.Edge()
	_, v.gap = s.cov.OpenGap()
	v.fenceWhy = s.fenceWhy[v.slot]
	return v, nil
}

// ownerOf is the shard that owns slot in the adopted membership, with its URL when known.
// Called with s.mu held.
func (s *Shard) ownerOf(slot int) (name, url string) {
	for _, p := range s.settings.Peers {
		if p.Owned.Has(slot) {
			url = p.URL
			if url == "" {
				url = s.peerURL[p.Name]
			}
			return p.Name, url
		}
	}
	if s.settings.Owned.Has(slot) {
		return s.name, ""
	}
	return "", ""
}

// ExplainRow says what the shard knows of key (GET /v1/rows/{key}): a held row from memory; a
// key it does not hold read from the store (store.RowReader), to say why not. A key no row has is
// a *NoRowError; before the load ErrLoading; a store that cannot be read, its error.
func (s *Shard) ExplainRow(ctx context.Context, key string) (shardapi.RowExplanation, error) {
	if why := schedule.KeyProblem(key); why != "" {
		return shardapi.RowExplanation{}, errors.New(why)
	}
	now := s.clock()
	v, err := s.viewRow(now, key, -1)
	if err != nil {
		return shardapi.RowExplanation{}, err
	}
	if v.x.Held {
		return s.heldExplanation(now, key, v), nil
	}
	rr, ok := s.st.(store.RowReader)
	if !ok {
		return shardapi.RowExplanation{}, errors.New("the shard does not hold the row, and its store cannot read a row by its key")
	}
	rctx, cancel := context.WithTimeout(ctx, readRowTimeout)
	row, found, err := rr.ReadRow(rctx, key)
	cancel()
	if err != nil {
		return shardapi.RowExplanation{}, fmt.Errorf("the shard does not hold the row; reading it from the store: %w", err)
	}
	// the shard may have taken the row in while the store was read
	now = s.clock()
	if v, err = s.viewRow(now, key, row.Slot()); err != nil {
		return shardapi.RowExplanation{}, err
	}
	if v.x.Held {
		return s.heldExplanation(now, key, v), nil
	}
	if !found {
		return shardapi.RowExplanation{}, &NoRowError{Slot: v.slot, Owner: v.owner}
	}
	return s.notHeldExplanation(now, row, v), nil
}

// base is the part of an explanation every answer has.
func (s *Shard) base(now time.Time, key string, v rowView) shardapi.RowExplanation {
	return shardapi.RowExplanation{
		Shard: s.name, AsOf: now.UTC(), Key: key, Slot: v.slot,
		Owner: v.owner, OwnerURL: v.ownerURL, Epoch: v.epoch,
	}
}

// heldExplanation explains a held row.
func (s *Shard) heldExplanation(now time.Time, key string, v rowView) shardapi.RowExplanation {
	x := &v.x
	e := s.base(now, key, v)
	e.Held = true
	due := x.Due
	e.Row = shardapi.RowFields{Due: &due, Cadence: x.Cadence.Seconds(), Route: x.Route, Source: x.Source.String(), Urgent: x.Urgent, Rev: x.Rev}
	late := x.Lateness.Seconds()
	rel := late / x.Cadence.Seconds()
	score := x.Score
	e.LateSeconds, e.LateRelative, e.Score = &late, &rel, &score
	if x.Fenced {
		f := &shardapi.Fence{Slots: strconv.Itoa(v.slot), Reason: v.fenceWhy}
		if f.Reason == "" {
			f.Reason = "fenced"
		}
		if !x.FenceOpen {
			u := x.FenceUntil
			f.Until = &u
		}
		e.Fence = f
	}
	switch {
	case v.state != core.SlotOwned:
		e.State = shardapi.RowIncoming
		giver := v.giver
		if giver == "" {
			giver = v.owner
		}
		e.Reason = fmt.Sprintf("held in slot %d, which is being handed to this shard: it serves none of the slot's rows until the handoff commits", v.slot)
		if giver != "" {
			e.Reason += "; shard " + giver + " serves them meanwhile"
		}
	case x.Leased:
		e.State = shardapi.RowLeased
		l := &shardapi.RowLease{ID: LeaseID(x.LeaseToken), Expires: x.LeaseExpires, Completing: x.Completing}
		e.Reason = "leased to a worker"
		if !x.LeasedSince.IsZero() {
			since := x.LeasedSince
			l.Since = &since
			e.Reason += fmt.Sprintf(" %s ago", roundDur(now.Sub(since)))
		} else {
			e.Reason += " (the lease came with the slot from its earlier owner)"
		}
		if x.Completing {
			e.Reason += "; its completion is being written: the row stays leased until that write resolves"
		} else {
			e.Reason += fmt.Sprintf("; the lease ends in %s unless the worker completes, releases or extends it", roundDur(x.LeaseExpires.Sub(now)))
		}
		e.Lease = l
	case !x.IsDue:
		e.State = shardapi.RowNotDue
		e.Reason = fmt.Sprintf("held, not due yet: due in %s", roundDur(-x.Lateness))
	case x.Fenced:
		e.State = shardapi.RowHeldBack
		e.Reason = fmt.Sprintf("due %s ago, held back: slot %d hands out none of its rows", roundDur(x.Lateness), v.slot)
		if x.FenceOpen {
			e.Reason += " until the leases of its earlier owner are known"
		} else {
			e.Reason += fmt.Sprintf(" for %s more", roundDur(x.FenceUntil.Sub(now)))
		}
		if v.fenceWhy != "" {
			e.Reason += " (" + v.fenceWhy + ")"
		}
	default:
		e.State = shardapi.RowWaiting
		e.Reason = fmt.Sprintf("due %s ago (%.2f cadences), waiting for a claim: %d of the shard's %d claimable due rows come before it",
			roundDur(x.Lateness), rel, x.Ahead, x.DueClaimable)
	}
	if x.Ranked {
		note := RankNote
		if x.OwnedFenced {
			note += rankNoteFenced
		}
		e.Rank = &shardapi.RowRank{Ahead: x.Ahead, AheadUrgent: x.AheadUrgent, Due: x.DueClaimable, Note: note}
	}
	if v.state == core.SlotOwned {
		est := &shardapi.ClaimEstimate{ClaimRate: x.ClaimRate, ClaimRateSeconds: x.ClaimRateOver.Seconds(), Method: EstimateMethod, Why: x.Estimate.Why}
		if x.Estimate.OK {
			at := x.Estimate.At
			in := at.Sub(now).Seconds()
			est.At, est.InSeconds = &at, &in
		}
		e.Estimate = est
	}
	return e
}

// notHeldExplanation explains a row the store has and the shard does not hold.
func (s *Shard) notHeldExplanation(now time.Time, row schedule.Row, v rowView) shardapi.RowExplanation {
	e := s.base(now, row.Key, v)
	e.Row = shardapi.RowFields{Cadence: row.Cadence.Seconds(), Route: row.Route, Source: row.Source.String(), Urgent: row.Urgent, Rev: row.Rev}
	if row.HasDue {
		due := row.Due.UTC()
		e.Row.Due = &due
	}
	dueMs := row.Due.UnixMilli()
	switch {
	case v.state == core.SlotNone:
		e.State = shardapi.RowNotOwned
		if v.owner != "" {
			e.Reason = fmt.Sprintf("slot %d is shard %s's, not this shard's", v.slot, v.owner)
		} else {
			e.Reason = fmt.Sprintf("no shard owns slot %d in membership epoch %d", v.slot, v.epoch)
		}
	case row.HoldProblem() != "":
		e.State = shardapi.RowInvalid
		e.Reason = "the row in PostgreSQL is invalid: " + row.HoldProblem() + "; no shard holds it until it is written valid"
	case v.window > 0 && dueMs >= now.Add(v.window).UnixMilli():
		e.State = shardapi.RowBeyondWindow
		e.Reason = fmt.Sprintf("due in %s, beyond the window: the shard holds the rows due within %s; a walk (every %s) takes it in once it comes within the window",
			roundDur(row.Due.Sub(now)), roundDur(v.window), roundDur(v.interval))
	case v.edge.Known && !v.edge.Unbounded && dueMs >= v.edge.At.UnixMilli():
		e.State = shardapi.RowBeyondWindow
		e.Reason = fmt.Sprintf("due in %s, after the edge (%s: the last walk's start + the window): the next walk (every %s) takes it in",
			roundDur(row.Due.Sub(now)), v.edge.At.UTC().Format(time.RFC3339), roundDur(v.interval))
	default:
		e.State = shardapi.RowNotSeen
		switch {
		case v.x.KnownRev > 0 && row.Rev > v.x.KnownRev:
			e.Reason = fmt.Sprintf("PostgreSQL has rev %d, this shard has applied rev %d of the key", row.Rev, v.x.KnownRev)
		default:
			e.Reason = fmt.Sprintf("PostgreSQL has rev %d, which this shard has not applied", row.Rev)
		}
		e.Reason += ": its change event has not arrived yet"
		if v.gap {
			e.Reason += ", or was lost in the open gap of the shard's change events (a walk repairs it once they resume)"
		} else {
			e.Reason += " (ask again), or was lost (a walk repairs it)"
		}
	}
	if v.state == core.SlotIncoming && e.State != shardapi.RowNotOwned {
		e.Reason += fmt.Sprintf("; slot %d is being handed to this shard", v.slot)
	}
	return e
}

// LeaseID names a lease without revealing its token (shardapi.RowLease.ID): "sha256:" and the
// first 16 hex digits of the SHA-256 of the token's wire form.
func LeaseID(token uint64) string {
	sum := sha256.Sum256([]byte(httpserve.FormatLease(token)))
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// roundDur rounds d for people: to the millisecond below a second, to the second below an hour,
// to the minute above.
func roundDur(d time.Duration) time.Duration {
	switch {
	case d < 0:
		return -roundDur(-d)
	case d < time.Second:
		return d.Round(time.Millisecond)
	case d < time.Hour:
		return d.Round(time.Second)
	}
	return d.Round(time.Minute)
}
