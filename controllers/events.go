package controllers

import (
	"k8s.io/apimachinery/pkg/runtime"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// pendingEvent is an event about a RenderQueue, emitted once the status write that makes it true
// succeeded (or the change it reports was made).
type pendingEvent struct {
	Type, Reason, Action, Message string
	// Related is the object the event is also about (a shard Pod), or nil. The events API counts
	// repeats of one (regarding, related, reason, action) as a series, so events about different
	// shards must name their Pod here to stay apart.
	Related runtime.Object
}

// emit records evs on rq.
func (r *RenderQueueReconciler) emit(rq *rqv1.RenderQueue, evs []pendingEvent) {
	if r.Recorder == nil {
		return
	}
	for _, e := range evs {
		r.Recorder.Eventf(rq, e.Related, e.Type, e.Reason, e.Action, "%s", e.Message)
	}
}
