package policy

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// ShardReport is what the operator learnt about one shard in one poll.
type ShardReport struct {
	// Name of the shard.
	Name string
	// Pod is the shard's Pod; nil when it does not exist.
	Pod *corev1.Pod
	// Status is the shard's /v1/status; nil when it could not be read.
	Status *shardapi.Status
	// Err says why Status is nil (or that it was rejected).
	Err error
	// Asked is false when the shard was not asked at all (no Pod, no IP).
	Asked bool
	// URL is the base URL the shard was asked at (when Asked): status.shards[].url, where render
	// workers find it.
	URL string
}

// Reachable reports whether the shard answered with a valid status.
func (r ShardReport) Reachable() bool { return r.Status != nil }

// ShardLoaded reports whether a shard's Pod is Ready and, if the shard answered, it has finished
// a walk. The Pod's readiness probe (/readyz: the first walk finished) is the authority; the
// report only confirms it when the shard can be asked.
func ShardLoaded(pod *corev1.Pod, rep ShardReport) bool {
	if !PodReady(pod) {
		return false
	}
	if rep.Status == nil {
		return true
	}
	return walked(rep)
}

// walked reports whether the shard answered and reports a finished walk.
func walked(rep ShardReport) bool {
	return rep.Status != nil && rep.Status.LastWalk != nil && rep.Status.LastWalk.FinishedAt != nil
}

// PodReady reports whether pod exists, is not being deleted and its Ready condition is True.
func PodReady(pod *corev1.Pod) bool {
	if pod == nil || pod.DeletionTimestamp != nil {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
