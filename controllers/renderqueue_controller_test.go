package controllers

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/policy"
	"github.com/renderqueue/renderqueue/controllers/specs"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

var nsCounter atomic.Int32

// newQueue creates a namespace and a RenderQueue with shards shards (changed by edit before it is
// created), and fake shards for up to maxShards of its shard names.
func newQueue(name string, shards, maxShards int, edit ...func(*rqv1.RenderQueue)) (*rqv1.RenderQueue, []*fakeShard) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("rq-%d-%s", nsCounter.Add(1), name)}}
	Expect(k8sClient.Create(suiteCtx, ns)).To(Succeed())
	var fs []*fakeShard
	for i := range maxShards {
		f := newFakeShard(k8sClient, ns.Name, name, rqv1.ShardName(name, i))
		fakes.add(f)
		fs = append(fs, f)
	}
	rq := &rqv1.RenderQueue{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns.Name},
		Spec: rqv1.RenderQueueSpec{
			Shards: int32(shards),
			Store:  rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "pg", Key: "dsn"}},
		},
	}
	for _, e := range edit {
		e(rq)
	}
	Expect(k8sClient.Create(suiteCtx, rq)).To(Succeed())
	return rq, fs
}

func getQueue(g Gomega, rq *rqv1.RenderQueue) *rqv1.RenderQueue {
	var out rqv1.RenderQueue
	g.Expect(k8sClient.Get(suiteCtx, client.ObjectKeyFromObject(rq), &out)).To(Succeed())
	return &out
}

func condOf(rq *rqv1.RenderQueue, typ string) metav1.Condition {
	if c := meta.FindStatusCondition(rq.Status.Conditions, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// settled waits until rq is settled with every shard ready and the due count exact.
func settled(rq *rqv1.RenderQueue, shards int) *rqv1.RenderQueue {
	var out *rqv1.RenderQueue
	Eventually(func(g Gomega) {
		out = getQueue(g, rq)
		g.Expect(out.Status.ReadyShards).To(BeEquivalentTo(shards))
		g.Expect(out.Status.CurrentShards).To(BeEquivalentTo(shards))
		g.Expect(out.Status.DueExact).To(BeTrue(), "conditions: %+v", out.Status.Conditions)
		g.Expect(condOf(out, rqv1.ConditionProgressing).Reason).To(Equal(rqv1.ReasonSettled))
		g.Expect(condOf(out, rqv1.ConditionReady).Status).To(Equal(metav1.ConditionTrue))
	}).WithTimeout(30 * time.Second).Should(Succeed())
	return out
}

// eventReasons lists the reasons of the events about rq, oldest first.
func eventReasons(g Gomega, rq *rqv1.RenderQueue) []string {
	var list corev1.EventList
	g.Expect(k8sClient.List(suiteCtx, &list, client.InNamespace(rq.Namespace))).To(Succeed())
	items := list.Items
	slices.SortStableFunc(items, func(a, b corev1.Event) int {
		return eventTime(a).Compare(eventTime(b))
	})
	var out []string
	for _, e := range items {
		if e.InvolvedObject.Name == rq.Name && e.InvolvedObject.Kind == "RenderQueue" {
			out = append(out, e.Reason)
		}
	}
	return out
}

func eventTime(e corev1.Event) time.Time {
	if !e.EventTime.IsZero() {
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

func eventMessage(g Gomega, rq *rqv1.RenderQueue, reason string) string {
	var list corev1.EventList
	g.Expect(k8sClient.List(suiteCtx, &list, client.InNamespace(rq.Namespace))).To(Succeed())
	for _, e := range list.Items {
		if e.InvolvedObject.Name == rq.Name && e.Reason == reason {
			return e.Message
		}
	}
	return ""
}

func ownedBy(obj client.Object, rq *rqv1.RenderQueue) bool {
	for _, ref := range obj.GetOwnerReferences() {
		if ref.UID == rq.UID && ref.Kind == "RenderQueue" && ref.Controller != nil && *ref.Controller {
			return true
		}
	}
	return false
}

var _ = Describe("RenderQueue children", func() {
	It("creates every child with owner references, keeps the token, and recreates a deleted shard Pod", func() {
		rq, _ := newQueue("kids", 2, 2)
		key := func(name string) types.NamespacedName {
			return types.NamespacedName{Namespace: rq.Namespace, Name: name}
		}
		rq = settled(rq, 2)

		var secret corev1.Secret
		Expect(k8sClient.Get(suiteCtx, key("kids-api-token"), &secret)).To(Succeed())
		Expect(ownedBy(&secret, rq)).To(BeTrue())
		token := string(secret.Data["token"])
		Expect(token).To(HaveLen(64))

		var sa corev1.ServiceAccount
		Expect(k8sClient.Get(suiteCtx, key("kids-shard"), &sa)).To(Succeed())
		Expect(ownedBy(&sa, rq)).To(BeTrue())
		var role rbacv1.Role
		Expect(k8sClient.Get(suiteCtx, key("kids-shard"), &role)).To(Succeed())
		Expect(ownedBy(&role, rq)).To(BeTrue())
		Expect(role.Rules).To(Equal([]rbacv1.PolicyRule{{
			APIGroups: []string{"renderqueue.dev"}, Resources: []string{"renderqueues"},
			ResourceNames: []string{"kids"}, Verbs: []string{"get", "list", "watch"},
		}}))
		var rb rbacv1.RoleBinding
		Expect(k8sClient.Get(suiteCtx, key("kids-shard"), &rb)).To(Succeed())
		Expect(ownedBy(&rb, rq)).To(BeTrue())
		Expect(rb.RoleRef.Name).To(Equal("kids-shard"))
		Expect(rb.Subjects).To(ConsistOf(rbacv1.Subject{Kind: "ServiceAccount", Name: "kids-shard", Namespace: rq.Namespace}))

		var svc corev1.Service
		Expect(k8sClient.Get(suiteCtx, key("kids-shards"), &svc)).To(Succeed())
		Expect(ownedBy(&svc, rq)).To(BeTrue())
		Expect(svc.Spec.ClusterIP).To(Equal(corev1.ClusterIPNone))
		Expect(svc.Spec.Selector).To(HaveKeyWithValue(rqv1.LabelQueue, "kids"))

		var pdb policyv1.PodDisruptionBudget
		Expect(k8sClient.Get(suiteCtx, key("kids-shards"), &pdb)).To(Succeed())
		Expect(ownedBy(&pdb, rq)).To(BeTrue())
		Expect(pdb.Spec.MaxUnavailable.IntValue()).To(Equal(1))

		for i := range 2 {
			name := fmt.Sprintf("kids-shard-%d", i)
			var pod corev1.Pod
			Expect(k8sClient.Get(suiteCtx, key(name), &pod)).To(Succeed())
			Expect(ownedBy(&pod, rq)).To(BeTrue())
			Expect(pod.Labels).To(HaveKeyWithValue(rqv1.LabelQueue, "kids"))
			Expect(pod.Labels).To(HaveKeyWithValue(rqv1.LabelShard, name))
			Expect(pod.Annotations).To(HaveKey(rqv1.AnnotationPodTemplateHash))
			Expect(pod.Spec.ServiceAccountName).To(Equal("kids-shard"))
			c := pod.Spec.Containers[0]
			Expect(c.Image).To(Equal(testImage))
			Expect(c.Args).To(Equal([]string{"keeper", "--renderqueue", "kids", "--namespace", rq.Namespace,
				"--name", name, "--listen", ":8080", "--token-file", "/var/run/renderqueue/token/token"}))
			Expect(c.Env).To(ContainElement(corev1.EnvVar{Name: "RENDERQUEUE_DSN", ValueFrom: &corev1.EnvVarSource{
				SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "pg"}, Key: "dsn"}}}))
			Expect(c.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "api-token", MountPath: "/var/run/renderqueue/token", ReadOnly: true}))
			Expect(c.Ports).To(ContainElement(HaveField("Name", "http")))
			Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
			Expect(c.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))
			Expect(*c.SecurityContext.ReadOnlyRootFilesystem).To(BeTrue())
			Expect(*c.SecurityContext.AllowPrivilegeEscalation).To(BeFalse())
			Expect(c.SecurityContext.Capabilities.Drop).To(ConsistOf(corev1.Capability("ALL")))
			Expect(*pod.Spec.SecurityContext.RunAsNonRoot).To(BeTrue())
			Expect(*pod.Spec.SecurityContext.RunAsUser).To(BeEquivalentTo(65532))
			Expect(pod.Spec.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
		}
		Expect(rq.Status.Membership.Epoch).To(BeEquivalentTo(1))
		Expect(rq.Status.Membership.Assignment).To(Equal([]rqv1.ShardSlots{
			{Shard: "kids-shard-0", Slots: "0-511"}, {Shard: "kids-shard-1", Slots: "512-1023"}}))
		Expect(rq.Status.Selector).To(Equal(specs.SelectorString(rq)))

		By("deleting a shard Pod")
		var pod corev1.Pod
		Expect(k8sClient.Get(suiteCtx, key("kids-shard-1"), &pod)).To(Succeed())
		oldUID := pod.UID
		Expect(k8sClient.Delete(suiteCtx, &pod)).To(Succeed())
		Eventually(func(g Gomega) {
			var again corev1.Pod
			g.Expect(k8sClient.Get(suiteCtx, key("kids-shard-1"), &again)).To(Succeed())
			g.Expect(again.UID).NotTo(Equal(oldUID))
			g.Expect(ownedBy(&again, rq)).To(BeTrue())
		}).WithTimeout(15 * time.Second).Should(Succeed())

		By("deleting the Service and touching the spec: the Service comes back, the token stays")
		Expect(k8sClient.Delete(suiteCtx, &svc)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(suiteCtx, key("kids-shards"), &corev1.Service{})).To(Succeed())
		}).WithTimeout(15 * time.Second).Should(Succeed())
		Expect(k8sClient.Get(suiteCtx, key("kids-api-token"), &secret)).To(Succeed())
		Expect(string(secret.Data["token"])).To(Equal(token))
	})
})

var _ = Describe("RenderQueue status", func() {
	It("aggregates due, reports edge lag, partial walks, inexact and unreachable shards, and is not rewritten when nothing changed", func() {
		rq, fs := newQueue("web", 3, 3)
		fs[0].set(func(f *fakeShard) { f.due, f.coming = 100, shardapi.Coming{Next15m: 1, Next60m: 10, Next24h: 100} })
		fs[1].set(func(f *fakeShard) { f.due, f.coming = 20, shardapi.Coming{Next15m: 2, Next60m: 20, Next24h: 200} })
		fs[2].set(func(f *fakeShard) { f.due, f.coming = 3, shardapi.Coming{Next15m: 3, Next60m: 30, Next24h: 300} })
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			g.Expect(got.Status.Due).To(BeEquivalentTo(123))
			g.Expect(got.Status.DueExact).To(BeTrue())
			// the forecast: due plus what comes due; the day a lower bound, the fakes' edges being
			// 23 hours ahead
			g.Expect(got.Status.Forecast).NotTo(BeNil())
			g.Expect(got.Status.Forecast.Horizons).To(HaveLen(3))
			h := got.Status.Forecast.Horizons
			g.Expect(h[0]).To(Equal(rqv1.ForecastHorizon{Horizon: "15m", Due: 129, Exact: true}))
			g.Expect(h[1]).To(Equal(rqv1.ForecastHorizon{Horizon: "1h", Due: 183, Exact: true}))
			g.Expect(h[2].Due).To(BeEquivalentTo(723))
			g.Expect(h[2].Exact).To(BeFalse())
			g.Expect(h[2].Reason).To(ContainSubstring("do not hold all their rows due within 24h"))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		got := settled(rq, 3)
		for _, typ := range []string{rqv1.ConditionReady, rqv1.ConditionExact, rqv1.ConditionEdgeHealthy, rqv1.ConditionWalksComplete} {
			Expect(condOf(got, typ).Status).To(Equal(metav1.ConditionTrue), typ)
		}
		Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		Expect(got.Status.DueAsOf).NotTo(BeNil())
		Expect(got.Status.Shards).To(HaveLen(3))
		s1 := got.Status.Shards[1]
		Expect(s1.Name).To(Equal("web-shard-1"))
		Expect(s1.Slots).To(Equal("342-682"))
		Expect(s1.State).To(Equal("queued"))
		Expect(s1.URL).To(HavePrefix("http://127.0.0.1:"), "the URL the shard was polled at, for render workers")
		Expect(s1.RowsHeld).To(BeEquivalentTo(1000))
		Expect(s1.RowsOwned).To(BeEquivalentTo(6000))
		Expect(s1.Due).To(BeEquivalentTo(20))
		Expect(s1.Edge).NotTo(BeNil())
		Expect(*s1.EdgeAheadSeconds).To(BeNumerically(">", 22*3600))
		Expect(s1.LastWalk).NotTo(BeNil())

		By("polling several times with nothing changing")
		rv := got.ResourceVersion
		Consistently(func(g Gomega) {
			g.Expect(getQueue(g, rq).ResourceVersion).To(Equal(rv))
		}).WithTimeout(8 * testPollInterval).WithPolling(testPollInterval / 2).Should(Succeed())

		By("a shard whose edge is behind now")
		fs[1].set(func(f *fakeShard) {
			edge := time.Now().Add(-80 * time.Minute).Truncate(time.Second)
			f.edge = &edge
			f.complete, f.exact, f.status = false, false, "unready"
		})
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			c := condOf(got, rqv1.ConditionEdgeHealthy)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(rqv1.ReasonEdgeLagging))
			g.Expect(c.Message).To(ContainSubstring("shard web-shard-1 edge is 1h20m behind now"))
			g.Expect(*got.Status.Shards[1].EdgeAheadSeconds).To(BeNumerically("<", -79*60))
			g.Expect(got.Status.DueExact).To(BeFalse())
			g.Expect(condOf(got, rqv1.ConditionExact).Reason).To(Equal(rqv1.ReasonShardInexact))
			g.Expect(eventReasons(g, rq)).To(ContainElement(rqv1.ReasonEdgeLagging))
		}).WithTimeout(15 * time.Second).Should(Succeed())

		By("a shard whose last walk was partial")
		fs[2].set(func(f *fakeShard) { f.partial, f.unread = true, 3 })
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			c := condOf(got, rqv1.ConditionWalksComplete)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(rqv1.ReasonPartialWalk))
			g.Expect(c.Message).To(ContainSubstring("shard web-shard-2's last walk left 3 segments unread"))
			g.Expect(got.Status.Shards[2].LastWalk.UnreadSegments).To(BeEquivalentTo(3))
			g.Expect(eventReasons(g, rq)).To(ContainElement(rqv1.ReasonPartialWalk))
		}).WithTimeout(15 * time.Second).Should(Succeed())

		By("a class on a shard starving: due rows and no render for longer than its cadence")
		since := time.Now().Add(-2 * time.Hour).UTC().Truncate(time.Second)
		fs[2].set(func(f *fakeShard) {
			f.classes = []shardapi.Class{{Cadence: 3600, Source: "discovered", Due: 3, Held: 3, LateBy: make([]int, 5), WaitingSince: &since}}
		})
		starving := "class 1h/discovered on shard web-shard-2 has had due rows and no render since " + since.Format(time.RFC3339) +
			", longer than its cadence (1h)"
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			c := condOf(got, rqv1.ConditionClassesServed)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(rqv1.ReasonClassStarving))
			g.Expect(c.Message).To(Equal(starving))
			g.Expect(eventReasons(g, rq)).To(ContainElement(rqv1.ReasonClassStarving))
		}).WithTimeout(15 * time.Second).Should(Succeed())
		Expect(describe(rq)).To(And(ContainSubstring("ClassesServed"), ContainSubstring(rqv1.ReasonClassStarving), ContainSubstring(starving)),
			"kubectl describe shows the condition and the event")

		writeDescribe(rq)

		By("the shards recovering, then one becoming unreachable")
		fs[1].set(func(f *fakeShard) {
			edge := time.Now().Add(20 * time.Hour).Truncate(time.Second)
			f.edge = &edge
			f.complete, f.exact, f.status = true, true, "queued"
		})
		fs[2].set(func(f *fakeShard) { f.partial, f.unread, f.classes = false, 0, nil })
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			g.Expect(got.Status.DueExact).To(BeTrue())
			g.Expect(condOf(got, rqv1.ConditionClassesServed).Status).To(Equal(metav1.ConditionTrue))
			g.Expect(condOf(got, rqv1.ConditionEdgeHealthy).Status).To(Equal(metav1.ConditionTrue))
			g.Expect(condOf(got, rqv1.ConditionWalksComplete).Status).To(Equal(metav1.ConditionTrue))
		}).WithTimeout(15 * time.Second).Should(Succeed())

		for _, tc := range []struct {
			what   string
			break_ func(f *fakeShard)
			err    string
		}{
			{"an HTTP error", func(f *fakeShard) { f.failWith = 503 }, "503 Service Unavailable"},
			{"bad JSON", func(f *fakeShard) { f.badJSON = true }, "decoding the status"},
			{"the wrong shard name", func(f *fakeShard) { f.wrongName = true }, `reports shard "web-shard-0-impostor"`},
		} {
			By("a shard answering with " + tc.what)
			fs[0].set(tc.break_)
			Eventually(func(g Gomega) {
				got := getQueue(g, rq)
				g.Expect(got.Status.DueExact).To(BeFalse())
				g.Expect(got.Status.Due).To(BeEquivalentTo(23), "a lower bound: the other shards' slots")
				g.Expect(got.Status.Shards[0].State).To(Equal(policy.StateUnreachable))
				g.Expect(got.Status.Shards[0].Error).To(ContainSubstring(tc.err))
				c := condOf(got, rqv1.ConditionExact)
				g.Expect(c.Reason).To(Equal(rqv1.ReasonShardUnreachable))
				g.Expect(c.Message).To(ContainSubstring("shard web-shard-0 is unreachable"))
			}).WithTimeout(15 * time.Second).Should(Succeed())
			fs[0].set(func(f *fakeShard) { f.failWith, f.badJSON, f.wrongName = 0, false, false })
			Eventually(func(g Gomega) {
				g.Expect(getQueue(g, rq).Status.DueExact).To(BeTrue())
			}).WithTimeout(15 * time.Second).Should(Succeed())
		}
		Eventually(func(g Gomega) {
			g.Expect(eventReasons(g, rq)).To(ContainElement(policy.EventShardUnreachable))
		}).Should(Succeed())
	})
})

// scaleTo sets spec.shards through the spec or the scale subresource.
type scaleFunc func(rq *rqv1.RenderQueue, n int32)

func scaleViaSpec(rq *rqv1.RenderQueue, n int32) {
	Eventually(func(g Gomega) {
		got := getQueue(g, rq)
		got.Spec.Shards = n
		g.Expect(k8sClient.Update(suiteCtx, got)).To(Succeed())
	}).Should(Succeed())
}

func scaleViaSubresource(rq *rqv1.RenderQueue, n int32) {
	Eventually(func(g Gomega) {
		scale := &autoscalingv1.Scale{}
		g.Expect(k8sClient.SubResource("scale").Get(suiteCtx, rq, scale)).To(Succeed())
		scale.Spec.Replicas = n
		g.Expect(k8sClient.SubResource("scale").Update(suiteCtx, rq, client.WithSubResourceBody(scale))).To(Succeed())
	}).Should(Succeed())
}

var _ = Describe("Scaling", func() {
	DescribeTable("3 → 4 prepares, waits for the receiver, then commits",
		func(name string, doScale scaleFunc) {
			rq, fs := newQueue(name, 3, 4)
			fs[3].set(func(f *fakeShard) { f.autoPrepare = false })
			before := settled(rq, 3)
			Expect(before.Status.Membership.Epoch).To(BeEquivalentTo(1))

			doScale(rq, 4)
			var prepEpoch int64
			Eventually(func(g Gomega) {
				got := getQueue(g, rq)
				ms := got.Status.Membership
				g.Expect(ms.HandoffInProgress()).To(BeTrue())
				g.Expect(ms.Handoff).NotTo(BeNil())
				g.Expect(ms.Handoff.State).To(Equal(rqv1.HandoffPreparing))
				g.Expect(ms.Handoff.Waiting).To(Equal([]string{name + "-shard-3"}))
				g.Expect(ms.Epoch).To(BeEquivalentTo(2))
				g.Expect(ms.Incoming).To(HaveLen(1))
				g.Expect(ms.Incoming[0].Shard).To(Equal(name + "-shard-3"))
				g.Expect(ms.SlotsMoving).To(BeEquivalentTo(256))
				g.Expect(ms.Assignment).To(Equal(before.Status.Membership.Assignment), "owners unchanged while preparing")
				g.Expect(got.Status.CurrentShards).To(BeEquivalentTo(3))
				c := condOf(got, rqv1.ConditionProgressing)
				g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
				g.Expect(c.Reason).To(Equal(rqv1.ReasonRebalancing))
				g.Expect(c.Message).To(ContainSubstring(name + "-shard-3"))
				prepEpoch = ms.Handoff.PrepareEpoch
			}).WithTimeout(testRebalanceTimeout).Should(Succeed())

			By("the receiver reporting the prepare epoch walked")
			fs[3].set(func(f *fakeShard) { f.preparedEpoch = prepEpoch })
			Eventually(func(g Gomega) {
				got := getQueue(g, rq)
				ms := got.Status.Membership
				g.Expect(ms.Handoff.State).To(Equal(rqv1.HandoffCommitted))
				g.Expect(ms.Epoch).To(BeEquivalentTo(3))
				g.Expect(ms.Incoming).To(BeEmpty())
				g.Expect(ms.Assignment).To(HaveLen(4))
				for _, a := range ms.Assignment {
					slots, err := parseCount(a.Slots)
					g.Expect(err).NotTo(HaveOccurred())
					g.Expect(slots).To(Equal(256), a.Shard)
				}
			}).WithTimeout(20 * time.Second).Should(Succeed())
			settled(rq, 4)
			// the stand-in shards put their whole due in their first owned slot and report none for
			// prepared incoming slots, so the exact sum may read 30 until the receiver adopts
			Eventually(func(g Gomega) {
				got := getQueue(g, rq)
				g.Expect(got.Status.DueExact).To(BeTrue())
				g.Expect(got.Status.Due).To(BeEquivalentTo(40))
			}).WithTimeout(20 * time.Second).Should(Succeed())
			Eventually(func(g Gomega) {
				reasons := eventReasons(g, rq)
				g.Expect(reasons).To(ContainElements(EventRebalanceStarted, EventRebalanceCommitted))
				g.Expect(slices.Index(reasons, EventRebalanceStarted)).To(BeNumerically("<", slices.Index(reasons, EventRebalanceCommitted)))
			}).Should(Succeed())
			scale := &autoscalingv1.Scale{}
			Expect(k8sClient.SubResource("scale").Get(suiteCtx, rq, scale)).To(Succeed())
			Expect(scale.Status.Replicas).To(BeEquivalentTo(4))
		},
		Entry("via spec.shards", "grow", scaleFunc(scaleViaSpec)),
		Entry("via the scale subresource", "scaled", scaleFunc(scaleViaSubresource)),
	)

	It("rolls back when a receiver never reports prepared", func() {
		rq, fs := newQueue("stuck", 2, 3)
		fs[2].set(func(f *fakeShard) { f.autoPrepare = false })
		before := settled(rq, 2)
		scaleViaSpec(rq, 3)
		Eventually(func(g Gomega) {
			g.Expect(getQueue(g, rq).Status.Membership.HandoffInProgress()).To(BeTrue())
		}).WithTimeout(15 * time.Second).Should(Succeed())
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			ms := got.Status.Membership
			g.Expect(ms.Handoff.State).To(Equal(rqv1.HandoffRolledBack))
			g.Expect(ms.Handoff.Waiting).To(Equal([]string{"stuck-shard-2"}))
			g.Expect(ms.Epoch).To(BeEquivalentTo(3))
			g.Expect(ms.HandoffInProgress()).To(BeFalse())
			g.Expect(ms.Incoming).To(BeEmpty())
			g.Expect(ms.Assignment).To(Equal(before.Status.Membership.Assignment))
			c := condOf(got, rqv1.ConditionProgressing)
			g.Expect(c.Reason).To(Equal(rqv1.ReasonRebalancing))
			g.Expect(c.Message).To(ContainSubstring("rolled back"))
			g.Expect(eventReasons(g, rq)).To(ContainElement(EventRebalanceRolledBack))
			g.Expect(eventMessage(g, rq, EventRebalanceRolledBack)).To(ContainSubstring("stuck-shard-2 did not report"))
		}).WithTimeout(testRebalanceTimeout + 15*time.Second).Should(Succeed())
	})

	It("scales 3 → 2 by moving the slots off first, then deleting the surplus Pod", func() {
		rq, _ := newQueue("shrink", 3, 3)
		settled(rq, 3)
		scaleViaSpec(rq, 2)
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			g.Expect(got.Status.Membership.Handoff.State).To(Equal(rqv1.HandoffCommitted))
			asg := got.Status.Membership.Assignment
			g.Expect(asg).To(HaveLen(2))
			for i, a := range asg {
				g.Expect(a.Shard).To(Equal(rqv1.ShardName("shrink", i)))
				n, err := parseCount(a.Slots)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(n).To(Equal(512))
			}
			err := k8sClient.Get(suiteCtx, types.NamespacedName{Namespace: rq.Namespace, Name: "shrink-shard-2"}, &corev1.Pod{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the surplus Pod is deleted")
		}).WithTimeout(20 * time.Second).Should(Succeed())
		settled(rq, 2)
	})
})

var _ = Describe("Rolling replacement", func() {
	It("replaces outdated shard Pods one at a time when the image changes", func() {
		rq, _ := newQueue("roll", 3, 3)
		settled(rq, 3)

		// Watch the Pods: at every deletion, every other shard Pod must exist and be Ready.
		wc, err := client.NewWithWatch(cfg, client.Options{Scheme: k8sClient.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		w, err := wc.Watch(suiteCtx, &corev1.PodList{}, client.InNamespace(rq.Namespace))
		Expect(err).NotTo(HaveOccurred())
		var (
			mu         sync.Mutex
			violations []string
			deletions  []string
		)
		done := make(chan struct{})
		go func() {
			defer close(done)
			state := map[string]bool{} // name → ready
			for ev := range w.ResultChan() {
				pod, ok := ev.Object.(*corev1.Pod)
				if !ok {
					continue
				}
				switch ev.Type {
				case watch.Added, watch.Modified:
					state[pod.Name] = policy.PodReady(pod)
				case watch.Deleted:
					mu.Lock()
					deletions = append(deletions, pod.Name)
					for i := range 3 {
						other := rqv1.ShardName("roll", i)
						if other != pod.Name && !state[other] {
							violations = append(violations, fmt.Sprintf("%s deleted while %s was not ready", pod.Name, other))
						}
					}
					mu.Unlock()
					delete(state, pod.Name)
				}
			}
		}()

		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			got.Spec.Image = "registry.example/renderqueue:v2"
			g.Expect(k8sClient.Update(suiteCtx, got)).To(Succeed())
		}).Should(Succeed())

		Eventually(func(g Gomega) {
			var pods corev1.PodList
			g.Expect(k8sClient.List(suiteCtx, &pods, client.InNamespace(rq.Namespace))).To(Succeed())
			g.Expect(pods.Items).To(HaveLen(3))
			for _, p := range pods.Items {
				g.Expect(p.Spec.Containers[0].Image).To(Equal("registry.example/renderqueue:v2"), p.Name)
				g.Expect(policy.PodReady(&p)).To(BeTrue(), p.Name)
			}
		}).WithTimeout(45 * time.Second).Should(Succeed())
		settled(rq, 3)
		w.Stop()
		<-done
		mu.Lock()
		defer mu.Unlock()
		Expect(violations).To(BeEmpty())
		Expect(deletions).To(Equal([]string{"roll-shard-0", "roll-shard-1", "roll-shard-2"}))
		Eventually(func(g Gomega) {
			reasons := eventReasons(g, rq)
			n := 0
			for _, r := range reasons {
				if r == EventShardReplacing {
					n++
				}
			}
			g.Expect(n).To(Equal(3))
		}).Should(Succeed())
	})
})

// parseCount returns the number of slots in a slot text.
func parseCount(text string) (int, error) {
	n := 0
	for _, run := range strings.Split(text, ",") {
		var a, b int
		if _, err := fmt.Sscanf(run, "%d-%d", &a, &b); err == nil {
			n += b - a + 1
			continue
		}
		if _, err := fmt.Sscanf(run, "%d", &a); err != nil {
			return 0, err
		}
		n++
	}
	return n, nil
}

// describe returns `kubectl describe renderqueue` of rq, run with the envtest kubectl.
func describe(rq *rqv1.RenderQueue) string {
	user, err := testEnv.AddUser(envtest.User{Name: "describe", Groups: []string{"system:masters"}}, nil)
	Expect(err).NotTo(HaveOccurred())
	kubectl, err := user.Kubectl()
	Expect(err).NotTo(HaveOccurred())
	stdout, stderr, err := kubectl.Run("describe", "renderqueue", rq.Name, "--namespace", rq.Namespace)
	Expect(err).NotTo(HaveOccurred(), "%v", stderr)
	return readAll(stdout)
}

// writeDescribe writes `kubectl describe renderqueue` of rq (and the kubeconfig it used) into
// $RENDERQUEUE_DESCRIBE_DIR, when set, with the envtest kubectl.
func writeDescribe(rq *rqv1.RenderQueue) {
	dir := os.Getenv("RENDERQUEUE_DESCRIBE_DIR")
	if dir == "" {
		return
	}
	user, err := testEnv.AddUser(envtest.User{Name: "describe", Groups: []string{"system:masters"}}, nil)
	Expect(err).NotTo(HaveOccurred())
	kubeconfig, err := user.KubeConfig()
	Expect(err).NotTo(HaveOccurred())
	Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
	Expect(os.WriteFile(filepath.Join(dir, "kubeconfig"), kubeconfig, 0o600)).To(Succeed())
	kubectl, err := user.Kubectl()
	Expect(err).NotTo(HaveOccurred())
	stdout, stderr, err := kubectl.Run("describe", "renderqueue", rq.Name, "--namespace", rq.Namespace)
	Expect(err).NotTo(HaveOccurred(), "%v", stderr)
	out := new(strings.Builder)
	_, _ = fmt.Fprint(out, readAll(stdout))
	Expect(os.WriteFile(filepath.Join(dir, "describe.txt"), []byte(out.String()), 0o644)).To(Succeed())
	stdout, _, err = kubectl.Run("get", "renderqueue", "--namespace", rq.Namespace, "-o", "wide")
	Expect(err).NotTo(HaveOccurred())
	Expect(os.WriteFile(filepath.Join(dir, "get.txt"), []byte(readAll(stdout)), 0o644)).To(Succeed())
}
