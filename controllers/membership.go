package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/log"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/policy"
	"github.com/renderqueue/renderqueue/controllers/specs"
	"github.com/renderqueue/renderqueue/pkg/membership"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// Event reasons of the membership step.
const (
	// EventSlotsAssigned: the first assignment was published.
	EventSlotsAssigned = "SlotsAssigned"
	// EventRebalanceStarted: a prepare was published.
	EventRebalanceStarted = "RebalanceStarted"
	// EventRebalanceCommitted: every receiver was prepared and ownership moved.
	EventRebalanceCommitted = "RebalanceCommitted"
	// EventRebalanceRolledBack: a receiver did not report in time; ownership stayed.
	EventRebalanceRolledBack = "RebalanceRolledBack"
)

// membershipStep is the outcome of reconcileMembership.
type membershipStep struct {
	// Progress is set while a rebalance is pending or running.
	Progress *policy.Progress
	// Events to emit once the status is written.
	Events []policy.Event
	// RequeueAfter, when positive, asks to look again no later than this.
	RequeueAfter time.Duration
}

// reconcileMembership drives the slot assignment towards spec.shards from *assign (the assignment
// published in status.membership, parsed once by the caller). What to do is decided by
// pkg/membership in one call (membership.Decide); this writes the decision into next.Membership
// (the caller persists it in one status write, which is when it takes effect) and the assignment
// it publishes into *assign, so the caller never parses it back, and turns it into the
// Progressing message and the events:
//
//   - no assignment yet: the first one is planned and committed at once (nothing is counted
//     before it, so there is nothing to prepare; shards can load while their Pods start);
//   - a handoff Preparing: stepped with the receivers' reported preparedEpoch; it commits when
//     all are prepared and rolls back at its deadline;
//   - settled but not balanced over the target shards: once every receiving shard's Pod is Ready,
//     a rebalance starts with its prepare phase. After a rollback it is retried after
//     RebalanceRetryAfter.
func (r *RenderQueueReconciler) reconcileMembership(ctx context.Context, rq *rqv1.RenderQueue, assign *membership.Assignment,
	next *rqv1.RenderQueueStatus, reports []policy.ShardReport, pods map[string]*corev1.Pod, now time.Time) (membershipStep, error) {
	logger := log.FromContext(ctx)
	ms := &next.Membership
	targets := specs.TargetShards(rq)
	sit := membership.Situation{
		Current: *assign, Targets: targets, Prepared: map[string]int64{}, Now: now,
		Ready:   func(name string) bool { return policy.PodReady(pods[name]) },
		Timeout: r.rebalanceTimeout(), RetryAfter: r.rebalanceRetryAfter(),
	}
	for _, rep := range reports {
		if rep.Reachable() {
			sit.Prepared[rep.Name] = rep.Status.Membership.PreparedEpoch
		}
	}
	var last membership.Handoff
	if ms.Handoff != nil {
		last = policy.HandoffFromStatus(ms.Handoff)
		sit.Last = &last
		if ms.Handoff.FinishedAt != nil {
			sit.LastFinished = ms.Handoff.FinishedAt.Time
		}
	}
	step, err := membership.Decide(sit)
	if err != nil {
		return membershipStep{}, err
	}
	publish := func() {
		policy.SetAssignment(rq, ms, step.Publish)
		*assign = step.Publish
		ms.Handoff = policy.HandoffToStatus(step.Handoff)
	}
	h := step.Handoff
	switch step.Kind {
	case membership.StepAssign:
		publish()
		ms.Handoff.FinishedAt = ptr.To(metav1.NewTime(now))
		logger.Info("Assigned slots", "epoch", step.Publish.Epoch, "shards", len(targets))
		return membershipStep{Events: []policy.Event{{
			Type: corev1.EventTypeNormal, Reason: EventSlotsAssigned, Action: "Assign",
			Message: fmt.Sprintf("assigned %d slots to %d shards at epoch %d", schedule.NumSlots, len(targets), step.Publish.Epoch),
		}}}, nil
	case membership.StepRetryLater:
		return membershipStep{
			Progress: &policy.Progress{Reason: rqv1.ReasonRebalancing, Message: fmt.Sprintf(
				"the rebalance from epoch %d rolled back (%s did not report prepared); retrying at %s",
				last.FromEpoch, strings.Join(last.Waiting, ", "), step.RetryAt.UTC().Format(time.RFC3339))},
			RequeueAfter: step.RequeueAfter,
		}, nil
	case membership.StepWaitReady:
		return membershipStep{Progress: &policy.Progress{Reason: rqv1.ReasonRebalancing, Message: fmt.Sprintf(
			"waiting for %s to become ready before moving %d slots to %d shards",
			strings.Join(step.NotReady, ", "), step.Plan.Moved(), len(targets))}}, nil
	case membership.StepPrepare:
		publish()
		msg := fmt.Sprintf("moving %d slots to %d shards (%s): prepare at epoch %d, waiting for %s to report prepared by %s",
			step.Plan.Moved(), len(targets), policy.DescribeMoves(h.Moves), h.PrepareEpoch, strings.Join(h.Waiting, ", "),
			h.Deadline.UTC().Format(time.RFC3339))
		logger.Info("Rebalance started", "fromEpoch", h.FromEpoch, "prepareEpoch", h.PrepareEpoch,
			"slotsMoving", step.Plan.Moved(), "receivers", h.Receivers())
		return membershipStep{
			Progress:     &policy.Progress{Reason: rqv1.ReasonRebalancing, Message: msg},
			Events:       []policy.Event{{Type: corev1.EventTypeNormal, Reason: EventRebalanceStarted, Action: "Prepare", Message: msg}},
			RequeueAfter: step.RequeueAfter,
		}, nil
	case membership.StepWait:
		ms.Handoff.Waiting = slices.Clone(h.Waiting)
		return membershipStep{
			Progress: &policy.Progress{Reason: rqv1.ReasonRebalancing, Message: fmt.Sprintf(
				"moving %d slots (%s) at prepare epoch %d: waiting for %s to report prepared, rollback at %s",
				policy.MovedSlots(last.Moves), policy.DescribeMoves(last.Moves), last.PrepareEpoch, strings.Join(h.Waiting, ", "),
				last.Deadline.UTC().Format(time.RFC3339))},
			RequeueAfter: step.RequeueAfter,
		}, nil
	case membership.StepCommit:
		publish()
		ms.Handoff.FinishedAt = ptr.To(metav1.NewTime(now))
		msg := fmt.Sprintf("committed the move of %d slots (%s) at epoch %d",
			policy.MovedSlots(last.Moves), policy.DescribeMoves(last.Moves), step.Publish.Epoch)
		logger.Info("Rebalance committed", "epoch", step.Publish.Epoch, "slotsMoved", policy.MovedSlots(last.Moves))
		return membershipStep{Events: []policy.Event{{
			Type: corev1.EventTypeNormal, Reason: EventRebalanceCommitted, Action: "Commit", Message: msg,
		}}}, nil
	case membership.StepRollback:
		publish()
		ms.Handoff.FinishedAt = ptr.To(metav1.NewTime(now))
		msg := fmt.Sprintf("rolled back the move of %d slots at epoch %d: %s did not report prepare epoch %d walked by %s",
			policy.MovedSlots(last.Moves), step.Publish.Epoch, strings.Join(h.Waiting, ", "), last.PrepareEpoch,
			last.Deadline.UTC().Format(time.RFC3339))
		logger.Info("Rebalance rolled back", "epoch", step.Publish.Epoch, "waiting", h.Waiting)
		return membershipStep{
			Progress:     &policy.Progress{Reason: rqv1.ReasonRebalancing, Message: msg},
			Events:       []policy.Event{{Type: corev1.EventTypeWarning, Reason: EventRebalanceRolledBack, Action: "Rollback", Message: msg}},
			RequeueAfter: step.RequeueAfter,
		}, nil
	default:
		return membershipStep{}, nil
	}
}
