package controllers

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/policy"
	"github.com/renderqueue/renderqueue/controllers/specs"
	"github.com/renderqueue/renderqueue/pkg/membership"
)

// Event reasons of the Pod steps.
const (
	// EventShardCreated: a missing shard Pod was created (or recreated).
	EventShardCreated = "ShardCreated"
	// EventShardRemoved: a shard Pod without slots beyond spec.shards was deleted.
	EventShardRemoved = "ShardRemoved"
	// EventShardReplacing: an outdated shard Pod was deleted to be recreated from the current
	// template.
	EventShardReplacing = "ShardReplacing"
)

// listShardPods returns rq's shard Pods by name (Pods labelled with rq's name and controlled by it).
func (r *RenderQueueReconciler) listShardPods(ctx context.Context, rq *rqv1.RenderQueue) (map[string]*corev1.Pod, error) {
	var list corev1.PodList
	if err := r.List(ctx, &list, client.InNamespace(rq.Namespace), client.MatchingLabels(specs.ShardSelector(rq))); err != nil {
		return nil, fmt.Errorf("listing the shard Pods: %w", err)
	}
	pods := map[string]*corev1.Pod{}
	for i := range list.Items {
		p := &list.Items[i]
		if metaOwnedBy(p, rq) {
			pods[p.Name] = p
		}
	}
	return pods, nil
}

func metaOwnedBy(obj client.Object, rq *rqv1.RenderQueue) bool {
	for _, ref := range obj.GetOwnerReferences() {
		if ref.UID == rq.UID && ref.Controller != nil && *ref.Controller {
			return true
		}
	}
	return false
}

// shardsToKeep is every shard that must have a Pod: the target shards and every shard the
// persisted assignment gives slots to (owned or incoming), in index order. A shard beyond
// spec.shards keeps its Pod until its slots have moved off.
func shardsToKeep(rq *rqv1.RenderQueue, persisted membership.Assignment) []string {
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

// reconcilePods creates the missing shard Pods of keep (recreating deleted ones under the same
// name) and deletes shard Pods not in keep (surplus shards whose slots have moved off). It
// updates pods to match. A Pod the API server refuses (policy.RefusedByAPIServer: a missing
// PriorityClass, a quota, an admission policy) does not stop the others, nor the poll and the
// status after it: it is returned as the ShardPodRefused policy.Blocker, which the Reconciled condition
// and its event show. Other errors (the API server not answering) are returned.
func (r *RenderQueueReconciler) reconcilePods(ctx context.Context, rq *rqv1.RenderQueue, keep []string,
	pods map[string]*corev1.Pod, hash string) ([]policy.Event, *policy.Blocker, error) {
	logger := log.FromContext(ctx)
	var events []policy.Event
	var refused []string
	wanted := map[string]bool{}
	for _, name := range keep {
		wanted[name] = true
		if pods[name] != nil {
			continue
		}
		pod := specs.ShardPod(rq, r.KeeperImage, name, hash)
		if err := controllerutil.SetControllerReference(rq, pod, r.Scheme); err != nil {
			return events, nil, fmt.Errorf("owning the shard Pod %s: %w", name, err)
		}
		if err := r.Create(ctx, pod); err != nil {
			if apierrors.IsAlreadyExists(err) {
				continue // the cache has not seen it yet
			}
			if policy.RefusedByAPIServer(err) {
				logger.Info("The API server refused a shard Pod", "pod", name, "error", err.Error())
				refused = append(refused, fmt.Sprintf("shard Pod %s: %v", name, err))
				continue
			}
			return events, nil, fmt.Errorf("creating the shard Pod %s: %w", name, err)
		}
		logger.Info("Created shard Pod", "pod", name)
		pods[name] = pod
		events = append(events, policy.Event{Type: corev1.EventTypeNormal, Reason: EventShardCreated, Action: "Create",
			Message: fmt.Sprintf("created shard Pod %s", name), Related: pod})
	}
	for name, pod := range pods {
		if wanted[name] || pod.DeletionTimestamp != nil {
			continue
		}
		if err := r.deletePod(ctx, pod); err != nil {
			return events, nil, err
		}
		logger.Info("Deleted surplus shard Pod", "pod", name)
		delete(pods, name)
		events = append(events, policy.Event{Type: corev1.EventTypeNormal, Reason: EventShardRemoved, Action: "Delete",
			Message: fmt.Sprintf("deleted shard Pod %s: it is beyond spec.shards and owns no slots", name), Related: pod})
	}
	if len(refused) > 0 {
		msg := "the API server refused " + strings.Join(refused, "; ")
		if len(refused) > 1 {
			msg = fmt.Sprintf("the API server refused %d shard Pods: %s", len(refused), strings.Join(refused, "; "))
		}
		return events, &policy.Blocker{Reason: rqv1.ReasonShardPodRefused, Message: msg}, nil
	}
	return events, nil, nil
}

// deletePod deletes pod, only if it is still the Pod the caller saw (UID precondition), so a stale
// cache never deletes a freshly recreated Pod of the same name.
func (r *RenderQueueReconciler) deletePod(ctx context.Context, pod *corev1.Pod) error {
	uid := pod.UID
	err := r.Delete(ctx, pod, client.Preconditions{UID: &uid})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting the shard Pod %s: %w", pod.Name, err)
	}
	return nil
}

// rollingStep is the outcome of reconcileRollingUpdate.
type rollingStep struct {
	Progress *policy.Progress
	Events   []policy.Event
}

// reconcileRollingUpdate replaces shard Pods built from an outdated template, one at a time:
// it deletes one outdated Pod (the lowest index; reconcilePods recreates it from the current
// template) only while every shard of keep has a Ready Pod that, when it can be asked, has
// finished a walk. So at most one serving shard is ever down for replacement. Outdated Pods that
// are not loaded serve nothing and are replaced at once, all of them: otherwise a template that
// cannot run (a missing Secret, a bad DSN, a wrong image) could never be replaced by its fix.
func (r *RenderQueueReconciler) reconcileRollingUpdate(ctx context.Context, rq *rqv1.RenderQueue, keep []string,
	pods map[string]*corev1.Pod, reports map[string]policy.ShardReport, hash string) (rollingStep, error) {
	var outdated []string
	for _, name := range keep {
		if p := pods[name]; p != nil && p.Annotations[rqv1.AnnotationPodTemplateHash] != hash {
			outdated = append(outdated, name)
		}
	}
	var waiting []string
	for _, name := range keep {
		if !policy.ShardLoaded(pods[name], reports[name]) {
			waiting = append(waiting, name)
		}
	}
	// A replaced shard that has not come back yet is still part of the rolling update.
	replacing := len(outdated) > 0 || (progressingReason(rq) == rqv1.ReasonRollingUpdate && len(waiting) > 0)
	if !replacing {
		return rollingStep{}, nil
	}
	updated := len(keep) - len(outdated)
	var down []*corev1.Pod
	for _, name := range outdated {
		if !policy.ShardLoaded(pods[name], reports[name]) {
			down = append(down, pods[name])
		}
	}
	if len(down) > 0 {
		var step rollingStep
		var names []string
		for _, victim := range down {
			if err := r.deletePod(ctx, victim); err != nil {
				return step, err
			}
			log.FromContext(ctx).Info("Replacing outdated shard Pod that is not ready", "pod", victim.Name,
				"podTemplateHash", victim.Annotations[rqv1.AnnotationPodTemplateHash], "currentHash", hash)
			names = append(names, victim.Name)
			step.Events = append(step.Events, policy.Event{Type: corev1.EventTypeNormal, Reason: EventShardReplacing, Action: "Replace",
				Message: fmt.Sprintf("replacing shard Pod %s (template %s, current %s) at once: it is not ready, so it serves nothing",
					victim.Name, victim.Annotations[rqv1.AnnotationPodTemplateHash], hash), Related: victim})
		}
		step.Progress = &policy.Progress{Reason: rqv1.ReasonRollingUpdate, Message: fmt.Sprintf(
			"replacing shard Pods %s, which are not ready, at once; %d of %d shards run the current template",
			strings.Join(names, ", "), updated, len(keep))}
		return step, nil
	}
	if len(waiting) > 0 {
		return rollingStep{Progress: &policy.Progress{Reason: rqv1.ReasonRollingUpdate, Message: fmt.Sprintf(
			"%d of %d shards run the current template; waiting for %s to be ready and loaded",
			updated, len(keep), strings.Join(waiting, ", "))}}, nil
	}
	victim := pods[outdated[0]]
	if err := r.deletePod(ctx, victim); err != nil {
		return rollingStep{}, err
	}
	log.FromContext(ctx).Info("Replacing outdated shard Pod", "pod", victim.Name,
		"podTemplateHash", victim.Annotations[rqv1.AnnotationPodTemplateHash], "currentHash", hash)
	msg := fmt.Sprintf("replacing shard Pod %s (template %s, current %s); %d of %d shards run the current template",
		victim.Name, victim.Annotations[rqv1.AnnotationPodTemplateHash], hash, updated, len(keep))
	return rollingStep{
		Progress: &policy.Progress{Reason: rqv1.ReasonRollingUpdate, Message: msg},
		Events:   []policy.Event{{Type: corev1.EventTypeNormal, Reason: EventShardReplacing, Action: "Replace", Message: msg, Related: victim}},
	}, nil
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
