package policy

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

func shardPod(name, hash string, ready bool) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{rqv1.AnnotationPodTemplateHash: hash}},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}}}
}

func podNames(pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

func TestRollingUpdate(t *testing.T) {
	rq := &rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: "q"}}
	keep := []string{"q-shard-0", "q-shard-1", "q-shard-2"}
	noReports := map[string]ShardReport{}

	// everything current: nothing to do
	pods := map[string]*corev1.Pod{"q-shard-0": shardPod("q-shard-0", "new", true), "q-shard-1": shardPod("q-shard-1", "new", true),
		"q-shard-2": shardPod("q-shard-2", "new", true)}
	if got := RollingUpdate(rq, keep, pods, noReports, "new"); got.Delete != nil || got.Progress != nil {
		t.Fatalf("current Pods: %+v", got)
	}

	// two outdated, all loaded: the lowest index only
	pods["q-shard-1"], pods["q-shard-2"] = shardPod("q-shard-1", "old", true), shardPod("q-shard-2", "old", true)
	got := RollingUpdate(rq, keep, pods, noReports, "new")
	if strings.Join(podNames(got.Delete), ",") != "q-shard-1" || got.AtOnce || len(got.Events) != 1 ||
		got.Events[0].Reason != EventShardReplacing || got.Progress == nil || !strings.Contains(got.Progress.Message, "1 of 3 shards") {
		t.Errorf("one at a time: %+v", got)
	}

	// a shard still loading (its walk not finished): wait
	reports := map[string]ShardReport{"q-shard-0": {Name: "q-shard-0", Status: &shardapi.Status{}}}
	got = RollingUpdate(rq, keep, pods, reports, "new")
	if got.Delete != nil || got.Progress == nil || !strings.Contains(got.Progress.Message, "waiting for q-shard-0") {
		t.Errorf("waiting: %+v", got)
	}

	// outdated Pods that are not ready serve nothing: all of them at once
	pods["q-shard-1"], pods["q-shard-2"] = shardPod("q-shard-1", "old", false), shardPod("q-shard-2", "old", false)
	got = RollingUpdate(rq, keep, pods, noReports, "new")
	if strings.Join(podNames(got.Delete), ",") != "q-shard-1,q-shard-2" || !got.AtOnce || len(got.Events) != 2 {
		t.Errorf("at once: %+v", got)
	}

	// the replaced shard not back yet: still rolling while Progressing says so
	pods["q-shard-1"], pods["q-shard-2"] = shardPod("q-shard-1", "new", true), shardPod("q-shard-2", "new", false)
	if got = RollingUpdate(rq, keep, pods, noReports, "new"); got.Progress != nil {
		t.Errorf("no rolling update recorded: %+v", got)
	}
	rq.Status.Conditions = []metav1.Condition{{Type: rqv1.ConditionProgressing, Reason: rqv1.ReasonRollingUpdate}}
	if got = RollingUpdate(rq, keep, pods, noReports, "new"); got.Delete != nil || got.Progress == nil ||
		!strings.Contains(got.Progress.Message, "3 of 3 shards run the current template; waiting for q-shard-2") {
		t.Errorf("replaced shard not back: %+v", got)
	}
}

func TestMissingPod(t *testing.T) {
	pods := map[string]*corev1.Pod{"a": {}}
	if MissingPod([]string{"a"}, pods) || !MissingPod([]string{"a", "b"}, pods) {
		t.Error("MissingPod")
	}
}
