package membership

import (
	"slices"
	"testing"
	"time"
)

// TestDecide walks a RenderQueue's membership through every step Decide takes: the first
// assignment, a scale-up waiting for its receiver's Pod, the prepare, waiting for the receiver,
// the commit, nothing to do; then a prepare that rolls back, the pause before a retry, and the
// retry.
func TestDecide(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const timeout, retryAfter = 5 * time.Minute, time.Minute
	ready := map[string]bool{}
	sit := func(cur Assignment, last *Handoff, finished time.Time, targets int, prepared map[string]int64, now time.Time) Situation {
		return Situation{Current: cur, Last: last, LastFinished: finished, Targets: shardNames(targets), Prepared: prepared,
			Ready: func(n string) bool { return ready[n] }, Now: now, Timeout: timeout, RetryAfter: retryAfter}
	}
	decide := func(s Situation, want StepKind) Step {
		t.Helper()
		st, err := Decide(s)
		if err != nil {
			t.Fatalf("%s: %v", want, err)
		}
		if st.Kind != want {
			t.Fatalf("decided %s, want %s (%+v)", st.Kind, want, st)
		}
		return st
	}

	first := decide(sit(Assignment{}, nil, time.Time{}, 2, nil, t0), StepAssign)
	if first.Publish.Epoch != 1 || len(first.Publish.Counts()) != 2 || first.Handoff.State != HandoffCommitted {
		t.Fatalf("first assignment: %s, handoff %+v", layout(first.Publish), first.Handoff)
	}
	cur, last := first.Publish, first.Handoff
	decide(sit(cur, &last, t0, 2, nil, t0.Add(time.Second)), StepNone)

	// scale to 3: the receiver's Pod is not ready yet
	w := decide(sit(cur, &last, t0, 3, nil, t0.Add(time.Minute)), StepWaitReady)
	if !slices.Equal(w.NotReady, []string{"shard-2"}) || w.Plan.Moved() == 0 {
		t.Fatalf("waiting for %v, moving %d", w.NotReady, w.Plan.Moved())
	}
	ready["shard-2"] = true
	prep := decide(sit(cur, &last, t0, 3, nil, t0.Add(2*time.Minute)), StepPrepare)
	if prep.Publish.Epoch != 2 || prep.Publish.Settled() || prep.Handoff.State != HandoffPreparing || prep.RequeueAfter != timeout {
		t.Fatalf("prepare: epoch %d settled %v handoff %+v requeue %v", prep.Publish.Epoch, prep.Publish.Settled(), prep.Handoff, prep.RequeueAfter)
	}
	cur, last = prep.Publish, prep.Handoff
	wait := decide(sit(cur, &last, time.Time{}, 3, map[string]int64{"shard-2": 1}, t0.Add(3*time.Minute)), StepWait)
	if !slices.Equal(wait.Handoff.Waiting, []string{"shard-2"}) || wait.RequeueAfter != 4*time.Minute {
		t.Fatalf("wait: %v, requeue %v", wait.Handoff.Waiting, wait.RequeueAfter)
	}
	commit := decide(sit(cur, &last, time.Time{}, 3, map[string]int64{"shard-2": 2}, t0.Add(4*time.Minute)), StepCommit)
	if commit.Publish.Epoch != 3 || !commit.Publish.Settled() || commit.Handoff.State != HandoffCommitted {
		t.Fatalf("commit: %s, handoff %+v", layout(commit.Publish), commit.Handoff)
	}
	cur, last = commit.Publish, commit.Handoff
	decide(sit(cur, &last, t0.Add(4*time.Minute), 3, nil, t0.Add(5*time.Minute)), StepNone)

	// scale to 4: the prepare rolls back at its deadline, is not retried before RetryAfter, then is
	ready["shard-3"] = true
	prep = decide(sit(cur, &last, t0.Add(4*time.Minute), 4, nil, t0.Add(6*time.Minute)), StepPrepare)
	cur, last = prep.Publish, prep.Handoff
	back := decide(sit(cur, &last, time.Time{}, 4, nil, t0.Add(6*time.Minute+timeout)), StepRollback)
	if back.Publish.Epoch != 5 || !back.Publish.Settled() || back.Handoff.State != HandoffRolledBack || back.RequeueAfter != retryAfter {
		t.Fatalf("rollback: %s, handoff %+v, requeue %v", layout(back.Publish), back.Handoff, back.RequeueAfter)
	}
	if back.Publish.Owned("shard-3").Len() != 0 {
		t.Fatalf("the rollback gave shard-3 slots: %s", layout(back.Publish))
	}
	cur, last = back.Publish, back.Handoff
	rolledAt := t0.Add(6*time.Minute + timeout)
	later := decide(sit(cur, &last, rolledAt, 4, nil, rolledAt.Add(30*time.Second)), StepRetryLater)
	if !later.RetryAt.Equal(rolledAt.Add(retryAfter)) || later.RequeueAfter != 30*time.Second {
		t.Fatalf("retry at %v, requeue %v", later.RetryAt, later.RequeueAfter)
	}
	decide(sit(cur, &last, rolledAt, 4, nil, rolledAt.Add(retryAfter)), StepPrepare)

	// a handoff whose record is broken is an error, not a guess
	broken := last
	broken.State, broken.Moves = HandoffPreparing, []MoveText{{From: "shard-0", To: "shard-3", Slots: "0-2000"}}
	broken.PrepareEpoch, broken.FinalEpoch = broken.FromEpoch+1, broken.FromEpoch+2
	if _, err := Decide(sit(cur, &broken, time.Time{}, 4, nil, rolledAt)); err == nil {
		t.Fatal("a handoff with unparsable moves was stepped")
	}
}
