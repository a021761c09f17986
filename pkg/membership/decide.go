package membership

import (
	"fmt"
	"time"
)

// Situation is what the operator knows when it decides the membership's next step: the published
// assignment, the last handoff and what the shards and their Pods report.
type Situation struct {
	// Current is the published assignment.
	Current Assignment
	// Last is the last handoff (nil before the first), and LastFinished when it was committed or
	// rolled back (zero when unknown).
	Last         *Handoff
	LastFinished time.Time
	// Targets are the shards the RenderQueue asks for, in the operator's order.
	Targets []string
	// Prepared is the preparedEpoch each reachable shard reports.
	Prepared map[string]int64
	// Ready says whether a shard can take slots now (its Pod is Ready): a rebalance starts only
	// when every receiver can.
	Ready func(shard string) bool
	// Now is the time of the decision.
	Now time.Time
	// Timeout bounds a prepare (a receiver not prepared by then rolls it back); RetryAfter is how
	// long after a rollback a rebalance is tried again.
	Timeout, RetryAfter time.Duration
}

// StepKind is what Decide decided.
type StepKind string

const (
	// StepNone: the assignment is what the targets ask for; nothing to do.
	StepNone StepKind = "None"
	// StepAssign: publish the first assignment (committed at once: nothing is counted before it).
	StepAssign StepKind = "Assign"
	// StepPrepare: publish the prepare phase of a rebalance.
	StepPrepare StepKind = "Prepare"
	// StepWait: a handoff is preparing and some receivers have not reported prepared.
	StepWait StepKind = "Wait"
	// StepCommit: every receiver is prepared; publish the commit.
	StepCommit StepKind = "Commit"
	// StepRollback: a receiver missed the deadline; publish the rollback.
	StepRollback StepKind = "Rollback"
	// StepRetryLater: the last rebalance rolled back less than RetryAfter ago.
	StepRetryLater StepKind = "RetryLater"
	// StepWaitReady: a rebalance is due but some receivers cannot take slots yet.
	StepWaitReady StepKind = "WaitReady"
)

// Step is the membership's next step. For Assign, Prepare, Commit and Rollback the operator
// publishes Publish together with Handoff in one write, which is when the step takes effect.
type Step struct {
	Kind StepKind
	// Publish is the assignment to publish (Assign, Prepare, Commit, Rollback).
	Publish Assignment
	// Handoff is the handoff to persist: started (Assign, Prepare) or stepped (Wait, Commit,
	// Rollback).
	Handoff Handoff
	// Plan is the rebalance (Assign, Prepare, WaitReady).
	Plan Plan
	// NotReady lists the receivers that cannot take slots yet (WaitReady), in target order.
	NotReady []string
	// RetryAt is when a rebalance is tried again (RetryLater).
	RetryAt time.Time
	// RequeueAfter, when positive, is when to decide again at the latest.
	RequeueAfter time.Duration
}

// Decide is the membership's next step in s, in one call: a preparing handoff is stepped
// (Handoff.Step: wait, commit or roll back); otherwise the assignment is planned towards the
// targets (PlanRebalance) and, when slots must move, the first assignment is published at once,
// or a rebalance starts with its prepare phase once every receiver is ready and no rollback
// happened less than RetryAfter ago. It does no I/O and reads no clock.
func Decide(s Situation) (Step, error) {
	if s.Last != nil && s.Last.State == HandoffPreparing {
		next, act, err := s.Last.Step(s.Now, s.Prepared)
		if err != nil {
			return Step{}, fmt.Errorf("stepping the handoff from epoch %d: %w", s.Last.FromEpoch, err)
		}
		switch act.Kind {
		case ActionWait:
			return Step{Kind: StepWait, Handoff: next, RequeueAfter: act.RequeueAfter}, nil
		case ActionCommit, ActionRollback:
			a, err := Apply(s.Current, act.Phase)
			if err != nil {
				return Step{}, fmt.Errorf("applying the %s phase at epoch %d: %w", act.Phase.Kind, act.Phase.Epoch, err)
			}
			if act.Kind == ActionCommit {
				return Step{Kind: StepCommit, Publish: a, Handoff: next}, nil
			}
			return Step{Kind: StepRollback, Publish: a, Handoff: next, RequeueAfter: s.RetryAfter}, nil
		default:
			return Step{Kind: StepNone}, nil
		}
	}
	plan, err := PlanRebalance(s.Current, s.Targets)
	if err != nil {
		return Step{}, fmt.Errorf("planning the slots of %d shards from epoch %d: %w", len(s.Targets), s.Current.Epoch, err)
	}
	if plan.IsEmpty() {
		return Step{Kind: StepNone}, nil
	}
	if s.Current.IsEmpty() {
		h, act, err := StartHandoff(s.Current, plan, s.Now, s.Timeout)
		if err != nil {
			return Step{}, fmt.Errorf("starting the first assignment: %w", err)
		}
		a, err := Apply(s.Current, act.Phase)
		if err != nil {
			return Step{}, fmt.Errorf("applying the first assignment: %w", err)
		}
		return Step{Kind: StepAssign, Publish: a, Handoff: h, Plan: plan}, nil
	}
	if s.Last != nil && s.Last.State == HandoffRolledBack && !s.LastFinished.IsZero() {
		if retry := s.LastFinished.Add(s.RetryAfter); s.Now.Before(retry) {
			return Step{Kind: StepRetryLater, RetryAt: retry, RequeueAfter: retry.Sub(s.Now)}, nil
		}
	}
	receivers := map[string]bool{}
	for _, m := range plan.Moves() {
		receivers[m.To] = true
	}
	var notReady []string
	for _, name := range s.Targets {
		if receivers[name] && (s.Ready == nil || !s.Ready(name)) {
			notReady = append(notReady, name)
		}
	}
	if len(notReady) > 0 {
		return Step{Kind: StepWaitReady, Plan: plan, NotReady: notReady}, nil
	}
	h, act, err := StartHandoff(s.Current, plan, s.Now, s.Timeout)
	if err != nil {
		return Step{}, fmt.Errorf("starting a rebalance from epoch %d: %w", s.Current.Epoch, err)
	}
	a, err := Apply(s.Current, act.Phase)
	if err != nil {
		return Step{}, fmt.Errorf("applying the prepare phase at epoch %d: %w", act.Phase.Epoch, err)
	}
	return Step{Kind: StepPrepare, Publish: a, Handoff: h, Plan: plan, RequeueAfter: act.RequeueAfter}, nil
}
