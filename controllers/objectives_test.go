package controllers

import (
	"encoding/json"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/policy"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

var _ = Describe("Freshness objectives", func() {
	It("sums the shards' event counters into status.objectives and ObjectivesMet, keeps the history in a ConfigMap it owns, and clears both when the objectives go", func() {
		since := time.Now().Add(-time.Hour).UTC().Truncate(time.Second) // the keepers counted before the history began
		rq, fs := newQueue("slo", 2, 2, func(rq *rqv1.RenderQueue) {
			rq.Spec.Objectives = []rqv1.Objective{{Name: "hourly", Class: rqv1.ObjectiveClass{MaxCadence: &metav1.Duration{Duration: time.Hour}},
				Percentile: "99", MaxLateness: metav1.Duration{Duration: 10 * time.Minute}}}
		})
		set := func(f *fakeShard, good, late uint64) {
			f.set(func(f *fakeShard) {
				f.objectives = []shardapi.ObjectiveCount{{Name: "hourly", Percentile: 99, Good: good, Late: late, Since: since}}
			})
		}
		set(fs[0], 5000, 10)
		set(fs[1], 3000, 0)
		history := func(g Gomega) policy.ObjectiveHistory {
			var cm corev1.ConfigMap
			g.Expect(k8sClient.Get(suiteCtx, client.ObjectKey{Namespace: rq.Namespace, Name: rqv1.ObjectiveHistoryConfigMapName(rq.Name)}, &cm)).To(Succeed())
			var h policy.ObjectiveHistory
			g.Expect(json.Unmarshal([]byte(cm.Data[rqv1.ObjectiveHistoryKey]), &h)).To(Succeed())
			return h
		}
		By("the first polls: the history begins, the shards' counters are written at once, what they counted before is not taken")
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			g.Expect(got.Status.Objectives).To(HaveLen(1))
			o := got.Status.Objectives[0]
			g.Expect(o.Name).To(Equal("hourly"))
			g.Expect(o.Window.Duration).To(Equal(rqv1.DefaultObjectiveWindow))
			g.Expect(o.Good + o.Late).To(BeZero())
			g.Expect(condOf(got, rqv1.ConditionObjectivesMet).Reason).To(Equal(rqv1.ReasonNoObjectiveEvents))
			h := history(g)
			g.Expect(h.Shards).To(HaveKeyWithValue("slo-shard-0/hourly", policy.ShardObjectiveCounters{Since: since, Good: 5000, Late: 10}))
			g.Expect(h.Shards).To(HaveKeyWithValue("slo-shard-1/hourly", policy.ShardObjectiveCounters{Since: since, Good: 3000}))
		}).WithTimeout(30 * time.Second).Should(Succeed())

		By("events: 990 good and 10 late more, summed over the shards")
		set(fs[0], 5600, 15)
		set(fs[1], 3390, 5)
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			o := got.Status.Objectives[0]
			g.Expect(o.Good).To(BeEquivalentTo(990))
			g.Expect(o.Late).To(BeEquivalentTo(10))
			g.Expect(o.Attainment).To(Equal("99%"))
			g.Expect(o.BudgetRemaining).To(Equal("0%"))
			g.Expect(o.BurnRate1h).To(Equal("1"))
			g.Expect(o.Met).To(BeTrue())
			g.Expect(condOf(got, rqv1.ConditionObjectivesMet).Status).To(Equal(metav1.ConditionTrue))
		}).WithTimeout(30 * time.Second).Should(Succeed())

		By("more late events: the objective is missed, and the condition names it")
		set(fs[1], 3390, 25)
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			c := condOf(got, rqv1.ConditionObjectivesMet)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(rqv1.ReasonObjectiveMissed))
			g.Expect(c.Message).To(ContainSubstring("hourly: 97.06% of 1,020 events good over 672h0m0s, below 99%"))
		}).WithTimeout(30 * time.Second).Should(Succeed())

		By("the history ConfigMap is owned by the RenderQueue")
		var cm corev1.ConfigMap
		Expect(k8sClient.Get(suiteCtx, client.ObjectKey{Namespace: rq.Namespace, Name: rqv1.ObjectiveHistoryConfigMapName(rq.Name)}, &cm)).To(Succeed())
		Expect(cm.OwnerReferences).To(HaveLen(1))
		Expect(cm.OwnerReferences[0].Name).To(Equal(rq.Name))

		By("the objectives removed: status and condition cleared")
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			got.Spec.Objectives = nil
			g.Expect(k8sClient.Update(suiteCtx, got)).To(Succeed())
		}).WithTimeout(10 * time.Second).Should(Succeed())
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			g.Expect(got.Status.Objectives).To(BeEmpty())
			g.Expect(condOf(got, rqv1.ConditionObjectivesMet).Type).To(BeEmpty())
		}).WithTimeout(30 * time.Second).Should(Succeed())
	})
})
