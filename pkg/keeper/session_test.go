package keeper

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// nextProcess starts another keeper process of e's shard over the same store and clock (the
// shard's container restarted, or its Pod replaced: stateFile says which), begins its session
// and loads it.
func (e *shardEnv) nextProcess(settings Settings, stateFile string) *Shard {
	e.t.Helper()
	sh, err := NewShard(Options{Name: "test-shard", Store: e.fs, Clock: e.clock.Now, Log: logr.Discard(), StateFile: stateFile}, settings)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := sh.Subscribe(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = sh.sub.Close() })
	if err := sh.beginSession(e.ctx, nil); err != nil {
		e.t.Fatal(err)
	}
	if rep := sh.Walk(e.ctx, true); rep.Failed || rep.Partial {
		e.t.Fatalf("load: %+v", rep)
	}
	return sh
}

// TestSessionHoldsBackAfterADeadProcess: a keeper process that died with a lease out leaves its
// rows to the next process of the shard; that one hands none of them out until the dead one's
// leases must have ended — the state file's horizon when it runs in the same Pod, the longest
// lease after its start when it runs in another Pod — while the due count stays exact.
func TestSessionHoldsBackAfterADeadProcess(t *testing.T) {
	settings := allSlots(2 * time.Hour)
	settings.LeaseDuration = time.Minute
	for _, tc := range []struct {
		name string
		// samePod: the next process finds the dead one's state file (its container restarted);
		// otherwise it starts with none (a new Pod)
		samePod bool
		// heldUntil is when the next process hands rows out again, from the moment it starts
		// (the clock stands still meanwhile); the dead process claimed at t0 for a minute
		heldUntil time.Duration
	}{
		// the state file's horizon: the lease's end plus a quarter of the longest lease
		{name: "same Pod", samePod: true, heldUntil: time.Minute + 15*time.Second},
		// nothing is known of the dead process's leases but that they end within the longest
		// lease of its death, which is at the latest now
		{name: "another Pod", samePod: false, heldUntil: time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newShardEnv(t, settings)
			e.upsert(srow("a", t0.Add(-time.Hour), time.Hour), srow("b", t0.Add(-2*time.Hour), time.Hour))
			dir := t.TempDir()
			first := e.nextProcess(settings, StateFileIn(filepath.Join(dir)))
			if st := first.Status(t0); len(st.Fences) != 0 || st.HeldBack != 0 {
				t.Fatalf("the shard's first process holds rows back: %+v", st.Fences)
			}
			rows, err := first.Claim(t0, 1, time.Minute)
			if err != nil || len(rows) != 1 {
				t.Fatalf("claim: %v %v", rows, err)
			}
			// the first process dies (no Drain): the next one starts
			next := StateFileIn(dir)
			if !tc.samePod {
				next = StateFileIn(t.TempDir())
			}
			second := e.nextProcess(settings, next)
			st := second.Status(t0)
			if !st.Exact || st.Due != 2 || st.HeldBack != 2 || len(st.Fences) != 1 || st.Fences[0].Until == nil {
				t.Fatalf("after the death: exact=%v due=%d heldBack=%d fences=%+v", st.Exact, st.Due, st.HeldBack, st.Fences)
			}
			if want := t0.Add(tc.heldUntil); !st.Fences[0].Until.Equal(want) {
				t.Errorf("held back until %v, want %v", st.Fences[0].Until, want)
			}
			if got, err := second.Claim(t0, 2, time.Minute); err != nil || len(got) != 0 {
				t.Fatalf("a claim while the dead process's lease may run: %v %v", got, err)
			}
			e.clock.Set(t0.Add(tc.heldUntil))
			got, err := second.Claim(e.clock.Now(), 2, time.Minute)
			if err != nil || len(got) != 2 {
				t.Fatalf("a claim once it must have ended: %v %v", got, err)
			}
			if st := second.Status(e.clock.Now()); st.HeldBack != 0 || len(st.Fences) != 0 {
				t.Errorf("after the fence: heldBack=%d fences=%+v", st.HeldBack, st.Fences)
			}
		})
	}
}

// TestSessionAfterACleanEnd: a keeper stopped by SIGTERM drains — it refuses claims at once and
// waits for its leases — and records its clean end; the next process, in another Pod, holds its
// rows back only until the lease still out when it ended, or not at all when none was.
func TestSessionAfterACleanEnd(t *testing.T) {
	settings := allSlots(2 * time.Hour)
	settings.LeaseDuration = 10 * time.Minute
	e := newShardEnv(t, settings)
	e.upsert(srow("a", t0.Add(-time.Hour), time.Hour), srow("b", t0.Add(-2*time.Hour), time.Hour))
	first := e.nextProcess(settings, StateFileIn(t.TempDir()))
	rows, err := first.Claim(t0, 1, time.Minute)
	if err != nil || len(rows) != 1 {
		t.Fatalf("claim: %v %v", rows, err)
	}
	// the drain gives up with the lease still out (its context ends): the end records it
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	first.Drain(ctx)
	if _, err := first.Claim(t0, 1, time.Minute); !errors.Is(err, ErrDraining) {
		t.Fatalf("a claim while draining: %v, want ErrDraining", err)
	}
	second := e.nextProcess(settings, StateFileIn(t.TempDir()))
	st := second.Status(t0)
	if !st.Exact || st.Due != 2 || len(st.Fences) != 1 || st.Fences[0].Until == nil || !st.Fences[0].Until.Equal(t0.Add(time.Minute)) {
		t.Fatalf("after a clean end with a lease out until %v: due=%d fences=%+v (the longest lease is %v)",
			t0.Add(time.Minute), st.Due, st.Fences, settings.LeaseDuration)
	}

	// the second process's lease is completed before it stops: the third holds nothing back
	e.clock.Set(t0.Add(time.Minute))
	got, err := second.Claim(e.clock.Now(), 1, time.Minute)
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %v %v", got, err)
	}
	if _, err := second.Release(e.clock.Now(), []CompleteItem{{Key: got[0].Key, Lease: got[0].Lease}}); err != nil {
		t.Fatal(err)
	}
	second.Drain(e.ctx)
	third := e.nextProcess(settings, StateFileIn(t.TempDir()))
	if st := third.Status(e.clock.Now()); len(st.Fences) != 0 || st.HeldBack != 0 {
		t.Fatalf("after a clean end with no lease out: fences=%+v heldBack=%d", st.Fences, st.HeldBack)
	}
}
