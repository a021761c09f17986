package controllers

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/specs"
)

var _ = Describe("The operator's cache", func() {
	It("holds the RenderQueue's children, not unlabelled Pods; and the operator reads no Secret at all", func() {
		rq, _ := newQueue("cached", 1, 1)
		ns := rq.Namespace
		// the store Secret the RenderQueue names, and someone else's Pod, both unlabelled
		store := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pg", Namespace: ns},
			StringData: map[string]string{"dsn": "postgres://u:p@db/x"}}
		Expect(k8sClient.Create(suiteCtx, store)).To(Succeed())
		other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: ns},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		Expect(k8sClient.Create(suiteCtx, other)).To(Succeed())
		// a labelled Pod created after them: once the cache holds it, it has seen the
		// unlabelled one too if it were to hold it
		sentinelPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sentinel", Namespace: ns,
			Labels: map[string]string{rqv1.LabelQueue: "none"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		Expect(k8sClient.Create(suiteCtx, sentinelPod)).To(Succeed())

		Eventually(func(g Gomega) {
			g.Expect(mgrCache.Get(suiteCtx, client.ObjectKeyFromObject(sentinelPod), &corev1.Pod{})).To(Succeed())
			// the operator's own children are there
			g.Expect(mgrCache.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: rqv1.ShardName(rq.Name, 0)}, &corev1.Pod{})).To(Succeed())
		}).Should(Succeed())

		err := mgrCache.Get(suiteCtx, client.ObjectKeyFromObject(other), &corev1.Pod{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "an unlabelled Pod is in the operator's cache (err %v)", err)
		var pods corev1.PodList
		Expect(mgrCache.List(suiteCtx, &pods, client.InNamespace(ns))).To(Succeed())
		for _, o := range objectsOf(pods.Items) {
			Expect(o.GetLabels()).To(HaveKey(rqv1.LabelQueue), "%s in the cache has no %s label", o.GetName(), rqv1.LabelQueue)
		}

		By("the token Secret exists, created by an operator that may not read Secrets")
		var token corev1.Secret
		Expect(k8sClient.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: specs.TokenSecretName(rq)}, &token)).To(Succeed())
		Expect(ownedBy(&token, rq)).To(BeTrue())
		operator, err := client.New(operatorCfg, client.Options{Scheme: k8sClient.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		for _, name := range []string{store.Name, token.Name} {
			err = operator.Get(suiteCtx, client.ObjectKey{Namespace: ns, Name: name}, &corev1.Secret{})
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "the operator's credentials read the Secret %s (err %v)", name, err)
		}
		err = operator.List(suiteCtx, &corev1.SecretList{}, client.InNamespace(ns))
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "the operator's credentials list Secrets (err %v)", err)
	})
})

// objectsOf returns pointers to items as client.Objects.
func objectsOf[T any, PT interface {
	*T
	client.Object
}](items []T) []client.Object {
	out := make([]client.Object, len(items))
	for i := range items {
		out[i] = PT(&items[i])
	}
	return out
}

var _ = Describe("A child's name taken by an unlabelled object", func() {
	It("is left alone with a ChildConflict event, and taken over once labelled", func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("rq-%d-taken", nsCounter.Add(1))}}
		Expect(k8sClient.Create(suiteCtx, ns)).To(Succeed())
		theirs := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "taken-shards", Namespace: ns.Name},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "web", Port: 80}}}}
		Expect(k8sClient.Create(suiteCtx, theirs)).To(Succeed())
		f := newFakeShard(k8sClient, ns.Name, "taken", rqv1.ShardName("taken", 0))
		fakes.add(f)
		rq := &rqv1.RenderQueue{
			ObjectMeta: metav1.ObjectMeta{Name: "taken", Namespace: ns.Name},
			Spec:       rqv1.RenderQueueSpec{Shards: 1, Store: rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "pg", Key: "dsn"}}},
		}
		Expect(k8sClient.Create(suiteCtx, rq)).To(Succeed())

		Eventually(func(g Gomega) {
			g.Expect(eventMessage(g, rq, EventChildConflict)).To(And(ContainSubstring("headless Service taken-shards"),
				ContainSubstring("not labelled "+rqv1.LabelQueue+"=taken")))
		}).WithTimeout(15 * time.Second).Should(Succeed())
		var svc corev1.Service
		Expect(k8sClient.Get(suiteCtx, client.ObjectKeyFromObject(theirs), &svc)).To(Succeed())
		Expect(svc.OwnerReferences).To(BeEmpty(), "the operator took over an object it does not manage")
		Expect(svc.Spec.Ports).To(HaveLen(1))
		Expect(svc.Spec.Ports[0].Name).To(Equal("web"))

		By("labelling it")
		svc.Labels = map[string]string{rqv1.LabelQueue: "taken"}
		Expect(k8sClient.Update(suiteCtx, &svc)).To(Succeed())
		settled(rq, 1)
		Expect(k8sClient.Get(suiteCtx, client.ObjectKeyFromObject(theirs), &svc)).To(Succeed())
		Expect(ownedBy(&svc, rq)).To(BeTrue())
	})
})
