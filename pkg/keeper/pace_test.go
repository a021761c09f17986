package keeper

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/memstore"
)

// TestWalkPacerStep checks the pauses of a pacer at 1,000 rows a second, step by step.
func TestWalkPacerStep(t *testing.T) {
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	p := walkPacer{rate: 1000}
	for i, st := range []struct {
		paced bool      // the step's walk verifies
		n     int       // rows in the step
		now   time.Time // when the step ended
		want  time.Duration
	}{
		{true, 100, ms(0), 0},                        // the first step begins the stretch
		{true, 100, ms(20), 80 * time.Millisecond},   // 100 rows should take 100 ms; 20 passed
		{true, 100, ms(100), 100 * time.Millisecond}, // 200 rows: 200 ms; 100 passed
		{true, 100, ms(400), 0},                      // behind the rate (300 rows, 400 ms): no pause
		{true, 100, ms(600), 0},                      // 200 ms behind (400 rows, 600 ms): begins again
		{true, 100, ms(620), 80 * time.Millisecond},  // 100 rows since: 100 ms; 20 passed, not 220 ms behind
		{false, 100, ms(701), 0},                     // not verifying: no pause, the stretch ends
		{true, 100, ms(802), 0},                      // a new stretch begins
		{true, 50, ms(812), 40 * time.Millisecond},   // 50 rows of it: 50 ms; 10 passed
		{true, 5000, ms(852), 5 * time.Second},       // 5,050 rows: 5.05 s; 50 ms passed
	} {
		if got := p.step(st.paced, st.n, st.now); got != st.want {
			t.Fatalf("step %d: pause %v, want %v", i, got, st.want)
		}
	}
	if d := (&walkPacer{}).step(true, 1000, ms(0)); d != 0 {
		t.Fatalf("rate 0 paused %v", d)
	}
}

// pacedShard returns a loaded shard over a memstore holding n due rows (those of the slots the
// settings hold are held), walking at most rate rows a
// second (settings' VerifyWalkRate), on a fake clock that its pauses advance; pauses collects them.
func pacedShard(t *testing.T, n, rate int, settings Settings) (sh *Shard, pauses *[]time.Duration) {
	t.Helper()
	ctx := context.Background()
	st := memstore.New(memstore.Options{})
	rows := make([]schedule.Row, n)
	for i := range rows {
		rows[i] = srow(fmt.Sprintf("https://x.example/%d", i), t0.Add(-time.Hour), time.Hour)
	}
	if _, err := st.Upsert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	clock := &fakeClock{now: t0}
	settings.VerifyWalkRate = rate
	sh, err := NewShard(Options{Name: "paced", Store: st, Clock: clock.Now, Log: logr.Discard()}, settings)
	if err != nil {
		t.Fatal(err)
	}
	pauses = new([]time.Duration)
	sh.pause = func(_ context.Context, d time.Duration, _ <-chan Settings) {
		*pauses = append(*pauses, d)
		clock.Set(clock.Now().Add(d))
	}
	held := 0 // the rows of the slots the settings hold
	for _, r := range rows {
		if sl := r.Slot(); settings.Owned.Has(sl) || settings.Incoming.Has(sl) {
			held++
		}
	}
	if rep := sh.Walk(ctx, true); rep.Failed || sh.core.Held() != held {
		t.Fatalf("load: %+v, held %d, want %d", rep, sh.core.Held(), held)
	}
	if len(*pauses) != 0 {
		t.Fatalf("the load paused %d times", len(*pauses))
	}
	return sh, pauses
}

func sum(ds []time.Duration) (s time.Duration) {
	for _, d := range ds {
		s += d
	}
	return s
}

// TestVerificationWalkIsPaced: a re-walk of an exact shard keeps to the rate (its rows after the
// first step take rows/rate on the clock); a walk after a gap, one while slots arrive, and the
// rest of a walk during which a gap opens are not paced.
func TestVerificationWalkIsPaced(t *testing.T) {
	const n, rate = 10_000, 1000
	ctx := context.Background()

	t.Run("verifying", func(t *testing.T) {
		sh, pauses := pacedShard(t, n, rate, allSlots(0))
		rep := sh.Walk(ctx, true)
		if rep.Failed || rep.Counts.Scanned != n {
			t.Fatalf("re-walk: %+v", rep)
		}
		// the first step's rows are not paced; the others take rows/rate
		lo, hi := time.Duration(n-walkStepRows)*time.Second/rate, time.Duration(n)*time.Second/rate
		if got := sum(*pauses); got < lo || got > hi {
			t.Fatalf("paused %v in %d pauses, want %v..%v", got, len(*pauses), lo, hi)
		}
		if took := rep.FinishedAt.Sub(rep.StartedAt); took != sum(*pauses) {
			t.Fatalf("the walk took %v on the clock, paused %v", took, sum(*pauses))
		}
	})

	t.Run("after a gap", func(t *testing.T) {
		sh, pauses := pacedShard(t, n, rate, allSlots(0))
		sh.HandleBatch(store.Batch{Kind: store.KindGap, Err: errors.New("injected")})
		sh.HandleBatch(store.Batch{Kind: store.KindResumed})
		if rep := sh.Walk(ctx, true); rep.Failed || len(*pauses) != 0 {
			t.Fatalf("the repair walk paused %d times (%+v)", len(*pauses), rep)
		}
		if !sh.Status(sh.clock()).Exact {
			t.Fatal("not exact after the repair walk")
		}
		if sh.Walk(ctx, true); len(*pauses) == 0 {
			t.Fatal("the next verification walk did not pause")
		}
	})

	t.Run("a gap midway", func(t *testing.T) {
		sh, pauses := pacedShard(t, n, rate, allSlots(0))
		pause := sh.pause
		sh.pause = func(ctx context.Context, d time.Duration, updates <-chan Settings) {
			pause(ctx, d, updates)
			if len(*pauses) == 3 {
				sh.HandleBatch(store.Batch{Kind: store.KindGap, Err: errors.New("injected")})
			}
		}
		if rep := sh.Walk(ctx, true); rep.Failed || len(*pauses) != 3 {
			t.Fatalf("paused %d times, want 3 (none after the gap): %+v", len(*pauses), rep)
		}
	})

	t.Run("slots arriving", func(t *testing.T) {
		settings := allSlots(0)
		settings.Owned, settings.Incoming = schedule.SlotSet{}, schedule.SlotSet{}
		for sl := range schedule.NumSlots {
			if sl < schedule.NumSlots/2 {
				settings.Owned.Add(sl)
			} else {
				settings.Incoming.Add(sl)
			}
		}
		sh, pauses := pacedShard(t, n, rate, settings)
		if rep := sh.Walk(ctx, true); rep.Failed || len(*pauses) != 0 {
			t.Fatalf("a walk with incoming slots paused %d times (%+v)", len(*pauses), rep)
		}
	})

	t.Run("rate 0", func(t *testing.T) {
		sh, pauses := pacedShard(t, n, 0, allSlots(0))
		if sh.Walk(ctx, true); len(*pauses) != 0 {
			t.Fatalf("paused %d times at rate 0", len(*pauses))
		}
	})
}

// The slots of a handoff during a walk (handoffSettings): one leaves the shard, one arrives.
const handoffLeft, handoffArriving = 7, 9

// handoffSettings returns the settings a walk starts with (every slot owned but handoffArriving)
// and those sent to it midway (epoch 2: handoffLeft gone, handoffArriving incoming).
func handoffSettings() (first, next Settings) {
	first = allSlots(0)
	first.Owned.Remove(handoffArriving)
	next = first
	next.Epoch = 2
	next.Owned.Remove(handoffLeft)
	next.Incoming.Add(handoffArriving)
	return first, next
}

// handoffShard returns a loaded shard of 10,000 rows whose walks are paced at rate (0: not
// paced), holding handoffSettings' first settings, and the settings to send it midway.
func handoffShard(t *testing.T, rate int) (sh *Shard, pauses *[]time.Duration, next Settings) {
	first, next := handoffSettings()
	sh, pauses = pacedShard(t, 10_000, rate, first)
	return sh, pauses, next
}

// checkHandoffWalked checks what a walk that adopted handoffSettings' next midway walked: not the
// slot that left nor the one that arrived (it is walked next), and the others.
func checkHandoffWalked(t *testing.T, sh *Shard) {
	t.Helper()
	if sh.core.WalkedBefore(handoffLeft) || sh.core.WalkedBefore(handoffArriving) {
		t.Fatalf("walked before: slot %d that left %v, slot %d that arrived %v", handoffLeft, sh.core.WalkedBefore(handoffLeft),
			handoffArriving, sh.core.WalkedBefore(handoffArriving))
	}
	if !sh.core.WalkedBefore(0) {
		t.Fatal("slot 0 not walked")
	}
}

// runUpdates gives sh a settings channel as Run does, holding pending (at most one).
func runUpdates(sh *Shard, pending ...Settings) chan Settings {
	updates := make(chan Settings, 1)
	for _, ns := range pending {
		updates <- ns
	}
	sh.mu.Lock()
	sh.adopt = updates
	sh.mu.Unlock()
	return updates
}

// epochOf returns the epoch of sh's settings.
func epochOf(sh *Shard) int64 {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.settings.Epoch
}

// TestPacedWalkAdoptsSettings: settings sent to Run while a paced walk runs apply at its next
// pause, not when it ends (at 100,000 rows/s a walk of 10M rows lasts 100 s). Here a slot
// leaves and another arrives: the walk stops pausing (slots are arriving), finishes, and vouches
// neither for the slot that left nor for the one that arrived.
func TestPacedWalkAdoptsSettings(t *testing.T) {
	ctx := context.Background()
	sh, pauses, next := handoffShard(t, 1000)
	updates := runUpdates(sh)
	var adopted bool
	fake := sh.pause
	sh.pause = func(ctx context.Context, d time.Duration, walkUpdates <-chan Settings) {
		fake(ctx, d, walkUpdates) // recorded, and the fake clock advanced
		if len(*pauses) == 3 {
			updates <- next
			wait, cancel := context.WithTimeout(ctx, 10*time.Second) // a bound, should it not adopt them
			sh.pauseAdopting(wait, time.Hour, walkUpdates)           // returns once it has adopted them
			cancel()
			adopted = epochOf(sh) == 2
		}
	}
	rep := sh.Walk(ctx, true)
	if !adopted {
		t.Fatal("the settings were not adopted during the pause")
	}
	if rep.Failed || len(*pauses) != 3 {
		t.Fatalf("paused %d times, want 3 (none once slots arrive): %+v", len(*pauses), rep)
	}
	checkHandoffWalked(t, sh)
}

// TestUnpacedWalkAdoptsSettings: a full walk after the load that is not paced adopts settings
// between its steps, with what TestPacedWalkAdoptsSettings checks: the slot that left is left
// unwalked, the slot that arrived is walked next, the others are walked.
func TestUnpacedWalkAdoptsSettings(t *testing.T) {
	ctx := context.Background()
	sh, pauses, next := handoffShard(t, 0)
	runUpdates(sh, next) // waiting when the walk starts: Walk itself must take it
	rep := sh.Walk(ctx, true)
	if rep.Failed || len(*pauses) != 0 {
		t.Fatalf("walk %+v, paused %d times", rep, len(*pauses))
	}
	if epoch := epochOf(sh); epoch != 2 {
		t.Fatalf("the settings were not adopted during the walk: epoch %d", epoch)
	}
	checkHandoffWalked(t, sh)
}

// TestWalkAdoptingNewEpochPrepares: a full walk that is reading incoming slots for the first time
// adopts, midway, settings of a new epoch with the same slots. The new epoch is prepared when the
// walk ends (coverage: nothing arrived since it started) — not at the next verification, an hour
// later, while the handoff waits.
func TestWalkAdoptingNewEpochPrepares(t *testing.T) {
	ctx := context.Background()
	sh, _, next := handoffShard(t, 0)
	if err := sh.UpdateSettings(ctx, next); err != nil { // epoch 2: handoffArriving incoming
		t.Fatal(err)
	}
	select { // the walk the arrival asked for is this test's
	case <-sh.wake:
	default:
	}
	bumped := next
	bumped.Epoch = 3 // the same slots
	runUpdates(sh, bumped)
	if rep := sh.Walk(ctx, true); rep.Failed {
		t.Fatalf("walk: %+v", rep)
	}
	if epoch := epochOf(sh); epoch != 3 {
		t.Fatalf("epoch %d: the walk did not adopt the settings", epoch)
	}
	sh.mu.Lock()
	prepared := sh.cov.Prepared()
	sh.mu.Unlock()
	if prepared != 3 {
		t.Fatalf("epoch 3 is not prepared when the walk ends (prepared %d)", prepared)
	}
}

// TestLoadHoldsSettings: the load adopts no settings before it ends (its rows are sorted into
// their trees at its end); they wait for Run.
func TestLoadHoldsSettings(t *testing.T) {
	ctx := context.Background()
	st := memstore.New(memstore.Options{})
	rows := make([]schedule.Row, 1000)
	for i := range rows {
		rows[i] = srow(fmt.Sprintf("https://x.example/%d", i), t0.Add(-time.Hour), time.Hour)
	}
	if _, err := st.Upsert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	sh, err := NewShard(Options{Name: "load", Store: st, Log: logr.Discard()}, allSlots(0))
	if err != nil {
		t.Fatal(err)
	}
	next := allSlots(0)
	next.Epoch = 2
	updates := runUpdates(sh, next)
	if rep := sh.Walk(ctx, true); rep.Failed || rep.Counts.Scanned != len(rows) {
		t.Fatalf("load: %+v", rep)
	}
	if len(updates) != 1 {
		t.Fatal("the load took the settings")
	}
}

// TestWalkRateFollowsSettings: settings that change the rate of a running shard pace its next
// walks at the new rate (a settings source such as the RenderQueue's spec.verifyWalkRate changes
// it without a restart); 0 stops the pauses, and a rate given again brings them back. The status
// reports the rate.
func TestWalkRateFollowsSettings(t *testing.T) {
	const n = 10_000
	ctx := context.Background()
	sh, pauses := pacedShard(t, n, 1000, allSlots(0))
	for _, rate := range []int{1000, 4000, 0, 250} {
		settings := allSlots(0)
		settings.VerifyWalkRate = rate
		if err := sh.UpdateSettings(ctx, settings); err != nil {
			t.Fatal(err)
		}
		if got := sh.Status(sh.clock()).VerifyWalkRate; got == nil || *got != rate {
			t.Fatalf("rate %d: the status reports %v", rate, got)
		}
		*pauses = nil
		rep := sh.Walk(ctx, true)
		if rep.Failed || rep.Counts.Scanned != n {
			t.Fatalf("rate %d: walk %+v", rate, rep)
		}
		if rate == 0 {
			if len(*pauses) != 0 {
				t.Fatalf("rate 0: paused %d times", len(*pauses))
			}
			continue
		}
		// as in TestVerificationWalkIsPaced: the rows after the first step take rows/rate
		lo, hi := time.Duration(n-walkStepRows)*time.Second/time.Duration(rate), time.Duration(n)*time.Second/time.Duration(rate)
		if got := sum(*pauses); got < lo || got > hi {
			t.Fatalf("rate %d: paused %v in %d pauses, want %v..%v", rate, got, len(*pauses), lo, hi)
		}
	}
}

// TestNegativeWalkRateIsRefused: a negative rate is an error, not an unpaced walk, at the start
// and in new settings (which leave the shard at its rate).
func TestNegativeWalkRateIsRefused(t *testing.T) {
	bad := allSlots(0)
	bad.VerifyWalkRate = -1
	if _, err := NewShard(Options{Store: memstore.New(memstore.Options{})}, bad); err == nil {
		t.Fatal("a negative walk rate was accepted")
	}
	sh, pauses := pacedShard(t, 1000, 1000, allSlots(0))
	if err := sh.UpdateSettings(context.Background(), bad); err == nil {
		t.Fatal("settings with a negative walk rate were adopted")
	}
	if sh.Walk(context.Background(), true); len(*pauses) == 0 {
		t.Fatal("the shard stopped pacing after refusing a negative rate")
	}
}
