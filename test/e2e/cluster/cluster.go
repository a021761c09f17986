package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/controlplane"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/kubelet"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/process"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/runtime"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/wait"
)

// Options configure a local cluster.
type Options struct {
	// Repo is the repository root (for hack/postgres.sh). Required unless SkipPostgres.
	Repo string
	// Assets is the KUBEBUILDER_ASSETS directory with etcd, kube-apiserver,
	// kube-controller-manager and kubectl. Required.
	Assets string
	// Binary is the renderqueue binary: the Runner runs it for every image whose repository is
	// named renderqueue (runtime.RenderqueueImage). Required unless Images maps what the Pods run.
	Binary string
	// Images are further image mappings of the Runner (see kubelet.RunnerOptions.Images).
	Images []runtime.ImageMapping
	// Dir holds the cluster's state (certificates, etcd data, logs, Pod directories). Required;
	// the caller removes it.
	Dir string
	// Logf reports progress (nil: silent).
	Logf func(format string, args ...any)
	// ComponentLog, if not nil, also receives the output of every process (line-prefixed);
	// everything always goes to the log files under Dir/logs and the Pod directories.
	ComponentLog io.Writer
	// HPASyncPeriod is kube-controller-manager's --horizontal-pod-autoscaler-sync-period
	// (default 2s).
	HPASyncPeriod time.Duration
	// HPADownscaleStabilization is its --horizontal-pod-autoscaler-downscale-stabilization
	// (default 30s).
	HPADownscaleStabilization time.Duration
	// CrashLoopBackOff and MaxCrashLoopBackOff are the Runner's container restart back-off
	// (default: kubelet's 10s doubling to 5m).
	CrashLoopBackOff, MaxCrashLoopBackOff time.Duration
	// RetryPeriod is how often the Runner retries a Pod that cannot start yet (default 10s).
	RetryPeriod time.Duration
	// MaxGrace caps the termination grace period of Pods (default 10s, so that Stop is quick).
	MaxGrace time.Duration
	// SkipPostgres leaves out the throwaway PostgreSQL.
	SkipPostgres bool
	// SkipRunner leaves out the Runner (and the pod network and the Node).
	SkipRunner bool
}

func (o *Options) logf(format string, args ...any) {
	if o.Logf != nil {
		o.Logf(format, args...)
	}
}

// Cluster is a running local cluster. Stop stops everything Start and StartProcess started.
type Cluster struct {
	// Kubeconfig is the path of an admin kubeconfig (user in group system:masters).
	Kubeconfig string
	// RESTConfig is the admin client configuration.
	RESTConfig *rest.Config
	// Client is an admin clientset.
	Client kubernetes.Interface
	// Postgres is the throwaway database (nil with SkipPostgres).
	Postgres *Postgres
	// Runner plays kubelet and scheduler for the Node (nil with SkipRunner).
	Runner *kubelet.Runner
	// Network is the pod network (nil with SkipRunner).
	Network *runtime.PodNetwork
	// Dir is the state directory.
	Dir string

	o            Options
	cp           *controlplane.ControlPlane
	kubeletAPI   *kubelet.Server
	runnerCancel context.CancelFunc
	runnerDone   chan struct{}

	mu    sync.Mutex
	procs []*process.Process
}

// Start starts PostgreSQL, etcd, kube-apiserver, kube-controller-manager, the pod network and
// the Runner (which registers its Node). On error everything already started is stopped.
func Start(ctx context.Context, o Options) (c *Cluster, err error) {
	if o.Assets == "" || o.Dir == "" || (o.Repo == "" && !o.SkipPostgres) || (o.Binary == "" && len(o.Images) == 0 && !o.SkipRunner) {
		return nil, errors.New("cluster: Assets, Dir, Repo (unless SkipPostgres) and Binary or Images (unless SkipRunner) are required")
	}
	if o.MaxGrace <= 0 {
		o.MaxGrace = 10 * time.Second
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("cluster: creating %s: %w", o.Dir, err)
	}
	c = &Cluster{o: o, Dir: o.Dir}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if !o.SkipPostgres {
		o.logf("starting a throwaway PostgreSQL (hack/postgres.sh)")
		if c.Postgres, err = StartPostgres(ctx, o.Repo); err != nil {
			return c, err
		}
	}
	if c.cp, err = controlplane.Start(ctx, controlplane.Options{
		Assets: o.Assets, Dir: o.Dir, Logf: o.Logf, ComponentLog: o.ComponentLog,
		HPASyncPeriod: o.HPASyncPeriod, HPADownscaleStabilization: o.HPADownscaleStabilization,
	}); err != nil {
		return c, err
	}
	c.Kubeconfig = c.cp.Kubeconfig
	c.RESTConfig = rest.CopyConfig(c.cp.RESTConfig)
	if c.Client, err = kubernetes.NewForConfig(c.RESTConfig); err != nil {
		return c, fmt.Errorf("cluster: building a clientset: %w", err)
	}
	if o.SkipRunner {
		o.logf("local cluster up (no runner): KUBECONFIG=%s", c.Kubeconfig)
		return c, nil
	}
	if c.Network, err = runtime.AddPodNetwork(); err != nil {
		return c, err
	}
	o.logf("pod network %s (ip route add local %s dev lo)", c.Network.CIDR, c.Network.CIDR)
	cert, cas, err := c.cp.KubeletTLS()
	if err != nil {
		return c, err
	}
	if c.kubeletAPI, err = kubelet.NewServer(cert, cas); err != nil {
		return c, err
	}
	runner, err := kubelet.NewRunner(kubelet.RunnerOptions{
		Client: c.Client, Server: c.cp.URL, Network: c.Network, Binary: o.Binary, Images: o.Images,
		Dir: filepath.Join(o.Dir, "pods"), Logf: o.Logf, ProcessLog: o.ComponentLog,
		CrashLoopBackOff: o.CrashLoopBackOff, MaxCrashLoopBackOff: o.MaxCrashLoopBackOff,
		RetryPeriod: o.RetryPeriod, MaxGrace: o.MaxGrace, Kubelet: c.kubeletAPI,
	})
	if err != nil {
		return c, err
	}
	c.Runner = runner
	rctx, cancel := context.WithCancel(context.Background())
	c.runnerCancel, c.runnerDone = cancel, make(chan struct{})
	runErr := make(chan error, 1)
	go func() {
		defer close(c.runnerDone)
		if err := runner.Run(rctx); err != nil {
			o.logf("runner: %v", err)
			runErr <- err
		}
	}()
	if err := wait.Poll(ctx, 30*time.Second, 100*time.Millisecond, "the runner's Node to be registered", func(ctx context.Context) (bool, string, error) {
		select {
		case err := <-runErr:
			return false, "", err
		default:
		}
		n, err := c.Client.CoreV1().Nodes().Get(ctx, runner.NodeName(), metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return true, "", nil
			}
		}
		return false, "not Ready yet", nil
	}); err != nil {
		return c, err
	}
	o.logf("local cluster up: Node %s runs every Pod; KUBECONFIG=%s", runner.NodeName(), c.Kubeconfig)
	return c, nil
}

// Stop stops the processes started with StartProcess (last first), the Runner and its
// containers, the control plane, the pod network and PostgreSQL. It is safe to call more than
// once.
func (c *Cluster) Stop() {
	c.mu.Lock()
	procs := c.procs
	c.procs = nil
	c.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop(10 * time.Second)
	}
	if c.runnerCancel != nil {
		c.runnerCancel()
		<-c.runnerDone
		c.runnerCancel = nil
	}
	if c.kubeletAPI != nil {
		_ = c.kubeletAPI.Close()
		c.kubeletAPI = nil
	}
	if c.cp != nil {
		c.cp.Stop()
		c.cp = nil
	}
	if c.Network != nil {
		if err := c.Network.Remove(); err != nil {
			c.o.logf("removing the pod network: %v", err)
		}
		c.Network = nil
	}
	if c.Postgres != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Postgres.Stop(ctx); err != nil {
			c.o.logf("stopping PostgreSQL: %v", err)
		}
		c.Postgres = nil
	}
}

// LogDir is where the control plane's and StartProcess's logs are.
func (c *Cluster) LogDir() string { return filepath.Join(c.Dir, "logs") }

// Env is the environment for a process talking to the cluster: this process's PATH and HOME,
// KUBECONFIG, and extra.
func (c *Cluster) Env(extra ...string) []string {
	return append([]string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir(),
		"KUBECONFIG=" + c.Kubeconfig,
	}, extra...)
}

// StartProcess starts bin with args and Env(extraEnv...), logging to LogDir()/<name>.log; Stop
// stops it.
func (c *Cluster) StartProcess(name, bin string, args, extraEnv []string) (*process.Process, error) {
	p, err := process.Start(name, bin, args, c.Env(extraEnv...), filepath.Join(c.LogDir(), name+".log"), c.o.ComponentLog)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

// Kubectl runs the kubectl of the assets with the admin kubeconfig and returns its stdout; the
// error carries stderr.
func (c *Cluster) Kubectl(ctx context.Context, stdin []byte, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.o.Assets, "kubectl"), args...)
	cmd.Env = c.Env()
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %v: %w: %s", args, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out.String(), nil
}

func apiServices(cfg *rest.Config) (dynamic.ResourceInterface, error) {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building a dynamic client: %w", err)
	}
	return dc.Resource(schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}), nil
}

// WaitAPIServiceAvailable waits until the APIService group/version reports Available.
func (c *Cluster) WaitAPIServiceAvailable(ctx context.Context, group, version string, timeout time.Duration) error {
	apis, err := apiServices(c.RESTConfig)
	if err != nil {
		return err
	}
	name := version + "." + group
	return wait.Poll(ctx, timeout, 500*time.Millisecond, "APIService "+name+" Available", func(ctx context.Context) (bool, string, error) {
		as, err := apis.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		conds, _, _ := unstructured.NestedSlice(as.Object, "status", "conditions")
		for _, x := range conds {
			cond, _ := x.(map[string]any)
			if cond["type"] == "Available" {
				return cond["status"] == "True", fmt.Sprintf("%v: %v", cond["reason"], cond["message"]), nil
			}
		}
		return false, "no Available condition yet", nil
	})
}

// Assets is the directory of the control plane binaries and kubectl.
func (c *Cluster) Assets() string { return c.o.Assets }
