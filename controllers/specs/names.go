package specs

import (
	"sort"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// Names of the children of a RenderQueue.

// TokenSecretName is the name of the Secret holding the shards' API bearer token.
func TokenSecretName(rq *rqv1.RenderQueue) string { return rq.Name + "-api-token" }

// ServiceName is the name of the headless Service of the shards.
func ServiceName(rq *rqv1.RenderQueue) string { return rq.Name + "-shards" }

// ShardServiceAccountName is the name of the ServiceAccount (and Role, RoleBinding) of the shards.
func ShardServiceAccountName(rq *rqv1.RenderQueue) string { return rq.Name + "-shard" }

// PDBName is the name of the PodDisruptionBudget of the shards.
func PDBName(rq *rqv1.RenderQueue) string { return rq.Name + "-shards" }

// shardIndex returns i for a Pod named <rq>-shard-<i>, or false.
func shardIndex(rq *rqv1.RenderQueue, podName string) (int, bool) {
	rest, ok := strings.CutPrefix(podName, rq.Name+"-shard-")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || strconv.Itoa(i) != rest {
		return 0, false
	}
	return i, true
}

// TargetShards is the shard list spec.shards asks for: <rq>-shard-0 .. <rq>-shard-(n-1).
func TargetShards(rq *rqv1.RenderQueue) []string {
	n := int(rq.Spec.Shards)
	if n < 1 {
		n = rqv1.DefaultShards
	}
	if n > rqv1.MaxShards {
		n = rqv1.MaxShards
	}
	out := make([]string, n)
	for i := range out {
		out[i] = rq.ShardName(i)
	}
	return out
}

// SortShards sorts shard names of rq by index (<rq>-shard-2 before <rq>-shard-10); names that are
// not rq's shard names go last, by name.
func SortShards(rq *rqv1.RenderQueue, names []string) {
	sort.SliceStable(names, func(i, j int) bool {
		a, aok := shardIndex(rq, names[i])
		b, bok := shardIndex(rq, names[j])
		switch {
		case aok && bok:
			return a < b
		case aok != bok:
			return aok
		default:
			return names[i] < names[j]
		}
	})
}

// queueLabels are the labels of every child of rq; ShardSelector selects its shard Pods.
func queueLabels(rq *rqv1.RenderQueue) map[string]string {
	return map[string]string{
		rqv1.LabelQueue:                rq.Name,
		"app.kubernetes.io/name":       "renderqueue",
		"app.kubernetes.io/instance":   rq.Name,
		"app.kubernetes.io/managed-by": "renderqueue-operator",
	}
}

// ShardSelector is the label selector of rq's shard Pods (of its Service, PodDisruptionBudget and
// scale subresource), e.g. for a NetworkPolicy (config/samples/networkpolicy.yaml).
func ShardSelector(rq *rqv1.RenderQueue) map[string]string {
	return map[string]string{rqv1.LabelQueue: rq.Name, rqv1.LabelComponent: ComponentKeeper}
}

// SelectorString is the label selector of the shard Pods in string form (status.selector, for
// the scale subresource).
func SelectorString(rq *rqv1.RenderQueue) string {
	return metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: ShardSelector(rq)})
}
