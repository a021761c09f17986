package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/controlplane"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/process"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/wait"
)

// Options configure a node.
type Options struct {
	// Assets is the directory with the kubelet and kube-proxy (hack/setup-envtest.sh). Required.
	Assets string
	// ControlPlane is the running control plane the node joins: its PKI issues the node's
	// certificates and its API server is the node's. Required.
	ControlPlane *controlplane.ControlPlane
	// Client is an admin clientset of the cluster. Required.
	Client kubernetes.Interface
	// Dir holds the node's configuration files (Dir/node) and its components' logs (Dir/logs).
	// Required.
	Dir string
	// Images are OCI image layout archives (bin/image/*.oci.tar) imported into containerd before
	// the kubelet starts: every image a Pod of the cluster runs, the sandbox image among them.
	Images []string
	// SandboxImage is the name of the Pods' sandbox ("pause") image, one of Images. Required.
	SandboxImage string
	// CoreDNSImage, when set, is the name of the CoreDNS image (one of Images): the node then runs
	// the cluster's DNS (a Deployment in kube-system behind the kube-dns Service).
	CoreDNSImage string
	// MaxRestartBackOff caps the kubelet's crash-loop back-off (KubeletConfiguration
	// crashLoopBackOff.maxContainerRestartPeriod; default 10s, as the first delay is, so that a
	// test's killed container comes back within seconds; a kubelet's own default is 5m).
	MaxRestartBackOff time.Duration
	// Logf reports progress (nil: silent).
	Logf func(format string, args ...any)
	// ComponentLog, if not nil, also receives every component's output (line-prefixed).
	ComponentLog io.Writer
}

func (o *Options) logf(format string, args ...any) {
	if o.Logf != nil {
		o.Logf(format, args...)
	}
}

// Node is the running node: containerd, the kubelet, kube-proxy and (with CoreDNSImage) CoreDNS.
type Node struct {
	o        Options
	confDir  string
	logDir   string
	kubeletP int // the kubelet API's port
	healthzP int

	mu         sync.Mutex
	containerd *process.Process
	kubelet    *process.Process
	proxy      *process.Process
}

// Paths of the node's runtime.
const (
	containerdSocket = RunDir + "/containerd.sock"
	runcRoot         = RunDir + "/runc"
	podLogsDir       = StateDir + "/pod-logs"
	cniConfDir       = StateDir + "/cni/net.d"
	// cniNetwork is the CNI network's name (the host-local IPAM's and libcni's cache files carry it).
	cniNetwork = "rq-node"
	// criNamespace is containerd's namespace of the CRI plugin.
	criNamespace = "k8s.io"
)

// Start starts containerd, imports the images, starts the kubelet and waits for the Node to be
// Ready, starts kube-proxy and, with CoreDNSImage, deploys CoreDNS and waits for it. The machine
// must have been prepared (Prepare). On error, what it started is stopped.
func Start(ctx context.Context, o Options) (_ *Node, err error) {
	if o.Assets == "" || o.ControlPlane == nil || o.Client == nil || o.Dir == "" || o.SandboxImage == "" {
		return nil, errors.New("node: Assets, ControlPlane, Client, Dir and SandboxImage are required")
	}
	if o.MaxRestartBackOff <= 0 {
		o.MaxRestartBackOff = 10 * time.Second
	}
	n := &Node{o: o, confDir: filepath.Join(o.Dir, "node"), logDir: filepath.Join(o.Dir, "logs")}
	defer func() {
		if err != nil {
			n.stopDaemons()
		}
	}()
	for _, d := range []string{n.confDir, n.logDir, StateDir, RunDir, cniConfDir, podLogsDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("node: creating %s: %w", d, err)
		}
	}
	if err := makeCgroups(); err != nil {
		return nil, err
	}
	if err := n.writeConfigs(); err != nil {
		return nil, err
	}
	if err := n.startContainerd(ctx); err != nil {
		return nil, err
	}
	imported := time.Now()
	for _, img := range o.Images {
		if err := n.importImage(ctx, img); err != nil {
			return nil, err
		}
	}
	o.logf("%d images imported in %s", len(o.Images), time.Since(imported).Round(100*time.Millisecond))
	if err := n.startKubelet(ctx); err != nil {
		return nil, err
	}
	if err := n.startProxy(ctx); err != nil {
		return nil, err
	}
	if o.CoreDNSImage != "" {
		if err := deployCoreDNS(ctx, o.Client, o.CoreDNSImage); err != nil {
			return nil, err
		}
		if err := waitCoreDNS(ctx, o.Client); err != nil {
			return nil, err
		}
		o.logf("CoreDNS serves %s at %s", ClusterDomain, DNSServiceIP)
	}
	return n, nil
}

// makeCgroups makes the node's cgroup (the kubelet's cgroupRoot) in every hierarchy; a cgroup v1
// cpuset needs its CPUs and memory nodes copied from its parent before anything can join it.
func makeCgroups() error {
	for _, h := range cgroupHierarchies() {
		d := filepath.Join(h, CgroupName)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("node: creating cgroup %s: %w", d, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			parent, err := os.ReadFile(filepath.Join(h, f))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(d, f), parent, 0o644); err != nil {
				return fmt.Errorf("node: writing %s/%s: %w", d, f, err)
			}
		}
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		// cgroup v2: hand the controllers down to the node's cgroup.
		ctrls, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
		if err != nil {
			return fmt.Errorf("node: reading cgroup.controllers: %w", err)
		}
		var enable []string
		for _, c := range strings.Fields(string(ctrls)) {
			enable = append(enable, "+"+c)
		}
		_ = os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte(strings.Join(enable, " ")), 0o644)
	}
	return nil
}

func (n *Node) startProcess(name, bin string, args []string) (*process.Process, error) {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir()}
	return process.Start(name, bin, args, env, filepath.Join(n.logDir, name+".log"), n.o.ComponentLog)
}

func (n *Node) startContainerd(ctx context.Context) error {
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return fmt.Errorf("node: containerd is not installed (hack/node.sh installs Debian's containerd, runc and containernetworking-plugins): %w", err)
	}
	n.o.logf("starting containerd (%s)", containerdSocket)
	p, err := n.startProcess("containerd", bin, []string{"--config", filepath.Join(n.confDir, "containerd.toml")})
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.containerd = p
	n.mu.Unlock()
	return wait.Poll(ctx, 60*time.Second, 100*time.Millisecond, "containerd to answer", func(ctx context.Context) (bool, string, error) {
		if exited, werr := p.Exited(); exited {
			return false, "", fmt.Errorf("containerd exited (%v); see %s:\n%s", werr, p.LogPath, p.Tail(20))
		}
		out, err := n.ctr(ctx, "version")
		if err != nil {
			return false, err.Error(), nil
		}
		return strings.Contains(out, "Server:"), out, nil
	})
}

// ctr runs containerd's ctr against the node's containerd in the CRI's namespace.
func (n *Node) ctr(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", containerdSocket, "--namespace", criNamespace}, args...)...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out.String(), nil
}

// importImage imports an OCI image layout archive into the CRI's namespace (the platform of this
// machine is unpacked for the snapshotter).
func (n *Node) importImage(ctx context.Context, archive string) error {
	start := time.Now()
	out, err := n.ctr(ctx, "images", "import", "--no-unpack=false", archive)
	if err != nil {
		return fmt.Errorf("node: importing %s: %w", archive, err)
	}
	n.o.logf("imported %s in %s: %s", filepath.Base(archive), time.Since(start).Round(time.Millisecond), strings.TrimSpace(out))
	return nil
}

func (n *Node) startKubelet(ctx context.Context) error {
	bin := filepath.Join(n.o.Assets, "kubelet")
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("node: no kubelet in %s; run hack/setup-envtest.sh: %w", n.o.Assets, err)
	}
	n.o.logf("starting the kubelet (node %s, %s)", Name, NodeIP)
	p, err := n.startProcess("kubelet", bin, []string{
		"--config=" + filepath.Join(n.confDir, "kubelet.yaml"),
		"--kubeconfig=" + filepath.Join(n.confDir, "kubelet.kubeconfig"),
		"--root-dir=" + filepath.Join(StateDir, "kubelet"),
		"--hostname-override=" + Name,
		"--node-ip=" + NodeIP,
		"--v=0",
	})
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.kubelet = p
	n.mu.Unlock()
	if err := n.waitHealthy(ctx, p); err != nil {
		return err
	}
	return n.waitReady(ctx, p)
}

// waitHealthy waits for the kubelet p to answer its health check (its sync loop and pod
// lifecycle events running, its API served): the Node's Ready condition in the API may still be
// the previous kubelet's.
func (n *Node) waitHealthy(ctx context.Context, p *process.Process) error {
	url := fmt.Sprintf("http://127.0.0.1:%d/healthz", n.healthzP)
	return wait.Poll(ctx, 60*time.Second, 100*time.Millisecond, "the kubelet's "+url, func(ctx context.Context) (bool, string, error) {
		if exited, werr := p.Exited(); exited {
			return false, "", fmt.Errorf("the kubelet exited (%v); see %s:\n%s", werr, p.LogPath, p.Tail(30))
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, "", err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err.Error(), nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status, nil
	})
}

// waitReady waits for the Node to be Ready (with p, the kubelet, still running).
func (n *Node) waitReady(ctx context.Context, p *process.Process) error {
	start := time.Now()
	err := wait.Poll(ctx, 90*time.Second, 250*time.Millisecond, "the Node "+Name+" to be Ready", func(ctx context.Context) (bool, string, error) {
		if exited, werr := p.Exited(); exited {
			return false, "", fmt.Errorf("the kubelet exited (%v); see %s:\n%s", werr, p.LogPath, p.Tail(30))
		}
		node, err := n.o.Client.CoreV1().Nodes().Get(ctx, Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, c.Reason + ": " + c.Message, nil
			}
		}
		return false, "no Ready condition yet", nil
	})
	if err == nil {
		n.o.logf("node %s Ready %s after the kubelet started", Name, time.Since(start).Round(100*time.Millisecond))
	}
	return err
}

func (n *Node) startProxy(ctx context.Context) error {
	bin := filepath.Join(n.o.Assets, "kube-proxy")
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("node: no kube-proxy in %s; run hack/setup-envtest.sh: %w", n.o.Assets, err)
	}
	n.o.logf("starting kube-proxy (iptables)")
	p, err := n.startProcess("kube-proxy", bin, []string{
		"--config=" + filepath.Join(n.confDir, "kube-proxy.yaml"),
		"--v=0",
	})
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.proxy = p
	n.mu.Unlock()
	// kube-proxy has programmed the kubernetes Service once its chain for it exists.
	return wait.Poll(ctx, 60*time.Second, 250*time.Millisecond, "kube-proxy's rules", func(ctx context.Context) (bool, string, error) {
		if exited, werr := p.Exited(); exited {
			return false, "", fmt.Errorf("kube-proxy exited (%v); see %s:\n%s", werr, p.LogPath, p.Tail(20))
		}
		out, err := exec.CommandContext(ctx, "iptables-save", "-t", "nat").Output()
		if err != nil {
			return false, err.Error(), nil
		}
		return bytes.Contains(out, []byte("default/kubernetes:https")), "no rule for default/kubernetes yet", nil
	})
}

// Stop deletes every Pod (the kubelet tears each down: containers stopped, CNI DEL), then stops
// kube-proxy, the kubelet and containerd. The caller stops the controllers that would make new
// Pods first; Host.Release sweeps what is left. It is safe to call more than once.
func (n *Node) Stop(ctx context.Context) {
	n.mu.Lock()
	running := n.kubelet != nil
	n.mu.Unlock()
	if running {
		if err := n.deletePods(ctx); err != nil {
			n.mu.Lock()
			k := n.kubelet
			n.mu.Unlock()
			n.o.logf("deleting the Pods before stopping the node: %v; the kubelet's log ends:\n%s", err, k.Tail(30))
		}
	}
	n.stopDaemons()
}

func (n *Node) stopDaemons() {
	n.mu.Lock()
	procs := []*process.Process{n.proxy, n.kubelet, n.containerd}
	n.proxy, n.kubelet, n.containerd = nil, nil, nil
	n.mu.Unlock()
	for _, p := range procs {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
}

// deletePods deletes every Pod with a short grace period and waits (up to 60 s) until the
// kubelet has confirmed each one gone. Each poll deletes the Pods not yet being deleted, so a Pod
// made after the first round (by an operator Pod that had not stopped yet: the operator creates
// its shard Pods itself) goes too, and is logged.
func (n *Node) deletePods(ctx context.Context) error {
	grace := int64(1)
	first := true
	return wait.Poll(ctx, 60*time.Second, 250*time.Millisecond, "every Pod to be gone", func(ctx context.Context) (bool, string, error) {
		pods, err := n.o.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, fmt.Sprintf("listing Pods: %v", err), nil
		}
		var left, deleted []string
		for _, p := range pods.Items {
			name := p.Namespace + "/" + p.Name
			left = append(left, name)
			if p.DeletionTimestamp != nil {
				continue
			}
			err := n.o.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
			if err != nil && !apierrors.IsNotFound(err) {
				return false, fmt.Sprintf("deleting Pod %s: %v", name, err), nil
			}
			deleted = append(deleted, name)
		}
		if !first && len(deleted) > 0 {
			n.o.logf("deleting the Pods before stopping the node: %s made after the first round, deleted too", strings.Join(deleted, ", "))
		}
		first = false
		return len(left) == 0, strings.Join(left, ", "), nil
	})
}

// RestartKubelet kills the kubelet (SIGKILL, as a crash would) and starts it again; the Pods keep
// running. It returns when the Node is Ready again.
func (n *Node) RestartKubelet(ctx context.Context) error {
	n.mu.Lock()
	p := n.kubelet
	n.mu.Unlock()
	if p == nil {
		return errors.New("node: the kubelet is not running")
	}
	_ = p.Kill(syscall.SIGKILL)
	<-p.Done()
	return n.startKubelet(ctx)
}

// RestartContainerd kills containerd (SIGKILL) and starts it again; its shims, and so the
// containers, keep running.
func (n *Node) RestartContainerd(ctx context.Context) error {
	n.mu.Lock()
	p := n.containerd
	n.mu.Unlock()
	if p == nil {
		return errors.New("node: containerd is not running")
	}
	_ = p.Kill(syscall.SIGKILL)
	<-p.Done()
	return n.startContainerd(ctx)
}

// containerID is the runtime's id of a container of a Pod (from its status).
func containerID(pod *corev1.Pod, container string) (string, error) {
	statuses := append(append([]corev1.ContainerStatus{}, pod.Status.ContainerStatuses...), pod.Status.InitContainerStatuses...)
	for _, cs := range statuses {
		if container != "" && cs.Name != container {
			continue
		}
		_, id, ok := strings.Cut(cs.ContainerID, "://")
		if !ok || id == "" {
			return "", fmt.Errorf("container %q of %s/%s has no container id yet", cs.Name, pod.Namespace, pod.Name)
		}
		return id, nil
	}
	return "", fmt.Errorf("%s/%s has no container %q in its status", pod.Namespace, pod.Name, container)
}

// ContainerPID is the host pid of a container's first process (runc's state), for the Pod ns/name
// as the API has it now; container "" means the first container.
func (n *Node) ContainerPID(ctx context.Context, ns, name, container string) (int, error) {
	pod, err := n.o.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("node: getting Pod %s/%s: %w", ns, name, err)
	}
	id, err := containerID(pod, container)
	if err != nil {
		return 0, fmt.Errorf("node: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(runcRoot, criNamespace, id, "state.json"))
	if err != nil {
		return 0, fmt.Errorf("node: reading runc's state of container %s of %s/%s: %w", id, ns, name, err)
	}
	var st struct {
		Pid int `json:"init_process_pid"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Pid <= 0 {
		return 0, fmt.Errorf("node: runc's state of container %s has no pid (%v)", id, err)
	}
	return st.Pid, nil
}

// KillContainer sends sig to a container's first process (the kubelet then restarts it, as it
// would after a crash); it returns the pid it signalled.
func (n *Node) KillContainer(ctx context.Context, ns, name, container string, sig syscall.Signal) (int, error) {
	pid, err := n.ContainerPID(ctx, ns, name, container)
	if err != nil {
		return 0, err
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return pid, fmt.Errorf("node: signalling pid %d of %s/%s: %w", pid, ns, name, err)
	}
	return pid, nil
}

// InPodNetwork runs argv (e.g. iptables) in the network namespace of a Pod (that of its first
// container's process) with nsenter, and returns its combined output.
func (n *Node) InPodNetwork(ctx context.Context, ns, name string, argv ...string) (string, error) {
	pid, err := n.ContainerPID(ctx, ns, name, "")
	if err != nil {
		return "", err
	}
	args := append([]string{"--net=/proc/" + strconv.Itoa(pid) + "/ns/net", "--"}, argv...)
	out, err := exec.CommandContext(ctx, "nsenter", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("node: nsenter %s in %s/%s: %w: %s", strings.Join(argv, " "), ns, name, err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// LogFile is one container's log file as the kubelet writes it.
type LogFile struct {
	// Namespace, Pod and Container name the container.
	Namespace, Pod, Container string
	// Path is the log file (CRI format: time, stream, tag, line).
	Path string
}

// LogFiles lists the containers' log files, current and earlier instances alike.
func (n *Node) LogFiles() []LogFile {
	var files []LogFile
	pods, _ := os.ReadDir(podLogsDir)
	for _, p := range pods {
		parts := strings.SplitN(p.Name(), "_", 3) // NAMESPACE_NAME_UID
		if len(parts) != 3 {
			continue
		}
		containers, _ := os.ReadDir(filepath.Join(podLogsDir, p.Name()))
		for _, c := range containers {
			logs, _ := filepath.Glob(filepath.Join(podLogsDir, p.Name(), c.Name(), "*.log"))
			for _, l := range logs {
				files = append(files, LogFile{Namespace: parts[0], Pod: parts[1], Container: c.Name(), Path: l})
			}
		}
	}
	return files
}

// freePort asks the kernel for a free TCP port on addr.
func freePort(addr string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, fmt.Errorf("finding a free port on %s: %w", addr, err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}
