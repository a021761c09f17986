package controllers

import (
	"errors"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

var _ = Describe("A malformed status.membership", func() {
	It("is reported in the Reconciled condition and not retried", func() {
		rq, _ := newQueue("badms", 2, 2)
		before := settled(rq, 2)
		good := before.Status.Membership.Assignment[0].Slots
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			got.Status.Membership.Assignment[0].Slots = "0-2000" // no such slot
			g.Expect(k8sClient.Status().Update(suiteCtx, got)).To(Succeed())
		}).Should(Succeed())

		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			c := condOf(got, rqv1.ConditionReconciled)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(rqv1.ReasonInvalidMembership))
			g.Expect(c.Message).To(ContainSubstring("status.membership"))
			g.Expect(eventMessage(g, rq, rqv1.ReasonInvalidMembership)).To(ContainSubstring("0-2000"))
		}).Should(Succeed())
		// the record is left as it is: nothing rewrites the membership the operator cannot read
		Consistently(func(g Gomega) {
			g.Expect(getQueue(g, rq).Status.Membership.Assignment[0].Slots).To(Equal("0-2000"))
		}).WithTimeout(2 * testPollInterval).Should(Succeed())

		// a reconcile of it ends in a terminal error: controller-runtime does not requeue it
		r := &RenderQueueReconciler{Client: k8sClient, Scheme: k8sClient.Scheme()}
		_, err := r.Reconcile(suiteCtx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(rq)})
		Expect(errors.Is(err, reconcile.TerminalError(nil))).To(BeTrue(), "error %v is not terminal", err)

		// fixed, it is reconciled again (here by a reconcile of the fixed object)
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			got.Status.Membership.Assignment[0].Slots = good
			g.Expect(k8sClient.Status().Update(suiteCtx, got)).To(Succeed())
		}).Should(Succeed())
		_, err = r.Reconcile(suiteCtx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(rq)})
		Expect(err).NotTo(HaveOccurred())
		Eventually(func(g Gomega) {
			g.Expect(condOf(getQueue(g, rq), rqv1.ConditionReconciled).Status).To(Equal(metav1.ConditionTrue))
		}).Should(Succeed())
	})
})
