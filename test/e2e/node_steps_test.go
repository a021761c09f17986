//go:build e2e

package e2e

// TestEndToEnd's steps that a real node makes possible: kubectl exec into the image, kubectl
// port-forward to a shard's API and to the console, kubectl logs --previous of a restarted
// keeper, render workers finding the shards by cluster DNS, the scheduler applying the shard Pods'
// resource requests, priority class and topology spread, and a keeper OOM-killed by its memory
// limit.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/node"
)

// portForward runs `kubectl port-forward ns/target :port` and returns the local address it
// forwards from; the forward ends with the test.
func (e *env) portForward(t *testing.T, ns, target string, port int) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, filepath.Join(e.c.Assets(), "kubectl"), "-n", ns, "port-forward", target, fmt.Sprintf(":%d", port))
	cmd.Env = e.c.Env()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("kubectl port-forward %s/%s: %v", ns, target, err)
	}
	m := regexp.MustCompile(`Forwarding from (127\.0\.0\.1:\d+) -> `).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("kubectl port-forward %s/%s said %q", ns, target, line)
	}
	return m[1]
}

// stepExecPortForwardLogs: the image as a user would poke at it — `kubectl exec` runs the binary
// of the image (there is no shell), `kubectl port-forward` reaches a shard's API (HTTPS, verified
// with the shard CA for the shards' name) and the console, and `kubectl logs --previous` shows the
// keeper that stepKillKeeper killed.
func (e *env) stepExecPortForwardLogs(t *testing.T) {
	shard := queueName + "-shard-1"
	out := e.kubectl("exec", shard, "-c", "keeper", "--", "/renderqueue", "version")
	if !strings.HasPrefix(strings.TrimSpace(out), "renderqueue v") {
		t.Errorf("kubectl exec %s -- /renderqueue version: %q", shard, out)
	}
	t.Logf("kubectl exec %s -- /renderqueue version: %s", shard, strings.TrimSpace(out))
	if out, err := e.c.Kubectl(context.Background(), nil, "exec", shard, "-c", "keeper", "--", "/bin/sh", "-c", "true"); err == nil {
		t.Errorf("the image has a shell: %q", out)
	}

	addr := e.portForward(t, namespace, "pod/"+shard, 8080)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cm, err := e.c.Client.CoreV1().ConfigMaps(namespace).Get(ctx, rqv1.ShardCAConfigMapName(queueName), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading the shard CA: %v", err)
	}
	hc, err := client.NewHTTPClient(client.TLSOptions{CAPEM: []byte(cm.Data["ca.crt"]), ServerName: rqv1.ShardServerName(namespace, queueName)})
	if err != nil {
		t.Fatal(err)
	}
	st, err := client.GetStatus(ctx, hc, "https://"+addr)
	if err != nil {
		t.Fatalf("GET /v1/status through kubectl port-forward: %v", err)
	}
	t.Logf("through kubectl port-forward %s: status %s, due %d, exact %v", shard, st.Status, st.Due, st.Exact)

	// The console, as docs/console.md says to reach it: its JSON API with the token.
	console := e.portForward(t, operatorNS, "deployment/renderqueue-operator", 8090)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+console+"/api/v1/queues", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.ensureConsoleToken(t))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET the console through kubectl port-forward: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), queueName) {
		t.Errorf("the console's queues through kubectl port-forward: %s %.300q", resp.Status, body)
	}

	prev := e.kubectl("logs", shard, "-c", "keeper", "--previous", "--tail=200")
	if !strings.Contains(prev, "Keeper serving") {
		t.Errorf("kubectl logs --previous %s has no \"Keeper serving\":\n%s", shard, prev)
	}
}

// stepDNSWorker runs a render worker Pod that finds the shards by cluster DNS (the headless
// Service web-shards, through CoreDNS) rather than through the RenderQueue, over HTTPS, for 5 s, one
// row at a time (it leaves the due rows to the workers step): it must see every shard and complete
// rows.
func (e *env) stepDNSWorker(t *testing.T) {
	shards := len(e.queue().Status.Shards)
	manifest := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: dns-worker, namespace: %[1]s}
spec:
  restartPolicy: Never
  securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: worker
    image: %[2]q
    args: [worker-sim, "--dns=%[3]s-shards.%[1]s.svc:8080", --token-file=/var/run/renderqueue/token,
      --tls-ca-file=/var/run/renderqueue-ca/ca.crt, --duration=5s, --concurrency=1, --batch=1,
      --render-time=500ms, --progress=0]
    securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
    volumeMounts:
    - {name: token, mountPath: /var/run/renderqueue, readOnly: true}
    - {name: ca, mountPath: /var/run/renderqueue-ca, readOnly: true}
  volumes:
  - {name: token, secret: {secretName: %[3]s-api-token, items: [{key: token, path: token}]}}
  - {name: ca, configMap: {name: %[4]s}}
`, namespace, e.images.Renderqueue, queueName, rqv1.ShardCAConfigMapName(queueName))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := e.c.Kubectl(ctx, []byte(manifest), "apply", "-f", "-"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	defer func() { _, _ = e.c.Kubectl(context.Background(), nil, "delete", "pod", "dns-worker", "--wait=false") }()
	e.eventually(t, 90*time.Second, time.Second, "the DNS worker to finish", func() (bool, string) {
		p := e.pod(t, namespace, "dns-worker")
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, string(p.Status.Phase)
	})
	logs := e.kubectl("logs", "dns-worker")
	t.Logf("dns-worker: %s", strings.TrimSpace(logs))
	m := regexp.MustCompile(`worker-sim done: [0-9.]+s: (\d+) shards, .* completed (\d+) `).FindStringSubmatch(logs)
	if m == nil || m[1] != fmt.Sprint(shards) || m[2] == "0" {
		t.Errorf("the worker finding the shards by DNS did not see the %d shards or completed nothing: %q", shards, logs)
	}
	if p := e.pod(t, namespace, "dns-worker"); p.Status.Phase != corev1.PodSucceeded {
		t.Errorf("the DNS worker ended %s", p.Status.Phase)
	}
}

// stepScheduling applies a RenderQueue whose shard Pods ask for more CPU than the node has and
// spread over a zone label the node lacks, with a priority class: the scheduler leaves them
// Pending and the RenderQueue's status says why (Unschedulable, in the scheduler's words); with a
// request that fits they stay Pending on the spread alone; once the node carries the zone label
// they run, with the priority class's priority.
func (e *env) stepScheduling(t *testing.T) {
	const name = "placed"
	pc := `apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: renderqueue-e2e}
value: 100000
description: the e2e's shard priority
`
	apply := func(manifest string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := e.c.Kubectl(ctx, []byte(manifest), "apply", "-f", "-"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	rq := func(cpu string) string {
		return fmt.Sprintf(`apiVersion: renderqueue.dev/v1alpha1
kind: RenderQueue
metadata: {name: %s, namespace: %s}
spec:
  shards: 1
  window: 24h
  store: {secretRef: {name: renderqueue-db, key: dsn}}
  priorityClassName: renderqueue-e2e
  resources: {requests: {cpu: %q, memory: 32Mi}}
  topologySpreadConstraints:
  - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule}
`, name, namespace, cpu)
	}
	apply(pc)
	apply(rq("1000"))
	defer func() {
		_, _ = e.c.Kubectl(context.Background(), nil, "delete", "renderqueue", name, "--wait=true")
		_, _ = e.c.Kubectl(context.Background(), nil, "delete", "priorityclass", "renderqueue-e2e")
		_, _ = e.c.Kubectl(context.Background(), nil, "label", "node", node.Name, "topology.kubernetes.io/zone-")
	}()
	shard := rqv1.ShardName(name, 0)
	waitReason := func(want ...string) {
		t.Helper()
		e.eventually(t, 90*time.Second, time.Second, fmt.Sprintf("RenderQueue %s to say its shard is Unschedulable (%q)", name, want), func() (bool, string) {
			var q rqv1.RenderQueue
			if err := e.k8s.Get(context.Background(), ctrlclient.ObjectKey{Namespace: namespace, Name: name}, &q); err != nil {
				return false, err.Error()
			}
			ready := meta.FindStatusCondition(q.Status.Conditions, rqv1.ConditionReady)
			if ready == nil {
				return false, "no Ready condition"
			}
			for _, w := range append([]string{"Unschedulable"}, want...) {
				if !strings.Contains(ready.Message, w) {
					return false, ready.Message
				}
			}
			return true, ""
		})
	}
	waitReason("Insufficient cpu")
	described := e.kubectl("describe", "renderqueue", name)
	if !strings.Contains(described, "Unschedulable") || !strings.Contains(described, "Insufficient cpu") {
		t.Errorf("kubectl describe renderqueue %s does not say why its shard is Pending:\n%s", name, described)
	}
	t.Logf("kubectl describe renderqueue %s (1000 CPUs asked for):\n%s", name, described)

	apply(rq("10m"))
	waitReason("topology spread")
	e.kubectl("label", "node", node.Name, "topology.kubernetes.io/zone=e2e-a")
	e.eventually(t, 2*time.Minute, time.Second, shard+" scheduled and Ready", func() (bool, string) {
		p, err := e.c.Client.CoreV1().Pods(namespace).Get(context.Background(), shard, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ok, why := podIsReady(p)
		return ok && p.Spec.Containers[0].Resources.Requests.Cpu().String() == "10m", why
	})
	p := e.pod(t, namespace, shard)
	if p.Spec.PriorityClassName != "renderqueue-e2e" || p.Spec.Priority == nil || *p.Spec.Priority != 100000 {
		t.Errorf("%s: priorityClassName %q priority %v, want renderqueue-e2e 100000", shard, p.Spec.PriorityClassName, p.Spec.Priority)
	}
	if p.Spec.NodeName != node.Name {
		t.Errorf("%s placed on %q", shard, p.Spec.NodeName)
	}
}

// stepOOMKill applies a RenderQueue whose keeper's memory limit is far too small: the kernel
// OOM-kills it (the container's cgroup), the kubelet restarts it into a crash loop, and the
// RenderQueue's status and `kubectl describe` name OOMKilled, while its count stays inexact (it
// never loaded); Prometheus (stepPrometheus's) fires RenderQueueShardFailing for it and exports
// its count as inexact. The queue is deleted at the end.
func (e *env) stepOOMKill(t *testing.T) {
	const name = "tight"
	manifest := fmt.Sprintf(`apiVersion: renderqueue.dev/v1alpha1
kind: RenderQueue
metadata: {name: %s, namespace: %s}
spec:
  shards: 1
  window: 24h
  store: {secretRef: {name: renderqueue-db, key: dsn}}
  resources: {limits: {memory: 12Mi}}
`, name, namespace)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := e.c.Kubectl(ctx, []byte(manifest), "apply", "-f", "-"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	defer func() { _, _ = e.c.Kubectl(context.Background(), nil, "delete", "renderqueue", name, "--wait=true") }()
	var described string
	e.eventually(t, 2*time.Minute, time.Second, "kubectl describe renderqueue "+name+" to name OOMKilled", func() (bool, string) {
		var q rqv1.RenderQueue
		if err := e.k8s.Get(context.Background(), ctrlclient.ObjectKey{Namespace: namespace, Name: name}, &q); err != nil {
			return false, err.Error()
		}
		if q.Status.DueExact {
			return false, "the queue says its count is exact"
		}
		described = e.kubectl("describe", "renderqueue", name)
		return strings.Contains(described, "OOMKilled"), conds(q.Status.Conditions)
	})
	t.Logf("kubectl describe renderqueue %s (memory limit 12Mi):\n%s", name, described)

	// The alert for it: RenderQueueShardFailing fires (its for: shortened to promRulesFor) from the
	// operator's renderqueue_queue_shard_state{state="Failing"}.
	api, ok := e.runningProm()
	if !ok {
		t.Log("Prometheus is not running (stepPrometheus left out): RenderQueueShardFailing not checked")
		return
	}
	const alert = "RenderQueueShardFailing"
	state := "inactive"
	e.eventually(t, promRulesFor+90*time.Second, 500*time.Millisecond, alert+" firing for "+name, func() (bool, string) {
		a, err := api.alertOf(alert, namespace, name)
		if err != nil {
			return false, err.Error()
		}
		if a == nil {
			return false, "inactive"
		}
		if a.State != state {
			t.Logf("%s %s %s → %s (shard %s, activeAt %s; description: %s)", time.Now().Format("15:04:05.000"), alert,
				state, a.State, a.Labels["shard"], a.ActiveAt.Format("15:04:05.000"), a.Annotations["description"])
			state = a.State
		}
		return a.State == "firing", a.State
	})
	if v, err := api.one(fmt.Sprintf(`renderqueue_queue_due_exact{namespace=%q, renderqueue=%q}`, namespace, name)); err != nil || v != 0 {
		t.Errorf("renderqueue_queue_due_exact of %s is %v (%v) while %s fires: want 0", name, v, err, alert)
	}
}

func podIsReady(p *corev1.Pod) (bool, string) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue, fmt.Sprintf("%s %s: %s", p.Status.Phase, c.Reason, c.Message)
		}
	}
	return false, string(p.Status.Phase)
}
