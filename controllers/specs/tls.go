package specs

import (
	corev1 "k8s.io/api/core/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// ChildLabels are the labels every child of rq carries (renderqueue.dev/queue among them): the
// operator's cache holds only objects labelled so. The shards' certificate Secret carries them.
func ChildLabels(rq *rqv1.RenderQueue) map[string]string { return queueLabels(rq) }

// ShardCAConfigMap makes cm (new, or as the cache holds it) the ConfigMap rqv1.ShardCAConfigMapName
// publishing bundle, the shard CA bundle, under rqv1.ShardCAKey for rq's clients (spec.tls
// OperatorIssued); labels others set are kept, the data is replaced. The owner reference is the
// reconciler's.
func ShardCAConfigMap(rq *rqv1.RenderQueue, cm *corev1.ConfigMap, bundle []byte) {
	mergeLabels(&cm.ObjectMeta, queueLabels(rq))
	cm.Data = map[string]string{rqv1.ShardCAKey: string(bundle)}
	cm.BinaryData = nil
}

// ObjectiveHistoryConfigMap fills cm, the ConfigMap rqv1.ObjectiveHistoryConfigMapName of rq, with
// the objectives' history (JSON) written at writtenAt (the annotation rqv1.ObjectiveHistoryWrittenAt).
func ObjectiveHistoryConfigMap(rq *rqv1.RenderQueue, cm *corev1.ConfigMap, history []byte, writtenAt string) {
	mergeLabels(&cm.ObjectMeta, queueLabels(rq))
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[rqv1.ObjectiveHistoryWrittenAt] = writtenAt
	cm.Data = map[string]string{rqv1.ObjectiveHistoryKey: string(history)}
	cm.BinaryData = nil
}
