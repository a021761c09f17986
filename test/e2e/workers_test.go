//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// stepWorkers replaces the HPA step's stand-in Deployment (pause Pods, so that nothing completed
// rows while the earlier steps compared the due count with SQL) by the render workers users
// apply: config/samples/workers as shipped, with the shard CA mounted as its comments say (the
// queue serves TLS) — worker-sim on pkg/client, discovering the shards through the RenderQueue
// with its own ServiceAccount, the API token from web-api-token, verifying the shards with the CA
// of web-shard-ca, and the HPA on renderqueue_due. The worker Pods must drain every due row: the queue ends exact with a
// due count of 0, SQL agrees, and the HPA reads the drained count.
func (e *env) stepWorkers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	before := e.sqlDue()
	if before == 0 {
		t.Fatal("no rows are due before the workers start: the step could not tell them working")
	}
	e.kubectl("-n", namespace, "delete", "hpa,deployment", workers, "--wait=true")
	out := e.kubectl("-n", namespace, "apply", "-k", workersWithTLS(t, e.root))
	t.Logf("kubectl apply -k config/samples/workers (with the shard CA mounted, --tls-ca-file):\n%s", strings.TrimSpace(out))

	e.eventually(t, 90*time.Second, 500*time.Millisecond, "the sample's worker Pods running", func() (bool, string) {
		pods, err := e.c.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + workers})
		if err != nil {
			return false, err.Error()
		}
		running := 0
		var states []string
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Running != nil {
				running++
			}
			states = append(states, fmt.Sprintf("%s %s %v", p.Name, p.Status.Phase, p.Status.ContainerStatuses))
		}
		return running > 0, strings.Join(states, "; ")
	})
	t.Logf("kubectl get pods -l app.kubernetes.io/name=%s -o wide:\n%s", workers,
		e.kubectl("-n", namespace, "get", "pods", "-l", "app.kubernetes.io/name="+workers, "-o", "wide"))

	e.eventually(t, 2*time.Minute, time.Second, fmt.Sprintf("the workers to drain the %d due rows", before), func() (bool, string) {
		st := e.queue().Status
		sql := e.sqlDue()
		return sql == 0 && st.DueExact && st.Due == 0, fmt.Sprintf("SQL due %d; status due %d exact %v", sql, st.Due, st.DueExact)
	})
	e.exactAndTrue(30*time.Second, 4)
	t.Logf("kubectl logs -l app.kubernetes.io/name=%s --tail=3:\n%s", workers,
		e.kubectl("-n", namespace, "logs", "-l", "app.kubernetes.io/name="+workers, "--tail=3", "--prefix"))

	e.eventually(t, 90*time.Second, time.Second, "the sample HPA to read the drained count", func() (bool, string) {
		h, err := e.c.Client.AutoscalingV2().HorizontalPodAutoscalers(namespace).Get(ctx, workers, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		active := hpaCondition(h, autoscalingv2.ScalingActive)
		if active == nil || active.Status != corev1.ConditionTrue || len(h.Status.CurrentMetrics) == 0 {
			return false, hpaSummary(h)
		}
		m := h.Status.CurrentMetrics[0].External
		return m != nil && m.Current.AverageValue != nil && m.Current.AverageValue.IsZero(), hpaSummary(h)
	})
	t.Logf("kubectl describe hpa %s:\n%s", workers, e.kubectl("-n", namespace, "describe", "hpa", workers))
}
