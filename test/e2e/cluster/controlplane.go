package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/process"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/wait"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
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

// controlPlane is etcd, kube-apiserver and kube-controller-manager.
type controlPlane struct {
	dir        string
	pki        *pki
	etcd       *process.Process
	apiserver  *process.Process
	kcm        *process.Process
	url        string
	kubeconfig string
	restConfig *rest.Config
}

// startControlPlane starts etcd, kube-apiserver and kube-controller-manager from assets and waits
// until the API server is ready and the controller manager has created the default
// ServiceAccount.
func startControlPlane(ctx context.Context, o *Options, dir string) (cp *controlPlane, err error) {
	cp = &controlPlane{dir: dir}
	defer func() {
		if err != nil {
			cp.stop()
		}
	}()
	if cp.pki, err = newPKI(filepath.Join(dir, "pki")); err != nil {
		return cp, err
	}
	logs := filepath.Join(dir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return cp, fmt.Errorf("creating %s: %w", logs, err)
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
		return cp, err
	}
	clientPort, err := process.FreePort()
	if err != nil {
		return cp, err
	}
	peerPort, err := process.FreePort()
	if err != nil {
		return cp, err
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
		return cp, err
	}
	if err := wait.Poll(ctx, 60*time.Second, 200*time.Millisecond, "etcd", func(ctx context.Context) (bool, string, error) {
		if exited, werr := cp.etcd.Exited(); exited {
			return false, "", fmt.Errorf("etcd exited (%v); see %s:\n%s", werr, cp.etcd.LogPath, cp.etcd.Tail(20))
		}
		return httpOK(ctx, http.DefaultClient, etcdURL+"/health")
	}); err != nil {
		return cp, err
	}

	// kube-apiserver
	apiBin, err := bin("kube-apiserver")
	if err != nil {
		return cp, err
	}
	apiPort, err := process.FreePort()
	if err != nil {
		return cp, err
	}
	cp.url = fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	p := cp.pki
	o.logf("starting kube-apiserver on %s", cp.url)
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
		return cp, err
	}

	cp.restConfig = &rest.Config{
		Host: cp.url,
		TLSClientConfig: rest.TLSClientConfig{
			CAFile: p.CACert, CertFile: p.AdminCert, KeyFile: p.AdminKey,
		},
		QPS: 50, Burst: 100,
	}
	cp.kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(cp.kubeconfig, cp.url, p.caPEM, func(a *clientcmdapi.AuthInfo) {
		a.ClientCertificate, a.ClientKey = p.AdminCert, p.AdminKey
	}); err != nil {
		return cp, err
	}
	hc, err := rest.HTTPClientFor(cp.restConfig)
	if err != nil {
		return cp, fmt.Errorf("building an HTTP client for the API server: %w", err)
	}
	if err := wait.Poll(ctx, 120*time.Second, 250*time.Millisecond, "kube-apiserver /readyz", func(ctx context.Context) (bool, string, error) {
		if exited, werr := cp.apiserver.Exited(); exited {
			return false, "", fmt.Errorf("kube-apiserver exited (%v); see %s:\n%s", werr, cp.apiserver.LogPath, cp.apiserver.Tail(20))
		}
		return httpOK(ctx, hc, cp.url+"/readyz")
	}); err != nil {
		return cp, err
	}

	// kube-controller-manager
	kcmBin, err := bin("kube-controller-manager")
	if err != nil {
		return cp, err
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
		"--kubeconfig=" + cp.kubeconfig,
		"--authentication-kubeconfig=" + cp.kubeconfig,
		"--authorization-kubeconfig=" + cp.kubeconfig,
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
		return cp, err
	}
	cs, err := kubernetes.NewForConfig(cp.restConfig)
	if err != nil {
		return cp, fmt.Errorf("building a clientset: %w", err)
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
		return cp, err
	}
	return cp, nil
}

// stop stops the controller manager, the API server and etcd, in that order.
func (cp *controlPlane) stop() {
	for _, p := range []*process.Process{cp.kcm, cp.apiserver, cp.etcd} {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
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
