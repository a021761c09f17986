package controllers

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
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

// assignmentFromStatus parses the assignment published in status.membership.
func assignmentFromStatus(ms rqv1.MembershipStatus) (membership.Assignment, error) {
	byName := map[string]*membership.ShardSlots{}
	var names []string
	get := func(name string) *membership.ShardSlots {
		if s, ok := byName[name]; ok {
			return s
		}
		s := &membership.ShardSlots{Name: name}
		byName[name] = s
		names = append(names, name)
		return s
	}
	for _, s := range ms.Assignment {
		get(s.Shard).Owned = s.Slots
	}
	for _, s := range ms.Incoming {
		get(s.Shard).Incoming = s.Slots
	}
	spec := membership.AssignmentSpec{Epoch: ms.Epoch}
	for _, n := range names {
		spec.Shards = append(spec.Shards, *byName[n])
	}
	a, err := membership.ParseAssignment(spec)
	if err != nil {
		return membership.Assignment{}, fmt.Errorf("status.membership: %w", err)
	}
	return a, nil
}

// setAssignment publishes a in status.membership (assignment, incoming, epoch, slotsMoving).
func setAssignment(rq *rqv1.RenderQueue, ms *rqv1.MembershipStatus, a membership.Assignment) {
	ms.Epoch = a.Epoch
	ms.Assignment, ms.Incoming = nil, nil
	moving := 0
	names := a.Shards()
	specs.SortShards(rq, names)
	for _, n := range names {
		if owned := a.Owned(n); !owned.IsEmpty() {
			ms.Assignment = append(ms.Assignment, rqv1.ShardSlots{Shard: n, Slots: schedule.FormatSlots(owned)})
		}
		if in := a.Incoming(n); !in.IsEmpty() {
			ms.Incoming = append(ms.Incoming, rqv1.ShardSlots{Shard: n, Slots: schedule.FormatSlots(in)})
			moving += in.Len()
		}
	}
	ms.SlotsMoving = int32(moving)
}

// handoffToStatus converts the coordinator's state for status.
func handoffToStatus(h membership.Handoff) *rqv1.HandoffStatus {
	out := &rqv1.HandoffStatus{
		State:        rqv1.HandoffState(h.State),
		FromEpoch:    h.FromEpoch,
		PrepareEpoch: h.PrepareEpoch,
		FinalEpoch:   h.FinalEpoch,
		StartedAt:    metav1.NewTime(h.StartedAt),
		Deadline:     metav1.NewTime(h.Deadline),
		Waiting:      slices.Clone(h.Waiting),
	}
	for _, m := range h.Moves {
		out.Moves = append(out.Moves, rqv1.SlotMove{From: m.From, To: m.To, Slots: m.Slots})
	}
	return out
}

// handoffFromStatus converts status.membership.handoff back for the coordinator.
func handoffFromStatus(s *rqv1.HandoffStatus) membership.Handoff {
	h := membership.Handoff{
		State:        membership.HandoffState(s.State),
		FromEpoch:    s.FromEpoch,
		PrepareEpoch: s.PrepareEpoch,
		FinalEpoch:   s.FinalEpoch,
		StartedAt:    s.StartedAt.Time,
		Deadline:     s.Deadline.Time,
		Waiting:      slices.Clone(s.Waiting),
	}
	for _, m := range s.Moves {
		h.Moves = append(h.Moves, membership.MoveText{From: m.From, To: m.To, Slots: m.Slots})
	}
	return h
}

// membershipStep is the outcome of reconcileMembership.
type membershipStep struct {
	// Progress is set while a rebalance is pending or running.
	Progress *progress
	// Events to emit once the status is written.
	Events []pendingEvent
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
	next *rqv1.RenderQueueStatus, reports []shardReport, pods map[string]*corev1.Pod, now time.Time) (membershipStep, error) {
	logger := log.FromContext(ctx)
	ms := &next.Membership
	targets := specs.TargetShards(rq)
	sit := membership.Situation{
		Current: *assign, Targets: targets, Prepared: map[string]int64{}, Now: now,
		Ready:   func(name string) bool { return podReady(pods[name]) },
		Timeout: r.rebalanceTimeout(), RetryAfter: r.rebalanceRetryAfter(),
	}
	for _, rep := range reports {
		if rep.Reachable() {
			sit.Prepared[rep.Name] = rep.Status.Membership.PreparedEpoch
		}
	}
	var last membership.Handoff
	if ms.Handoff != nil {
		last = handoffFromStatus(ms.Handoff)
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
		setAssignment(rq, ms, step.Publish)
		*assign = step.Publish
		ms.Handoff = handoffToStatus(step.Handoff)
	}
	h := step.Handoff
	switch step.Kind {
	case membership.StepAssign:
		publish()
		ms.Handoff.FinishedAt = ptrTime(now)
		logger.Info("Assigned slots", "epoch", step.Publish.Epoch, "shards", len(targets))
		return membershipStep{Events: []pendingEvent{{
			Type: corev1.EventTypeNormal, Reason: EventSlotsAssigned, Action: "Assign",
			Message: fmt.Sprintf("assigned %d slots to %d shards at epoch %d", schedule.NumSlots, len(targets), step.Publish.Epoch),
		}}}, nil
	case membership.StepRetryLater:
		return membershipStep{
			Progress: &progress{Reason: rqv1.ReasonRebalancing, Message: fmt.Sprintf(
				"the rebalance from epoch %d rolled back (%s did not report prepared); retrying at %s",
				last.FromEpoch, strings.Join(last.Waiting, ", "), step.RetryAt.UTC().Format(time.RFC3339))},
			RequeueAfter: step.RequeueAfter,
		}, nil
	case membership.StepWaitReady:
		return membershipStep{Progress: &progress{Reason: rqv1.ReasonRebalancing, Message: fmt.Sprintf(
			"waiting for %s to become ready before moving %d slots to %d shards",
			strings.Join(step.NotReady, ", "), step.Plan.Moved(), len(targets))}}, nil
	case membership.StepPrepare:
		publish()
		msg := fmt.Sprintf("moving %d slots to %d shards (%s): prepare at epoch %d, waiting for %s to report prepared by %s",
			step.Plan.Moved(), len(targets), describeMoves(h.Moves), h.PrepareEpoch, strings.Join(h.Waiting, ", "),
			h.Deadline.UTC().Format(time.RFC3339))
		logger.Info("Rebalance started", "fromEpoch", h.FromEpoch, "prepareEpoch", h.PrepareEpoch,
			"slotsMoving", step.Plan.Moved(), "receivers", h.Receivers())
		return membershipStep{
			Progress:     &progress{Reason: rqv1.ReasonRebalancing, Message: msg},
			Events:       []pendingEvent{{Type: corev1.EventTypeNormal, Reason: EventRebalanceStarted, Action: "Prepare", Message: msg}},
			RequeueAfter: step.RequeueAfter,
		}, nil
	case membership.StepWait:
		ms.Handoff.Waiting = slices.Clone(h.Waiting)
		return membershipStep{
			Progress: &progress{Reason: rqv1.ReasonRebalancing, Message: fmt.Sprintf(
				"moving %d slots (%s) at prepare epoch %d: waiting for %s to report prepared, rollback at %s",
				movedSlots(last.Moves), describeMoves(last.Moves), last.PrepareEpoch, strings.Join(h.Waiting, ", "),
				last.Deadline.UTC().Format(time.RFC3339))},
			RequeueAfter: step.RequeueAfter,
		}, nil
	case membership.StepCommit:
		publish()
		ms.Handoff.FinishedAt = ptrTime(now)
		msg := fmt.Sprintf("committed the move of %d slots (%s) at epoch %d",
			movedSlots(last.Moves), describeMoves(last.Moves), step.Publish.Epoch)
		logger.Info("Rebalance committed", "epoch", step.Publish.Epoch, "slotsMoved", movedSlots(last.Moves))
		return membershipStep{Events: []pendingEvent{{
			Type: corev1.EventTypeNormal, Reason: EventRebalanceCommitted, Action: "Commit", Message: msg,
		}}}, nil
	case membership.StepRollback:
		publish()
		ms.Handoff.FinishedAt = ptrTime(now)
		msg := fmt.Sprintf("rolled back the move of %d slots at epoch %d: %s did not report prepare epoch %d walked by %s",
			movedSlots(last.Moves), step.Publish.Epoch, strings.Join(h.Waiting, ", "), last.PrepareEpoch,
			last.Deadline.UTC().Format(time.RFC3339))
		logger.Info("Rebalance rolled back", "epoch", step.Publish.Epoch, "waiting", h.Waiting)
		return membershipStep{
			Progress:     &progress{Reason: rqv1.ReasonRebalancing, Message: msg},
			Events:       []pendingEvent{{Type: corev1.EventTypeWarning, Reason: EventRebalanceRolledBack, Action: "Rollback", Message: msg}},
			RequeueAfter: step.RequeueAfter,
		}, nil
	default:
		return membershipStep{}, nil
	}
}

// describeMoves summarises moves per receiver: "web-shard-3 receives 256".
func describeMoves(moves []membership.MoveText) string {
	per := map[string]int{}
	var order []string
	for _, m := range moves {
		s, err := schedule.ParseSlots(m.Slots)
		if err != nil {
			continue
		}
		if _, ok := per[m.To]; !ok {
			order = append(order, m.To)
		}
		per[m.To] += s.Len()
	}
	sort.Strings(order)
	parts := make([]string, 0, len(order))
	for _, to := range order {
		parts = append(parts, fmt.Sprintf("%s receives %d", to, per[to]))
	}
	return strings.Join(parts, ", ")
}

// movedSlots counts the slots of moves.
func movedSlots(moves []membership.MoveText) int {
	n := 0
	for _, m := range moves {
		if s, err := schedule.ParseSlots(m.Slots); err == nil {
			n += s.Len()
		}
	}
	return n
}
