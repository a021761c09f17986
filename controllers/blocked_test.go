package controllers

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/specs"
)

// newNamespace creates a namespace for one test.
func newNamespace(name string) string {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("rq-%d-%s", nsCounter.Add(1), name)}}
	Expect(k8sClient.Create(suiteCtx, ns)).To(Succeed())
	return ns.Name
}

// rawQueue is a RenderQueue as unstructured, so that specs the Go types cannot hold can be sent.
func rawQueue(namespace, name string, spec map[string]any) *unstructured.Unstructured {
	if spec["store"] == nil {
		spec["store"] = map[string]any{"secretRef": map[string]any{"name": "pg", "key": "dsn"}}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": rqv1.GroupVersion.String(), "kind": "RenderQueue",
		"metadata": map[string]any{"name": name, "namespace": namespace},
		"spec":     spec,
	}}
}

// withLooseCRD runs create while the RenderQueue CRD accepts any spec and any name, as a CRD
// from before the validation rules did, and restores the CRD after it, waiting until the API
// server enforces the rules again.
func withLooseCRD(create func(g Gomega)) {
	GinkgoHelper()
	crd := &unstructured.Unstructured{}
	crd.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
	key := client.ObjectKey{Name: "renderqueues." + rqv1.GroupVersion.Group}
	Expect(k8sClient.Get(suiteCtx, key, crd)).To(Succeed())
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	strict := versions[0].(map[string]any)["schema"]
	restore := func() {
		GinkgoHelper()
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(suiteCtx, key, crd)).To(Succeed())
			vs, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
			vs[0].(map[string]any)["schema"] = strict
			g.Expect(unstructured.SetNestedSlice(crd.Object, vs, "spec", "versions")).To(Succeed())
			g.Expect(k8sClient.Update(suiteCtx, crd)).To(Succeed())
		}).Should(Succeed())
	}
	DeferCleanup(restore)

	loose, _, _ := unstructured.NestedMap(strict.(map[string]any), "openAPIV3Schema")
	loose["properties"].(map[string]any)["spec"] = map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}
	delete(loose, "x-kubernetes-validations") // the name rule
	versions[0].(map[string]any)["schema"] = map[string]any{"openAPIV3Schema": loose}
	Expect(unstructured.SetNestedSlice(crd.Object, versions, "spec", "versions")).To(Succeed())
	Expect(k8sClient.Update(suiteCtx, crd)).To(Succeed())
	Eventually(create).WithTimeout(30 * time.Second).Should(Succeed())

	restore()
	ns := newNamespace("probe")
	Eventually(func(g Gomega) {
		err := k8sClient.Create(suiteCtx, rawQueue(ns, "probe", map[string]any{"window": "2562048h"}))
		g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "the restored CRD does not validate yet: %v", err)
	}).WithTimeout(30 * time.Second).Should(Succeed())
}

// expectBlocked waits for rq's Reconciled condition to be False with reason and a message
// containing text, and a warning event saying so; and checks that rq has no shard Pods.
func expectBlocked(rq *rqv1.RenderQueue, reason, text string) {
	GinkgoHelper()
	expectReconciledFalse(rq, reason, text)
	Eventually(func(g Gomega) {
		g.Expect(eventMessage(g, rq, reason)).To(ContainSubstring(text))
	}).WithTimeout(15 * time.Second).Should(Succeed())
	var pods corev1.PodList
	Expect(k8sClient.List(suiteCtx, &pods, client.InNamespace(rq.Namespace), client.MatchingLabels{rqv1.LabelQueue: rq.Name})).To(Succeed())
	Expect(pods.Items).To(BeEmpty(), "a RenderQueue blocked by %s got shard Pods", reason)
}

var _ = Describe("RenderQueues stored before the API's rules", func() {
	It("are reported on the object, left alone, and never stop the others", func() {
		ns := newNamespace("stored")
		withLooseCRD(func(g Gomega) {
			for _, u := range []*unstructured.Unstructured{
				rawQueue(ns, "overflow", map[string]any{"shards": int64(1), "window": "2562048h"}),
				rawQueue(ns, "tiny-lease", map[string]any{"shards": int64(1), "leaseDuration": "1ns"}),
				rawQueue(ns, "web.prod", map[string]any{"shards": int64(1)}),
				rawQueue(ns, "other-ns-secret", map[string]any{"shards": int64(1),
					"store": map[string]any{"secretRef": map[string]any{"name": "db/pg", "key": "dsn"}}}),
			} {
				g.Expect(client.IgnoreAlreadyExists(k8sClient.Create(suiteCtx, u))).To(Succeed())
			}
		})

		By("a RenderQueue created after them is reconciled")
		rq, _ := newQueue("after", 2, 2)
		settled(rq, 2)
		Expect(condOf(getQueue(Default, rq), rqv1.ConditionReconciled).Reason).To(Equal(rqv1.ReasonReconcileSucceeded))

		By("each of them says what is wrong, naming the field, with a warning event")
		queue := func(name string) *rqv1.RenderQueue {
			return &rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		}
		// the operator may have written their status while the loose CRD was in place: clear it,
		// so that what follows is written under the rules (which must not refuse a status write
		// to an object stored before them)
		for _, name := range []string{"overflow", "tiny-lease", "web.prod", "other-ns-secret"} {
			Eventually(func(g Gomega) {
				u := &unstructured.Unstructured{}
				u.SetGroupVersionKind(rqv1.GroupVersion.WithKind("RenderQueue"))
				g.Expect(k8sClient.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: name}, u)).To(Succeed())
				unstructured.RemoveNestedField(u.Object, "status")
				g.Expect(k8sClient.Status().Update(suiteCtx, u)).To(Succeed())
			}).Should(Succeed())
		}
		expectBlocked(queue("overflow"), rqv1.ReasonInvalidSpec, `spec.window: time: invalid duration "2562048h"`)
		expectBlocked(queue("tiny-lease"), rqv1.ReasonInvalidSpec, "spec.leaseDuration: Invalid value: \"1ns\": must be from 1s to 24h0m0s")
		expectBlocked(queue("web.prod"), rqv1.ReasonInvalidSpec, "metadata.name: Invalid value: \"web.prod\"")
		expectBlocked(queue("other-ns-secret"), rqv1.ReasonInvalidSpec, "spec.store.secretRef.name: Invalid value: \"db/pg\"")
		for _, name := range []string{"overflow", "tiny-lease"} {
			err := k8sClient.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: name + "-api-token"}, &corev1.Secret{})
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%s got a token Secret (err %v)", name, err)
		}

		By("fixing one: it is reconciled")
		fixed := rawQueue(ns, "tiny-lease", map[string]any{"shards": int64(1), "leaseDuration": "30s"})
		Eventually(func(g Gomega) {
			var cur unstructured.Unstructured
			cur.SetGroupVersionKind(fixed.GroupVersionKind())
			g.Expect(k8sClient.Get(suiteCtx, client.ObjectKeyFromObject(fixed), &cur)).To(Succeed())
			g.Expect(unstructured.SetNestedField(cur.Object, "30s", "spec", "leaseDuration")).To(Succeed())
			g.Expect(k8sClient.Update(suiteCtx, &cur)).To(Succeed())
		}).Should(Succeed())
		f := newFakeShard(k8sClient, ns, "tiny-lease", rqv1.ShardName("tiny-lease", 0))
		fakes.add(f)
		lease := settled(queue("tiny-lease"), 1)
		Expect(condOf(lease, rqv1.ConditionReconciled).Reason).To(Equal(rqv1.ReasonReconcileSucceeded))
		Eventually(func(g Gomega) {
			g.Expect(eventMessage(g, lease, rqv1.ReasonReconcileSucceeded)).NotTo(BeEmpty())
		}).Should(Succeed())
	})
})

var _ = Describe("An image the operator does not run", func() {
	It("gets no Pods and a condition saying so, until it is one it runs", func() {
		ns := newNamespace("denied")
		fakes.add(newFakeShard(k8sClient, ns, "denied", rqv1.ShardName("denied", 0)))
		rq := &rqv1.RenderQueue{
			ObjectMeta: metav1.ObjectMeta{Name: "denied", Namespace: ns},
			Spec: rqv1.RenderQueueSpec{Shards: 1, Image: "evil.example/miner:latest",
				Store: rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "pg", Key: "dsn"}}},
		}
		Expect(k8sClient.Create(suiteCtx, rq)).To(Succeed())
		expectBlocked(rq, rqv1.ReasonImageNotAllowed, `spec.image "evil.example/miner:latest" is not among the images the operator runs (--allowed-images `+testAllowedImages+")")
		Consistently(func(g Gomega) {
			var pods corev1.PodList
			g.Expect(k8sClient.List(suiteCtx, &pods, client.InNamespace(ns))).To(Succeed())
			g.Expect(pods.Items).To(BeEmpty())
		}).WithTimeout(time.Second).Should(Succeed())

		By("an allowed image")
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			got.Spec.Image = "registry.example/renderqueue:v2"
			g.Expect(k8sClient.Update(suiteCtx, got)).To(Succeed())
		}).Should(Succeed())
		got := settled(rq, 1)
		Expect(condOf(got, rqv1.ConditionReconciled).Status).To(Equal(metav1.ConditionTrue))
		var pod corev1.Pod
		Expect(k8sClient.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: rqv1.ShardName("denied", 0)}, &pod)).To(Succeed())
		Expect(pod.Spec.Containers[0].Image).To(Equal("registry.example/renderqueue:v2"))
	})
})

var _ = Describe("A shard Pod the API server refuses", func() {
	It("is a warning and a condition, and the poll and the status go on", func() {
		rq, fs := newQueue("refused", 2, 2)
		settled(rq, 2)

		By("naming a PriorityClass that does not exist: shard 0 is replaced and its Pod refused")
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			got.Spec.PriorityClassName = "missing-class"
			g.Expect(k8sClient.Update(suiteCtx, got)).To(Succeed())
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			c := condOf(got, rqv1.ConditionReconciled)
			g.Expect(c.Reason).To(Equal(rqv1.ReasonShardPodRefused))
			g.Expect(c.Message).To(ContainSubstring("the API server refused shard Pod refused-shard-0"))
			g.Expect(c.Message).To(ContainSubstring("no PriorityClass with name missing-class was found"))
			g.Expect(eventMessage(g, rq, rqv1.ReasonShardPodRefused)).To(Equal(c.Message))
		}).WithTimeout(15 * time.Second).Should(Succeed())

		By("the other shard's figures still reach the status")
		fs[1].set(func(f *fakeShard) { f.due = 4242 })
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			g.Expect(got.Status.Due).To(BeEquivalentTo(4242))
			g.Expect(got.Status.DueExact).To(BeFalse(), "shard 0 is down, so the sum is a lower bound")
			g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		}).WithTimeout(15 * time.Second).Should(Succeed())

		By("creating the PriorityClass")
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "missing-class"}, Value: 1000}
		Expect(k8sClient.Create(suiteCtx, pc)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(suiteCtx, pc))).To(Succeed()) })
		fs[1].set(func(f *fakeShard) { f.due = 10 })
		got := settled(rq, 2)
		Expect(condOf(got, rqv1.ConditionReconciled).Status).To(Equal(metav1.ConditionTrue))
	})
})

var _ = Describe("The token Secret", func() {
	It("is created again, before the Pod that mounts it, when it was deleted", func() {
		rq, _ := newQueue("retoken", 1, 1)
		settled(rq, 1)
		key := client.ObjectKey{Namespace: rq.Namespace, Name: specs.TokenSecretName(rq)}
		var secret corev1.Secret
		Expect(k8sClient.Get(suiteCtx, key, &secret)).To(Succeed())
		Expect(k8sClient.Delete(suiteCtx, &secret)).To(Succeed())
		var pod corev1.Pod
		Expect(k8sClient.Get(suiteCtx, client.ObjectKey{Namespace: rq.Namespace, Name: rqv1.ShardName(rq.Name, 0)}, &pod)).To(Succeed())
		Expect(k8sClient.Delete(suiteCtx, &pod)).To(Succeed())
		Eventually(func(g Gomega) {
			var again corev1.Pod
			g.Expect(k8sClient.Get(suiteCtx, client.ObjectKeyFromObject(&pod), &again)).To(Succeed())
			g.Expect(again.UID).NotTo(Equal(pod.UID))
			var s corev1.Secret
			g.Expect(k8sClient.Get(suiteCtx, key, &s)).To(Succeed())
			g.Expect(s.CreationTimestamp.Time).NotTo(BeTemporally(">", again.CreationTimestamp.Time))
			g.Expect(s.Data[specs.TokenKey]).To(HaveLen(64))
			g.Expect(s.UID).NotTo(Equal(secret.UID))
		}).WithTimeout(15 * time.Second).Should(Succeed())
	})
})
