package keeper

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/renderqueue/renderqueue/pkg/keeper/core"
	"github.com/renderqueue/renderqueue/pkg/keeper/shardmetrics"
	"github.com/renderqueue/renderqueue/pkg/store"
)

// ErrLoading is returned by Claim until the shard has loaded.
var ErrLoading = errors.New("shard is loading: claims are served once the first walk has finished")

// errWriteFailed marks, for the metrics, the items of a completion whose write failed.
var errWriteFailed = errors.New("the completion could not be written")

// ErrChangedSinceClaimed: the row was changed (by a producer: urgent set, due moved, cadence
// changed, ...) after it was claimed, so the render was of an older version. The completion is
// not written: the row stays as the producer wrote it, and is handed out again when it is due.
var ErrChangedSinceClaimed = errors.New("the row changed since it was claimed: the completion was not written, the row keeps its new version and is handed out again when due")

// maxClaimRoom bounds the rows a claim allocates room for before it takes the lock; a larger
// claim grows its buffers under it.
const maxClaimRoom = 1024

// minClaimRoom is the rows a claim makes room for, at least, after a claim that got fewer rows
// than it asked for (claimRoom).
const minClaimRoom = 64

// claimRoom is the rows a claim of n makes room for before it takes the lock: n, up to
// maxClaimRoom, or, when the last claim got fewer rows than it asked for, twice those (at least
// minClaimRoom), so that workers polling a queue with little due do not make room for rows that
// are not there. A claim that gets more grows its buffers under the lock.
func (s *Shard) claimRoom(n int) int {
	room := min(n, maxClaimRoom)
	if short := s.claimShort.Load(); short > 0 {
		room = min(room, int(short))
	}
	return room
}

// noteClaimed records, for the next claim's buffers (claimRoom, claimBuffers), that a claim of n
// rows got got of them, whose keys took keyBytes.
func (s *Shard) noteClaimed(n, got, keyBytes int) {
	if n <= 0 {
		return
	}
	if got > 0 {
		// a little more than the mean, so that a claim of slightly longer keys still fits
		s.claimKeyBytes.Store(int64(keyBytes/got + 8))
	}
	short := int64(0) // got what it asked for: the next claim makes room for all it asks
	if got < n {
		short = int64(max(2*got, minClaimRoom))
	}
	s.claimShort.Store(short)
}

// defaultClaimKeyBytes is the key bytes per row a claim allocates room for before any claim got
// rows (claimKeyBytes).
const defaultClaimKeyBytes = 64

// claimBuffers returns room for a claim of n rows: its rows and its keys (claimKeyBytes per row),
// with every memory page of both written once, so that the claim, under the lock, writes to
// memory already in place. The Go heap grows into fresh memory (for a while after a load, by
// hundreds of MB), which make does not write to; the first write to a fresh page faults, and
// under the lock every claim waits for it. (One write per page: reused memory make has zeroed
// already.)
func (s *Shard) claimBuffers(n int) ([]core.Claimed, claimKeys) {
	rows := make([]core.Claimed, n)
	for i := 0; i < n; i += claimedPerPage {
		rows[i] = core.Claimed{}
	}
	perRow := s.claimKeyBytes.Load()
	if perRow == 0 {
		perRow = defaultClaimKeyBytes
	}
	b := make([]byte, n*int(perRow))
	for i := 0; i < len(b); i += pageBytes {
		b[i] = 0
	}
	return rows[:0], claimKeys{b: b[:0]}
}

// pageBytes is the size of a memory page (the smallest; larger pages are touched all the more).
const pageBytes = 4096

// claimedPerPage is how many Claimed records fit in a page: writing every claimedPerPage-th one
// writes to every page of a slice of them.
const claimedPerPage = max(1, pageBytes/int(unsafe.Sizeof(core.Claimed{})))

// claimKeys makes a claim's keys as strings over one buffer, which lives as long as the claim's
// answer: the shard keeps none of them (a lease's claimed rev is in the core's lease table).
type claimKeys struct{ b []byte }

// add copies key to the buffer and returns it as a string over the copy. Those bytes are never
// written again: a later add writes past them, or to a new buffer when this one is full.
func (k *claimKeys) add(key []byte) string {
	off := len(k.b)
	k.b = append(k.b, key...)
	return unsafe.String(unsafe.SliceData(k.b[off:]), len(key))
}

// Claim leases up to n due rows for leaseFor (the default lease when 0; at most the longest
// lease, Settings.MaxLease).
func (s *Shard) Claim(now time.Time, n int, leaseFor time.Duration) ([]core.Claimed, error) {
	start := time.Now()
	if s.draining.Load() {
		return nil, ErrDraining
	}
	if !s.loaded.Load() {
		return nil, ErrLoading // at once: the load holds the lock for long stretches
	}
	// the claim's rows and keys are allocated and written before the lock (claimBuffers)
	var rows []core.Claimed
	var keys claimKeys
	if n > 0 {
		rows, keys = s.claimBuffers(s.claimRoom(n))
	}
	s.mu.Lock()
	if leaseFor == 0 {
		leaseFor = s.settings.LeaseDuration
	}
	leaseFor = min(leaseFor, s.settings.maxLease())
	rows = s.core.ClaimInto(now, n, leaseFor, rows, keys.add)
	s.mu.Unlock()
	// the state file must cover these leases before anyone learns of them (session.go)
	if len(rows) > 0 {
		if err := s.coverLeases(now.Add(leaseFor)); err != nil {
			s.mu.Lock()
			for _, r := range rows {
				_ = s.core.Release(now, r.Key, r.Lease)
			}
			s.mu.Unlock()
			s.log.Error(err, "Cannot record the lease horizon; the claim is refused and its rows handed back", "shard", s.name)
			return nil, fmt.Errorf("recording the lease horizon: %w", err)
		}
	}
	s.noteClaimed(n, len(rows), len(keys.b))
	s.m.Claimed(now, rows, time.Since(start))
	return rows, nil
}

// CompleteItem is one finished render.
type CompleteItem struct {
	Key   string
	Lease uint64
	// NextDue is the next render time; nil means the shard's Reschedule policy decides.
	NextDue *time.Time
}

// Complete records finished renders: it checks every item's lease, writes the next due times
// through the store's group-committed path, applies the written rows and ends the leases.
// Items whose lease is not current get an error and write nothing. A row changed since its
// lease was given (its rev moved) is not written either: its item gets ErrChangedSinceClaimed,
// the shard applies the row as stored and ends the lease, so the new version is claimable when
// due. It returns one error (or nil) per item, and an error when the write itself failed (then
// nothing was written and the leases stand).
//
// From the lease check until the write's outcome is applied, each accepted item's lease is
// pinned (core.Core.BeginCompleting): it does not expire, whatever its expiry, and cannot be
// released or completed again, so the row is handed to no other worker while its completion may
// still be written. A completion accepted under a live lease is thus answered as SQL has it:
// written (the lease ends), or not written — the write failed, or the row is gone from the store
// — and then the lease is back under its expiry, and a lease that expired meanwhile ends at once
// with the row claimable again.
func (s *Shard) Complete(ctx context.Context, items []CompleteItem) ([]error, error) {
	start := time.Now()
	results := make([]error, len(items))
	classes := make([]shardmetrics.RowClass, len(items))
	var writes []store.Completion
	// idx[j] is the item of writes[j] and where Completing found its row
	type pending struct {
		item int
		hint core.Hint
	}
	var idx []pending
	s.mu.Lock()
	now := s.clock()
	if err := s.handoverPendingFor(now, items); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	for i, it := range items {
		if i%walkStepRows == 0 {
			// read the next step's index entries ahead, as walks and events do (the keys are
			// seldom in the caches any more: claimed a request or thousands of rows ago)
			s.core.Prefetch(min(len(items)-i, walkStepRows), func(j int) string { return items[i+j].Key })
		}
		cp, held, err := s.core.BeginCompleting(now, it.Key, it.Lease)
		if held {
			classes[i] = shardmetrics.ClassOf(cp.Cadence, cp.Source)
		}
		if err != nil {
			results[i] = s.orMoved(now, it, err)
			continue
		}
		due := cp.NextDue
		if it.NextDue != nil {
			due = *it.NextDue
		}
		// written only over the version that was claimed (and rendered); when the row is still
		// held as that version, its values are known and need not come back from the store
		w := store.Completion{Key: it.Key, Due: due, Rev: cp.ClaimedRev}
		if cp.AsClaimed {
			w.Known, w.Cadence, w.Route, w.Source = true, cp.Cadence, cp.Route, cp.Source
		}
		writes = append(writes, w)
		idx = append(idx, pending{i, cp.Hint})
	}
	s.mu.Unlock()
	if len(writes) == 0 {
		s.recordCompleted(results, classes, 0)
		return results, nil
	}
	written, err := s.st.Complete(ctx, writes)
	if err != nil {
		for _, p := range idx {
			results[p.item] = errWriteFailed
		}
		// nothing was written: the leases are back under their expiries
		for lo := 0; lo < len(idx); lo += walkStepRows {
			s.mu.Lock()
			now = s.clock()
			for _, p := range idx[lo:min(lo+walkStepRows, len(idx))] {
				_ = s.core.AbortCompleting(now, items[p.item].Key, items[p.item].Lease, p.hint)
			}
			s.unlockStep()
		}
		s.recordCompleted(results, classes, time.Since(start))
		s.log.Error(err, "Writing completions failed; the request is answered 503 and its leases stand", "shard", s.name, "items", len(writes))
		return nil, fmt.Errorf("writing %d completions: %w", len(writes), err)
	}
	s.noteAnswered() // the store wrote: a walk it did not answer may be tried again
	// in bounded steps, so claims wait for at most one step
	for lo := 0; lo < len(written); lo += walkStepRows {
		s.mu.Lock()
		now = s.clock()
		hi := min(lo+walkStepRows, len(written))
		s.core.PrefetchHints(hi-lo, func(j int) core.Hint { return idx[lo+j].hint })
		for j := lo; j < hi; j++ {
			res, i := written[j], idx[j].item
			if !res.Found {
				// the row is gone from the store (a delete's event follows): nothing written
				results[i] = core.ErrNotHeld
				_ = s.core.AbortCompleting(now, items[i].Key, items[i].Lease, idx[j].hint)
				continue
			}
			// the version now stored (written, or changed by someone else since the claim), and
			// the lease ended (it may have left the window, lease gone with it)
			if res.Changed {
				results[i] = ErrChangedSinceClaimed
				s.core.ApplyRefused(now, res.Row, items[i].Lease, idx[j].hint)
			} else {
				s.core.ApplyCompleted(now, res.Row, items[i].Lease, idx[j].hint)
			}
		}
		s.unlockStep()
	}
	s.recordCompleted(results, classes, time.Since(start))
	return results, nil
}

// recordCompleted records a completion's items in the metrics by class and result
// (shardmetrics.Result*).
func (s *Shard) recordCompleted(errs []error, classes []shardmetrics.RowClass, took time.Duration) {
	if s.m == nil {
		return
	}
	out := make([]string, len(errs))
	for i, err := range errs {
		var moved *MovedError
		switch {
		case err == nil:
			out[i] = shardmetrics.ResultOK
		case errors.As(err, &moved):
			out[i] = shardmetrics.ResultMoved
		case errors.Is(err, core.ErrNotHeld):
			out[i] = shardmetrics.ResultNotHeld
		case errors.Is(err, errWriteFailed):
			out[i] = shardmetrics.ResultWriteFailed
		case errors.Is(err, ErrChangedSinceClaimed):
			out[i] = shardmetrics.ResultChanged
		case errors.Is(err, core.ErrCompletionInFlight):
			out[i] = shardmetrics.ResultInFlight
		default:
			out[i] = shardmetrics.ResultLeaseLost
		}
	}
	s.m.Completed(out, classes, took)
}

// Release hands leased rows back unrendered: they are claimable again at once. A row whose
// completion is being written is not released (core.ErrCompletionInFlight): it stays leased until
// the write resolves.
func (s *Shard) Release(now time.Time, items []CompleteItem) ([]error, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.handoverPendingFor(now, items); err != nil {
		return nil, err
	}
	out := make([]error, len(items))
	for i, it := range items {
		out[i] = s.orMoved(now, it, s.core.Release(now, it.Key, it.Lease))
	}
	return out, nil
}

// Extend sets each item's lease to expire leaseFor (the default lease when 0; at most the longest
// lease, Settings.MaxLease) after now; a lease that is no longer current gets an error and stays
// ended. It returns each lease's new expiry or its error, in item order, and ErrHandoverPending
// (nothing done) when a lease may still arrive with a handover.
func (s *Shard) Extend(now time.Time, items []CompleteItem, leaseFor time.Duration) ([]time.Time, []error, error) {
	s.mu.Lock()
	if err := s.handoverPendingFor(now, items); err != nil {
		s.mu.Unlock()
		return nil, nil, err
	}
	if leaseFor == 0 {
		leaseFor = s.settings.LeaseDuration
	}
	leaseFor = min(leaseFor, s.settings.maxLease())
	expires, errs := make([]time.Time, len(items)), make([]error, len(items))
	var latestExp time.Time
	for i, it := range items {
		expires[i], errs[i] = s.core.Extend(now, it.Key, it.Lease, leaseFor)
		errs[i] = s.orMoved(now, it, errs[i])
		if errs[i] == nil {
			latestExp = latest(latestExp, expires[i])
		}
	}
	s.mu.Unlock()
	// the state file must cover the new expiries before the worker learns of them
	if err := s.coverLeases(latestExp); err != nil {
		s.log.Error(err, "Cannot record the lease horizon; the extensions are answered 503", "shard", s.name)
		return nil, nil, fmt.Errorf("recording the lease horizon: %w", err)
	}
	return expires, errs, nil
}

// orMoved returns err, or, when err says the lease is not current here because it left with
// its slot, the error naming where it went. Called with s.mu held.
func (s *Shard) orMoved(now time.Time, it CompleteItem, err error) error {
	if err == nil || (!errors.Is(err, core.ErrNotHeld) && !errors.Is(err, core.ErrLeaseLost)) {
		return err
	}
	if moved := s.movedTo(now, it.Key, it.Lease); moved != nil {
		return moved
	}
	return err
}

// handoverPendingFor returns the error for a request whose items include a lease that may still
// arrive with a slot coming to this shard (handoverPending: ErrHandoverPending), or one that
// arrived before its row was read here (core.ErrRowNotRead); nil when there is none. Either way
// the request is answered 503, nothing done, and sent again. Called with s.mu held.
func (s *Shard) handoverPendingFor(now time.Time, items []CompleteItem) error {
	arriving := s.slotsArriving()
	for _, it := range items {
		if s.core.AwaitsRow(now, it.Key, it.Lease) {
			return core.ErrRowNotRead
		}
		if arriving && s.handoverPending(now, it.Key, it.Lease) {
			return ErrHandoverPending
		}
	}
	return nil
}
