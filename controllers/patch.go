package controllers

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// patchStatus writes next as rq's status, only when it differs from rq.Status (semantic
// equality: nil and empty lists, and times, compare by value). The patch is a merge patch with
// optimistic locking: a status computed from a stale read fails with a conflict instead of
// overwriting a newer one — which matters because status.membership is the record of the slot
// handoff. It reports whether it wrote.
func patchStatus(ctx context.Context, c client.Client, rq *rqv1.RenderQueue, next *rqv1.RenderQueueStatus) (bool, error) {
	if equality.Semantic.DeepEqual(rq.Status, *next) {
		return false, nil
	}
	updated := rq.DeepCopy()
	updated.Status = *next.DeepCopy()
	patch := client.MergeFromWithOptions(rq, client.MergeFromWithOptimisticLock{})
	if err := c.Status().Patch(ctx, updated, patch); err != nil {
		return false, fmt.Errorf("patching the status of RenderQueue %s/%s: %w", rq.Namespace, rq.Name, err)
	}
	rq.Status = updated.Status
	rq.ResourceVersion = updated.ResourceVersion
	return true, nil
}
