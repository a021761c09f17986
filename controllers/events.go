package controllers

import (
	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/policy"
)

// emit records evs on rq.
func (r *RenderQueueReconciler) emit(rq *rqv1.RenderQueue, evs []policy.Event) {
	if r.Recorder == nil {
		return
	}
	for _, e := range evs {
		r.Recorder.Eventf(rq, e.Related, e.Type, e.Reason, e.Action, "%s", e.Message)
	}
}
