package controllers

import (
	"fmt"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/policy"
	"github.com/renderqueue/renderqueue/controllers/specs"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// shardOf returns the named shard's status of rq, or a zero one.
func shardOf(rq *rqv1.RenderQueue, name string) rqv1.ShardStatus {
	for _, s := range rq.Status.Shards {
		if s.Name == name {
			return s
		}
	}
	return rqv1.ShardStatus{}
}

var _ = Describe("A shard that cannot run", func() {
	It("says why from the Pod's container status, and recovers", func() {
		rq, fs := newQueue("broken", 2, 2)
		rq = settled(rq, 2)
		name := rqv1.ShardName(rq.Name, 1)
		key := client.ObjectKey{Namespace: rq.Namespace, Name: name}

		By("recreating shard 1's Pod while its store Secret is missing")
		kubelet.hold(rq.Namespace, name)
		var old corev1.Pod
		Expect(k8sClient.Get(suiteCtx, key, &old)).To(Succeed())
		Expect(k8sClient.Delete(suiteCtx, &old)).To(Succeed())
		setStatus := func(status corev1.PodStatus) {
			Eventually(func(g Gomega) {
				var pod corev1.Pod
				g.Expect(k8sClient.Get(suiteCtx, key, &pod)).To(Succeed())
				g.Expect(pod.UID).NotTo(Equal(old.UID))
				pod.Status = status
				g.Expect(k8sClient.Status().Update(suiteCtx, &pod)).To(Succeed())
			}).WithTimeout(15 * time.Second).Should(Succeed())
		}
		setStatus(corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
			Name: specs.KeeperContainerName, Image: testImage,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
				Reason: "CreateContainerConfigError", Message: `secret "pg" not found`}},
		}}})
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			s := shardOf(got, name)
			g.Expect(s.State).To(Equal(policy.StateFailing))
			g.Expect(s.Error).To(Equal(`CreateContainerConfigError: secret "pg" not found`))
			ready := condOf(got, rqv1.ConditionReady)
			g.Expect(ready.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(ready.Message).To(Equal(`1 of 2 shards ready; shard broken-shard-1 cannot run: CreateContainerConfigError: secret "pg" not found`))
			g.Expect(eventMessage(g, rq, policy.EventShardFailing)).To(ContainSubstring(`shard broken-shard-1 cannot run: CreateContainerConfigError: secret "pg" not found`))
			// exported, so that RenderQueueShardFailing fires
			failing := map[string]string{"namespace": rq.Namespace, "renderqueue": rq.Name, "shard": name, "state": policy.StateFailing}
			v, ok := sampleOf(g, "renderqueue_queue_shard_state", failing)
			g.Expect(ok).To(BeTrue(), "renderqueue_queue_shard_state%v missing", failing)
			g.Expect(v).To(BeEquivalentTo(1))
		}).WithTimeout(15 * time.Second).Should(Succeed())

		By("a crash loop")
		// between restarts nothing answers on the Pod's IP
		fs[1].set(func(f *fakeShard) { f.failWith = http.StatusServiceUnavailable })
		setStatus(corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.9.0.1", ContainerStatuses: []corev1.ContainerStatus{{
			Name: specs.KeeperContainerName, Image: testImage, RestartCount: 3,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
				Reason: "CrashLoopBackOff", Message: "back-off 40s restarting failed container"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 1, Reason: "Error", Message: "level=INFO msg=starting\nrenderqueue keeper: --token-file: open /var/run/renderqueue/token/token: permission denied\n"}},
		}}})
		const crash = "CrashLoopBackOff: container keeper exited with code 1 (Error): renderqueue keeper: --token-file: " +
			"open /var/run/renderqueue/token/token: permission denied; restarted 3 times"
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			g.Expect(shardOf(got, name).Error).To(Equal(crash))
			g.Expect(condOf(got, rqv1.ConditionReady).Message).To(ContainSubstring("shard broken-shard-1 cannot run: " + crash))
			g.Expect(condOf(got, rqv1.ConditionExact).Message).To(ContainSubstring("shard broken-shard-1 is not running (" + crash + ")"))
		}).WithTimeout(15 * time.Second).Should(Succeed())

		By("the Pod running again")
		var pod corev1.Pod
		Expect(k8sClient.Get(suiteCtx, key, &pod)).To(Succeed())
		pod.Status = corev1.PodStatus{Phase: corev1.PodPending}
		Expect(k8sClient.Status().Update(suiteCtx, &pod)).To(Succeed())
		fs[1].set(func(f *fakeShard) { f.failWith = 0 })
		kubelet.release(rq.Namespace, name)
		settled(rq, 2)
		Eventually(func(g Gomega) {
			g.Expect(eventMessage(g, rq, policy.EventShardRecovered)).To(ContainSubstring("shard broken-shard-1 recovered"))
		}).WithTimeout(15 * time.Second).Should(Succeed())
	})

	It("shows the error a shard reports while it is not ready (its database unreachable)", func() {
		rq, fs := newQueue("nodb", 2, 2)
		settled(rq, 2)
		const dbErr = "database unreachable: dial tcp 10.0.0.9:5432: connect: connection refused (retrying)"
		fs[0].set(func(f *fakeShard) {
			f.status, f.complete, f.exact, f.walked, f.err = shardapi.StatusUnready, false, false, false, dbErr
		})
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			s := shardOf(got, rqv1.ShardName(rq.Name, 0))
			g.Expect(s.State).To(Equal(shardapi.StatusUnready))
			g.Expect(s.Error).To(Equal(dbErr))
			g.Expect(condOf(got, rqv1.ConditionReady).Message).To(Equal("1 of 2 shards ready; shard nodb-shard-0 is unready: " + dbErr))
			g.Expect(eventMessage(g, rq, policy.EventShardFailing)).To(Equal("shard nodb-shard-0 is unready: " + dbErr))
		}).WithTimeout(15 * time.Second).Should(Succeed())

		fs[0].set(func(f *fakeShard) {
			f.status, f.complete, f.exact, f.walked, f.err = shardapi.StatusQueued, true, true, true, ""
		})
		settled(rq, 2)
		Eventually(func(g Gomega) {
			g.Expect(eventMessage(g, rq, policy.EventShardRecovered)).To(ContainSubstring("shard nodb-shard-0 recovered (was: " + dbErr + ")"))
		}).WithTimeout(15 * time.Second).Should(Succeed())
	})
})

var _ = Describe("A template that cannot run", func() {
	It("is replaced by its fix at once, without waiting for Pods that will never be ready", func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("rq-%d-stuck", nsCounter.Add(1))}}
		Expect(k8sClient.Create(suiteCtx, ns)).To(Succeed())
		names := []string{rqv1.ShardName("stuck", 0), rqv1.ShardName("stuck", 1)}
		for _, n := range names {
			kubelet.hold(ns.Name, n)
			fakes.add(newFakeShard(k8sClient, ns.Name, "stuck", n))
		}
		rq := &rqv1.RenderQueue{
			ObjectMeta: metav1.ObjectMeta{Name: "stuck", Namespace: ns.Name},
			Spec: rqv1.RenderQueueSpec{Shards: 2, Image: "registry.example/renderqueue:typo",
				Store: rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "pg", Key: "dsn"}}},
		}
		Expect(k8sClient.Create(suiteCtx, rq)).To(Succeed())
		uids := map[string]types.UID{}
		for _, n := range names {
			Eventually(func(g Gomega) {
				var pod corev1.Pod
				g.Expect(k8sClient.Get(suiteCtx, client.ObjectKey{Namespace: ns.Name, Name: n}, &pod)).To(Succeed())
				pod.Status = corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
					Name: specs.KeeperContainerName, Image: rq.Spec.Image,
					State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
						Reason: "ImagePullBackOff", Message: `Back-off pulling image "registry.example/renderqueue:typo"`}},
				}}}
				g.Expect(k8sClient.Status().Update(suiteCtx, &pod)).To(Succeed())
				uids[n] = pod.UID
			}).WithTimeout(15 * time.Second).Should(Succeed())
		}
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			g.Expect(condOf(got, rqv1.ConditionReady).Message).To(ContainSubstring("cannot run: ImagePullBackOff"))
		}).WithTimeout(15 * time.Second).Should(Succeed())

		By("fixing the image")
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			got.Spec.Image = testImage
			g.Expect(k8sClient.Update(suiteCtx, got)).To(Succeed())
		}).Should(Succeed())
		// both Pods are replaced while neither is ready (the kubelet still holds them)
		Eventually(func(g Gomega) {
			for _, n := range names {
				var pod corev1.Pod
				g.Expect(k8sClient.Get(suiteCtx, client.ObjectKey{Namespace: ns.Name, Name: n}, &pod)).To(Succeed())
				g.Expect(pod.UID).NotTo(Equal(uids[n]), n)
				g.Expect(pod.Spec.Containers[0].Image).To(Equal(testImage), n)
				g.Expect(policy.PodReady(&pod)).To(BeFalse(), n)
			}
		}).WithTimeout(20 * time.Second).Should(Succeed())
		for _, n := range names {
			kubelet.release(ns.Name, n)
		}
		settled(rq, 2)
	})
})
