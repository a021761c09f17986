package policy

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/specs"
	"github.com/renderqueue/renderqueue/pkg/membership"
)

// EventShardReplacing: an outdated shard Pod was deleted to be recreated from the current
// template (controllers.EventShardReplacing).
const EventShardReplacing = "ShardReplacing"

// ShardsToKeep is every shard that must have a Pod: the target shards and every shard the
// persisted assignment gives slots to (owned or incoming), in index order. A shard beyond
// spec.shards keeps its Pod until its slots have moved off.
func ShardsToKeep(rq *rqv1.RenderQueue, persisted membership.Assignment) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range append(specs.TargetShards(rq), persisted.Shards()...) {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	specs.SortShards(rq, out)
	return out
}

// MissingPod reports whether a shard of keep has no Pod (one is about to be created).
func MissingPod(keep []string, pods map[string]*corev1.Pod) bool {
	for _, name := range keep {
		if pods[name] == nil {
			return true
		}
	}
	return false
}

// RollingStep is what the rolling replacement of outdated shard Pods does now (RollingUpdate).
type RollingStep struct {
	// Delete are the Pods to delete, in order; Events[i] is the event of Delete[i], emitted once
	// it is deleted.
	Delete []*corev1.Pod
	Events []Event
	// AtOnce is true when Delete are outdated Pods that are not loaded (replaced all at once).
	AtOnce bool
	// Progress is the Progressing condition's reason and message while the update runs.
	Progress *Progress
}

// RollingUpdate decides the rolling replacement of shard Pods built from a template other than
// hash, one at a time: it deletes one outdated Pod (the lowest index of keep; the reconciler
// recreates it from the current template) only while every shard of keep has a Ready Pod that,
// when it could be asked (reports), has finished a walk. So at most one serving shard is ever
// down for replacement. Outdated Pods that are not loaded serve nothing and are replaced at once,
// all of them: otherwise a template that cannot run (a missing Secret, a bad DSN, a wrong image)
// could never be replaced by its fix.
func RollingUpdate(rq *rqv1.RenderQueue, keep []string, pods map[string]*corev1.Pod, reports map[string]ShardReport,
	hash string) RollingStep {
	var outdated []string
	for _, name := range keep {
		if p := pods[name]; p != nil && p.Annotations[rqv1.AnnotationPodTemplateHash] != hash {
			outdated = append(outdated, name)
		}
	}
	var waiting []string
	for _, name := range keep {
		if !ShardLoaded(pods[name], reports[name]) {
			waiting = append(waiting, name)
		}
	}
	// A replaced shard that has not come back yet is still part of the rolling update.
	replacing := len(outdated) > 0 || (progressingReason(rq) == rqv1.ReasonRollingUpdate && len(waiting) > 0)
	if !replacing {
		return RollingStep{}
	}
	updated := len(keep) - len(outdated)
	step := RollingStep{AtOnce: true}
	var names []string
	for _, name := range outdated {
		if victim := pods[name]; !ShardLoaded(victim, reports[name]) {
			names = append(names, victim.Name)
			step.Delete = append(step.Delete, victim)
			step.Events = append(step.Events, Event{Type: corev1.EventTypeNormal, Reason: EventShardReplacing, Action: "Replace",
				Message: fmt.Sprintf("replacing shard Pod %s (template %s, current %s) at once: it is not ready, so it serves nothing",
					victim.Name, victim.Annotations[rqv1.AnnotationPodTemplateHash], hash), Related: victim})
		}
	}
	if len(step.Delete) > 0 {
		step.Progress = &Progress{Reason: rqv1.ReasonRollingUpdate, Message: fmt.Sprintf(
			"replacing shard Pods %s, which are not ready, at once; %d of %d shards run the current template",
			strings.Join(names, ", "), updated, len(keep))}
		return step
	}
	if len(waiting) > 0 {
		return RollingStep{Progress: &Progress{Reason: rqv1.ReasonRollingUpdate, Message: fmt.Sprintf(
			"%d of %d shards run the current template; waiting for %s to be ready and loaded",
			updated, len(keep), strings.Join(waiting, ", "))}}
	}
	victim := pods[outdated[0]]
	msg := fmt.Sprintf("replacing shard Pod %s (template %s, current %s); %d of %d shards run the current template",
		victim.Name, victim.Annotations[rqv1.AnnotationPodTemplateHash], hash, updated, len(keep))
	return RollingStep{
		Delete:   []*corev1.Pod{victim},
		Events:   []Event{{Type: corev1.EventTypeNormal, Reason: EventShardReplacing, Action: "Replace", Message: msg, Related: victim}},
		Progress: &Progress{Reason: rqv1.ReasonRollingUpdate, Message: msg},
	}
}

// progressingReason is the reason of rq's persisted Progressing condition, "" if none.
func progressingReason(rq *rqv1.RenderQueue) string {
	for _, c := range rq.Status.Conditions {
		if c.Type == rqv1.ConditionProgressing {
			return c.Reason
		}
	}
	return ""
}
