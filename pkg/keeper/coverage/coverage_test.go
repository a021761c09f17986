package coverage

import (
	"fmt"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// The dimensions of TestCompleteExactState.
type (
	gapCase  int
	edgeCase int
)

const (
	noGap gapCase = iota
	gapLasting
	gapResumedNotWalked // resumed, no full walk started since
	gapDuringWalk       // began and ended while the last full walk ran: that walk does not cover it
	gapCovered          // resumed, then a full walk started and finished
	numGapCases
)

const (
	notLoaded     edgeCase = iota
	edgeUnbounded          // window 0
	edgeAhead              // now before start + window
	edgePassed             // now at or after start + window
	numEdgeCases
)

var gapNames = [...]string{"no-gap", "gap-lasting", "gap-resumed-not-walked", "gap-during-walk", "gap-covered"}
var edgeNames = [...]string{"not-loaded", "unbounded", "edge-ahead", "edge-passed"}

// scenario drives a ledger through the events of one combination and returns it with the time
// to ask at.
func scenario(t *testing.T, g gapCase, e edgeCase, partial bool) (*Ledger, time.Time) {
	t.Helper()
	window := time.Hour
	if e == edgeUnbounded {
		window = 0
	}
	l := New(window, 1)
	now := t0
	if g == gapCovered {
		l.OnGap(now, "lost")
		now = now.Add(time.Second)
		l.OnResumed(now)
		now = now.Add(time.Second)
	}
	walkStart := now
	if e != notLoaded {
		w := l.WalkStarting(now, true)
		if g == gapDuringWalk {
			l.OnGap(now.Add(time.Second), "lost during the walk")
			l.OnResumed(now.Add(2 * time.Second))
		}
		now = now.Add(10 * time.Second)
		l.OnWalkFinished(w, WalkEnd{Partial: partial})
	} else if partial {
		// a partial walk of incoming slots only: no load, but the last walk was partial
		l.OnWalkFinished(l.WalkStarting(now, false), WalkEnd{Partial: true})
	}
	switch g {
	case gapLasting:
		l.OnGap(now, "lost")
	case gapResumedNotWalked:
		l.OnGap(now, "lost")
		l.OnResumed(now.Add(time.Second))
	}
	now = now.Add(time.Minute)
	if e == edgePassed {
		now = walkStart.Add(window)
	}
	return l, now
}

// TestCompleteExactState: every combination of gap, edge, partial last walk, unwalked owned slots
// and due rows against the rules of docs/design.md ("What a shard vouches for"), written here
// independently: complete = loaded, before the edge, no gap since the last full walk started;
// exact = complete, last walk not partial, every owned slot walked; queued while rows are due,
// empty only when complete, unready otherwise.
func TestCompleteExactState(t *testing.T) {
	for g := range numGapCases {
		for e := range numEdgeCases {
			for _, partial := range []bool{false, true} {
				for _, ownedWalked := range []bool{true, false} {
					for _, due := range []int{0, 3} {
						name := fmt.Sprintf("%s/%s/partial=%v/ownedWalked=%v/due=%d", gapNames[g], edgeNames[e], partial, ownedWalked, due)
						t.Run(name, func(t *testing.T) {
							l, now := scenario(t, g, e, partial)
							// without a full walk, a gap is never covered (and none happens during it)
							gapOpen := g == gapLasting || g == gapResumedNotWalked ||
								(g == gapDuringWalk && e != notLoaded) || (g == gapCovered && e == notLoaded)
							edgeOK := e == edgeUnbounded || e == edgeAhead
							wantComplete := e != notLoaded && edgeOK && !gapOpen
							wantExact := wantComplete && !partial && ownedWalked
							wantState := shardapi.StatusUnready
							switch {
							case due > 0:
								wantState = shardapi.StatusQueued
							case wantComplete:
								wantState = shardapi.StatusEmpty
							}
							if got := l.Complete(now); got != wantComplete {
								t.Errorf("complete %v, want %v", got, wantComplete)
							}
							if got := l.Exact(now, ownedWalked); got != wantExact {
								t.Errorf("exact %v, want %v", got, wantExact)
							}
							if got := l.State(due, now); got != wantState {
								t.Errorf("state %q, want %q", got, wantState)
							}
							if _, open := l.OpenGap(); open != gapOpen {
								t.Errorf("open gap %v, want %v", open, gapOpen)
							}
							if got := l.Loaded(); got != (e != notLoaded) {
								t.Errorf("loaded %v", got)
							}
						})
					}
				}
			}
		}
	}
}

// TestWalks: what a walk vouches for depends on how it ended and on what happened while it ran.
func TestWalks(t *testing.T) {
	t.Run("the first full walk is the load, once", func(t *testing.T) {
		l := New(time.Hour, 1)
		if l.OnWalkFinished(l.WalkStarting(t0, false), WalkEnd{}) {
			t.Fatal("a walk of incoming slots counted as the load")
		}
		if !l.OnWalkFinished(l.WalkStarting(t0, true), WalkEnd{}) {
			t.Fatal("the first full walk was not the load")
		}
		if l.OnWalkFinished(l.WalkStarting(t0.Add(time.Minute), true), WalkEnd{}) {
			t.Fatal("the second full walk counted as the load")
		}
		if e := l.Edge(); !e.Known || e.Unbounded || !e.At.Equal(t0.Add(time.Minute+time.Hour)) {
			t.Fatalf("edge %+v, want the last full walk's start + window", e)
		}
	})
	t.Run("a failed walk vouches for nothing", func(t *testing.T) {
		l := New(time.Hour, 1)
		if l.OnWalkFinished(l.WalkStarting(t0, true), WalkEnd{Failed: true, IncomingWalked: true}) {
			t.Fatal("a failed walk counted as the load")
		}
		if l.Loaded() || l.Edge().Known || l.Prepared() != 0 || l.Complete(t0) {
			t.Fatalf("after a failed walk: loaded %v edge %+v prepared %d", l.Loaded(), l.Edge(), l.Prepared())
		}
		l.OnWalkFinished(l.WalkStarting(t0, true), WalkEnd{})
		l.OnGap(t0.Add(time.Second), "lost")
		l.OnResumed(t0.Add(2 * time.Second))
		l.OnWalkFinished(l.WalkStarting(t0.Add(3*time.Second), true), WalkEnd{Failed: true})
		if l.Complete(t0.Add(4 * time.Second)) {
			t.Fatal("a failed walk covered a gap")
		}
		if e := l.Edge(); !e.At.Equal(t0.Add(time.Hour)) {
			t.Fatalf("a failed walk moved the edge to %v", e.At)
		}
	})
	t.Run("a walk that starts during a gap does not cover it", func(t *testing.T) {
		l := New(time.Hour, 1)
		l.OnWalkFinished(l.WalkStarting(t0, true), WalkEnd{})
		l.OnGap(t0.Add(time.Second), "lost")
		w := l.WalkStarting(t0.Add(2*time.Second), true)
		l.OnResumed(t0.Add(3 * time.Second))
		l.OnWalkFinished(w, WalkEnd{})
		if l.Complete(t0.Add(4 * time.Second)) {
			t.Fatal("complete after a walk that started while the gap lasted")
		}
		l.OnWalkFinished(l.WalkStarting(t0.Add(5*time.Second), true), WalkEnd{})
		if !l.Complete(t0.Add(6 * time.Second)) {
			t.Fatal("not complete after a full walk that started after the gap ended")
		}
		if _, open := l.OpenGap(); open {
			t.Fatal("the covered gap is still reported")
		}
		if g, lasting := l.LastGap(); g.Seq != 1 || lasting || g.Reason != "lost" {
			t.Fatalf("last gap %+v lasting %v", g, lasting)
		}
	})
	t.Run("a walk of incoming slots neither loads nor covers a gap, but its partial counts", func(t *testing.T) {
		l := New(time.Hour, 1)
		l.OnWalkFinished(l.WalkStarting(t0, true), WalkEnd{})
		l.OnGap(t0.Add(time.Second), "lost")
		l.OnResumed(t0.Add(2 * time.Second))
		l.OnWalkFinished(l.WalkStarting(t0.Add(3*time.Second), false), WalkEnd{Partial: true})
		if l.Complete(t0.Add(4 * time.Second)) {
			t.Fatal("a walk of incoming slots covered a gap")
		}
		l.OnWalkFinished(l.WalkStarting(t0.Add(5*time.Second), true), WalkEnd{})
		if !l.Exact(t0.Add(6*time.Second), true) {
			t.Fatal("not exact after a full walk that was not partial")
		}
		l.OnWalkFinished(l.WalkStarting(t0.Add(7*time.Second), false), WalkEnd{Partial: true})
		if l.Exact(t0.Add(8*time.Second), true) {
			t.Fatal("exact after a partial walk of incoming slots")
		}
	})
}

// TestGaps: a gap begins once (the first reason kept) and ends once.
func TestGaps(t *testing.T) {
	l := New(0, 1)
	if !l.OnGap(t0, "first") || l.OnGap(t0.Add(time.Second), "second") {
		t.Fatal("a gap began twice")
	}
	if ended, _ := l.OnResumed(t0.Add(-time.Second)); !ended {
		t.Fatal("the gap did not end")
	}
	if ended, _ := l.OnResumed(t0.Add(time.Minute)); ended {
		t.Fatal("a resumption without a gap ended one")
	}
	g, open := l.OpenGap()
	if !open || g.Reason != "first" || g.Seq != 1 || !g.Since.Equal(t0) || !g.Resumed.Equal(t0.Add(-time.Second)) {
		t.Fatalf("open gap %+v %v", g, open)
	}
	l.OnGap(t0.Add(2*time.Minute), "again")
	l.OnResumed(t0.Add(3 * time.Minute))
	if g, _ := l.OpenGap(); g.Seq != 2 || g.Reason != "again" {
		t.Fatalf("second gap %+v", g)
	}
	if _, lasted := func() (bool, time.Duration) { l.OnGap(t0, "x"); return l.OnResumed(t0.Add(90 * time.Second)) }(); lasted != 90*time.Second {
		t.Fatalf("lasted %v", lasted)
	}
}

// TestEpochDuringWalk: settings of a new epoch that a shard adopts during a walk, with no slot
// arriving, are prepared when the walk ends with every incoming slot walked; with slots arriving
// they are not (TestSettings).
func TestEpochDuringWalk(t *testing.T) {
	l := New(time.Hour, 1)
	l.OnWalkFinished(l.WalkStarting(t0, true), WalkEnd{IncomingWalked: true})
	l.OnSettings(time.Hour, 2, true, false) // slots arrive (incoming)
	w := l.WalkStarting(t0.Add(time.Minute), false)
	l.OnSettings(time.Hour, 3, false, false) // midway; the incoming slots are being walked
	if l.Prepared() != 1 {
		t.Fatalf("prepared %d before the walk ends", l.Prepared())
	}
	l.OnWalkFinished(w, WalkEnd{IncomingWalked: true})
	if l.Prepared() != 3 {
		t.Fatalf("prepared %d by a walk during which nothing arrived, want 3", l.Prepared())
	}
}

// TestSettings: a new window voids the edge; a new epoch is prepared at once only when nothing
// arrived and every incoming slot has been walked, and a walk during which slots arrived prepares
// no epoch.
func TestSettings(t *testing.T) {
	l := New(time.Hour, 1)
	l.OnWalkFinished(l.WalkStarting(t0, true), WalkEnd{IncomingWalked: true})
	if l.Prepared() != 1 {
		t.Fatalf("prepared %d after a walk with every incoming slot walked", l.Prepared())
	}
	if l.OnSettings(time.Hour, 2, true, false) {
		t.Fatal("the window changed")
	}
	if l.Prepared() != 1 {
		t.Fatalf("prepared %d with slots arriving", l.Prepared())
	}
	// a walk that started in epoch 2 finishes after epoch 3 arrived: it prepares neither
	w := l.WalkStarting(t0.Add(time.Minute), false)
	l.OnSettings(time.Hour, 3, true, false)
	l.OnWalkFinished(w, WalkEnd{IncomingWalked: true})
	if l.Prepared() != 1 {
		t.Fatalf("prepared %d by a walk of an older epoch", l.Prepared())
	}
	l.OnWalkFinished(l.WalkStarting(t0.Add(2*time.Minute), false), WalkEnd{IncomingWalked: true})
	if l.Prepared() != 3 {
		t.Fatalf("prepared %d, want 3", l.Prepared())
	}
	// nothing arrives (a commit or rollback): prepared at once
	l.OnSettings(time.Hour, 4, false, true)
	if l.Prepared() != 4 {
		t.Fatalf("prepared %d, want 4", l.Prepared())
	}
	l.OnSettings(time.Hour, 5, false, false)
	if l.Prepared() != 4 {
		t.Fatalf("prepared %d with incoming slots unwalked", l.Prepared())
	}
	if !l.Complete(t0.Add(3 * time.Minute)) {
		t.Fatal("not complete before the window change")
	}
	if !l.OnSettings(2*time.Hour, 5, false, false) {
		t.Fatal("the window change was not reported")
	}
	if l.Edge().Known || l.Complete(t0.Add(3*time.Minute)) {
		t.Fatalf("after a window change: edge %+v", l.Edge())
	}
	l.OnWalkFinished(l.WalkStarting(t0.Add(4*time.Minute), true), WalkEnd{})
	if e := l.Edge(); !e.At.Equal(t0.Add(4*time.Minute + 2*time.Hour)) {
		t.Fatalf("edge %v, want the walk's start + the new window", e.At)
	}
	// the window changes while a full walk runs (a paced walk adopts settings): the walk held
	// rows by the old window, so it vouches for no edge; the next full walk does
	w = l.WalkStarting(t0.Add(5*time.Minute), true)
	l.OnSettings(3*time.Hour, 5, false, false)
	l.OnWalkFinished(w, WalkEnd{})
	if l.Edge().Known || l.Complete(t0.Add(6*time.Minute)) {
		t.Fatalf("after a walk across a window change: edge %+v", l.Edge())
	}
	l.OnWalkFinished(l.WalkStarting(t0.Add(7*time.Minute), true), WalkEnd{})
	if e := l.Edge(); !e.At.Equal(t0.Add(7*time.Minute + 3*time.Hour)) {
		t.Fatalf("edge %v, want the next walk's start + the new window", e.At)
	}
}

// TestEdgeLag: one episode per passing of the edge; none without a bounded edge.
func TestEdgeLag(t *testing.T) {
	l := New(time.Hour, 1)
	if entered, left, _ := l.EdgeLag(t0.Add(2 * time.Hour)); entered || left {
		t.Fatal("an episode before the first walk")
	}
	l.OnWalkFinished(l.WalkStarting(t0, true), WalkEnd{})
	steps := []struct {
		at            time.Duration
		entered, left bool
		wantAheadSecs float64
	}{
		{30 * time.Minute, false, false, 1800},
		{time.Hour, true, false, 0},
		{2 * time.Hour, false, false, -3600},
	}
	for _, s := range steps {
		entered, left, ahead := l.EdgeLag(t0.Add(s.at))
		if entered != s.entered || left != s.left || ahead.Seconds() != s.wantAheadSecs {
			t.Fatalf("at +%v: entered %v left %v ahead %v", s.at, entered, left, ahead)
		}
	}
	l.OnWalkFinished(l.WalkStarting(t0.Add(2*time.Hour), true), WalkEnd{})
	if entered, left, _ := l.EdgeLag(t0.Add(2 * time.Hour)); entered || !left {
		t.Fatalf("after a walk: entered %v left %v", entered, left)
	}
	u := New(0, 1)
	u.OnWalkFinished(u.WalkStarting(t0, true), WalkEnd{})
	if entered, _, _ := u.EdgeLag(t0.Add(1000 * time.Hour)); entered {
		t.Fatal("an unbounded edge lagged")
	}
}
