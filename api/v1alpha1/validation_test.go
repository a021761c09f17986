package v1alpha1_test

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

const ns = "default"

// remove, as a value in a field edit, deletes the field instead of setting it.
type removeField struct{}

var remove = removeField{}

// minimal is the smallest valid RenderQueue, as the API server receives it (unstructured, so that
// values the Go types cannot hold, such as malformed durations, can be sent too).
func minimal() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "renderqueue.dev/v1alpha1",
		"kind":       "RenderQueue",
		"metadata":   map[string]any{"generateName": "rq-", "namespace": ns},
		"spec": map[string]any{
			"store": map[string]any{"secretRef": map[string]any{"name": "renderqueue-db"}},
		},
	}}
}

// withField is minimal() with one field (a dotted path under spec) set or removed.
func withField(path string, value any) *unstructured.Unstructured {
	u := minimal()
	fields := append([]string{"spec"}, strings.Split(path, ".")...)
	if value == remove {
		unstructured.RemoveNestedField(u.Object, fields...)
	} else {
		Expect(unstructured.SetNestedField(u.Object, value, fields...)).To(Succeed())
	}
	return u
}

// floor and floors build spec.priority.floors as the API server receives it.
func floor(cadence, source, share string) map[string]any {
	return map[string]any{"cadence": cadence, "source": source, "share": share}
}

func floors(f ...map[string]any) []any {
	out := make([]any, len(f))
	for i := range f {
		out[i] = f[i]
	}
	return out
}

var _ = Describe("RenderQueue validation", func() {
	DescribeTable("rejects an invalid spec with a clear message",
		func(path string, value any, message string) {
			err := k8sClient.Create(ctx, withField(path, value))
			Expect(err).To(HaveOccurred(), "spec.%s = %v was accepted", path, value)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "not an Invalid error: %v", err)
			Expect(err.Error()).To(ContainSubstring(message))
		},
		Entry("no shards", "shards", int64(0), "shards must be between 1 and 256"),
		Entry("negative shards", "shards", int64(-3), "shards must be between 1 and 256"),
		Entry("too many shards", "shards", int64(257), "shards must be between 1 and 256"),
		Entry("negative window", "window", "-1h", "window must not be negative"),
		Entry("malformed window", "window", "3 days", "spec.window in body should match"),
		Entry("window in days", "window", "1d", "spec.window in body should match"),
		Entry("negative verifyInterval", "verifyInterval", "-5m", "verifyInterval must not be negative"),
		Entry("zero leaseDuration", "leaseDuration", "0s", "leaseDuration must be positive"),
		Entry("negative leaseDuration", "leaseDuration", "-30s", "leaseDuration must be positive"),
		Entry("malformed leaseDuration", "leaseDuration", "five minutes", "spec.leaseDuration in body should match"),
		Entry("zero submittedBoost", "priority.submittedBoost", "0", "submittedBoost must be a decimal number greater than 0 and at most 1000"),
		Entry("negative submittedBoost", "priority.submittedBoost", "-2", "submittedBoost must be a decimal number greater than 0 and at most 1000"),
		Entry("huge submittedBoost", "priority.submittedBoost", "1000.5", "submittedBoost must be a decimal number greater than 0 and at most 1000"),
		Entry("non-decimal submittedBoost", "priority.submittedBoost", "1e3", "submittedBoost must be a decimal number greater than 0 and at most 1000"),
		Entry("urgentMaxShare above 1", "priority.urgentMaxShare", "1.5", "urgentMaxShare must be a decimal number from 0 to 1"),
		Entry("negative urgentMaxShare", "priority.urgentMaxShare", "-0.1", "urgentMaxShare must be a decimal number from 0 to 1"),
		Entry("percent urgentMaxShare", "priority.urgentMaxShare", "20%", "urgentMaxShare must be a decimal number from 0 to 1"),
		Entry("no store", "store", remove, "spec.store: Required value"),
		Entry("no store secret", "store.secretRef", remove, "spec.store.secretRef: Required value"),
		Entry("no store secret name", "store.secretRef.name", remove, "spec.store.secretRef.name: Required value"),
		Entry("empty store secret name", "store.secretRef.name", "", "store.secretRef.name must name the Secret holding the PostgreSQL DSN"),
		Entry("bad store secret key", "store.secretRef.key", "a/b", "spec.store.secretRef.key in body should match"),
		Entry("bad imagePullPolicy", "imagePullPolicy", "Sometimes", "spec.imagePullPolicy: Unsupported value"),
		Entry("floor share 0", "priority.floors", floors(floor("96h", "discovered", "0")), "floor share must be a decimal number greater than 0 and at most 1"),
		Entry("floor share above 1", "priority.floors", floors(floor("96h", "discovered", "1.5")), "floor share must be a decimal number greater than 0 and at most 1"),
		Entry("floor share percent", "priority.floors", floors(floor("96h", "discovered", "5%")), "floor share must be a decimal number greater than 0 and at most 1"),
		Entry("floors past 1", "priority.floors", floors(floor("1h", "submitted", "0.6"), floor("96h", "discovered", "0.5")), "floors: shares must not sum past 1"),
		Entry("floor class twice", "priority.floors", floors(floor("1h", "submitted", "0.1"), floor("1h", "submitted", "0.2")), "floors: at most one floor per class"),
		Entry("floor source", "priority.floors", floors(floor("1h", "crawler", "0.1")), "Unsupported value: \"crawler\""),
		Entry("floor cadence 0", "priority.floors", floors(floor("0s", "submitted", "0.1")), "floor cadence must be at least 1ms"),
		Entry("floor cadence malformed", "priority.floors", floors(floor("hourly", "submitted", "0.1")), "cadence in body should match"),
		Entry("floor without share", "priority.floors", floors(map[string]any{"cadence": "1h", "source": "submitted"}), "share: Required value"),
		Entry("bad reschedule", "priority.reschedule", "Later", "spec.priority.reschedule: Unsupported value"),
	)

	DescribeTable("accepts valid edge cases",
		func(path string, value any) {
			Expect(k8sClient.Create(ctx, withField(path, value))).To(Succeed())
		},
		Entry("one shard", "shards", int64(1)),
		Entry("256 shards", "shards", int64(256)),
		Entry("window 0", "window", "0"),
		Entry("fractional window", "window", "1.5h"),
		Entry("compound window", "window", "36h30m"),
		Entry("verifyInterval 0", "verifyInterval", "0s"),
		Entry("urgentMaxShare 0", "priority.urgentMaxShare", "0"),
		Entry("urgentMaxShare 1", "priority.urgentMaxShare", "1"),
		Entry("submittedBoost below 1", "priority.submittedBoost", "0.5"),
		Entry("sub-second lease", "leaseDuration", "500ms"),
		Entry("floors summing to exactly 1", "priority.floors", floors(floor("1h", "submitted", "0.1"), floor("1h", "discovered", "0.2"), floor("96h", "discovered", "0.7"))),
		Entry("one floor of 1", "priority.floors", floors(floor("24h", "submitted", "1"))),
		Entry("reschedule AfterRender", "priority.reschedule", "AfterRender"),
	)

	// The shard Pod fields: a RenderQueue the API server admits must give Pods it admits too.
	DescribeTable("rejects invalid shard Pod fields with a message naming the field",
		func(path string, value any, field, message string) {
			err := k8sClient.Create(ctx, withField(path, value))
			Expect(err).To(HaveOccurred(), "spec.%s = %v was accepted", path, value)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "not an Invalid error: %v", err)
			Expect(err.Error()).To(ContainSubstring(field))
			Expect(err.Error()).To(ContainSubstring(message))
		},
		Entry("label key with a space", "podLabels", map[string]any{"cost center": "42"},
			"spec.podLabels", "podLabels keys must be label keys"),
		Entry("label key name of 64 characters", "podLabels", map[string]any{strings.Repeat("k", 64): "v"},
			"spec.podLabels", "podLabels keys must be label keys"),
		Entry("label key with an upper-case prefix", "podLabels", map[string]any{"Example.com/team": "v"},
			"spec.podLabels", "podLabels keys must be label keys"),
		Entry("label key with an empty name", "podLabels", map[string]any{"example.com/": "v"},
			"spec.podLabels", "podLabels keys must be label keys"),
		Entry("label key prefix of 254 characters", "podLabels", map[string]any{strings.Repeat("a", 254) + "/team": "v"},
			"spec.podLabels", "podLabels keys must be label keys"),
		Entry("label value with a space", "podLabels", map[string]any{"team": "render farm"},
			"spec.podLabels[team]", "podLabels values must be label values"),
		Entry("label value of 64 characters", "podLabels", map[string]any{"team": strings.Repeat("v", 64)},
			"spec.podLabels.team", "Too long"),
		Entry("label value ending in a dash", "podLabels", map[string]any{"team": "render-"},
			"spec.podLabels[team]", "podLabels values must be label values"),
		Entry("the queue label", "podLabels", map[string]any{"renderqueue.dev/queue": "other"},
			"spec.podLabels", "podLabels must not set the operator's own labels"),
		Entry("the shard label", "podLabels", map[string]any{"renderqueue.dev/shard": "x"},
			"spec.podLabels", "podLabels must not set the operator's own labels"),
		Entry("the component label", "podLabels", map[string]any{"app.kubernetes.io/component": "web"},
			"spec.podLabels", "podLabels must not set the operator's own labels"),
		Entry("the managed-by label", "podLabels", map[string]any{"app.kubernetes.io/managed-by": "helm"},
			"spec.podLabels", "podLabels must not set the operator's own labels"),
		Entry("65 labels", "podLabels", manyStrings(65, ""),
			"spec.podLabels", "must have at most 64 items"),
		Entry("annotation key with a space", "podAnnotations", map[string]any{"my note": "x"},
			"spec.podAnnotations", "podAnnotations keys must be annotation keys"),
		Entry("the template hash annotation", "podAnnotations", map[string]any{"renderqueue.dev/pod-template-hash": "x"},
			"spec.podAnnotations", "podAnnotations must not set the operator's own annotations"),
		Entry("annotations over 255 KiB", "podAnnotations", map[string]any{"a": strings.Repeat("x", 200<<10), "b": strings.Repeat("y", 56<<10)},
			"spec.podAnnotations", "podAnnotations must be at most 255 KiB in all"),
		Entry("65 annotations", "podAnnotations", manyStrings(65, "x"),
			"spec.podAnnotations", "must have at most 64 items"),
		Entry("priorityClassName with a space", "priorityClassName", "high priority",
			"spec.priorityClassName", "priorityClassName must be a PriorityClass name"),
		Entry("upper-case priorityClassName", "priorityClassName", "High",
			"spec.priorityClassName", "priorityClassName must be a PriorityClass name"),
		Entry("priorityClassName of 254 characters", "priorityClassName", strings.Repeat("p", 254),
			"spec.priorityClassName", "Too long"),
		Entry("empty imagePullSecrets name", "imagePullSecrets", []any{map[string]any{"name": ""}},
			"spec.imagePullSecrets[0].name", "imagePullSecrets names must be Secret names"),
		Entry("imagePullSecrets name with a slash", "imagePullSecrets", []any{map[string]any{"name": "ns/regcred"}},
			"spec.imagePullSecrets[0].name", "imagePullSecrets names must be Secret names"),
		Entry("imagePullSecrets entry without name", "imagePullSecrets", []any{map[string]any{}},
			"spec.imagePullSecrets[0].name", "Required value"),
		Entry("imagePullSecrets name twice", "imagePullSecrets", []any{map[string]any{"name": "regcred"}, map[string]any{"name": "regcred"}},
			"spec.imagePullSecrets[1]", "Duplicate value"),
		Entry("17 imagePullSecrets", "imagePullSecrets", manySecrets(17),
			"spec.imagePullSecrets", "must have at most 16 items"),
		Entry("spread constraint with maxSkew 0", "topologySpreadConstraints",
			[]any{spread("topology.kubernetes.io/zone", "DoNotSchedule", map[string]any{"maxSkew": int64(0)})},
			"spec.topologySpreadConstraints[0].maxSkew", "should be greater than or equal to 1"),
		Entry("spread constraint with an unknown whenUnsatisfiable", "topologySpreadConstraints",
			[]any{spread("topology.kubernetes.io/zone", "Sometimes", nil)},
			"spec.topologySpreadConstraints[0].whenUnsatisfiable", `supported values: "DoNotSchedule", "ScheduleAnyway"`),
		Entry("spread constraint with an empty topologyKey", "topologySpreadConstraints",
			[]any{spread("", "DoNotSchedule", nil)},
			"spec.topologySpreadConstraints[0].topologyKey", "topologySpreadConstraints topologyKey must be a node label key"),
		Entry("spread constraint with a topologyKey with a space", "topologySpreadConstraints",
			[]any{spread("zone name", "DoNotSchedule", nil)},
			"spec.topologySpreadConstraints[0].topologyKey", "topologySpreadConstraints topologyKey must be a node label key"),
		Entry("spread constraint without topologyKey", "topologySpreadConstraints",
			[]any{map[string]any{"maxSkew": int64(1), "whenUnsatisfiable": "DoNotSchedule"}},
			"spec.topologySpreadConstraints[0].topologyKey", "Required value"),
		Entry("spread constraint without whenUnsatisfiable", "topologySpreadConstraints",
			[]any{map[string]any{"maxSkew": int64(1), "topologyKey": "kubernetes.io/hostname"}},
			"spec.topologySpreadConstraints[0].whenUnsatisfiable", "Required value"),
		Entry("spread constraint with minDomains 0", "topologySpreadConstraints",
			[]any{spread("topology.kubernetes.io/zone", "DoNotSchedule", map[string]any{"minDomains": int64(0)})},
			"spec.topologySpreadConstraints[0].minDomains", "should be greater than or equal to 1"),
		Entry("spread constraint with minDomains and ScheduleAnyway", "topologySpreadConstraints",
			[]any{spread("topology.kubernetes.io/zone", "ScheduleAnyway", map[string]any{"minDomains": int64(3)})},
			"spec.topologySpreadConstraints[0]", "topologySpreadConstraints minDomains is only allowed with whenUnsatisfiable DoNotSchedule"),
		Entry("spread constraint with an unknown nodeTaintsPolicy", "topologySpreadConstraints",
			[]any{spread("topology.kubernetes.io/zone", "DoNotSchedule", map[string]any{"nodeTaintsPolicy": "Always"})},
			"spec.topologySpreadConstraints[0].nodeTaintsPolicy", `supported values: "Honor", "Ignore"`),
		Entry("spread constraint with an unknown nodeAffinityPolicy", "topologySpreadConstraints",
			[]any{spread("topology.kubernetes.io/zone", "DoNotSchedule", map[string]any{"nodeAffinityPolicy": "Never"})},
			"spec.topologySpreadConstraints[0].nodeAffinityPolicy", `supported values: "Honor", "Ignore"`),
		Entry("spread constraint matching on the queue label", "topologySpreadConstraints",
			[]any{spread("kubernetes.io/hostname", "DoNotSchedule", map[string]any{"matchLabelKeys": []any{"renderqueue.dev/queue"}})},
			"spec.topologySpreadConstraints[0].matchLabelKeys", "matchLabelKeys must not name the shard selector's own keys"),
		Entry("spread constraint matching on a malformed key", "topologySpreadConstraints",
			[]any{spread("kubernetes.io/hostname", "DoNotSchedule", map[string]any{"matchLabelKeys": []any{"team name"}})},
			"spec.topologySpreadConstraints[0].matchLabelKeys", "matchLabelKeys must be label keys"),
		Entry("two spread constraints on one key and action", "topologySpreadConstraints",
			[]any{spread("kubernetes.io/hostname", "DoNotSchedule", nil), spread("kubernetes.io/hostname", "DoNotSchedule", map[string]any{"maxSkew": int64(2)})},
			"spec.topologySpreadConstraints[1]", "Duplicate value"),
		Entry("9 spread constraints", "topologySpreadConstraints", manySpreads(9),
			"spec.topologySpreadConstraints", "must have at most 8 items"),
	)

	DescribeTable("accepts valid shard Pod fields",
		func(path string, value any) {
			Expect(k8sClient.Create(ctx, withField(path, value))).To(Succeed())
		},
		Entry("labels with and without prefix, an empty value", "podLabels",
			map[string]any{"team": "render", "example.com/cost-center": "42", "canary": "", "app.kubernetes.io/part-of": "prerender"}),
		Entry("a label key of 63 characters under a 253-character prefix", "podLabels",
			map[string]any{strings.Repeat("a", 253) + "/" + strings.Repeat("k", 63): strings.Repeat("v", 63)}),
		Entry("64 labels", "podLabels", manyStrings(64, "")),
		Entry("annotations with any value", "podAnnotations",
			map[string]any{"sidecar.istio.io/inject": "false", "example.com/config": `{"a": [1, 2], "b": "x y"}`, "note": ""}),
		Entry("255 KiB of annotations", "podAnnotations", map[string]any{"a": strings.Repeat("x", 255<<10-1)}),
		Entry("a priorityClassName", "priorityClassName", "queue-critical.example"),
		Entry("two imagePullSecrets", "imagePullSecrets", []any{map[string]any{"name": "regcred"}, map[string]any{"name": "mirror.example"}}),
		Entry("16 imagePullSecrets", "imagePullSecrets", manySecrets(16)),
		Entry("spread over zones and nodes", "topologySpreadConstraints", []any{
			spread("topology.kubernetes.io/zone", "DoNotSchedule", map[string]any{"minDomains": int64(3), "nodeAffinityPolicy": "Honor", "nodeTaintsPolicy": "Ignore"}),
			spread("kubernetes.io/hostname", "ScheduleAnyway", map[string]any{"maxSkew": int64(2), "matchLabelKeys": []any{"team"}}),
			spread("kubernetes.io/hostname", "DoNotSchedule", nil),
		}),
		Entry("8 spread constraints", "topologySpreadConstraints", manySpreads(8)),
	)

	It("has no labelSelector in a spread constraint: kubectl's strict field validation refuses it", func() {
		u := withField("topologySpreadConstraints", []any{spread("topology.kubernetes.io/zone", "DoNotSchedule",
			map[string]any{"labelSelector": map[string]any{"matchLabels": map[string]any{"app": "web"}}})})
		err := k8sClient.Create(ctx, u, client.FieldValidation(metav1.FieldValidationStrict))
		Expect(err).To(HaveOccurred(), "a labelSelector was accepted")
		Expect(err.Error()).To(ContainSubstring(`unknown field "spec.topologySpreadConstraints[0].labelSelector"`))
	})

	It("accepts verifyInterval larger than window/3 (the keeper clamps it)", func() {
		u := withField("window", "3h")
		Expect(unstructured.SetNestedField(u.Object, "2h", "spec", "verifyInterval")).To(Succeed())
		Expect(k8sClient.Create(ctx, u)).To(Succeed())
		var rq rqv1.RenderQueue
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(u), &rq)).To(Succeed())
		Expect(rq.Spec.WalkInterval()).To(Equal(time.Hour))
	})

	It("applies the defaults", func() {
		u := minimal()
		Expect(k8sClient.Create(ctx, u)).To(Succeed())
		var rq rqv1.RenderQueue
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(u), &rq)).To(Succeed())
		Expect(rq.Spec.Shards).To(Equal(int32(rqv1.DefaultShards)))
		Expect(rq.Spec.Window).NotTo(BeNil())
		Expect(rq.Spec.Window.Duration).To(BeZero())
		Expect(rq.Spec.VerifyInterval).NotTo(BeNil())
		Expect(rq.Spec.VerifyInterval.Duration).To(Equal(rqv1.DefaultVerifyInterval))
		Expect(rq.Spec.LeaseDuration).NotTo(BeNil())
		Expect(rq.Spec.LeaseDuration.Duration).To(Equal(rqv1.DefaultLeaseDuration))
		Expect(rq.Spec.Priority.SubmittedBoost).To(Equal(rqv1.DefaultSubmittedBoost))
		Expect(rq.Spec.Priority.UrgentMaxShare).To(Equal(rqv1.DefaultUrgentMaxShare))
		Expect(rq.Spec.Store.SecretRef.Key).To(Equal(rqv1.DefaultSecretKey))
		Expect(rq.Spec.Image).To(BeEmpty(), "the image defaults at run time to the operator's own")
		Expect(rq.Spec.Priority.SubmittedBoostValue()).To(Equal(2.0))
		Expect(rq.Spec.Priority.UrgentMaxShareValue()).To(Equal(0.2))
		Expect(rq.Spec.Priority.Reschedule).To(Equal(rqv1.DefaultReschedule))
		Expect(rq.Spec.Priority.Floors).To(BeEmpty())
	})

	It("keeps the defaults of a partly given priority", func() {
		u := withField("priority.submittedBoost", "3")
		Expect(k8sClient.Create(ctx, u)).To(Succeed())
		var rq rqv1.RenderQueue
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(u), &rq)).To(Succeed())
		Expect(rq.Spec.Priority.SubmittedBoost).To(Equal("3"))
		Expect(rq.Spec.Priority.UrgentMaxShare).To(Equal(rqv1.DefaultUrgentMaxShare))
	})

	It("accepts the sample", func() {
		data, err := os.ReadFile(filepath.Join("..", "..", "config", "samples", "renderqueue_v1alpha1_renderqueue.yaml"))
		Expect(err).NotTo(HaveOccurred())
		var rq rqv1.RenderQueue
		Expect(yaml.UnmarshalStrict(data, &rq)).To(Succeed())
		rq.Namespace = ns
		Expect(k8sClient.Create(ctx, &rq)).To(Succeed())
		Expect(rq.Spec.Shards).To(Equal(int32(3)))
		Expect(rq.Spec.WindowDuration()).To(Equal(24 * time.Hour))
	})
})

var _ = Describe("RenderQueue subresources", func() {
	var rq *rqv1.RenderQueue

	BeforeEach(func() {
		rq = &rqv1.RenderQueue{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "scaled-", Namespace: ns},
			Spec: rqv1.RenderQueueSpec{
				Shards: 3,
				Window: &metav1.Duration{Duration: 24 * time.Hour},
				Store:  rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "renderqueue-db"}},
			},
		}
		Expect(k8sClient.Create(ctx, rq)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, rq))).To(Succeed()) })

		rq.Status = rqv1.RenderQueueStatus{
			ObservedGeneration: rq.Generation,
			CurrentShards:      3,
			ReadyShards:        2,
			Due:                4211,
			DueExact:           false,
			Selector:           rqv1.LabelQueue + "=" + rq.Name,
		}
		meta.SetStatusCondition(&rq.Status.Conditions, metav1.Condition{
			Type: rqv1.ConditionEdgeHealthy, Status: metav1.ConditionFalse, Reason: rqv1.ReasonEdgeLagging,
			Message: rq.ShardName(1) + " edge is 90s behind now", ObservedGeneration: rq.Generation,
		})
		Expect(k8sClient.Status().Update(ctx, rq)).To(Succeed())
	})

	It("keeps status out of spec updates and spec out of status updates", func() {
		var got rqv1.RenderQueue
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(rq), &got)).To(Succeed())
		Expect(got.Status.Due).To(Equal(int64(4211)))
		Expect(got.Spec.Shards).To(Equal(int32(3)))
		Expect(got.Spec.LeaseDuration).NotTo(BeNil(), "a Go client leaving leaseDuration unset gets the default")
		Expect(got.Spec.LeaseDuration.Duration).To(Equal(rqv1.DefaultLeaseDuration))

		got.Status.Due = 1
		got.Spec.Shards = 5
		Expect(k8sClient.Update(ctx, &got)).To(Succeed())
		Expect(got.Status.Due).To(Equal(int64(4211)), "a spec update must not write status")
		Expect(got.Spec.Shards).To(Equal(int32(5)))
	})

	It("serves the scale subresource over spec.shards, status.currentShards and status.selector", func() {
		scale := &autoscalingv1.Scale{}
		Expect(k8sClient.SubResource("scale").Get(ctx, rq, scale)).To(Succeed())
		Expect(scale.Spec.Replicas).To(Equal(int32(3)))
		Expect(scale.Status.Replicas).To(Equal(int32(3)))
		Expect(scale.Status.Selector).To(Equal(rqv1.LabelQueue + "=" + rq.Name))

		scale.Spec.Replicas = 4
		Expect(k8sClient.SubResource("scale").Update(ctx, rq, client.WithSubResourceBody(scale))).To(Succeed())
		var got rqv1.RenderQueue
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(rq), &got)).To(Succeed())
		Expect(got.Spec.Shards).To(Equal(int32(4)))
		Expect(got.Generation).To(BeNumerically(">", rq.Generation))
	})

	It("validates shards set through the scale subresource", func() {
		for _, replicas := range []int32{0, 257} {
			scale := &autoscalingv1.Scale{}
			Expect(k8sClient.SubResource("scale").Get(ctx, rq, scale)).To(Succeed())
			scale.Spec.Replicas = replicas
			err := k8sClient.SubResource("scale").Update(ctx, rq, client.WithSubResourceBody(scale))
			Expect(err).To(HaveOccurred(), "scaling to %d was accepted", replicas)
			Expect(err.Error()).To(ContainSubstring("shards must be between 1 and 256"))
		}
		var got rqv1.RenderQueue
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(rq), &got)).To(Succeed())
		Expect(got.Spec.Shards).To(Equal(int32(3)))
	})

	It("shows shards, ready, due, exact and edge health in kubectl get", func() {
		user, err := testEnv.AddUser(envtest.User{Name: "viewer", Groups: []string{"system:masters"}}, nil)
		Expect(err).NotTo(HaveOccurred())
		kubectl, err := user.Kubectl()
		Expect(err).NotTo(HaveOccurred())
		stdout, stderr, err := kubectl.Run("get", "rq", rq.Name, "--namespace", ns)
		errText, _ := io.ReadAll(stderr)
		Expect(err).NotTo(HaveOccurred(), "kubectl get: %s", errText)
		out, _ := io.ReadAll(stdout)
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		Expect(lines).To(HaveLen(2), "kubectl get printed:\n%s", out)
		Expect(strings.Fields(lines[0])).To(Equal([]string{"NAME", "SHARDS", "READY", "DUE", "EXACT", "EDGE", "AGE"}))
		Expect(strings.Fields(lines[1])[:6]).To(Equal([]string{rq.Name, "3", "2", "4211", "false", "False"}))
		GinkgoWriter.Printf("kubectl get rq:\n%s", out)
	})
})

// manyStrings is a string map of n distinct keys, each with value v.
func manyStrings(n int, v string) map[string]any {
	m := map[string]any{}
	for i := range n {
		m[fmt.Sprintf("key-%d", i)] = v
	}
	return m
}

// manySecrets is a list of n imagePullSecrets entries with distinct names.
func manySecrets(n int) []any {
	var out []any
	for i := range n {
		out = append(out, map[string]any{"name": fmt.Sprintf("regcred-%d", i)})
	}
	return out
}

// spread is a topology spread constraint with maxSkew 1, and extra fields set over it.
func spread(key, when string, extra map[string]any) map[string]any {
	c := map[string]any{"maxSkew": int64(1), "topologyKey": key, "whenUnsatisfiable": when}
	for k, v := range extra {
		c[k] = v
	}
	return c
}

// manySpreads is a list of n topology spread constraints on distinct keys.
func manySpreads(n int) []any {
	var out []any
	for i := range n {
		out = append(out, spread(fmt.Sprintf("example.com/zone-%d", i), "DoNotSchedule", nil))
	}
	return out
}
