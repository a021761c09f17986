package specs

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// templateQueue is a RenderQueue with the pod-shaping fields that existed before
// imagePullSecrets, podLabels, podAnnotations, priorityClassName and topologySpreadConstraints.
func templateQueue() *rqv1.RenderQueue {
	return &rqv1.RenderQueue{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "prod", UID: "u-1"},
		Spec: rqv1.RenderQueueSpec{
			Shards: 3,
			Store:  rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "pg", Key: "dsn"}},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
			},
			NodeSelector: map[string]string{"pool": "queue"},
			Tolerations:  []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}},
		},
	}
}

// TestPodTemplateHashUnchangedWithoutNewFields pins the hash of a template that sets none of
// the newer fields, as the operator computed it before they existed: an operator upgrade must
// not replace every shard.
func TestPodTemplateHashUnchangedWithoutNewFields(t *testing.T) {
	if got, want := PodTemplateHash(templateQueue(), "registry.example/renderqueue:v1"), "ebb720368b6e35f1"; got != want {
		t.Errorf("PodTemplateHash = %s, want %s (the hash before the newer pod fields existed)", got, want)
	}
}

// podFields sets every pod-shaping field added with the Deployment-like pod template.
func podFields(rq *rqv1.RenderQueue) *rqv1.RenderQueue {
	rq.Spec.ImagePullSecrets = []rqv1.LocalSecretReference{{Name: "regcred"}, {Name: "mirror"}}
	rq.Spec.PodLabels = map[string]rqv1.LabelValue{"team": "render", "cost-center": "42"}
	rq.Spec.PodAnnotations = map[string]string{"sidecar.istio.io/inject": "false"}
	rq.Spec.PriorityClassName = "queue-critical"
	honor, ignore := corev1.NodeInclusionPolicyHonor, corev1.NodeInclusionPolicyIgnore
	rq.Spec.TopologySpreadConstraints = []rqv1.TopologySpreadConstraint{{
		MaxSkew: 1, TopologyKey: "topology.kubernetes.io/zone", WhenUnsatisfiable: corev1.DoNotSchedule,
		MinDomains: ptr.To[int32](3), NodeAffinityPolicy: &honor, NodeTaintsPolicy: &ignore, MatchLabelKeys: []string{"team"},
	}}
	return rq
}

func TestShardPodCarriesPodFields(t *testing.T) {
	rq := podFields(templateQueue())
	hash := PodTemplateHash(rq, "img")
	pod := ShardPod(rq, "img", "web-shard-1", hash)

	for k, v := range map[string]string{
		"team": "render", "cost-center": "42",
		rqv1.LabelQueue: "web", rqv1.LabelComponent: ComponentKeeper, rqv1.LabelShard: "web-shard-1",
		"app.kubernetes.io/managed-by": "renderqueue-operator",
	} {
		if pod.Labels[k] != v {
			t.Errorf("label %s = %q, want %q (labels %v)", k, pod.Labels[k], v, pod.Labels)
		}
	}
	if pod.Annotations["sidecar.istio.io/inject"] != "false" || pod.Annotations[rqv1.AnnotationPodTemplateHash] != hash {
		t.Errorf("annotations %v lack spec.podAnnotations or the template hash %s", pod.Annotations, hash)
	}
	if got := pod.Spec.ImagePullSecrets; len(got) != 2 || got[0].Name != "regcred" || got[1].Name != "mirror" {
		t.Errorf("imagePullSecrets = %v, want regcred, mirror", got)
	}
	if pod.Spec.PriorityClassName != "queue-critical" {
		t.Errorf("priorityClassName = %q", pod.Spec.PriorityClassName)
	}
	honor, ignore := corev1.NodeInclusionPolicyHonor, corev1.NodeInclusionPolicyIgnore
	want := []corev1.TopologySpreadConstraint{{
		MaxSkew: 1, TopologyKey: "topology.kubernetes.io/zone", WhenUnsatisfiable: corev1.DoNotSchedule,
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{rqv1.LabelQueue: "web", rqv1.LabelComponent: ComponentKeeper}},
		MinDomains:    ptr.To[int32](3), NodeAffinityPolicy: &honor, NodeTaintsPolicy: &ignore, MatchLabelKeys: []string{"team"},
	}}
	if got := pod.Spec.TopologySpreadConstraints; !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("topologySpreadConstraints = %+v, want %+v (with the shard selector)", got, want)
	}
	*pod.Spec.TopologySpreadConstraints[0].MinDomains = 9
	if *rq.Spec.TopologySpreadConstraints[0].MinDomains != 3 {
		t.Errorf("the Pod's spread constraint shares pointers with the spec")
	}
	pod.Labels["team"] = "changed"
	if rq.Spec.PodLabels["team"] != "render" {
		t.Errorf("the Pod's labels share the spec's map")
	}
}

// A colliding spec key (the API refuses them; a RenderQueue admitted without the CRD's
// validation could still carry one) never displaces the operator's labels and annotation.
func TestOperatorLabelsWin(t *testing.T) {
	rq := templateQueue()
	rq.Spec.PodLabels = map[string]rqv1.LabelValue{rqv1.LabelQueue: "other", rqv1.LabelComponent: "web", rqv1.LabelShard: "x"}
	rq.Spec.PodAnnotations = map[string]string{rqv1.AnnotationPodTemplateHash: "forged"}
	pod := ShardPod(rq, "img", "web-shard-0", "h1")
	if pod.Labels[rqv1.LabelQueue] != "web" || pod.Labels[rqv1.LabelComponent] != ComponentKeeper || pod.Labels[rqv1.LabelShard] != "web-shard-0" {
		t.Errorf("labels %v: spec.podLabels displaced the operator's", pod.Labels)
	}
	if pod.Annotations[rqv1.AnnotationPodTemplateHash] != "h1" {
		t.Errorf("annotations %v: spec.podAnnotations displaced the template hash", pod.Annotations)
	}
}

// Every pod-shaping field is part of the template hash, so changing it replaces the shards (one
// at a time, by the reconciler's rolling update); the hash does not depend on map order or the shard.
func TestPodTemplateHashCoversPodFields(t *testing.T) {
	base := PodTemplateHash(podFields(templateQueue()), "img")
	if again := PodTemplateHash(podFields(templateQueue()), "img"); again != base {
		t.Fatalf("the hash of one template differs between calls: %s, %s", base, again)
	}
	for name, change := range map[string]func(*rqv1.RenderQueueSpec){
		"imagePullSecrets added": func(s *rqv1.RenderQueueSpec) {
			s.ImagePullSecrets = append(s.ImagePullSecrets, rqv1.LocalSecretReference{Name: "third"})
		},
		"imagePullSecrets renamed": func(s *rqv1.RenderQueueSpec) { s.ImagePullSecrets[0].Name = "regcred-2" },
		"imagePullSecrets removed": func(s *rqv1.RenderQueueSpec) { s.ImagePullSecrets = nil },
		"podLabels value":          func(s *rqv1.RenderQueueSpec) { s.PodLabels["team"] = "crawl" },
		"podLabels key added":      func(s *rqv1.RenderQueueSpec) { s.PodLabels["tier"] = "1" },
		"podLabels removed":        func(s *rqv1.RenderQueueSpec) { s.PodLabels = nil },
		"podAnnotations value":     func(s *rqv1.RenderQueueSpec) { s.PodAnnotations["sidecar.istio.io/inject"] = "true" },
		"podAnnotations removed":   func(s *rqv1.RenderQueueSpec) { s.PodAnnotations = nil },
		"podLabels and podAnnotations removed": func(s *rqv1.RenderQueueSpec) {
			s.PodLabels, s.PodAnnotations = nil, nil
		},
		"priorityClassName":       func(s *rqv1.RenderQueueSpec) { s.PriorityClassName = "batch" },
		"priorityClassName unset": func(s *rqv1.RenderQueueSpec) { s.PriorityClassName = "" },
		"topologySpread maxSkew":  func(s *rqv1.RenderQueueSpec) { s.TopologySpreadConstraints[0].MaxSkew = 2 },
		"topologySpread key":      func(s *rqv1.RenderQueueSpec) { s.TopologySpreadConstraints[0].TopologyKey = "kubernetes.io/hostname" },
		"topologySpread removed":  func(s *rqv1.RenderQueueSpec) { s.TopologySpreadConstraints = nil },
		"topologySpread matchLabelKeys": func(s *rqv1.RenderQueueSpec) {
			s.TopologySpreadConstraints[0].MatchLabelKeys = nil
		},
		"topologySpread minDomains": func(s *rqv1.RenderQueueSpec) { *s.TopologySpreadConstraints[0].MinDomains = 2 },
		"topologySpread nodeTaintsPolicy": func(s *rqv1.RenderQueueSpec) {
			s.TopologySpreadConstraints[0].NodeTaintsPolicy = nil
		},
		"procs 1 (the keeper's default, but set)": func(s *rqv1.RenderQueueSpec) { s.Procs = ptr.To[int32](1) },
		"procs 0":       func(s *rqv1.RenderQueueSpec) { s.Procs = ptr.To[int32](0) },
		"logging json":  func(s *rqv1.RenderQueueSpec) { s.Logging = &rqv1.ShardLogging{Format: "json"} },
		"logging debug": func(s *rqv1.RenderQueueSpec) { s.Logging = &rqv1.ShardLogging{Level: "debug"} },
	} {
		rq := podFields(templateQueue())
		change(&rq.Spec)
		if got := PodTemplateHash(rq, "img"); got == base {
			t.Errorf("%s: the template hash did not change (%s), so the shards would keep the old Pods", name, got)
		}
	}
	// Status and the shard count are not part of a Pod.
	rq := podFields(templateQueue())
	rq.Spec.Shards = 7
	rq.Status.Due = 12
	if got := PodTemplateHash(rq, "img"); got != base {
		t.Errorf("spec.shards or status changed the template hash (%s, want %s)", got, base)
	}
}

func TestPodTemplateHash(t *testing.T) {
	rq := &rqv1.RenderQueue{}
	rq.Name, rq.Namespace = "web", "prod"
	rq.Spec.Store.SecretRef.Name = "pg"
	h := PodTemplateHash(rq, "img:v1")
	if h != PodTemplateHash(rq.DeepCopy(), "img:v1") {
		t.Error("hash is not deterministic")
	}
	if h == PodTemplateHash(rq, "img:v2") {
		t.Error("the operator image does not change the hash")
	}
	rq2 := rq.DeepCopy()
	rq2.Spec.Image = "custom:v1"
	if h == PodTemplateHash(rq2, "img:v1") {
		t.Error("spec.image does not change the hash")
	}
	rq3 := rq.DeepCopy()
	rq3.Spec.Shards = 7
	if h != PodTemplateHash(rq3, "img:v1") {
		t.Error("spec.shards changes the hash (it must not replace Pods)")
	}
}

// TestKeeperProcsArg: spec.procs reaches the keeper as --procs, and only when set (unset, the
// keeper's own default of one thread applies and the arguments are those of before the field).
func TestKeeperProcsArg(t *testing.T) {
	for _, c := range []struct {
		procs *int32   // spec.procs
		want  []string // the arguments after --token-file
	}{
		{nil, nil}, // unset: no flag
		{ptr.To[int32](1), []string{"--procs", "1"}}, // the default, written out
		{ptr.To[int32](0), []string{"--procs", "0"}}, // the Go runtime's choice
		{ptr.To[int32](4), []string{"--procs", "4"}},
	} {
		rq := templateQueue()
		rq.Spec.Procs = c.procs
		pod := ShardPod(rq, "img", "web-shard-0", PodTemplateHash(rq, "img"))
		args := pod.Spec.Containers[0].Args
		i := slices.Index(args, "--token-file")
		if i < 0 || i+2 > len(args) {
			t.Fatalf("procs %v: no --token-file in %q", ptr.Deref(c.procs, -1), args)
		}
		if got := args[i+2:]; !slices.Equal(got, c.want) {
			t.Errorf("procs %v: arguments after --token-file %q, want %q", ptr.Deref(c.procs, -1), got, c.want)
		}
	}
	// that setting it changes the template hash (so the shards are replaced) is
	// TestPodTemplateHashCoversPodFields's
}

// TestKeeperLoggingArgs: spec.logging reaches the keeper as --log-format and --log-level, each
// only when set (an empty spec.logging leaves the arguments, and the hash, as without it).
func TestKeeperLoggingArgs(t *testing.T) {
	base := templateQueue()
	baseHash := PodTemplateHash(base, "img")
	for _, c := range []struct {
		logging *rqv1.ShardLogging
		want    []string // the arguments after --token-file
	}{
		{nil, nil},
		{&rqv1.ShardLogging{}, nil},
		{&rqv1.ShardLogging{Format: "json"}, []string{"--log-format", "json"}},
		{&rqv1.ShardLogging{Level: "2"}, []string{"--log-level", "2"}},
		{&rqv1.ShardLogging{Format: "json", Level: "debug"}, []string{"--log-format", "json", "--log-level", "debug"}},
	} {
		rq := templateQueue()
		rq.Spec.Logging = c.logging
		pod := ShardPod(rq, "img", "web-shard-0", PodTemplateHash(rq, "img"))
		args := pod.Spec.Containers[0].Args
		i := slices.Index(args, "--token-file")
		if i < 0 || i+2 > len(args) {
			t.Fatalf("logging %+v: no --token-file in %q", c.logging, args)
		}
		if got := args[i+2:]; !slices.Equal(got, c.want) {
			t.Errorf("logging %+v: arguments after --token-file %q, want %q", c.logging, got, c.want)
		}
		if c.want == nil && PodTemplateHash(rq, "img") != baseHash {
			t.Errorf("logging %+v changes the template hash: every shard would be replaced", c.logging)
		}
	}
}
