package metricsapi_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/metricsapi"
)

const (
	certSecret = "renderqueue-system/renderqueue-metrics-api-tls"
	svcName    = "renderqueue-system/renderqueue-metrics-api"
	// serverName is the name the aggregator verifies the metrics API's certificate for.
	serverName = "renderqueue-metrics-api.renderqueue-system.svc"
)

// TestServingCertificate runs two replicas of the metrics API with --metrics-api-cert-secret
// against a real kube-apiserver (envtest), each with only the config/metrics-api component's
// RBAC: they share one certificate from the Secret, the APIService gets its CA bundle (and no
// insecureSkipTLSVerify), a client verifying as the aggregator does (that bundle, the Service's
// DNS name) accepts both, an expiring certificate is renewed and served without a restart, and
// an APIService pointing at another adapter's Service is left alone.
func TestServingCertificate(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set, so there is no kube-apiserver/etcd: " +
			"run `make test` (hack/test.sh sets it) or `export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)`")
	}
	g := NewWithT(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	scheme := runtime.NewScheme()
	g.Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	g.Expect(rqv1.AddToScheme(scheme)).To(Succeed())
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	enableAggregatorProxy(t, env)
	admin, err := env.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	k8s, err := client.New(admin, client.Options{Scheme: scheme})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "renderqueue-system"}})).To(Succeed())
	for _, f := range []string{"clusterrolebinding-auth-delegator.yaml", "clusterrole-auth-reader.yaml", "clusterrolebinding-auth-reader.yaml",
		"role-cert-secret.yaml", "rolebinding-cert-secret.yaml", "clusterrole-apiservice.yaml", "clusterrolebinding-apiservice.yaml",
		"service.yaml", "apiservice.yaml"} {
		applyYAML(ctx, t, k8s, filepath.Join("..", "..", "config", "metrics-api", f))
	}

	// Each replica as the operator's ServiceAccount: the component's RBAC is all it has.
	asOperator := rest.CopyConfig(admin)
	asOperator.Impersonate = rest.ImpersonationConfig{UserName: operatorSA}
	delegation := writeKubeconfig(t, admin, operatorSA)
	replica := func(name string) string {
		t.Helper()
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		g.Expect(err).NotTo(HaveOccurred())
		srv, err := metricsapi.NewServer(metricsapi.Options{
			Reader: k8s, RESTConfig: asOperator, AuthKubeconfig: delegation, Listener: lis,
			CertSecret: certSecret, Service: svcName, CertRefresh: 200 * time.Millisecond,
			Logger: testr.New(t).WithName(name),
		})
		g.Expect(err).NotTo(HaveOccurred(), "replica %s", name)
		srvCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- srv.Start(srvCtx) }()
		t.Cleanup(func() {
			stop()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("replica %s: %v", name, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("replica %s did not stop within 30s", name)
			}
		})
		return lis.Addr().String()
	}
	a, b := replica("a"), replica("b")

	apiService := func() *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("apiregistration.k8s.io/v1")
		u.SetKind("APIService")
		g.Expect(k8s.Get(ctx, client.ObjectKey{Name: "v1beta1.external.metrics.k8s.io"}, u)).To(Succeed())
		return u
	}
	caBundle := func(g Gomega) []byte {
		s, _, _ := unstructured.NestedString(apiService().Object, "spec", "caBundle")
		b, err := base64.StdEncoding.DecodeString(s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(b).NotTo(BeEmpty(), "the APIService has no caBundle")
		return b
	}
	// served dials addr as the aggregator would (trusting bundle, for the Service's DNS name)
	// and returns the certificate the server presented.
	served := func(g Gomega, addr string, bundle []byte) *x509.Certificate {
		pool := x509.NewCertPool()
		g.Expect(pool.AppendCertsFromPEM(bundle)).To(BeTrue())
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}}}
		resp, err := hc.Get("https://" + addr + "/healthz")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(resp.Body.Close()).To(Succeed())
		g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
		return resp.TLS.PeerCertificates[0]
	}

	bundle := caBundle(g)
	skip, _, _ := unstructured.NestedBool(apiService().Object, "spec", "insecureSkipTLSVerify")
	g.Expect(skip).To(BeFalse(), "the APIService still skips TLS verification")
	var secret corev1.Secret
	g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: "renderqueue-system", Name: "renderqueue-metrics-api-tls"}, &secret)).To(Succeed())
	g.Expect(bundle).To(Equal(secret.Data["ca.crt"]))
	var first *x509.Certificate
	g.Eventually(func(g Gomega) {
		ca, cb := served(g, a, bundle), served(g, b, bundle)
		g.Expect(ca.Equal(cb)).To(BeTrue(), "the replicas serve different certificates")
		first = ca
	}).WithTimeout(30 * time.Second).Should(Succeed())
	g.Expect(first.DNSNames).To(ContainElement(serverName))

	By := func(what string) { t.Log(what) }
	By("a serving certificate about to expire is renewed, signed by the same CA, and served without a restart")
	expiring := signWithSecretCA(t, secret, 24*time.Hour)
	secret.Data["tls.crt"], secret.Data["tls.key"] = expiring.cert, expiring.key
	g.Expect(k8s.Update(ctx, &secret)).To(Succeed())
	g.Eventually(func(g Gomega) {
		for _, addr := range []string{a, b} {
			c := served(g, addr, bundle)
			g.Expect(c.SerialNumber).NotTo(Equal(first.SerialNumber))
			g.Expect(c.NotAfter).To(BeTemporally(">", time.Now().Add(300*24*time.Hour)), "still the expiring certificate")
		}
	}).WithTimeout(30 * time.Second).Should(Succeed())
	g.Expect(caBundle(g)).To(Equal(bundle), "the CA bundle changed with the serving certificate")

	By("an APIService that points at another adapter's Service keeps its caBundle")
	other := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	api := apiService()
	g.Expect(unstructured.SetNestedField(api.Object, map[string]any{"namespace": "keda", "name": "keda-operator-metrics-apiserver", "port": int64(443)},
		"spec", "service")).To(Succeed())
	g.Expect(unstructured.SetNestedField(api.Object, base64.StdEncoding.EncodeToString(other), "spec", "caBundle")).To(Succeed())
	g.Expect(k8s.Update(ctx, api)).To(Succeed())
	g.Consistently(func(g Gomega) {
		g.Expect(caBundle(g)).To(Equal(other))
	}).WithTimeout(2 * time.Second).Should(Succeed())
}

type keyPair struct{ cert, key []byte }

// signWithSecretCA issues a serving certificate for serverName, valid for d, with the CA in the
// metrics API's certificate Secret.
func signWithSecretCA(t *testing.T, secret corev1.Secret, d time.Duration) keyPair {
	t.Helper()
	caBlock, _ := pem.Decode(secret.Data["ca.crt"])
	ca, err := x509.ParseCertificate(caBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	keyBlock, _ := pem.Decode(secret.Data["ca.key"])
	caKey, err := x509.ParsePKCS8PrivateKey(keyBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(42), Subject: pkix.Name{CommonName: serverName}, DNSNames: []string{serverName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(d),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return keyPair{pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})}
}
