package keeper

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core"
	"github.com/renderqueue/renderqueue/pkg/keeper/httpserve"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// Leases across a handoff (docs/design.md, "Leases across a handoff").
//
// A slot's leases travel with it. When a shard adopts a commit that takes owned slots away (the
// giver), it takes their leases out of its core, with their tokens, expiries and revs, and keeps
// them as the slots' handover record; it hands out nothing of those slots any more. A shard that
// adopts a commit giving it slots (the receiver) holds their rows back (core.Core.HoldSlots: none
// is handed out) and asks the giver for the record (POST /v1/handover, answered by Handover):
// "owned" while the giver has not adopted the commit yet (the receiver asks again), the leases
// once it has (the receiver takes them over, core.Core.ImportLeases, and its fence ends — or
// waits for the giver's own fence), "unknown" when the giver's process has no record (it started
// after giving the slots: its answer bounds what its predecessor may have leased). A giver that
// does not answer for HandoverGiveUp leaves its leases unknown: the receiver holds the slots back
// until MaxLease has passed (fencing by time).
//
// A worker whose lease moved with its slot and that completes, releases or extends on the giver
// is answered with the receiver's URL (shardapi.ItemResult.MovedTo, ErrMoved); pkg/client sends
// the item there once. A receiver asked about a lease it does not know of a slot still arriving —
// incoming (it has not adopted the commit yet: the giver, which adopts first, may already send
// workers here) or its handover awaited — answers 503 (ErrHandoverPending): nothing is done, and
// the request is sent again.

// Peer is another shard of the queue, as the membership knows it.
type Peer struct {
	// Name is the shard's name.
	Name string
	// URL is the base URL of its API; empty while unknown (its Pod has no IP).
	URL string
	// Owned is the slots it owns in the published assignment.
	Owned schedule.SlotSet
}

// Arrival names the shard that gives slots to this one: the slots incoming to it in a prepare,
// or handed to it by the last committed handoff.
type Arrival struct {
	// From is the giving shard; "" for slots that had no owner (the first assignment).
	From string
	// Slots are the slots it gives.
	Slots schedule.SlotSet
	// CommittedAt is when the handoff was committed; zero while it prepares.
	CommittedAt time.Time
	// Epoch is the epoch of the commit; 0 while it prepares, or when not known. A giver's
	// handover answer counts from that epoch on (awaitedHandover.epoch).
	Epoch int64
}

// PeerClient asks another shard for the handover of slots (POST /v1/handover).
type PeerClient interface {
	Handover(ctx context.Context, baseURL string, req shardapi.HandoverRequest) (shardapi.HandoverResponse, error)
}

// Timings of the handover (variables so that tests can shorten them).
var (
	// HandoverGiveUp is how long a receiver asks a giver that does not answer (no connection,
	// an error) before it takes the giver's leases as unknown and fences the slots by time.
	HandoverGiveUp = 15 * time.Second
	// handoverRetry is the pause between two asks of a giver that still owns the slots or did
	// not answer.
	handoverRetry = 200 * time.Millisecond
	// handoverTimeout bounds one ask.
	handoverTimeout = 5 * time.Second
	// pinnedLeaseFor is the least a lease whose completion is being written when its slot leaves
	// goes with: longer than the write may take (the HTTP write timeout bounds the request).
	pinnedLeaseFor = 2 * time.Minute
)

// Errors of the lease operations that concern a handoff.
var (
	// ErrHandoverPending: the row's slot came to this shard and the leases of its earlier owner
	// have not arrived yet; nothing was done. Send the request again in a moment.
	ErrHandoverPending = errors.New("the row's slot is being handed over to this shard and the leases of its earlier owner have not arrived yet: send the request again in a moment")
)

// MovedError is an item refused because its lease moved with its slot to another shard.
type MovedError struct {
	// Shard is the shard that owns the slot now; URL its base URL, empty when unknown.
	Shard, URL string
}

func (e *MovedError) Error() string {
	if e.URL == "" {
		return fmt.Sprintf("the lease moved with its slot to shard %s, whose address is not known yet: send the item there", e.Shard)
	}
	return fmt.Sprintf("the lease moved with its slot to shard %s: send the item to %s", e.Shard, e.URL)
}

// outRecord is the handover record of a slot this shard gave away.
type outRecord struct {
	at    time.Time // when the slot left
	epoch int64     // the epoch whose settings took it away
	// fence is the end of a fence the slot had here (its rows were not handed out before it), or
	// zero
	fence  time.Time
	leases []core.Lease
	// fetched: the record was handed to a shard that asked for it
	fetched bool
}

// movedLease is a lease that left with its slot: for answering its worker with the new owner.
type movedLease struct {
	token   uint64
	slot    int
	expires time.Time
}

// awaitedHandover is a slot held back until its giver's leases arrive.
type awaitedHandover struct {
	from  string
	since time.Time
	// epoch is the commit's epoch (or, when not known, this shard's settings epoch when it took
	// the slot over): a giver's answer counts only once the giver has adopted that epoch too
	// (applyHandoverLocked)
	epoch int64
}

// maxLease is the longest lease a claim or an extension gets: Settings.MaxLease, or the default
// lease when it is 0.
func (s *Settings) maxLease() time.Duration {
	if s.MaxLease > 0 {
		return s.MaxLease
	}
	return s.LeaseDuration
}

// noteArrivals records who gives the slots of as (Settings.Arriving). Called with s.mu held.
func (s *Shard) noteArrivals(as []Arrival) {
	for _, a := range as {
		for _, sl := range a.Slots.Slots() {
			s.giverOf[sl] = giverInfo{known: true, from: a.From, committedAt: a.CommittedAt, epoch: a.Epoch}
		}
	}
}

// giverInfo is who gives a slot to this shard, when known.
type giverInfo struct {
	known       bool
	from        string
	committedAt time.Time
	epoch       int64 // of the commit; 0 when not known
}

// giveAway takes the leases of owned slots that are leaving out of the core into their handover
// records, before the core drops the slots. Called with s.mu held.
func (s *Shard) giveAway(now time.Time, slots []int, epoch int64) {
	if len(slots) == 0 {
		return
	}
	maxLease := s.settings.maxLease()
	ls := s.core.ExportLeases(now, slots, max(pinnedLeaseFor, maxLease))
	for _, sl := range slots {
		rec := &outRecord{at: now, epoch: epoch}
		if until, lifted := s.core.SlotFenceUntil(now, sl); lifted {
			// awaiting its own giver's leases still: those are unknown to the next owner
			rec.fence = now.Add(maxLease)
		} else {
			rec.fence = until
		}
		s.out[sl] = rec
		delete(s.awaiting, sl)
		s.fenceWhy[sl] = ""
	}
	for _, l := range ls {
		s.out[l.Slot].leases = append(s.out[l.Slot].leases, l)
		s.moved[l.Key] = movedLease{token: l.Token, slot: l.Slot, expires: l.Expires}
	}
	s.log.Info("Gave slots away; their leases go to the new owner with the handover", "shard", s.name, "epoch", epoch,
		"slots", schedule.FormatSlots(setOf(slots)), "leases", len(ls))
	s.m.HandedOver(len(ls))
}

// takeOver decides what arriving owned slots wait for: the leases of the shard that gave them
// (held back until its handover is applied), nothing (they had no owner, or at the start of the
// process the last handoff is older than any lease it could have moved), or, when the giver is
// not known, the time any lease could run (fenced for MaxLease). Called with s.mu held, after the
// core owns the slots.
func (s *Shard) takeOver(now time.Time, slots []int, startup bool) (cover time.Time) {
	if len(slots) == 0 {
		return time.Time{}
	}
	var held, unknown []int
	for _, sl := range slots {
		g := s.giverOf[sl]
		switch {
		case g.known && g.from == "":
		case g.known && g.from != s.name:
			if startup && !g.committedAt.IsZero() && now.After(g.committedAt.Add(s.settings.maxLease()+HandoverGiveUp)) {
				continue // every lease that could have moved with it has ended
			}
			// the giver's answer counts once it has adopted the commit that gave the slot away (when
			// not known, the settings this shard took it over with, which are no older)
			epoch := s.settings.Epoch
			if g.epoch > 0 && g.epoch < epoch {
				epoch = g.epoch
			}
			s.awaiting[sl] = awaitedHandover{from: g.from, since: now, epoch: epoch}
			s.fenceWhy[sl] = "awaiting the leases of " + g.from
			held = append(held, sl)
		case !startup:
			unknown = append(unknown, sl)
		}
	}
	if len(held) > 0 {
		s.core.HoldSlots(now, held)
		s.log.Info("Took slots over; holding their rows back until the giver's leases arrive", "shard", s.name,
			"slots", schedule.FormatSlots(setOf(held)))
		select {
		case s.handoverWake <- struct{}{}:
		default:
		}
	}
	if len(unknown) > 0 {
		until := now.Add(s.settings.maxLease())
		s.core.Fence(now, unknown, until)
		for _, sl := range unknown {
			s.fenceWhy[sl] = "the shard that gave them is not known: any lease of it has ended by then"
		}
		s.log.Info("Took slots over from an unknown shard; holding their rows back for the longest lease", "shard", s.name,
			"slots", schedule.FormatSlots(setOf(unknown)), "until", until)
		return until
	}
	return time.Time{}
}

func setOf(slots []int) schedule.SlotSet {
	var set schedule.SlotSet
	for _, sl := range slots {
		set.Add(sl)
	}
	return set
}

// Handover answers another shard's ask for the handover of slots (POST /v1/handover): per slot,
// owned (this shard still owns it), its handover record, or unknown (no record: with the bound on
// what an earlier process of this shard may have leased).
func (s *Shard) Handover(now time.Time, req shardapi.HandoverRequest) (shardapi.HandoverResponse, error) {
	asked, err := schedule.ParseSlots(req.Slots)
	if err != nil {
		return shardapi.HandoverResponse{}, fmt.Errorf("slots: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneMoved(now)
	resp := shardapi.HandoverResponse{Shard: s.name, Epoch: s.settings.Epoch}
	type groupKey struct {
		state string
		fence int64
	}
	groups := map[groupKey]*shardapi.HandoverSlots{}
	var order []groupKey
	sets := map[groupKey]*schedule.SlotSet{}
	add := func(k groupKey, sl int, leases []core.Lease) {
		g, ok := groups[k]
		if !ok {
			g = &shardapi.HandoverSlots{State: k.state}
			if k.fence > now.UnixMilli() {
				t := time.UnixMilli(k.fence).UTC()
				g.FenceUntil = &t
			}
			groups[k], sets[k] = g, &schedule.SlotSet{}
			order = append(order, k)
		}
		sets[k].Add(sl)
		for _, l := range leases {
			if l.Expires.After(now) {
				g.Leases = append(g.Leases, shardapi.HandoverLease{Key: l.Key, Slot: l.Slot, Lease: httpserve.FormatLease(l.Token),
					Expires: l.Expires, Rev: l.Rev})
			}
		}
	}
	for _, sl := range asked.Slots() {
		switch rec := s.out[sl]; {
		case s.core.SlotState(sl) == core.SlotOwned:
			add(groupKey{state: shardapi.HandoverOwned}, sl, nil)
		case rec != nil:
			add(groupKey{state: shardapi.HandoverGiven, fence: unixMilliOrZero(rec.fence)}, sl, rec.leases)
			rec.fetched = true
		default:
			add(groupKey{state: shardapi.HandoverUnknown, fence: unixMilliOrZero(s.inherited)}, sl, nil)
		}
	}
	for _, k := range order {
		g := groups[k]
		g.Slots = schedule.FormatSlots(*sets[k])
		resp.Slots = append(resp.Slots, *g)
	}
	s.log.V(1).Info("Answered a handover", "shard", s.name, "to", req.Shard, "slots", req.Slots, "groups", len(resp.Slots))
	return resp, nil
}

func unixMilliOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// pruneMoved forgets the moved leases that have ended, and the ended leases of handover
// records. Called with s.mu held.
func (s *Shard) pruneMoved(now time.Time) {
	for k, m := range s.moved {
		if !m.expires.After(now) {
			delete(s.moved, k)
		}
	}
	for _, rec := range s.out {
		rec.leases = slices.DeleteFunc(rec.leases, func(l core.Lease) bool { return !l.Expires.After(now) })
	}
}

// movedTo returns the error for an item whose lease left with its slot (nil when it did not).
// Called with s.mu held.
func (s *Shard) movedTo(now time.Time, key string, token uint64) error {
	m, ok := s.moved[key]
	if !ok || m.token != token || !m.expires.After(now) {
		return nil
	}
	for _, p := range s.settings.Peers {
		if p.Owned.Has(m.slot) {
			url := p.URL
			if url == "" {
				url = s.peerURL[p.Name]
			}
			return &MovedError{Shard: p.Name, URL: url}
		}
	}
	return nil
}

// handoverPending says whether key is held here in a slot that is arriving — its handover awaited,
// or still incoming (prepared, the commit not adopted here yet: its giver may have adopted it and
// sent the worker here with movedTo already) — with token not (yet) a lease of it: the lease may
// be the giver's, on its way. Called with s.mu held.
func (s *Shard) handoverPending(now time.Time, key string, token uint64) bool {
	if !s.slotsArriving() {
		return false
	}
	sl, held := s.core.SlotOfHeld(key)
	if !held {
		return false
	}
	if _, ok := s.awaiting[sl]; !ok && !s.settings.Incoming.Has(sl) {
		return false
	}
	return s.core.CheckLease(now, key, token) != nil
}

// slotsArriving says whether any slot is coming to this shard: incoming, or its handover awaited.
// Called with s.mu held.
func (s *Shard) slotsArriving() bool { return len(s.awaiting) > 0 || !s.settings.Incoming.IsEmpty() }

// runHandovers asks the givers of the slots this shard awaits for their handover, until ctx ends:
// again every handoverRetry while one still owns its slots or does not answer, and, for a giver
// that has not answered for HandoverGiveUp, fencing its slots by time instead.
func (s *Shard) runHandovers(ctx context.Context) {
	failing := map[string]time.Time{} // giver -> since when its asks fail
	for {
		s.mu.Lock()
		byGiver := map[string][]int{}
		for sl, a := range s.awaiting {
			byGiver[a.from] = append(byGiver[a.from], sl)
		}
		urls := map[string]string{}
		for g := range byGiver {
			urls[g] = s.peerURLOf(g)
		}
		s.mu.Unlock()
		for g := range failing {
			if byGiver[g] == nil {
				delete(failing, g)
			}
		}
		for g, slots := range byGiver {
			slices.Sort(slots)
			err := s.askHandover(ctx, g, urls[g], slots)
			if err == nil {
				delete(failing, g)
				continue
			}
			if ctx.Err() != nil {
				return
			}
			since, ok := failing[g]
			if !ok {
				since = s.clock()
				failing[g] = since
			}
			if s.clock().Sub(since) >= HandoverGiveUp {
				s.fenceUnknown(g, slots, err)
				delete(failing, g)
			}
		}
		s.mu.Lock()
		waiting := len(s.awaiting) > 0
		s.mu.Unlock()
		var retry <-chan time.Time
		var t *time.Timer
		if waiting {
			t = time.NewTimer(handoverRetry)
			retry = t.C
		}
		select {
		case <-ctx.Done():
		case <-s.handoverWake:
		case <-retry:
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// peerURLOf returns the base URL of shard name: from the settings, or the last one known (a Pod
// being deleted drops out of the RenderQueue's status). Called with s.mu held.
func (s *Shard) peerURLOf(name string) string {
	for _, p := range s.settings.Peers {
		if p.Name == name && p.URL != "" {
			return p.URL
		}
	}
	return s.peerURL[name]
}

// askHandover asks giver (at url) for the handover of slots and applies its answer. It returns
// nil when the giver answered (even "owned": then the slots stay awaited and are asked for again),
// an error when it could not be asked or did not answer.
func (s *Shard) askHandover(ctx context.Context, giver, url string, slots []int) error {
	if s.peers == nil {
		return errors.New("the keeper has no client for other shards")
	}
	if url == "" {
		return fmt.Errorf("the address of shard %s is not known", giver)
	}
	actx, cancel := context.WithTimeout(ctx, handoverTimeout)
	defer cancel()
	resp, err := s.peers.Handover(actx, url, shardapi.HandoverRequest{Shard: s.name, Slots: schedule.FormatSlots(setOf(slots))})
	if err != nil {
		return fmt.Errorf("asking %s (%s) for the handover of slots %s: %w", giver, url, schedule.FormatSlots(setOf(slots)), err)
	}
	if resp.Shard != giver {
		return fmt.Errorf("asking %s (%s) for a handover: %s answered", giver, url, resp.Shard)
	}
	s.applyHandover(giver, resp)
	return nil
}

// applyHandover applies giver's answer to the slots still awaited from it: its leases taken over
// and the slots fenced until the giver's fence ends (or not at all); slots it still owns stay
// awaited.
func (s *Shard) applyHandover(giver string, resp shardapi.HandoverResponse) {
	cover := s.applyHandoverLocked(giver, resp)
	if err := s.coverLeases(cover); err != nil {
		s.log.Error(err, "Cannot record the leases taken over in the state file", "shard", s.name)
	}
}

// applyHandoverLocked is applyHandover under the lock; it returns when the leases and fences it
// set end, for the state file.
func (s *Shard) applyHandoverLocked(giver string, resp shardapi.HandoverResponse) (cover time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	for _, g := range resp.Slots {
		set, err := schedule.ParseSlots(g.Slots)
		if err != nil {
			s.log.Error(err, "Ignoring a malformed handover answer", "shard", s.name, "from", giver)
			continue
		}
		var slots []int
		stale := 0
		for _, sl := range set.Slots() {
			if a, ok := s.awaiting[sl]; ok && a.from == giver && resp.Epoch < a.epoch {
				stale++
			}
			// A giver whose settings are older than the commit that gave the slot away may not
			// have come to own the slot yet (it may lag several epochs behind, and skip some):
			// its "unknown" or "given" says nothing about the leases it may still grant before
			// it gives the slot. Ask it again until it has caught up.
			if a, ok := s.awaiting[sl]; ok && a.from == giver && resp.Epoch >= a.epoch {
				slots = append(slots, sl)
			}
		}
		if stale > 0 && now.Sub(s.staleLogged[giver]) >= 5*time.Second {
			s.staleLogged[giver] = now
			s.log.Info("The giver answered from settings older than the commit; asking it again until it has caught up",
				"shard", s.name, "from", giver, "giverEpoch", resp.Epoch, "slots", stale, "state", g.State)
		}
		if len(slots) == 0 || g.State == shardapi.HandoverOwned {
			continue
		}
		mine := setOf(slots)
		var ls []core.Lease
		for _, l := range g.Leases {
			tok, err := httpserve.ParseLease(l.Lease)
			if err != nil || !mine.Has(l.Slot) {
				continue
			}
			ls = append(ls, core.Lease{Key: l.Key, Slot: l.Slot, Token: tok, Expires: l.Expires, Rev: l.Rev})
		}
		took := s.core.ImportLeases(now, ls)
		for _, l := range ls {
			cover = latest(cover, l.Expires)
		}
		var until time.Time
		if g.FenceUntil != nil {
			until = *g.FenceUntil
		}
		if s.inherited.After(until) {
			until = s.inherited // this shard's own predecessor may have served them too
		}
		cover = latest(cover, until)
		s.core.Fence(now, slots, until)
		for _, sl := range slots {
			delete(s.awaiting, sl)
			s.fenceWhy[sl] = ""
			if until.After(now) {
				s.fenceWhy[sl] = "the leases of an earlier keeper process of " + giver + " are not known: they have ended by then"
			}
		}
		s.log.Info("Handover applied: the slots' leases run on here", "shard", s.name, "from", giver, "state", g.State,
			"slots", schedule.FormatSlots(mine), "leases", took, "leasesAwaitingTheirRow", s.core.LeasesAwaitingRows(now),
			"fenceUntil", until, "giverEpoch", resp.Epoch)
		s.m.Handover(g.State, took)
	}
	return cover
}

// fenceUnknown gives up on the handover of slots from giver, which did not answer: its leases are
// unknown, so the slots hand out nothing until the longest lease has passed.
func (s *Shard) fenceUnknown(giver string, slots []int, cause error) {
	// the state file covers the fence: a process after this one holds the slots back as long
	if err := s.coverLeases(s.fenceUnknownLocked(giver, slots, cause)); err != nil {
		s.log.Error(err, "Cannot record the end of a fence in the state file", "shard", s.name)
	}
}

// fenceUnknownLocked is fenceUnknown under the lock; it returns when the fence it set ends (zero:
// it set none, the slots no longer awaited from giver).
func (s *Shard) fenceUnknownLocked(giver string, slots []int, cause error) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	var still []int
	for _, sl := range slots {
		if a, ok := s.awaiting[sl]; ok && a.from == giver {
			still = append(still, sl)
			delete(s.awaiting, sl)
		}
	}
	if len(still) == 0 {
		return time.Time{}
	}
	until := latest(now.Add(s.settings.maxLease()), s.inherited)
	s.core.Fence(now, still, until)
	for _, sl := range still {
		s.fenceWhy[sl] = "the leases of " + giver + " are unknown (it did not answer): any of them has ended by then"
	}
	s.log.Error(cause, "The giver did not hand its leases over; holding the slots' rows back for the longest lease", "shard", s.name,
		"from", giver, "slots", schedule.FormatSlots(setOf(still)), "until", until)
	s.m.Handover("unanswered", 0)
	return until
}

// fencesStatus returns the shard's fences for its status. Called with s.mu held.
func (s *Shard) fencesStatus(now time.Time) []shardapi.Fence {
	var out []shardapi.Fence
	for _, f := range s.core.Fences(now) {
		// one entry per reason within a fence
		byWhy := map[string]*schedule.SlotSet{}
		var whys []string
		for _, sl := range f.Slots.Slots() {
			if s.core.SlotState(sl) != core.SlotOwned {
				continue
			}
			why := s.fenceWhy[sl]
			if why == "" {
				why = "fenced"
			}
			if byWhy[why] == nil {
				byWhy[why] = &schedule.SlotSet{}
				whys = append(whys, why)
			}
			byWhy[why].Add(sl)
		}
		slices.Sort(whys)
		for _, why := range whys {
			e := shardapi.Fence{Slots: schedule.FormatSlots(*byWhy[why]), Reason: why}
			if !f.Until.IsZero() {
				u := f.Until
				e.Until = &u
			}
			out = append(out, e)
		}
	}
	return out
}
