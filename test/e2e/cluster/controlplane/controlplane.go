// Package controlplane runs the local cluster's control plane from a KUBEBUILDER_ASSETS directory
// (hack/setup-envtest.sh): etcd, kube-apiserver (Node and RBAC authorization, the NodeRestriction
// admission plugin, the aggregation layer, a kubelet client certificate for `kubectl logs`,
// `exec` and `port-forward`), kube-controller-manager (every controller but node IPAM, each with
// its own service account) and kube-scheduler. It writes the certificates of the whole cluster
// (PKI: one cluster CA, one front-proxy CA, a client certificate per component with its real
// identity), a kubeconfig per component, and each component's log under the state directory. The
// API server listens on the node's address (Options.NodeIP), which the Pods reach through the
// kubernetes Service. The Node and its Pods are package node's.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/process"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/wait"
)

// ControllerManagerControllers are the kube-controller-manager controllers the local cluster
// runs: all of them (`*`) but node IPAM, which would hand the Node a pod CIDR of its own; the one
// Node's pod range is the CNI configuration's (package node).
const ControllerManagerControllers = "*,-node-ipam-controller"

// Options configure a control plane.
type Options struct {
	// Assets is the KUBEBUILDER_ASSETS directory with etcd, kube-apiserver and
	// kube-controller-manager. Required.
	Assets string
	// Dir holds the state: pki/ (certificates and keys), etcd/ (etcd's data), logs/ (a log file
	// per component), kubeconfig (the admin's). Required; the caller removes it.
	Dir string
	// NodeName is the one Node's name (its kubelet's certificates are issued for it). Required.
	NodeName string
	// NodeIP is the address the API server listens on and advertises (the Pods reach it through
	// the kubernetes Service); it must be an address of this machine. Required.
	NodeIP net.IP
	// ServiceCIDR is the Services' cluster IP range; its first address is the kubernetes
	// Service's. Required.
	ServiceCIDR *net.IPNet
	// Logf reports progress (nil: silent).
	Logf func(format string, args ...any)
	// ComponentLog, if not nil, also receives every component's output (line-prefixed).
	ComponentLog io.Writer
	// HPASyncPeriod is kube-controller-manager's --horizontal-pod-autoscaler-sync-period
	// (default 2s).
	HPASyncPeriod time.Duration
	// HPADownscaleStabilization is its --horizontal-pod-autoscaler-downscale-stabilization
	// (default 30s).
	HPADownscaleStabilization time.Duration
}

func (o *Options) logf(format string, args ...any) {
	if o.Logf != nil {
		o.Logf(format, args...)
	}
}

// ControlPlane is a running etcd, kube-apiserver, kube-controller-manager and kube-scheduler;
// Stop stops them.
type ControlPlane struct {
	// URL is the API server's (https://NODE-IP:PORT).
	URL string
	// Kubeconfig is the path of an admin kubeconfig (user in group system:masters).
	Kubeconfig string
	// RESTConfig is the admin client configuration (its CAFile is the cluster CA).
	RESTConfig *rest.Config
	// PKI is the cluster's certificates and keys.
	PKI *PKI

	dir       string
	etcd      *process.Process
	apiserver *process.Process
	kcm       *process.Process
	scheduler *process.Process
}

// Start starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler from o.Assets and
// waits until the API server is ready and the controller manager has created the default
// ServiceAccount. On error, what it started is stopped.
func Start(ctx context.Context, o Options) (_ *ControlPlane, err error) {
	if o.Assets == "" || o.Dir == "" || o.NodeName == "" || o.NodeIP == nil || o.ServiceCIDR == nil {
		return nil, errors.New("control plane: Assets, Dir, NodeName, NodeIP and ServiceCIDR are required")
	}
	apiServiceIP := firstAddress(o.ServiceCIDR)
	if o.HPASyncPeriod <= 0 {
		o.HPASyncPeriod = 2 * time.Second
	}
	if o.HPADownscaleStabilization <= 0 {
		o.HPADownscaleStabilization = 30 * time.Second
	}
	dir := o.Dir
	cp := &ControlPlane{dir: dir}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	if cp.PKI, err = newPKI(filepath.Join(dir, "pki"), o.NodeName, o.NodeIP, apiServiceIP); err != nil {
		return nil, err
	}
	logs := filepath.Join(dir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", logs, err)
	}
	bin := func(name string) (string, error) {
		p := filepath.Join(o.Assets, name)
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s not found in KUBEBUILDER_ASSETS (%s); run hack/setup-envtest.sh: %w", name, o.Assets, err)
		}
		return p, nil
	}
	baseEnv := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir()}

	// etcd
	etcdBin, err := bin("etcd")
	if err != nil {
		return nil, err
	}
	clientPort, err := process.FreePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := process.FreePort()
	if err != nil {
		return nil, err
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	o.logf("starting etcd on %s", etcdURL)
	cp.etcd, err = process.Start("etcd", etcdBin, []string{
		"--name=default",
		"--data-dir=" + filepath.Join(dir, "etcd"),
		"--listen-client-urls=" + etcdURL, "--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=default=" + peerURL,
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	}, baseEnv, filepath.Join(logs, "etcd.log"), o.ComponentLog)
	if err != nil {
		return nil, err
	}
	if err := wait.Poll(ctx, 60*time.Second, 200*time.Millisecond, "etcd", func(ctx context.Context) (bool, string, error) {
		if exited, werr := cp.etcd.Exited(); exited {
			return false, "", fmt.Errorf("etcd exited (%v); see %s:\n%s", werr, cp.etcd.LogPath, cp.etcd.Tail(20))
		}
		return httpOK(ctx, http.DefaultClient, etcdURL+"/health")
	}); err != nil {
		return nil, err
	}

	// kube-apiserver
	apiBin, err := bin("kube-apiserver")
	if err != nil {
		return nil, err
	}
	apiPort, err := process.FreePort()
	if err != nil {
		return nil, err
	}
	cp.URL = "https://" + net.JoinHostPort(o.NodeIP.String(), strconv.Itoa(apiPort))
	p := cp.PKI
	o.logf("starting kube-apiserver on %s", cp.URL)
	cp.apiserver, err = process.Start("kube-apiserver", apiBin, []string{
		"--etcd-servers=" + etcdURL,
		// Only on the node's address (the bridge the run made), not on every interface.
		"--bind-address=" + o.NodeIP.String(), "--advertise-address=" + o.NodeIP.String(),
		"--secure-port=" + strconv.Itoa(apiPort),
		"--tls-cert-file=" + p.ServingCert, "--tls-private-key-file=" + p.ServingKey,
		"--client-ca-file=" + p.CACert,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.SAPub,
		"--service-account-signing-key-file=" + p.SAKey,
		"--service-cluster-ip-range=" + o.ServiceCIDR.String(),
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		// The aggregation layer: the aggregator authenticates to extension API servers (the
		// operator's external metrics API) with the front-proxy client certificate and passes
		// the user in request headers. It dials an APIService's Service at its cluster IP, which
		// kube-proxy's rules on this machine route to the Pod.
		"--requestheader-client-ca-file=" + p.FrontProxyCACert,
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + p.ProxyClientCert, "--proxy-client-key-file=" + p.ProxyClientKey,
		// kubectl logs, exec, port-forward: the API server reaches the kubelet API at the Node's
		// InternalIP, and the kubelet authorizes it (a webhook) as kube-apiserver-kubelet-client.
		"--kubelet-client-certificate=" + p.KubeletClientCert, "--kubelet-client-key=" + p.KubeletClientKey,
		"--kubelet-certificate-authority=" + p.CACert,
		"--kubelet-preferred-address-types=InternalIP",
		"--v=0",
	}, baseEnv, filepath.Join(logs, "kube-apiserver.log"), o.ComponentLog)
	if err != nil {
		return nil, err
	}

	cp.RESTConfig = &rest.Config{
		Host: cp.URL,
		TLSClientConfig: rest.TLSClientConfig{
			CAFile: p.CACert, CertFile: p.AdminCert, KeyFile: p.AdminKey,
		},
		QPS: 50, Burst: 100,
	}
	cp.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := cp.WriteKubeconfig(cp.Kubeconfig, p.AdminCert, p.AdminKey); err != nil {
		return nil, err
	}
	kcmConfig := filepath.Join(dir, "kube-controller-manager.kubeconfig")
	schedConfig := filepath.Join(dir, "kube-scheduler.kubeconfig")
	if err := cp.WriteKubeconfig(kcmConfig, p.ControllerManagerCert, p.ControllerManagerKey); err != nil {
		return nil, err
	}
	if err := cp.WriteKubeconfig(schedConfig, p.SchedulerCert, p.SchedulerKey); err != nil {
		return nil, err
	}
	hc, err := rest.HTTPClientFor(cp.RESTConfig)
	if err != nil {
		return nil, fmt.Errorf("building an HTTP client for the API server: %w", err)
	}
	if err := wait.Poll(ctx, 120*time.Second, 250*time.Millisecond, "kube-apiserver /readyz", func(ctx context.Context) (bool, string, error) {
		if exited, werr := cp.apiserver.Exited(); exited {
			return false, "", fmt.Errorf("kube-apiserver exited (%v); see %s:\n%s", werr, cp.apiserver.LogPath, cp.apiserver.Tail(20))
		}
		return httpOK(ctx, hc, cp.URL+"/readyz")
	}); err != nil {
		return nil, err
	}

	// kube-controller-manager
	kcmBin, err := bin("kube-controller-manager")
	if err != nil {
		return nil, err
	}
	// The API server has just bootstrapped its RBAC roles; the kubelet API's authorization (a
	// webhook to the API server) must allow the API server's client: kubeadm's binding.
	if err := cp.bindKubeletClient(ctx); err != nil {
		return nil, err
	}
	o.logf("starting kube-controller-manager (HPA sync period %s)", o.HPASyncPeriod)
	cp.kcm, err = process.Start("kube-controller-manager", kcmBin, []string{
		"--kubeconfig=" + kcmConfig,
		"--authentication-kubeconfig=" + kcmConfig,
		"--authorization-kubeconfig=" + kcmConfig,
		"--bind-address=127.0.0.1",
		"--secure-port=0",
		"--leader-elect=false",
		"--use-service-account-credentials=true",
		"--controllers=" + ControllerManagerControllers,
		"--cluster-signing-cert-file=" + p.CACert, "--cluster-signing-key-file=" + p.CAKey,
		"--root-ca-file=" + p.CACert,
		"--service-account-private-key-file=" + p.SAKey,
		"--horizontal-pod-autoscaler-sync-period=" + o.HPASyncPeriod.String(),
		"--horizontal-pod-autoscaler-downscale-stabilization=" + o.HPADownscaleStabilization.String(),
		"--concurrent-gc-syncs=5",
		"--v=0",
	}, baseEnv, filepath.Join(logs, "kube-controller-manager.log"), o.ComponentLog)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cp.RESTConfig)
	if err != nil {
		return nil, fmt.Errorf("building a clientset: %w", err)
	}
	if err := wait.Poll(ctx, 120*time.Second, 250*time.Millisecond, "kube-controller-manager to create the default ServiceAccount", func(ctx context.Context) (bool, string, error) {
		if exited, werr := cp.kcm.Exited(); exited {
			return false, "", fmt.Errorf("kube-controller-manager exited (%v); see %s:\n%s", werr, cp.kcm.LogPath, cp.kcm.Tail(20))
		}
		_, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "no default ServiceAccount yet", nil
		}
		if err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	}); err != nil {
		return nil, err
	}

	// kube-scheduler
	schedBin, err := bin("kube-scheduler")
	if err != nil {
		return nil, err
	}
	o.logf("starting kube-scheduler")
	cp.scheduler, err = process.Start("kube-scheduler", schedBin, []string{
		"--kubeconfig=" + schedConfig,
		"--authentication-kubeconfig=" + schedConfig,
		"--authorization-kubeconfig=" + schedConfig,
		"--bind-address=127.0.0.1",
		"--secure-port=0",
		"--leader-elect=false",
		"--v=0",
	}, baseEnv, filepath.Join(logs, "kube-scheduler.log"), o.ComponentLog)
	if err != nil {
		return nil, err
	}
	return cp, nil
}

// StopControllers stops the scheduler and the controller manager, so that nothing makes or
// places new Pods (before the node's Pods are deleted); Stop stops the rest.
func (cp *ControlPlane) StopControllers() {
	for _, p := range []*process.Process{cp.scheduler, cp.kcm} {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
}

// Stop stops the scheduler, the controller manager, the API server and etcd, in that order. It is
// safe to call more than once.
func (cp *ControlPlane) Stop() {
	for _, p := range []*process.Process{cp.scheduler, cp.kcm, cp.apiserver, cp.etcd} {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
}

// WriteKubeconfig writes a kubeconfig for the API server at path, authenticating with the client
// certificate cert and its key.
func (cp *ControlPlane) WriteKubeconfig(path, cert, key string) error {
	return writeKubeconfig(path, cp.URL, cp.PKI.caPEM, func(a *clientcmdapi.AuthInfo) {
		a.ClientCertificate, a.ClientKey = cert, key
	})
}

// bindKubeletClient binds the API server's kubelet client identity to system:kubelet-api-admin
// (what kubeadm does), so that the kubelet's webhook authorization lets `kubectl logs`, `exec` and
// `port-forward` through. It waits for the API server to have bootstrapped the role.
func (cp *ControlPlane) bindKubeletClient(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(cp.RESTConfig)
	if err != nil {
		return fmt.Errorf("building a clientset: %w", err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-apiserver-kubelet-client"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:kubelet-api-admin"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "kube-apiserver-kubelet-client"}},
	}
	return wait.Poll(ctx, 60*time.Second, 250*time.Millisecond, "the kubelet client's ClusterRoleBinding", func(ctx context.Context) (bool, string, error) {
		if _, err := cs.RbacV1().ClusterRoles().Get(ctx, "system:kubelet-api-admin", metav1.GetOptions{}); err != nil {
			return false, err.Error(), nil
		}
		_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return false, err.Error(), nil
		}
		return true, "", nil
	})
}

// firstAddress is the first host address of n (10.96.0.0/24 → 10.96.0.1).
func firstAddress(n *net.IPNet) net.IP {
	ip := make(net.IP, len(n.IP.To4()))
	copy(ip, n.IP.To4())
	ip[len(ip)-1]++
	return ip
}

// httpOK reports whether GET url answers 200.
func httpOK(ctx context.Context, hc *http.Client, url string) (bool, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, "", fmt.Errorf("building a request for %s: %w", url, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false, err.Error(), nil
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Sprintf("%s: %d %s", url, resp.StatusCode, body), nil
	}
	return true, "", nil
}

// writeKubeconfig writes a kubeconfig for server with the CA caPEM; auth fills in the user.
func writeKubeconfig(path, server string, caPEM []byte, auth func(*clientcmdapi.AuthInfo)) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	user := clientcmdapi.NewAuthInfo()
	auth(user)
	cfg.AuthInfos["user"] = user
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "user", Namespace: "default"}
	cfg.CurrentContext = "local"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return nil
}
