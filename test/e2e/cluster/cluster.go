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

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Options configure a local cluster.
type Options struct {
	// Repo is the repository root (for hack/postgres.sh). Required unless SkipPostgres.
	Repo string
	// Assets is the KUBEBUILDER_ASSETS directory with etcd, kube-apiserver,
	// kube-controller-manager and kubectl. Required.
	Assets string
	// Binary is the renderqueue binary the Runner runs for shard Pods. Required.
	Binary string
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
	// SkipPostgres leaves out the throwaway PostgreSQL.
	SkipPostgres bool
	// SkipRunner leaves out the Runner.
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
	// Runner plays kubelet for shard Pods (nil with SkipRunner).
	Runner *Runner
	// Dir is the state directory.
	Dir string

	o            Options
	cp           *controlPlane
	runnerCancel context.CancelFunc
	runnerDone   chan struct{}

	mu    sync.Mutex
	procs []*Process
}

// Start starts PostgreSQL, etcd, kube-apiserver, kube-controller-manager and the Runner. On error
// everything already started is stopped.
func Start(ctx context.Context, o Options) (c *Cluster, err error) {
	if o.Assets == "" || o.Binary == "" || o.Dir == "" || (o.Repo == "" && !o.SkipPostgres) {
		return nil, errors.New("cluster: Assets, Binary, Dir and Repo are required")
	}
	if o.HPASyncPeriod <= 0 {
		o.HPASyncPeriod = 2 * time.Second
	}
	if o.HPADownscaleStabilization <= 0 {
		o.HPADownscaleStabilization = 30 * time.Second
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
	if c.cp, err = startControlPlane(ctx, &o, o.Dir); err != nil {
		return c, err
	}
	c.Kubeconfig = c.cp.kubeconfig
	c.RESTConfig = rest.CopyConfig(c.cp.restConfig)
	if c.Client, err = kubernetes.NewForConfig(c.RESTConfig); err != nil {
		return c, fmt.Errorf("cluster: building a clientset: %w", err)
	}
	if !o.SkipRunner {
		runner, err := NewRunner(RunnerOptions{
			Client: c.Client, Server: c.cp.url, CAData: c.cp.pki.caPEM, Binary: o.Binary,
			Dir: filepath.Join(o.Dir, "pods"), Logf: o.Logf, ProcessLog: o.ComponentLog,
		})
		if err != nil {
			return c, err
		}
		c.Runner = runner
		rctx, cancel := context.WithCancel(context.Background())
		c.runnerCancel, c.runnerDone = cancel, make(chan struct{})
		go func() {
			defer close(c.runnerDone)
			if err := runner.Run(rctx); err != nil {
				o.logf("runner: %v", err)
			}
		}()
		o.logf("runner watching Pods labelled %s", DefaultRunnerSelector)
	}
	o.logf("local cluster up: KUBECONFIG=%s", c.Kubeconfig)
	return c, nil
}

// Stop stops the processes started with StartProcess (last first), the Runner and its Pod
// processes, the control plane and PostgreSQL. It is safe to call more than once.
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
	if c.cp != nil {
		c.cp.stop()
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
func (c *Cluster) StartProcess(name, bin string, args, extraEnv []string) (*Process, error) {
	p, err := startProcess(name, bin, args, c.Env(extraEnv...), filepath.Join(c.LogDir(), name+".log"), c.o.ComponentLog)
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

// RegisterAPIService makes group/version of the aggregated API reachable at
// https://127.0.0.1:port: an ExternalName Service namespace/service naming 127.0.0.1 and an
// APIService pointing at it (TLS verification skipped: the server's certificate is
// self-signed). Existing objects of those names are replaced.
//
// Why ExternalName: with --enable-aggregator-routing the aggregator would route to the
// Service's EndpointSlice addresses, but the API server rejects loopback addresses in
// EndpointSlices (and Endpoints); without it, it routes to the Service's cluster IP, or for an
// ExternalName Service to the external name and the APIService's port.
func (c *Cluster) RegisterAPIService(ctx context.Context, group, version, namespace, service string, port int) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: service, Namespace: namespace},
		Spec: corev1.ServiceSpec{
			Type:         corev1.ServiceTypeExternalName,
			ExternalName: "127.0.0.1",
			Ports:        []corev1.ServicePort{{Name: "https", Port: int32(port)}},
		},
	}
	svcs := c.Client.CoreV1().Services(namespace)
	if err := svcs.Delete(ctx, service, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("replacing Service %s/%s: %w", namespace, service, err)
	}
	if _, err := svcs.Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating Service %s/%s: %w", namespace, service, err)
	}
	apis, err := apiServices(c.RESTConfig)
	if err != nil {
		return err
	}
	name := version + "." + group
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"group": group, "version": version,
			"service":               map[string]any{"namespace": namespace, "name": service, "port": int64(port)},
			"insecureSkipTLSVerify": true,
			"groupPriorityMinimum":  int64(100),
			"versionPriority":       int64(100),
		},
	}}
	if err := apis.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("replacing APIService %s: %w", name, err)
	}
	if _, err := apis.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating APIService %s: %w", name, err)
	}
	return nil
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
	return poll(ctx, timeout, 500*time.Millisecond, "APIService "+name+" Available", func(ctx context.Context) (bool, string, error) {
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

// ServiceAccountKubeconfig writes to path a kubeconfig that authenticates as the ServiceAccount
// namespace/name (a TokenRequest token valid for ttl), so a process run with it has exactly the
// rights RBAC gives that ServiceAccount.
func (c *Cluster) ServiceAccountKubeconfig(ctx context.Context, namespace, name, path string, ttl time.Duration) error {
	tr, err := c.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(ttl / time.Second))},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("requesting a token of ServiceAccount %s/%s: %w", namespace, name, err)
	}
	return writeKubeconfig(path, c.cp.url, c.cp.pki.caPEM, func(a *clientcmdapi.AuthInfo) { a.Token = tr.Status.Token })
}

// Assets is the directory of the control plane binaries and kubectl.
func (c *Cluster) Assets() string { return c.o.Assets }
