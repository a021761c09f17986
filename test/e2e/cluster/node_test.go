package cluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/node"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/wait"
)

// nodeTestEnv is what the node tests need: root, the assets of hack/setup-envtest.sh and the
// images of hack/images.sh; it skips the test where it cannot run.
func nodeTestEnv(t *testing.T) (repo, assets string, images *Images) {
	t.Helper()
	if testing.Short() {
		t.Skip("a real node: skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("a real node needs root (containerd, the kubelet, network namespaces, iptables)")
	}
	assets = os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set: run `make test`, or `export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)`")
	}
	repo, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(filepath.Join(repo, "hack", "node.sh"), "install").CombinedOutput(); err != nil {
		t.Fatalf("hack/node.sh install: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if images, err = BuildImages(ctx, repo, assets, t.Logf); err != nil {
		t.Fatal(err)
	}
	return repo, assets, images
}

// TestNode runs Pods on the real node and checks what a real node gives them, then that the
// machine is left as it was found.
func TestNode(t *testing.T) {
	repo, assets, images := nodeTestEnv(t)
	before := cleanHost(t)
	ctx := context.Background()
	c, err := Start(ctx, Options{
		Repo: repo, Assets: assets, Dir: t.TempDir(), SkipPostgres: true, WaitForNode: true,
		Images: images.Archives, SandboxImage: images.Sandbox, CoreDNSImage: images.CoreDNS,
		Logf: t.Logf,
	})
	if err != nil {
		t.Fatalf("starting the cluster: %v", err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			c.Stop()
		}
	})
	kubectl := func(t *testing.T, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		out, err := c.Kubectl(ctx, nil, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	apply := func(t *testing.T, manifest string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if out, err := c.Kubectl(ctx, []byte(manifest), "apply", "-f", "-"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	pod := func(t *testing.T, name string) *corev1.Pod {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	waitPod := func(t *testing.T, name, what string, timeout time.Duration, cond func(p *corev1.Pod) (bool, string)) *corev1.Pod {
		t.Helper()
		var last *corev1.Pod
		err := wait.Poll(context.Background(), timeout, 250*time.Millisecond, name+" "+what, func(ctx context.Context) (bool, string, error) {
			p, err := c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			last = p
			ok, why := cond(p)
			return ok, why, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return last
	}
	kexec := func(t *testing.T, name string, argv ...string) (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return c.Kubectl(ctx, nil, append([]string{"exec", name, "--"}, argv...)...)
	}

	t.Run("node", func(t *testing.T) {
		out := kubectl(t, "get", "nodes", "-o", "wide")
		t.Logf("kubectl get nodes -o wide:\n%s", out)
		if !strings.Contains(out, node.Name) || !strings.Contains(out, "containerd://") || !strings.Contains(out, " Ready ") {
			t.Errorf("the node is not a Ready %s on containerd://", node.Name)
		}
	})

	// A Pod with the restricted security context, a read-only root, resource limits and a
	// readiness probe, behind a Service.
	t.Run("restricted-pod", func(t *testing.T) {
		apply(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: probe, namespace: default, labels: {app: probe}}
spec:
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: probe
    image: %q
    args: [serve, ":8080"]
    ports: [{containerPort: 8080}]
    readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
    resources:
      requests: {cpu: 10m, memory: 16Mi}
      limits: {cpu: 100m, memory: 64Mi}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL]}
---
apiVersion: v1
kind: Service
metadata: {name: probe, namespace: default}
spec:
  selector: {app: probe}
  ports: [{port: 80, targetPort: 8080}]
`, images.Probe))
		start := time.Now()
		p := waitPod(t, "probe", "Ready", 90*time.Second, podReady)
		t.Logf("probe Ready %s after the apply: IP %s on %s", time.Since(start).Round(10*time.Millisecond), p.Status.PodIP, p.Spec.NodeName)
		if p.Spec.NodeName != node.Name {
			t.Errorf("placed on %q, not by the scheduler on %s", p.Spec.NodeName, node.Name)
		}
		pid, err := c.Node.ContainerPID(context.Background(), "default", "probe", "probe")
		if err != nil {
			t.Fatal(err)
		}
		status := procStatus(t, pid)
		for _, want := range []string{"Uid:\t65532", "NoNewPrivs:\t1", "Seccomp:\t2", "CapEff:\t0000000000000000"} {
			if !strings.Contains(status, want) {
				t.Errorf("the container's process lacks %q:\n%s", want, status)
			}
		}
		if ns, host := readLink(t, fmt.Sprintf("/proc/%d/ns/net", pid)), readLink(t, "/proc/self/ns/net"); ns == host {
			t.Errorf("the container shares this machine's network namespace (%s)", ns)
		}
		if ns, host := readLink(t, fmt.Sprintf("/proc/%d/ns/pid", pid)), readLink(t, "/proc/self/ns/pid"); ns == host {
			t.Errorf("the container shares this machine's PID namespace (%s)", ns)
		}
	})

	t.Run("dns", func(t *testing.T) {
		for _, name := range []string{"probe.default.svc.cluster.local", "kubernetes.default.svc.cluster.local"} {
			out, err := kexec(t, "probe", "/probe", "dns", name)
			if err != nil || !strings.Contains(out, "rcode=RCodeSuccess answers=1") {
				t.Errorf("probe dns %s: %q, %v", name, out, err)
			}
		}
		// A public name: refused by CoreDNS, which asks nobody (it has no forward plugin at all).
		out, err := kexec(t, "probe", "/probe", "dns", "example.com")
		if err != nil || !strings.Contains(out, "rcode=RCodeRefused") && !strings.Contains(out, "rcode=RCodeNameError") {
			t.Errorf("probe dns example.com: %q, %v; want REFUSED or NXDOMAIN", out, err)
		}
		plugins, err := exec2(assets+"/coredns", "-plugins")
		names := strings.Fields(plugins)
		if err != nil || slices.Contains(names, "forward") || !slices.Contains(names, "kubernetes") {
			t.Errorf("coredns -plugins: want kubernetes and no forward: %v\n%s", err, plugins)
		}
	})

	t.Run("services", func(t *testing.T) {
		// Pod → Service → the same Pod (hairpin), through kube-proxy's rules.
		out, err := kexec(t, "probe", "/probe", "get", "http://probe.default.svc.cluster.local/")
		if err != nil || !strings.Contains(out, "200 OK") {
			t.Errorf("from the Pod, GET the probe Service: %q, %v", out, err)
		}
		out, err = kexec(t, "probe", "/probe", "dial", "kubernetes.default.svc.cluster.local:443")
		if err != nil || !strings.Contains(out, "connected") {
			t.Errorf("from the Pod, dial the kubernetes Service: %q, %v", out, err)
		}
		// This machine → the Service's cluster IP.
		svc, err := c.Client.CoreV1().Services("default").Get(context.Background(), "probe", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + svc.Spec.ClusterIP + "/")
		if err != nil {
			t.Fatalf("GET the probe Service at %s from this machine: %v", svc.Spec.ClusterIP, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET the probe Service at %s: %s", svc.Spec.ClusterIP, resp.Status)
		}
	})

	// Nothing leaves this machine: a Pod has no route out, and were it to get one, the node's
	// FORWARD rule refuses the packet. 192.0.2.1 is TEST-NET-1 (RFC 5737): routed nowhere.
	t.Run("egress-refused", func(t *testing.T) {
		start := time.Now()
		out, err := kexec(t, "probe", "/probe", "dial", "192.0.2.1:80")
		took := time.Since(start)
		if err == nil || !strings.Contains(err.Error(), "network is unreachable") {
			t.Errorf("from the Pod, dial 192.0.2.1:80: %q, %v; want 'network is unreachable'", out, err)
		}
		t.Logf("dial 192.0.2.1:80 from the Pod failed in %s: %v", took.Round(time.Millisecond), err)
		pid, err := c.Node.ContainerPID(context.Background(), "default", "probe", "probe")
		if err != nil {
			t.Fatal(err)
		}
		netns := fmt.Sprintf("--net=/proc/%d/ns/net", pid)
		if out, err := exec2("nsenter", netns, "ip", "route", "add", "default", "via", node.NodeIP); err != nil {
			t.Fatalf("adding a default route in the Pod's network namespace: %v\n%s", err, out)
		}
		probe := filepath.Join(repo, "bin", "image", "node", "probe")
		out, err = exec2("nsenter", netns, probe, "dial", "192.0.2.1:80")
		if err == nil || !strings.Contains(out, "connection refused") {
			t.Errorf("with a default route, dial 192.0.2.1:80: %q, %v; want the node's REJECT (connection refused)", out, err)
		}
		if out, err := exec2("nsenter", netns, "ip", "route", "del", "default"); err != nil {
			t.Fatalf("removing the default route: %v\n%s", err, out)
		}
	})

	t.Run("port-forward", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(assets, "kubectl"), "port-forward", "pod/probe", ":8080")
		cmd.Env = c.Env()
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil {
			t.Fatalf("kubectl port-forward: %v", err)
		}
		m := regexp.MustCompile(`Forwarding from (127\.0\.0\.1:\d+) -> 8080`).FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("kubectl port-forward said %q", line)
		}
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + m[1] + "/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if string(body) != "probe" {
			t.Errorf("through kubectl port-forward: %s %q", resp.Status, body)
		}
	})

	// A container that exits 1 is restarted; `kubectl logs --previous` shows the last instance's
	// output.
	t.Run("logs-previous", func(t *testing.T) {
		apply(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: crash, namespace: default}
spec:
  containers:
  - {name: crash, image: %q, args: [dial, "192.0.2.1:80"]}
`, images.Probe))
		waitPod(t, "crash", "restarted", 90*time.Second, func(p *corev1.Pod) (bool, string) {
			if len(p.Status.ContainerStatuses) == 0 {
				return false, "no status"
			}
			cs := p.Status.ContainerStatuses[0]
			return cs.RestartCount >= 1, fmt.Sprintf("restarts %d", cs.RestartCount)
		})
		out := kubectl(t, "logs", "crash", "--previous")
		if !strings.Contains(out, "probe: dial 192.0.2.1:80") {
			t.Errorf("kubectl logs --previous: %q", out)
		}
		kubectl(t, "delete", "pod", "crash", "--grace-period=1")
	})

	// The memory limit is the container's cgroup's: going past it is an OOM kill.
	t.Run("oom-kill", func(t *testing.T) {
		apply(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: oom, namespace: default}
spec:
  containers:
  - name: oom
    image: %q
    args: [alloc, "200"]
    resources: {limits: {memory: 48Mi}}
`, images.Probe))
		var killed *corev1.ContainerStateTerminated
		waitPod(t, "oom", "OOMKilled", 90*time.Second, func(p *corev1.Pod) (bool, string) {
			if len(p.Status.ContainerStatuses) == 0 {
				return false, "no status"
			}
			cs := p.Status.ContainerStatuses[0]
			for _, st := range []corev1.ContainerState{cs.State, cs.LastTerminationState} {
				if st.Terminated != nil && st.Terminated.Reason == "OOMKilled" {
					killed = st.Terminated
					return true, ""
				}
			}
			return false, fmt.Sprintf("%+v", cs.State)
		})
		t.Logf("oom: exit code %d, reason %s", killed.ExitCode, killed.Reason)
		kubectl(t, "delete", "pod", "oom", "--grace-period=1")
	})

	// The scheduler places Pods: one that asks for more than the node has stays Pending, and
	// says why.
	t.Run("unschedulable", func(t *testing.T) {
		apply(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: huge, namespace: default}
spec:
  containers:
  - {name: huge, image: %q, args: [sleep], resources: {requests: {cpu: "1000"}}}
`, images.Probe))
		waitPod(t, "huge", "Unschedulable", 60*time.Second, func(p *corev1.Pod) (bool, string) {
			for _, cnd := range p.Status.Conditions {
				if cnd.Type == corev1.PodScheduled {
					return cnd.Status == corev1.ConditionFalse && cnd.Reason == corev1.PodReasonUnschedulable &&
						strings.Contains(cnd.Message, "Insufficient cpu"), cnd.Reason + ": " + cnd.Message
				}
			}
			return false, "no PodScheduled condition"
		})
		kubectl(t, "delete", "pod", "huge", "--grace-period=0", "--force")
	})

	// The kubelet and containerd restart under running Pods: the containers go on.
	t.Run("restarts", func(t *testing.T) {
		pid, err := c.Node.ContainerPID(context.Background(), "default", "probe", "probe")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := c.Node.RestartKubelet(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.Node.RestartContainerd(ctx); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(pid, 0); err != nil {
			t.Errorf("the probe's process %d did not survive the restarts: %v", pid, err)
		}
		// kubectl exec works again once the kubelet has its runtime back.
		if err := wait.Poll(ctx, 60*time.Second, 500*time.Millisecond, "kubectl exec after the restarts", func(context.Context) (bool, string, error) {
			out, err := kexec(t, "probe", "/probe", "get", "http://probe.default.svc.cluster.local/")
			if err != nil {
				return false, err.Error(), nil
			}
			return strings.Contains(out, "200 OK"), out, nil
		}); err != nil {
			t.Error(err)
		}
		if p := pod(t, "probe"); p.Status.ContainerStatuses[0].RestartCount != 0 {
			t.Errorf("the probe container restarted %d times", p.Status.ContainerStatuses[0].RestartCount)
		}
	})

	c.Stop()
	stopped = true
	if after := snapshotHost(t); !slices.Equal(before, after) {
		t.Errorf("the machine is not as it was before the node:\n%s", diffLines(before, after))
	}
}

// TestNodeAfterKill kills a local cluster with SIGKILL while it runs a Pod (containerd's shims
// and the container outlive it), then checks that the next run sweeps everything away.
func TestNodeAfterKill(t *testing.T) {
	repo, assets, _ := nodeTestEnv(t)
	before := cleanHost(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "localcluster")
	build := exec.Command("go", "build", "-o", bin, "./test/e2e/cmd/localcluster")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build localcluster: %v\n%s", err, out)
	}
	envFile := filepath.Join(dir, "env")
	cmd := exec.Command(bin, "--repo", repo, "--assets", assets, "--dir", filepath.Join(dir, "state"), "--env-file", envFile, "--no-postgres", "--wait")
	cmd.Dir = repo
	logf, err := os.Create(filepath.Join(dir, "localcluster.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("localcluster's log:\n%s", b)
		}
		_ = node.Sweep(t.Logf)
	})
	if err := wait.Poll(context.Background(), 5*time.Minute, 500*time.Millisecond, "localcluster to be up", func(context.Context) (bool, string, error) {
		if cmd.ProcessState != nil {
			return false, "", fmt.Errorf("localcluster exited: %v", cmd.ProcessState)
		}
		_, err := os.Stat(envFile)
		return err == nil, "no env file yet", nil
	}); err != nil {
		t.Fatal(err)
	}
	kubeconfig := regexp.MustCompile(`(?m)^export KUBECONFIG='([^']*)'`).FindStringSubmatch(readFile(t, envFile))
	if kubeconfig == nil {
		t.Fatalf("no KUBECONFIG in %s", envFile)
	}
	kubectl := func(args ...string) (string, error) {
		c := exec.Command(filepath.Join(assets, "kubectl"), args...)
		c.Env = []string{"KUBECONFIG=" + kubeconfig[1], "PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
		out, err := c.CombinedOutput()
		return string(out), err
	}
	if out, err := kubectl("run", "sleeper", "--image=localhost/renderqueue/e2e-probe:dev", "--restart=Never", "--", "sleep"); err != nil {
		t.Fatalf("kubectl run: %v\n%s", err, out)
	}
	if out, err := kubectl("wait", "--for=condition=Ready", "--timeout=90s", "pod/sleeper"); err != nil {
		t.Fatalf("kubectl wait: %v\n%s", err, out)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	left := snapshotHost(t)
	if slices.Equal(before, left) {
		t.Fatal("the killed run left nothing behind: this test would not show a sweep")
	}
	t.Logf("left behind by the killed run:\n%s", diffLines(before, left))
	// The next run sweeps first: hack/node.sh sweep is that alone.
	if out, err := exec.Command(filepath.Join(repo, "hack", "node.sh"), "sweep").CombinedOutput(); err != nil {
		t.Fatalf("hack/node.sh sweep: %v\n%s", err, out)
	}
	if after := snapshotHost(t); !slices.Equal(before, after) {
		t.Errorf("after the sweep, the machine is not as it was:\n%s", diffLines(before, after))
	}
	// A second sweep finds nothing, and says so by saying nothing (it once reported removing the
	// bridge and rules it had just set up itself).
	out, err := exec.Command(filepath.Join(repo, "hack", "node.sh"), "sweep").CombinedOutput()
	if err != nil {
		t.Fatalf("hack/node.sh sweep, again: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "sweep:") {
		t.Errorf("a sweep of a clean machine reports removing something:\n%s", out)
	}
}

// TestNodeRefusesASecondRun: while one node runs, a second Prepare that does not wait is refused
// with a message that names the holder.
func TestNodeRefusesASecondRun(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a real node needs root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	h, err := node.Prepare(ctx, node.HostOptions{Wait: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	// flock's locks belong to open files: this process's second Prepare opens the lock file again
	// and conflicts with its own first one, as another process's would.
	_, err = node.Prepare(ctx, node.HostOptions{})
	if err == nil || !strings.Contains(err.Error(), "another local cluster runs on this machine") ||
		!strings.Contains(err.Error(), fmt.Sprintf("pid %d", os.Getpid())) {
		t.Fatalf("a second Prepare: %v; want it refused, naming pid %d", err, os.Getpid())
	}
}

func podReady(p *corev1.Pod) (bool, string) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue, c.Reason + " " + c.Message
		}
	}
	return false, string(p.Status.Phase)
}

func exec2(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

func procStatus(t *testing.T, pid int) string {
	t.Helper()
	return readFile(t, fmt.Sprintf("/proc/%d/status", pid))
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func readLink(t *testing.T, path string) string {
	t.Helper()
	s, err := os.Readlink(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// cleanHost sweeps away what an earlier, killed run left on this machine (as hack/node.sh sweep
// does: under the node's lock, waiting for a running node to end) and returns the snapshot of the
// machine as it is then, the state a node's teardown must return it to. Without the sweep, a
// killed run's leftovers would be in the baseline, and this run's own start would remove them.
func cleanHost(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	h, err := node.Prepare(ctx, node.HostOptions{Wait: true, Logf: t.Logf})
	if err != nil {
		t.Fatalf("sweeping the machine before the test: %v", err)
	}
	h.Release()
	return snapshotHost(t)
}

// snapshotHost lists, sorted, what a node could leave on this machine: iptables chains and rules
// (IPv4 and IPv6, without counters or empty built-in chains), mount points, network links,
// /run/netns entries, the node's cgroups, the node's and containers' processes (by program),
// the host paths containerd and the kubelet write to, and net.ipv4.ip_forward.
func snapshotHost(t *testing.T) []string {
	t.Helper()
	var s []string
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		out, err := exec.Command(save).Output()
		if err != nil {
			t.Fatalf("%s: %v", save, err)
		}
		table := ""
		for _, line := range strings.Split(string(out), "\n") {
			switch {
			case strings.HasPrefix(line, "*"):
				table = line[1:]
			case strings.HasPrefix(line, ":"):
				name, _, _ := strings.Cut(line[1:], " ")
				if !slices.Contains([]string{"INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"}, name) {
					s = append(s, save+" "+table+" chain "+name)
				}
			case strings.HasPrefix(line, "-A "):
				s = append(s, save+" "+table+" "+line)
			}
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			s = append(s, "mount "+f[4])
		}
	}
	links, err := exec.Command("ip", "-o", "link").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(links), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			s = append(s, "link "+name)
		}
	}
	if entries, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range entries {
			s = append(s, "netns "+e.Name())
		}
	}
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/" + node.CgroupName)
	for _, cg := range cgroups {
		s = append(s, "cgroup "+cg)
	}
	if _, err := os.Stat("/sys/fs/cgroup/" + node.CgroupName); err == nil {
		s = append(s, "cgroup /sys/fs/cgroup/"+node.CgroupName)
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		exe, err := os.Readlink(filepath.Join("/proc", p.Name(), "exe"))
		if err != nil {
			continue
		}
		switch base := filepath.Base(exe); base {
		case "containerd", "containerd-shim-runc-v2", "kubelet", "kube-proxy", "coredns", "probe", "pause":
			s = append(s, "process "+base+" "+p.Name())
		}
	}
	for _, p := range []string{"/run/containerd", "/var/lib/cni", "/var/log/containers", node.StateDir, node.RunDir} {
		if _, err := os.Lstat(p); err == nil {
			s = append(s, "path "+p)
		}
	}
	fwd, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	s = append(s, "ip_forward "+strings.TrimSpace(string(fwd)))
	slices.Sort(s)
	return s
}

// diffLines says what is only in a (-) and only in b (+).
func diffLines(a, b []string) string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, "- "+x)
		}
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			out = append(out, "+ "+x)
		}
	}
	return strings.Join(out, "\n")
}
