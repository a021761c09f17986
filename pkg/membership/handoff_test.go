package membership

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestHandoff(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	const timeout = 10 * time.Minute
	// Grow from 3 shards (epoch 1) to 5: receivers are shard-3 and shard-4; prepare epoch 2,
	// final epoch 3.
	_, start := mustPlanApply(t, Assignment{}, shardNames(3))
	plan, err := PlanRebalance(start, shardNames(5))
	if err != nil {
		t.Fatal(err)
	}

	type step struct {
		// after is the time since the start at which the step is taken.
		after time.Duration
		// reports is each shard's reported preparedEpoch.
		reports map[string]int64
		// wantAction is the expected action.
		wantAction ActionKind
		// wantState is the expected state after the step.
		wantState HandoffState
		// wantWaiting is the expected receivers still waited for.
		wantWaiting []string
	}
	tests := []struct {
		// name describes the case.
		name string
		// steps are taken in order after StartHandoff.
		steps []step
		// wantOwners is the shards owning slots at the end.
		wantOwners int
	}{
		{
			name: "all receivers report: commit",
			steps: []step{
				{after: time.Minute, reports: map[string]int64{"shard-0": 2, "shard-3": 2}, wantAction: ActionWait, wantState: HandoffPreparing, wantWaiting: []string{"shard-4"}},
				{after: 2 * time.Minute, reports: map[string]int64{"shard-3": 2, "shard-4": 2}, wantAction: ActionCommit, wantState: HandoffCommitted},
				{after: 3 * time.Minute, reports: nil, wantAction: ActionNone, wantState: HandoffCommitted},
			},
			wantOwners: 5,
		},
		{
			name: "a receiver never reports: rollback at the deadline",
			steps: []step{
				{after: time.Minute, reports: map[string]int64{"shard-3": 2}, wantAction: ActionWait, wantState: HandoffPreparing, wantWaiting: []string{"shard-4"}},
				{after: timeout - time.Nanosecond, reports: map[string]int64{"shard-3": 2}, wantAction: ActionWait, wantState: HandoffPreparing, wantWaiting: []string{"shard-4"}},
				{after: timeout, reports: map[string]int64{"shard-3": 2}, wantAction: ActionRollback, wantState: HandoffRolledBack, wantWaiting: []string{"shard-4"}},
				{after: timeout + time.Minute, reports: map[string]int64{"shard-3": 2, "shard-4": 2}, wantAction: ActionNone, wantState: HandoffRolledBack},
			},
			wantOwners: 3,
		},
		{
			name: "reports of an old epoch do not count",
			steps: []step{
				{after: time.Minute, reports: map[string]int64{"shard-3": 1, "shard-4": 0}, wantAction: ActionWait, wantState: HandoffPreparing, wantWaiting: []string{"shard-3", "shard-4"}},
				{after: timeout, reports: map[string]int64{"shard-3": 1, "shard-4": 1}, wantAction: ActionRollback, wantState: HandoffRolledBack, wantWaiting: []string{"shard-3", "shard-4"}},
			},
			wantOwners: 3,
		},
		{
			name: "reports arriving with the deadline still commit",
			steps: []step{
				{after: timeout + time.Hour, reports: map[string]int64{"shard-3": 2, "shard-4": 5}, wantAction: ActionCommit, wantState: HandoffCommitted},
			},
			wantOwners: 5,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, act, err := StartHandoff(start, plan, t0, timeout)
			if err != nil {
				t.Fatal(err)
			}
			if act.Kind != ActionPrepare || h.State != HandoffPreparing || h.PrepareEpoch != 2 || h.FinalEpoch != 3 {
				t.Fatalf("start: action %s, handoff %+v", act.Kind, h)
			}
			a, err := Apply(start, act.Phase)
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range tt.steps {
				// The operator persists the handoff between steps, its times in whole seconds.
				h = persisted(h)
				next, act, err := h.Step(t0.Add(st.after), st.reports)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if act.Kind != st.wantAction || next.State != st.wantState {
					t.Errorf("step %d: action %s state %s, want %s %s", i, act.Kind, next.State, st.wantAction, st.wantState)
				}
				if fmt.Sprint(act.Waiting) != fmt.Sprint(st.wantWaiting) {
					t.Errorf("step %d: waiting %v, want %v", i, act.Waiting, st.wantWaiting)
				}
				if act.Kind == ActionWait && act.RequeueAfter != timeout-st.after {
					t.Errorf("step %d: requeue after %v, want %v", i, act.RequeueAfter, timeout-st.after)
				}
				if act.Phase.Kind != "" {
					if a, err = Apply(a, act.Phase); err != nil {
						t.Fatalf("step %d: apply %s: %v", i, act.Phase.Kind, err)
					}
				}
				h = next
			}
			if !h.Done() || !a.Settled() || a.Epoch != 3 {
				t.Errorf("end: done %v, settled %v, epoch %d", h.Done(), a.Settled(), a.Epoch)
			}
			if got := len(a.Counts()); got != tt.wantOwners {
				t.Errorf("end: %d owners, want %d", got, tt.wantOwners)
			}
			if tt.wantOwners == 3 && a.Spec().Shards[0].Owned != start.Spec().Shards[0].Owned {
				t.Errorf("rollback changed ownership: %s", layout(a))
			}
		})
	}
}

// persisted is h as the operator reads it back from RenderQueue status (metav1.Time keeps whole
// seconds), with no slice shared.
func persisted(h Handoff) Handoff {
	h.StartedAt, h.Deadline = h.StartedAt.Truncate(time.Second), h.Deadline.Truncate(time.Second)
	h.Moves, h.Waiting = slices.Clone(h.Moves), slices.Clone(h.Waiting)
	return h
}

func TestHandoffFirstAssignment(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	plan, err := PlanRebalance(Assignment{}, shardNames(2))
	if err != nil {
		t.Fatal(err)
	}
	h, act, err := StartHandoff(Assignment{}, plan, t0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if act.Kind != ActionCommit || h.State != HandoffCommitted || h.FinalEpoch != 1 {
		t.Fatalf("action %s, handoff %+v", act.Kind, h)
	}
	a, err := Apply(Assignment{}, act.Phase)
	if err != nil || a.Owner(0) != "shard-0" || a.Owner(1023) != "shard-1" {
		t.Fatalf("first assignment %s: %v", layout(a), err)
	}
}

func TestHandoffErrors(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	_, start := mustPlanApply(t, Assignment{}, shardNames(2))
	plan, err := PlanRebalance(start, shardNames(3))
	if err != nil {
		t.Fatal(err)
	}
	empty, _ := PlanRebalance(start, shardNames(2))
	stale := start
	stale.Epoch++
	for _, tc := range []struct {
		// name describes the case.
		name string
		// current is the assignment the handoff starts from.
		current Assignment
		// plan is the plan to carry out.
		plan Plan
		// timeout is the prepare timeout.
		timeout time.Duration
		// wantErr is a fragment of the expected error.
		wantErr string
	}{
		{name: "empty plan", current: start, plan: empty, timeout: time.Minute, wantErr: "moves nothing"},
		{name: "stale plan", current: stale, plan: plan, timeout: time.Minute, wantErr: "made from epoch 1"},
		{name: "zero timeout", current: start, plan: plan, timeout: 0, wantErr: "not positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := StartHandoff(tc.current, tc.plan, t0, tc.timeout)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v, want one mentioning %q", err, tc.wantErr)
			}
		})
	}

	h, _, err := StartHandoff(start, plan, t0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	bad := h
	bad.Moves = []MoveText{{From: "shard-0", To: "shard-2", Slots: "5-3"}}
	if _, _, err := bad.Step(t0, nil); err == nil || !strings.Contains(err.Error(), "descending") {
		t.Errorf("bad slot text: error %v", err)
	}
	bad = h
	bad.State = "Dancing"
	if _, _, err := bad.Step(t0, nil); err == nil || !strings.Contains(err.Error(), "unknown state") {
		t.Errorf("bad state: error %v", err)
	}
	bad = h
	bad.FinalEpoch = bad.PrepareEpoch
	if _, _, err := bad.Step(t0, nil); err == nil || !strings.Contains(err.Error(), "inconsistent epochs") {
		t.Errorf("bad epochs: error %v", err)
	}
}
