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
	"github.com/renderqueue/renderqueue/pkg/logkeys"
)

// Event reasons of the Pod steps.
const (
	// EventShardCreated: a missing shard Pod was created (or recreated).
	EventShardCreated = "ShardCreated"
	// EventShardRemoved: a shard Pod without slots beyond spec.shards was deleted.
	EventShardRemoved = "ShardRemoved"
	// EventShardReplacing: an outdated shard Pod was deleted to be recreated from the current
	// template (policy.RollingUpdate).
	EventShardReplacing = policy.EventShardReplacing
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
				logger.Info("The API server refused a shard Pod", logkeys.Shard, name, "error", err.Error())
				refused = append(refused, fmt.Sprintf("shard Pod %s: %v", name, err))
				continue
			}
			return events, nil, fmt.Errorf("creating the shard Pod %s: %w", name, err)
		}
		logger.Info("Created shard Pod", logkeys.Shard, name)
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
		logger.Info("Deleted surplus shard Pod", logkeys.Shard, name)
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

// reconcileRollingUpdate replaces outdated shard Pods as policy.RollingUpdate decides: it deletes
// the Pods it names (reconcilePods recreates them from the current template) and returns the
// events of those deleted and the Progressing reason.
func (r *RenderQueueReconciler) reconcileRollingUpdate(ctx context.Context, rq *rqv1.RenderQueue, keep []string,
	pods map[string]*corev1.Pod, reports map[string]policy.ShardReport, hash string) (*policy.Progress, []policy.Event, error) {
	step := policy.RollingUpdate(rq, keep, pods, reports, hash)
	msg := "Replacing outdated shard Pod"
	if step.AtOnce {
		msg = "Replacing outdated shard Pod that is not ready"
	}
	for i, victim := range step.Delete {
		if err := r.deletePod(ctx, victim); err != nil {
			return nil, step.Events[:i], err
		}
		log.FromContext(ctx).Info(msg, logkeys.Shard, victim.Name,
			"podTemplateHash", victim.Annotations[rqv1.AnnotationPodTemplateHash], "currentHash", hash)
	}
	return step.Progress, step.Events, nil
}
