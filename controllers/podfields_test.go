package controllers

import (
	"fmt"
	"slices"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/policy"
	"github.com/renderqueue/renderqueue/controllers/specs"
)

// The Deployment-like pod fields (imagePullSecrets, podLabels, podAnnotations, priorityClassName,
// topologySpreadConstraints) against the real API server: its admission resolves the
// PriorityClass and validates the Pods, so a field the operator wired wrongly fails here.
var _ = Describe("Shard Pod fields", func() {
	It("puts the pod fields on every shard Pod and replaces the shards one at a time when they change", func() {
		for _, pc := range []string{"rq-queue-critical", "rq-queue-batch"} {
			class := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: pc}, Value: 1000}
			if pc == "rq-queue-batch" {
				class.Value = 10
			}
			Expect(client.IgnoreAlreadyExists(k8sClient.Create(suiteCtx, class))).To(Succeed())
		}

		const name = "dressed"
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("rq-%d-%s", nsCounter.Add(1), name)}}
		Expect(k8sClient.Create(suiteCtx, ns)).To(Succeed())
		for i := range 2 {
			fakes.add(newFakeShard(k8sClient, ns.Name, name, rqv1.ShardName(name, i)))
		}
		rq := &rqv1.RenderQueue{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns.Name},
			Spec: rqv1.RenderQueueSpec{
				Shards:            2,
				Store:             rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "pg", Key: "dsn"}},
				ImagePullSecrets:  []rqv1.LocalSecretReference{{Name: "regcred"}, {Name: "mirror"}},
				PodLabels:         map[string]rqv1.LabelValue{"team": "render", "example.com/cost-center": "42"},
				PodAnnotations:    map[string]string{"example.com/scrape": "true", "note": `{"json": ["ok"]}`},
				PriorityClassName: "rq-queue-critical",
				TopologySpreadConstraints: []rqv1.TopologySpreadConstraint{
					{MaxSkew: 1, TopologyKey: "topology.kubernetes.io/zone", WhenUnsatisfiable: corev1.DoNotSchedule, MinDomains: ptr.To[int32](2)},
					{MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.ScheduleAnyway, MatchLabelKeys: []string{"team"}},
				},
			},
		}
		Expect(k8sClient.Create(suiteCtx, rq)).To(Succeed())
		settled(rq, 2)

		shardSelector := &metav1.LabelSelector{MatchLabels: map[string]string{rqv1.LabelQueue: name, rqv1.LabelComponent: specs.ComponentKeeper}}
		var pods corev1.PodList
		Expect(k8sClient.List(suiteCtx, &pods, client.InNamespace(ns.Name))).To(Succeed())
		Expect(pods.Items).To(HaveLen(2))
		for _, pod := range pods.Items {
			Expect(pod.Labels).To(HaveKeyWithValue("team", "render"), pod.Name)
			Expect(pod.Labels).To(HaveKeyWithValue("example.com/cost-center", "42"), pod.Name)
			Expect(pod.Labels).To(HaveKeyWithValue(rqv1.LabelQueue, name), pod.Name)
			Expect(pod.Labels).To(HaveKeyWithValue(rqv1.LabelShard, pod.Name), pod.Name)
			Expect(pod.Annotations).To(HaveKeyWithValue("example.com/scrape", "true"), pod.Name)
			Expect(pod.Annotations).To(HaveKeyWithValue("note", `{"json": ["ok"]}`), pod.Name)
			Expect(pod.Annotations).To(HaveKey(rqv1.AnnotationPodTemplateHash), pod.Name)
			Expect(pod.Spec.ImagePullSecrets).To(Equal([]corev1.LocalObjectReference{{Name: "regcred"}, {Name: "mirror"}}), pod.Name)
			Expect(pod.Spec.PriorityClassName).To(Equal("rq-queue-critical"), pod.Name)
			Expect(pod.Spec.Priority).To(HaveValue(BeEquivalentTo(1000)), "%s: the Priority admission resolved the class", pod.Name)
			tsc := pod.Spec.TopologySpreadConstraints
			Expect(tsc).To(HaveLen(2), pod.Name)
			Expect(tsc[0].TopologyKey).To(Equal("topology.kubernetes.io/zone"))
			Expect(tsc[0].WhenUnsatisfiable).To(Equal(corev1.DoNotSchedule))
			Expect(tsc[0].MinDomains).To(HaveValue(BeEquivalentTo(2)))
			Expect(tsc[1].TopologyKey).To(Equal("kubernetes.io/hostname"))
			Expect(tsc[1].WhenUnsatisfiable).To(Equal(corev1.ScheduleAnyway))
			for _, c := range tsc {
				// The API server may merge matchLabelKeys into the selector (as team In (render));
				// the shard selector must be there either way.
				Expect(c.LabelSelector).NotTo(BeNil())
				for k, v := range shardSelector.MatchLabels {
					Expect(c.LabelSelector.MatchLabels).To(HaveKeyWithValue(k, v), "%s: spread selector %v", pod.Name, c.LabelSelector)
				}
			}
			Expect(tsc[1].MatchLabelKeys).To(Equal([]string{"team"}))
		}

		By("changing the pod labels and the priority class")
		stop := watchShardDeletions(rq, 2)
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			got.Spec.PodLabels["team"] = "crawl"
			got.Spec.PriorityClassName = "rq-queue-batch"
			g.Expect(k8sClient.Update(suiteCtx, got)).To(Succeed())
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			var pods corev1.PodList
			g.Expect(k8sClient.List(suiteCtx, &pods, client.InNamespace(ns.Name))).To(Succeed())
			g.Expect(pods.Items).To(HaveLen(2))
			for _, p := range pods.Items {
				g.Expect(p.Labels).To(HaveKeyWithValue("team", "crawl"), p.Name)
				g.Expect(p.Spec.PriorityClassName).To(Equal("rq-queue-batch"), p.Name)
				g.Expect(p.Spec.Priority).To(HaveValue(BeEquivalentTo(10)), p.Name)
				g.Expect(policy.PodReady(&p)).To(BeTrue(), p.Name)
			}
		}).WithTimeout(45 * time.Second).Should(Succeed())
		settled(rq, 2)
		order, violations := stop()
		Expect(violations).To(BeEmpty())
		Expect(order).To(Equal([]string{name + "-shard-0", name + "-shard-1"}), "each shard replaced once, in order")
		Eventually(func(g Gomega) {
			g.Expect(countOf(eventReasons(g, rq), EventShardReplacing)).To(Equal(2))
		}).Should(Succeed())

		By("changing only an annotation")
		stop = watchShardDeletions(rq, 2)
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			got.Spec.PodAnnotations["example.com/scrape"] = "false"
			g.Expect(k8sClient.Update(suiteCtx, got)).To(Succeed())
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			var pods corev1.PodList
			g.Expect(k8sClient.List(suiteCtx, &pods, client.InNamespace(ns.Name))).To(Succeed())
			g.Expect(pods.Items).To(HaveLen(2))
			for _, p := range pods.Items {
				g.Expect(p.Annotations).To(HaveKeyWithValue("example.com/scrape", "false"), p.Name)
				g.Expect(policy.PodReady(&p)).To(BeTrue(), p.Name)
			}
		}).WithTimeout(45 * time.Second).Should(Succeed())
		settled(rq, 2)
		order, violations = stop()
		Expect(violations).To(BeEmpty())
		Expect(order).To(Equal([]string{name + "-shard-0", name + "-shard-1"}))
	})
})

// watchShardDeletions watches rq's namespace and records every shard Pod deletion; at each one,
// every other of the shards shard Pods must exist and be Ready (one shard down at a time). stop
// ends the watch and returns the deletions in order and the violations.
func watchShardDeletions(rq *rqv1.RenderQueue, shards int) func() (deletions, violations []string) {
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
				for i := range shards {
					other := rq.ShardName(i)
					if other != pod.Name && !state[other] {
						violations = append(violations, fmt.Sprintf("%s deleted while %s was not ready", pod.Name, other))
					}
				}
				mu.Unlock()
				delete(state, pod.Name)
			}
		}
	}()
	return func() ([]string, []string) {
		w.Stop()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(deletions), slices.Clone(violations)
	}
}

func countOf(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}
