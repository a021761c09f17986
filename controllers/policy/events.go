package policy

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// Event is an event about a RenderQueue, emitted once the status write that makes it true
// succeeded (or the change it reports was made).
type Event struct {
	// Type is Normal or Warning; Reason (CamelCase), Action and Message are the events API's.
	Type, Reason, Action, Message string
	// Related is the object the event is also about (a shard Pod), or nil. The events API counts
	// repeats of one (regarding, related, reason, action) as a series, so events about different
	// shards must name their Pod here to stay apart.
	Related runtime.Object
}

// Event reasons of TransitionEvents (besides the condition reasons EdgeLagging, PartialWalk, ...).
const (
	// EventShardUnreachable: a shard's /v1/status could not be read (emitted when it starts).
	EventShardUnreachable = rqv1.ReasonShardUnreachable
	// EventShardReachable: a shard that was unreachable answers again.
	EventShardReachable = "ShardReachable"
	// EventShardFailing: a shard's Pod cannot run its keeper (StateFailing: the reason from the
	// Pod's status), or the shard answers with an error while not ready (its database
	// unreachable, say); emitted when the problem starts or changes.
	EventShardFailing = "ShardFailing"
	// EventShardRecovered: a shard that was failing is no longer (it may still be loading).
	EventShardRecovered = "ShardRecovered"
	// EventRowsHeldBack: a shard starts holding rows back, or for another reason: the leases of
	// slots it took over are not known yet (Normal: a handover in progress) or not at all
	// (Warning: a keeper process died or a giver did not answer, and the rows wait until any of
	// its leases must have ended).
	EventRowsHeldBack = rqv1.ReasonRowsHeldBack
	// EventRowsReleased: a shard holds nothing back any more.
	EventRowsReleased = "RowsReleased"
)

// TransitionEvents returns the events an operator must notice in the change from prev to next:
// a condition turning bad (EdgeLagging, PartialWalk, WalkFailed; InvalidSpec, ImageNotAllowed,
// ChildConflict, ShardPodRefused; ClassStarving) or recovering, and a shard becoming unreachable
// or reachable again. Nothing when nothing changed, so a steady state emits nothing on later
// polls.
func TransitionEvents(prev, next *rqv1.RenderQueueStatus, pods map[string]*corev1.Pod) []Event {
	var out []Event
	for _, typ := range []string{rqv1.ConditionEdgeHealthy, rqv1.ConditionWalksComplete, rqv1.ConditionReconciled, rqv1.ConditionClassesServed} {
		n := meta.FindStatusCondition(next.Conditions, typ)
		if n == nil || n.Status == metav1.ConditionUnknown {
			continue
		}
		p := meta.FindStatusCondition(prev.Conditions, typ)
		switch {
		case n.Status == metav1.ConditionFalse && (p == nil || p.Status != metav1.ConditionFalse || p.Reason != n.Reason):
			out = append(out, Event{Type: corev1.EventTypeWarning, Reason: n.Reason, Action: "Observe", Message: n.Message})
		case n.Status == metav1.ConditionTrue && p != nil && p.Status == metav1.ConditionFalse:
			out = append(out, Event{Type: corev1.EventTypeNormal, Reason: n.Reason, Action: "Observe", Message: n.Message})
		}
	}
	was := map[string]rqv1.ShardStatus{}
	for _, s := range prev.Shards {
		was[s.Name] = s
	}
	for _, s := range next.Shards {
		ps, known := was[s.Name]
		switch {
		case s.State == StateUnreachable && ps.State != StateUnreachable:
			out = append(out, Event{Type: corev1.EventTypeWarning, Reason: EventShardUnreachable, Action: "Poll",
				Message: fmt.Sprintf("shard %s is unreachable: %s", s.Name, s.Error), Related: relatedPod(pods, s.Name)})
		case known && ps.State == StateUnreachable && reachable(s):
			out = append(out, Event{Type: corev1.EventTypeNormal, Reason: EventShardReachable, Action: "Poll",
				Message: fmt.Sprintf("shard %s answers again (status %s)", s.Name, s.State), Related: relatedPod(pods, s.Name)})
		}
		switch hb, was := heldBackKey(s.HeldBack), heldBackKey(ps.HeldBack); {
		case hb != "" && hb != was:
			typ := corev1.EventTypeNormal
			if strings.Contains(s.HeldBack, "not known") || strings.Contains(s.HeldBack, "unknown") {
				typ = corev1.EventTypeWarning
			}
			out = append(out, Event{Type: typ, Reason: EventRowsHeldBack, Action: "Poll", Message: heldBackMessage(s), Related: relatedPod(pods, s.Name)})
		case hb == "" && was != "" && reachable(s):
			out = append(out, Event{Type: corev1.EventTypeNormal, Reason: EventRowsReleased, Action: "Poll",
				Message: fmt.Sprintf("shard %s hands out every due row again", s.Name), Related: relatedPod(pods, s.Name)})
		}
		key, prevKey := troubleKey(s), troubleKey(ps)
		switch {
		case key != "" && key != prevKey:
			out = append(out, Event{Type: corev1.EventTypeWarning, Reason: EventShardFailing, Action: "Poll",
				Message: troubleMessage(s), Related: relatedPod(pods, s.Name)})
		case key == "" && prevKey != "" && s.State != StateUnreachable:
			out = append(out, Event{Type: corev1.EventTypeNormal, Reason: EventShardRecovered, Action: "Poll",
				Message: fmt.Sprintf("shard %s recovered (was: %s); now %s", s.Name, ps.Error, s.State), Related: relatedPod(pods, s.Name)})
		}
	}
	return out
}

// heldBackKey is what of a shard's held-back text makes a new event: its reasons (not the slots
// and times, which change as fences are set and moved).
func heldBackKey(text string) string {
	if text == "" {
		return ""
	}
	var whys []string
	for _, part := range strings.Split(text, "; ") {
		if i := strings.Index(part, " ("); i >= 0 {
			whys = append(whys, part[i:])
		}
	}
	slices.Sort(whys)
	return strings.Join(slices.Compact(whys), ";")
}

// relatedPod is the shard's Pod as an event's related object, nil (not a typed nil) without one.
func relatedPod(pods map[string]*corev1.Pod, name string) runtime.Object {
	if p := pods[name]; p != nil {
		return p
	}
	return nil
}
