package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/policy"
	"github.com/renderqueue/renderqueue/controllers/specs"
)

// historyWriteEvery is how often at most the objectives' history ConfigMap is rewritten while
// only the counts move: what happened since the last write is not lost meanwhile (the shards'
// counters are cumulative; the next poll takes the difference from the counters written), only
// read again. A new counter (a shard, a keeper that started again) is written at once
// (policy.ObjectiveHistory.Observe).
const historyWriteEvery = time.Minute

// reconcileObjectives fills status.objectives and the ObjectivesMet condition from the shards'
// event counters of this poll and the history kept in the ConfigMap
// rqv1.ObjectiveHistoryConfigMapName (docs/objectives.md), and writes the history back when it
// changed, at most every historyWriteEvery. Without objectives it clears both and touches no
// ConfigMap.
func (r *RenderQueueReconciler) reconcileObjectives(ctx context.Context, rq *rqv1.RenderQueue, next *rqv1.RenderQueueStatus,
	reports []policy.ShardReport, now time.Time) error {
	if len(rq.Spec.Objectives) == 0 {
		next.Objectives = nil
		meta.RemoveStatusCondition(&next.Conditions, rqv1.ConditionObjectivesMet)
		return nil
	}
	cm := &corev1.ConfigMap{}
	key := types.NamespacedName{Namespace: rq.Namespace, Name: rqv1.ObjectiveHistoryConfigMapName(rq.Name)}
	h := &policy.ObjectiveHistory{}
	var writtenAt time.Time
	switch err := r.Get(ctx, key, cm); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("reading the objectives' history %s: %w", key.Name, err)
	default:
		if err := json.Unmarshal([]byte(cm.Data[rqv1.ObjectiveHistoryKey]), h); err != nil {
			// unreadable (edited by hand?): begun again, and said so
			log.FromContext(ctx).Error(err, "The objectives' history does not parse; it begins again", "configMap", key.Name)
			h = &policy.ObjectiveHistory{}
		}
		writtenAt, _ = time.Parse(time.RFC3339, cm.Annotations[rqv1.ObjectiveHistoryWrittenAt])
	}
	changed, structural := h.Observe(now, rq.Spec.Objectives, reports)
	next.Objectives = h.ObjectiveStatuses(now, rq.Spec.Objectives)
	policy.SetCondition(next, rq.Generation, now, rqv1.ConditionObjectivesMet, policy.ObjectivesCondition(rq.Spec.Objectives, next.Objectives))
	if !changed || (!structural && cm.Name != "" && now.Sub(writtenAt) < historyWriteEvery) {
		return nil
	}
	data, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("encoding the objectives' history: %w", err)
	}
	out := &corev1.ConfigMap{}
	out.Name, out.Namespace = key.Name, key.Namespace
	op, err := controllerutil.CreateOrUpdate(ctx, r.Client, out, func() error {
		specs.ObjectiveHistoryConfigMap(rq, out, data, now.UTC().Format(time.RFC3339))
		return controllerutil.SetControllerReference(rq, out, r.Scheme)
	})
	if apierrors.IsAlreadyExists(err) {
		err = &childConflictError{what: "objectives' history ConfigMap", name: out.Name, queue: rq.Name, err: err}
	}
	if err != nil {
		if apierrors.IsConflict(err) {
			return nil // read again at the next poll: the counters' differences are taken again from it
		}
		return fmt.Errorf("writing the objectives' history %s: %w", key.Name, err)
	}
	log.FromContext(ctx).V(1).Info("Reconciled child", "kind", "objectives' history ConfigMap", "name", out.Name, "operation", op)
	return nil
}
