// Package controlplane runs the local cluster's control plane from a KUBEBUILDER_ASSETS directory
// (hack/setup-envtest.sh): etcd, kube-apiserver — with the aggregation layer and aggregator
// routing to EndpointSlice addresses (no kube-proxy makes cluster IPs reachable), and a kubelet
// client certificate for `kubectl logs` — and kube-controller-manager with
// ControllerManagerControllers. It writes the certificates they need (one cluster CA, one
// front-proxy CA), an admin kubeconfig, and each component's log under the state directory. The
// Node and its Pods are someone else's: package kubelet.
package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

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
// runs: enough for Deployments, HPAs, owner-reference cleanup, namespaces, PDB status,
// ServiceAccounts and the EndpointSlices of Services that select Pods (which the aggregator
// routes APIService requests to). The node lifecycle controllers are left out: the runner's one
// Node is Ready while the runner runs, and nothing evicts its Pods.
var ControllerManagerControllers = []string{
	"deployment-controller",
	"replicaset-controller",
	"horizontal-pod-autoscaler-controller",
	"garbage-collector-controller",
	"namespace-controller",
	"serviceaccount-controller",
	"root-ca-certificate-publisher-controller",
	"disruption-controller",
	"endpointslice-controller",
}

// Options configure a control plane.
type Options struct {
	// Assets is the KUBEBUILDER_ASSETS directory with etcd, kube-apiserver and
	// kube-controller-manager. Required.
	Assets string
	// Dir holds the state: pki/ (certificates and keys), etcd/ (etcd's data), logs/ (a log file
	// per component), kubeconfig (the admin's). Required; the caller removes it.
	Dir string
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

// ControlPlane is a running etcd, kube-apiserver and kube-controller-manager; Stop stops them.
type ControlPlane struct {
	// URL is the API server's (https://127.0.0.1:PORT).
	URL string
	// Kubeconfig is the path of an admin kubeconfig (user in group system:masters).
	Kubeconfig string
	// RESTConfig is the admin client configuration (its CAFile is the cluster CA).
	RESTConfig *rest.Config

	pki       *pki
	etcd      *process.Process
	apiserver *process.Process
	kcm       *process.Process
}

// Start starts etcd, kube-apiserver and kube-controller-manager from o.Assets and waits until the
// API server is ready and the controller manager has created the default ServiceAccount. On
// error, what it started is stopped.
func Start(ctx context.Context, o Options) (_ *ControlPlane, err error) {
	if o.Assets == "" || o.Dir == "" {
		return nil, errors.New("control plane: Assets and Dir are required")
	}
	if o.HPASyncPeriod <= 0 {
		o.HPASyncPeriod = 2 * time.Second
	}
	if o.HPADownscaleStabilization <= 0 {
		o.HPADownscaleStabilization = 30 * time.Second
	}
	dir := o.Dir
	cp := &ControlPlane{}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	if cp.pki, err = newPKI(filepath.Join(dir, "pki")); err != nil {
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
	cp.URL = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	p := cp.pki
	o.logf("starting kube-apiserver on %s", cp.URL)
	cp.apiserver, err = process.Start("kube-apiserver", apiBin, []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(apiPort),
		"--tls-cert-file=" + p.ServingCert, "--tls-private-key-file=" + p.ServingKey,
		"--client-ca-file=" + p.CACert,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.SAPub,
		"--service-account-signing-key-file=" + p.SAKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=RBAC",
		"--allow-privileged=true",
		"--endpoint-reconciler-type=none", // the advertise address is loopback, invalid in EndpointSlices
		// The aggregation layer: the aggregator authenticates to extension API servers (the
		// operator's external metrics API) with the front-proxy client certificate and passes
		// the user in request headers. With aggregator routing it dials an APIService's Service
		// at one of its EndpointSlice addresses (the Pod IP) and target port, not its cluster IP,
		// which nothing makes reachable here (no kube-proxy).
		"--requestheader-client-ca-file=" + p.FrontProxyCACert,
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + p.ProxyClientCert, "--proxy-client-key-file=" + p.ProxyClientKey,
		"--enable-aggregator-routing=true",
		// kubectl logs: the API server reaches the runner's kubelet API at the Node's InternalIP.
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
	if err := writeKubeconfig(cp.Kubeconfig, cp.URL, p.caPEM, func(a *clientcmdapi.AuthInfo) {
		a.ClientCertificate, a.ClientKey = p.AdminCert, p.AdminKey
	}); err != nil {
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
	controllers := ""
	for i, c := range ControllerManagerControllers {
		if i > 0 {
			controllers += ","
		}
		controllers += c
	}
	o.logf("starting kube-controller-manager (HPA sync period %s)", o.HPASyncPeriod)
	cp.kcm, err = process.Start("kube-controller-manager", kcmBin, []string{
		"--kubeconfig=" + cp.Kubeconfig,
		"--authentication-kubeconfig=" + cp.Kubeconfig,
		"--authorization-kubeconfig=" + cp.Kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=0",
		"--leader-elect=false",
		"--use-service-account-credentials=false",
		"--controllers=" + controllers,
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
	return cp, nil
}

// Stop stops the controller manager, the API server and etcd, in that order. It is safe to call
// more than once.
func (cp *ControlPlane) Stop() {
	for _, p := range []*process.Process{cp.kcm, cp.apiserver, cp.etcd} {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
}

// KubeletTLS is what a Node's kubelet API serves with: its certificate (for 127.0.0.1, signed by
// the cluster CA) and the CA whose client certificates it accepts (the cluster CA: the API server
// presents its kubelet client certificate).
func (cp *ControlPlane) KubeletTLS() (tls.Certificate, *x509.CertPool, error) {
	cert, err := tls.LoadX509KeyPair(cp.pki.KubeletCert, cp.pki.KubeletKey)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("control plane: loading the kubelet certificate: %w", err)
	}
	cas := x509.NewCertPool()
	cas.AppendCertsFromPEM(cp.pki.caPEM)
	return cert, cas, nil
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
