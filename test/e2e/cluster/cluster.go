package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/controlplane"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/node"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/process"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/wait"
)

// Options configure a local cluster.
type Options struct {
	// Repo is the repository root (for hack/postgres.sh). Required unless SkipPostgres.
	Repo string
	// Assets is the KUBEBUILDER_ASSETS directory with etcd, kube-apiserver,
	// kube-controller-manager, kube-scheduler, kubectl, the kubelet and kube-proxy
	// (hack/setup-envtest.sh). Required.
	Assets string
	// Images are the OCI image archives the node imports into containerd: every image a Pod runs
	// (the renderqueue image of `make image`, the sandbox image, CoreDNS's, test images).
	// Required.
	Images []string
	// SandboxImage is the Pods' sandbox image (one of Images). Required.
	SandboxImage string
	// CoreDNSImage is CoreDNS's image (one of Images); empty: no cluster DNS.
	CoreDNSImage string
	// Dir holds the cluster's state (certificates, etcd data, configuration, logs). Required; the
	// caller removes it. The node's own state is under node.StateDir and node.RunDir.
	Dir string
	// Logf reports progress (nil: silent).
	Logf func(format string, args ...any)
	// ComponentLog, if not nil, also receives the output of every process (line-prefixed);
	// everything always goes to the log files under Dir/logs and the kubelet's Pod logs.
	ComponentLog io.Writer
	// HPASyncPeriod is kube-controller-manager's --horizontal-pod-autoscaler-sync-period
	// (default 2s).
	HPASyncPeriod time.Duration
	// HPADownscaleStabilization is its --horizontal-pod-autoscaler-downscale-stabilization
	// (default 30s).
	HPADownscaleStabilization time.Duration
	// MaxRestartBackOff caps the kubelet's crash-loop back-off (node.Options.MaxRestartBackOff).
	MaxRestartBackOff time.Duration
	// WaitForNode makes Start wait for another run's node to end instead of refusing at once
	// (node.ErrBusy).
	WaitForNode bool
	// SkipPostgres leaves out the throwaway PostgreSQL.
	SkipPostgres bool
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
	// Postgres is the throwaway database (nil with SkipPostgres). The Pods reach it at
	// Postgres.PodDSN (the node's address).
	Postgres *Postgres
	// Node is the one Node: containerd, the kubelet, kube-proxy, CoreDNS.
	Node *node.Node
	// Dir is the state directory.
	Dir string

	o    Options
	host *node.Host
	cp   *controlplane.ControlPlane

	mu    sync.Mutex
	procs []*process.Process
}

// Start prepares this machine for the node (node.Prepare: the lock, a sweep of a killed run's
// leftovers, the bridge), starts PostgreSQL (listening on the node's address too), etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler, then the node (containerd with the
// images, the kubelet, kube-proxy, CoreDNS). On error everything already started is stopped.
func Start(ctx context.Context, o Options) (c *Cluster, err error) {
	if o.Assets == "" || o.Dir == "" || (o.Repo == "" && !o.SkipPostgres) || len(o.Images) == 0 || o.SandboxImage == "" {
		return nil, errors.New("cluster: Assets, Dir, Images, SandboxImage and Repo (unless SkipPostgres) are required")
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
	began := time.Now()
	since := func() time.Duration { return time.Since(began).Round(100 * time.Millisecond) }
	if c.host, err = node.Prepare(ctx, node.HostOptions{Wait: o.WaitForNode, Logf: o.Logf}); err != nil {
		return c, err
	}
	if !o.SkipPostgres {
		o.logf("starting a throwaway PostgreSQL (hack/postgres.sh), also on %s for the Pods", node.NodeIP)
		if c.Postgres, err = StartPostgres(ctx, o.Repo, node.NodeIP, node.PodCIDR); err != nil {
			return c, err
		}
	}
	_, serviceCIDR, err := net.ParseCIDR(node.ServiceCIDR)
	if err != nil {
		return c, fmt.Errorf("cluster: %w", err)
	}
	if c.cp, err = controlplane.Start(ctx, controlplane.Options{
		Assets: o.Assets, Dir: o.Dir, Logf: o.Logf, ComponentLog: o.ComponentLog,
		NodeName: node.Name, NodeIP: net.ParseIP(node.NodeIP), ServiceCIDR: serviceCIDR,
		HPASyncPeriod: o.HPASyncPeriod, HPADownscaleStabilization: o.HPADownscaleStabilization,
	}); err != nil {
		return c, err
	}
	o.logf("control plane up at +%s", since())
	c.Kubeconfig = c.cp.Kubeconfig
	c.RESTConfig = rest.CopyConfig(c.cp.RESTConfig)
	if c.Client, err = kubernetes.NewForConfig(c.RESTConfig); err != nil {
		return c, fmt.Errorf("cluster: building a clientset: %w", err)
	}
	if c.Node, err = node.Start(ctx, node.Options{
		Assets: o.Assets, ControlPlane: c.cp, Client: c.Client, Dir: o.Dir,
		Images: o.Images, SandboxImage: o.SandboxImage, CoreDNSImage: o.CoreDNSImage,
		MaxRestartBackOff: o.MaxRestartBackOff, Logf: o.Logf, ComponentLog: o.ComponentLog,
	}); err != nil {
		return c, err
	}
	o.logf("local cluster up at +%s: Node %s (%s); KUBECONFIG=%s", since(), node.Name, node.NodeIP, c.Kubeconfig)
	return c, nil
}

// Stop stops the processes started with StartProcess (last first), the scheduler and the
// controller manager (nothing makes new Pods), the Pods and the node, the API server and etcd,
// PostgreSQL, and sweeps the machine (node.Host.Release). It is safe to call more than once.
func (c *Cluster) Stop() {
	began := time.Now()
	c.mu.Lock()
	procs := c.procs
	c.procs = nil
	c.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop(10 * time.Second)
	}
	if c.cp != nil {
		c.cp.StopControllers()
	}
	if c.Node != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		c.Node.Stop(ctx)
		cancel()
		c.Node = nil
		c.o.logf("node stopped at +%s", time.Since(began).Round(100*time.Millisecond))
	}
	if c.cp != nil {
		c.cp.Stop()
		c.cp = nil
	}
	if c.Postgres != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Postgres.Stop(ctx); err != nil {
			c.o.logf("stopping PostgreSQL: %v", err)
		}
		c.Postgres = nil
	}
	if c.host != nil {
		c.host.Release()
		c.host = nil
	}
	c.o.logf("local cluster stopped in %s", time.Since(began).Round(100*time.Millisecond))
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
