// Package coverage holds the rules of what a keeper shard vouches for: its edge, the gaps of its
// change-event subscription, whether it is complete and exact, its queue state (queued, empty,
// unready), and when it has loaded and prepared an epoch's incoming slots (docs/design.md, "What
// a shard vouches for").
//
// A Ledger is pure and deterministic: the shard tells it what happened (a gap, a resumption, a
// walk started and finished, new settings) with the time as a parameter, and asks it what the
// shard may claim. It does no I/O, reads no clock and takes no lock; the shard (package keeper)
// serialises the calls under its own lock.
package coverage

import (
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// Gap is the last loss of continuity of the subscription.
type Gap struct {
	// Since is when continuity was lost.
	Since time.Time
	// Resumed is when the subscription was back; zero while the gap lasts.
	Resumed time.Time
	// Reason says why (the subscription's error).
	Reason string
	// Seq is the number of gaps so far (0: none yet).
	Seq int
}

// Ledger is what a shard can vouch for, from what happened to it. The zero value is not usable;
// use New.
type Ledger struct {
	window time.Duration
	epoch  int64

	// loaded: the first full walk (the load) has finished.
	loaded bool
	// edge is the edge of the last finished full walk: every owned row due before it is held.
	edge core.Edge
	// gap is the last gap; gapActive says it lasts.
	gap       Gap
	gapActive bool
	// coveredGapSeq is the gap count when the last finished full walk started: the gaps up to it
	// are covered (repaired) by that walk.
	coveredGapSeq int
	// lastPartial: the last finished walk left segments unread.
	lastPartial bool
	// prepared is the highest epoch whose incoming slots are fully walked.
	prepared int64
	// arrivals counts the settings with which slots arrived (OnSettings).
	arrivals int
	// pastEdge: an edge-lag episode is in progress.
	pastEdge bool
}

// New returns the ledger of a shard that has walked nothing yet, with the given window and
// membership epoch.
func New(window time.Duration, epoch int64) *Ledger {
	return &Ledger{window: window, epoch: epoch}
}

// OnGap records that the subscription lost continuity at now. It returns true when this begins a
// new gap (false while one lasts already: the first reason is kept).
func (l *Ledger) OnGap(now time.Time, reason string) bool {
	if l.gapActive {
		return false
	}
	l.gapActive = true
	l.gap = Gap{Since: now, Reason: reason, Seq: l.gap.Seq + 1}
	return true
}

// OnResumed records that the subscription is back at now. It returns true when this ends a gap,
// and how long the gap lasted. A walk must follow: only a full walk started after this covers the
// gap.
func (l *Ledger) OnResumed(now time.Time) (ended bool, lasted time.Duration) {
	if !l.gapActive {
		return false, 0
	}
	l.gapActive = false
	l.gap.Resumed = now
	return true, now.Sub(l.gap.Since)
}

// WalkStart is the ledger's state when a walk started, which decides what the walk vouches for
// when it finishes.
type WalkStart struct {
	// At is when the walk started.
	At time.Time
	// Full: the walk reads every owned and incoming slot (otherwise only arriving slots).
	Full  bool
	epoch int64
	// window is the window the walk started under: rows it read before a change of the window
	// were held or not by the old one.
	window time.Duration
	// gapSeq and gapActive are the gap count and whether a gap lasted when the walk started.
	gapSeq    int
	gapActive bool
	// arrivals is the ledger's count of settings with slots arriving when the walk started.
	arrivals int
}

// WalkStarting records that a walk starts at now and returns what OnWalkFinished needs.
func (l *Ledger) WalkStarting(now time.Time, full bool) WalkStart {
	return WalkStart{At: now, Full: full, epoch: l.epoch, window: l.window, gapSeq: l.gap.Seq, gapActive: l.gapActive, arrivals: l.arrivals}
}

// WalkEnd is how a walk ended.
type WalkEnd struct {
	// Failed: the walk failed as a whole (it vouches for nothing).
	Failed bool
	// Partial: some segments were left unread.
	Partial bool
	// IncomingWalked: every incoming slot of the current settings has been read by a finished
	// walk (this one or an earlier one).
	IncomingWalked bool
}

// OnWalkFinished records the end of the walk that started as w. A full walk that did not fail
// sets the edge to its start plus the window (unless the window changed while it ran: then the
// edge stays unknown until the next full walk), marks the shard loaded, and covers every gap that
// had ended before it started. A walk that did not fail prepares the current epoch when every
// incoming slot has been walked and no slot arrived since it started (the epoch may have changed
// meanwhile: a shard adopts settings during a long walk). It returns true when this
// walk was the load (the first full walk to finish).
func (l *Ledger) OnWalkFinished(w WalkStart, end WalkEnd) (firstLoad bool) {
	l.lastPartial = end.Partial
	if end.Failed {
		return false
	}
	if w.Full {
		firstLoad = !l.loaded
		if w.window == l.window {
			l.edge = core.Edge{Known: true, Unbounded: l.window == 0, At: w.At.Add(l.window)}
		}
		l.loaded = true
		if !w.gapActive {
			l.coveredGapSeq = w.gapSeq
		}
	}
	// the current epoch: the one the walk started in, or a later one (settings adopted midway)
	// with which no slot arrived, since the walk read every slot held then
	if end.IncomingWalked && (w.epoch == l.epoch || w.arrivals == l.arrivals) {
		l.prepared = max(l.prepared, l.epoch)
	}
	return firstLoad
}

// OnSettings records new settings: the window and the membership epoch. arrived says slots
// joined the shard (owned or incoming); incomingWalked that every incoming slot of the new
// settings has been read by a finished walk. A new window voids the edge (incomplete until a
// full walk); a new epoch with nothing arrived and every incoming slot walked is prepared at
// once. It returns whether the window changed.
func (l *Ledger) OnSettings(window time.Duration, epoch int64, arrived, incomingWalked bool) (windowChanged bool) {
	windowChanged = window != l.window
	if windowChanged {
		// the old edge says nothing about the new window
		l.edge = core.Edge{}
	}
	l.window = window
	if epoch != l.epoch && incomingWalked && !arrived {
		l.prepared = max(l.prepared, epoch)
	}
	l.epoch = epoch
	if arrived {
		l.arrivals++
	}
	return windowChanged
}

// Loaded says whether the first full walk has finished.
func (l *Ledger) Loaded() bool { return l.loaded }

// Edge returns the edge of the last finished full walk (zero before it, or after the window
// changed).
func (l *Ledger) Edge() core.Edge { return l.edge }

// Prepared returns the highest epoch whose incoming slots are fully walked.
func (l *Ledger) Prepared() int64 { return l.prepared }

// Complete says whether the shard sees every owned row due before now: it has loaded, now is
// before the edge, and no gap has happened since the last full walk started.
func (l *Ledger) Complete(now time.Time) bool {
	if !l.loaded || l.gapActive || l.coveredGapSeq != l.gap.Seq {
		return false
	}
	return l.edge.Unbounded || now.Before(l.edge.At)
}

// Exact says whether the due count is the true count at now: complete, the last walk not
// partial, and ownedWalked — every owned slot read by a finished walk since it joined (the core
// knows, Core.WalkedBefore).
func (l *Ledger) Exact(now time.Time, ownedWalked bool) bool {
	return l.Complete(now) && !l.lastPartial && ownedWalked
}

// State is the queue state with due rows held at now: queued while due rows are held, empty only
// when complete and nothing is due, unready otherwise — never empty while unseen work may be due.
func (l *Ledger) State(due int, now time.Time) string {
	switch {
	case due > 0:
		return shardapi.StatusQueued
	case l.Complete(now):
		return shardapi.StatusEmpty
	default:
		return shardapi.StatusUnready
	}
}

// LastGap returns the last gap (Seq 0: none yet) and whether it lasts.
func (l *Ledger) LastGap() (g Gap, lasting bool) { return l.gap, l.gapActive }

// OpenGap returns the last gap while it is not covered: it lasts, or no full walk has started
// since it ended.
func (l *Ledger) OpenGap() (Gap, bool) {
	if l.gap.Seq > 0 && (l.gapActive || l.coveredGapSeq != l.gap.Seq) {
		return l.gap, true
	}
	return Gap{}, false
}

// EdgeLag says how the edge stands against now, for logging once per episode: entered is true
// when the clock has just passed the edge, left when the edge is ahead again after an episode;
// ahead is edge − now. Without a bounded edge there is no episode.
func (l *Ledger) EdgeLag(now time.Time) (entered, left bool, ahead time.Duration) {
	if !l.edge.Known || l.edge.Unbounded {
		return false, false, 0
	}
	ahead = l.edge.At.Sub(now)
	if ahead <= 0 && !l.pastEdge {
		l.pastEdge = true
		return true, false, ahead
	}
	if ahead > 0 && l.pastEdge {
		l.pastEdge = false
		return false, true, ahead
	}
	return false, false, ahead
}
