package metricsapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/metrics/pkg/apis/external_metrics/v1beta1"
	externalclient "k8s.io/metrics/pkg/client/external_metrics"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/metricsapi"
)

const (
	// The identities the config/metrics-api component grants: the operator delegates
	// authentication and authorization, the HPA controller reads the metrics.
	operatorSA = "system:serviceaccount:renderqueue-system:renderqueue-operator"
	hpaSA      = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
)

// TestServer runs the metrics API against a real kube-apiserver and etcd (envtest): RenderQueues
// with status in the API server, the server on a loopback port delegating authentication and
// authorization with only the component's RBAC, and requests over HTTPS as the HPA controller.
func TestServer(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set, so there is no kube-apiserver/etcd to serve the metrics API against: " +
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

	// The component's RBAC, as written (the APIService comes in the aggregator subtest).
	g.Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "renderqueue-system"}})).To(Succeed())
	for _, f := range []string{"clusterrolebinding-auth-delegator.yaml", "clusterrole-auth-reader.yaml", "clusterrolebinding-auth-reader.yaml",
		"clusterrole-external-metrics-reader.yaml", "clusterrolebinding-hpa.yaml",
		"role-cert-secret.yaml", "rolebinding-cert-secret.yaml", "clusterrole-apiservice.yaml", "clusterrolebinding-apiservice.yaml"} {
		applyYAML(ctx, t, k8s, filepath.Join("..", "..", "config", "metrics-api", f))
	}

	const ns = "render"
	g.Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	asOf := time.Now().UTC().Add(-30 * time.Second).Truncate(time.Second)
	later := asOf.Add(5 * time.Second)
	createRQ(ctx, t, k8s, ns, "web", map[string]string{"team": "a"}, func(s *rqv1.RenderQueueStatus) {
		s.Due, s.DueExact, s.DueAsOf = 120, true, &metav1.Time{Time: asOf}
		s.Forecast = &rqv1.ForecastStatus{AsOf: metav1.Time{Time: later}, Horizons: []rqv1.ForecastHorizon{
			{Horizon: "15m", Due: 150, Exact: true}, {Horizon: "1h", Due: 400, Exact: true},
			{Horizon: "24h", Due: 9000, Reason: "shard(s) web-shard-0 do not hold all their rows due within 24h"}}}
	})
	createRQ(ctx, t, k8s, ns, "batch", map[string]string{"team": "a"}, func(s *rqv1.RenderQueueStatus) {
		s.Due, s.DueExact, s.DueAsOf = 4000, true, &metav1.Time{Time: later}
	})
	mail := createRQ(ctx, t, k8s, ns, "mail", map[string]string{"team": "b"}, func(s *rqv1.RenderQueueStatus) {
		s.Due, s.DueExact, s.DueAsOf = 7, false, &metav1.Time{Time: asOf}
		s.Conditions = []metav1.Condition{{Type: rqv1.ConditionExact, Status: metav1.ConditionFalse,
			Reason: rqv1.ReasonShardUnreachable, Message: "mail-shard-1 unreachable", LastTransitionTime: metav1.Time{Time: asOf}}}
	})
	createRQ(ctx, t, k8s, ns, "fresh", map[string]string{"team": "c"}, nil)

	// The server: delegation as the operator's ServiceAccount (so the component's bindings are
	// what makes it work), through a kubeconfig file as the operator passes its own; its
	// certificate kept in a Secret as the component runs it, with the operator's RBAC;
	// RenderQueues read with the test's client.
	delegation := writeKubeconfig(t, admin, operatorSA)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	asOperator := rest.CopyConfig(admin)
	asOperator.Impersonate = rest.ImpersonationConfig{UserName: operatorSA}
	srv, err := metricsapi.NewServer(metricsapi.Options{
		Reader: k8s, RESTConfig: asOperator, AuthKubeconfig: delegation, Listener: lis, Logger: testr.New(t),
		CertSecret: certSecret, Service: svcName, CertRefresh: 500 * time.Millisecond,
	})
	g.Expect(err).NotTo(HaveOccurred())
	srvCtx, stopSrv := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Start(srvCtx) }()
	t.Cleanup(func() {
		stopSrv()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("server: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("server did not stop within 30s")
		}
	})

	// Clients as the HPA controller: the admin's certificate impersonating the HPA's
	// ServiceAccount, trusting the CA of the server's certificate Secret, for the Service's name.
	var certs corev1.Secret
	g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "renderqueue-system", Name: "renderqueue-metrics-api-tls"}, &certs)).To(Succeed())
	as := func(user string) *rest.Config {
		return &rest.Config{
			Host: "https://" + lis.Addr().String(),
			TLSClientConfig: rest.TLSClientConfig{
				CAData: certs.Data["ca.crt"], ServerName: serverName, CertData: admin.CertData, KeyData: admin.KeyData,
			},
			Impersonate: rest.ImpersonationConfig{UserName: user},
		}
	}
	hpa := as(hpaSA)
	metrics, err := externalclient.NewForConfig(hpa)
	g.Expect(err).NotTo(HaveOccurred())
	byName := func(name string) labels.Selector {
		return labels.SelectorFromSet(labels.Set{metricsapi.LabelName: name})
	}

	t.Run("serves once started", func(t *testing.T) {
		NewWithT(t).Eventually(func() error {
			_, err := metrics.NamespacedMetrics(ns).List(metricsapi.MetricDue, byName("web"))
			return err
		}).WithTimeout(60 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	})

	t.Run("exact due by name, with its timestamp", func(t *testing.T) {
		g := NewWithT(t)
		list, err := metrics.NamespacedMetrics(ns).List(metricsapi.MetricDue, byName("web"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(list.Items).To(HaveLen(1))
		g.Expect(list.Items[0].MetricName).To(Equal(metricsapi.MetricDue))
		g.Expect(list.Items[0].Value.Value()).To(Equal(int64(120)))
		g.Expect(list.Items[0].Timestamp.Time.Equal(asOf)).To(BeTrue(), "timestamp %s, want %s", list.Items[0].Timestamp, asOf)
		g.Expect(list.Items[0].MetricLabels).To(HaveKeyWithValue(metricsapi.LabelName, "web"))
	})

	t.Run("raw HTTPS GET as the HPA sends it", func(t *testing.T) {
		g := NewWithT(t)
		body, code := get(ctx, t, hpa, ns, metricsapi.MetricDue, "team=a")
		g.Expect(code).To(Equal(http.StatusOK), "body: %s", body)
		var list v1beta1.ExternalMetricValueList
		g.Expect(json.Unmarshal(body, &list)).To(Succeed())
		g.Expect(list.Kind).To(Equal("ExternalMetricValueList"))
		g.Expect(list.Items).To(HaveLen(2))
		g.Expect(list.Items[0].MetricLabels[metricsapi.LabelName]).To(Equal("batch"))
		g.Expect(list.Items[0].Value.Value()).To(Equal(int64(4000)))
		g.Expect(list.Items[0].Timestamp.Time.Equal(later)).To(BeTrue())
		g.Expect(list.Items[1].MetricLabels[metricsapi.LabelName]).To(Equal("web"))
		g.Expect(string(body)).To(ContainSubstring(`"timestamp":"` + asOf.Format(time.RFC3339) + `"`))
	})

	t.Run("inexact is a 503 naming the RenderQueue and why", func(t *testing.T) {
		g := NewWithT(t)
		body, code := get(ctx, t, hpa, ns, metricsapi.MetricDue, metricsapi.LabelName+"=mail")
		g.Expect(code).To(Equal(http.StatusServiceUnavailable), "body: %s", body)
		g.Expect(string(body)).To(And(ContainSubstring(`\"mail\"`), ContainSubstring("not exact"),
			ContainSubstring("ShardUnreachable"), ContainSubstring("mail-shard-1 unreachable")))
		_, err := metrics.NamespacedMetrics(ns).List(metricsapi.MetricDue, labels.Everything())
		g.Expect(apierrors.IsServiceUnavailable(err)).To(BeTrue(), "error %v", err)
	})

	t.Run("lower bound served while inexact", func(t *testing.T) {
		g := NewWithT(t)
		list, err := metrics.NamespacedMetrics(ns).List(metricsapi.MetricDueLowerBound, byName("mail"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(list.Items).To(HaveLen(1))
		g.Expect(list.Items[0].Value.Value()).To(Equal(int64(7)))
		g.Expect(list.Items[0].Timestamp.Time.Equal(asOf)).To(BeTrue())
	})

	t.Run("forecast for a horizon, and its errors", func(t *testing.T) {
		g := NewWithT(t)
		list, err := metrics.NamespacedMetrics(ns).List(metricsapi.MetricDueForecast,
			labels.SelectorFromSet(labels.Set{metricsapi.LabelName: "web", metricsapi.LabelHorizon: "15m"}))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(list.Items).To(HaveLen(1))
		g.Expect(list.Items[0].Value.Value()).To(Equal(int64(150)))
		g.Expect(list.Items[0].Timestamp.Time.Equal(later)).To(BeTrue())
		g.Expect(list.Items[0].MetricLabels).To(HaveKeyWithValue(metricsapi.LabelHorizon, "15m"))
		body, code := get(ctx, t, hpa, ns, metricsapi.MetricDueForecast, metricsapi.LabelName+"=web,horizon=24h")
		g.Expect(code).To(Equal(http.StatusServiceUnavailable), "body: %s", body)
		g.Expect(string(body)).To(ContainSubstring("do not hold all their rows due within 24h"))
		body, code = get(ctx, t, hpa, ns, metricsapi.MetricDueForecast, metricsapi.LabelName+"=web")
		g.Expect(code).To(Equal(http.StatusBadRequest), "body: %s", body)
		g.Expect(string(body)).To(ContainSubstring("names no horizon"))
	})

	t.Run("never computed is a 503", func(t *testing.T) {
		g := NewWithT(t)
		body, code := get(ctx, t, hpa, ns, metricsapi.MetricDueLowerBound, metricsapi.LabelName+"=fresh")
		g.Expect(code).To(Equal(http.StatusServiceUnavailable), "body: %s", body)
		g.Expect(string(body)).To(ContainSubstring("never computed"))
	})

	t.Run("no match is a 404, not 0", func(t *testing.T) {
		g := NewWithT(t)
		body, code := get(ctx, t, hpa, ns, metricsapi.MetricDue, metricsapi.LabelName+"=nope")
		g.Expect(code).To(Equal(http.StatusNotFound), "body: %s", body)
		g.Expect(string(body)).To(ContainSubstring("no RenderQueue selected"))
		body, code = get(ctx, t, hpa, "other-namespace", metricsapi.MetricDue, metricsapi.LabelName+"=web")
		g.Expect(code).To(Equal(http.StatusNotFound), "RenderQueues of another namespace must not be selected; body: %s", body)
	})

	t.Run("unknown metric is a 404", func(t *testing.T) {
		_, code := get(ctx, t, hpa, ns, "renderqueue_rows", "")
		NewWithT(t).Expect(code).To(Equal(http.StatusNotFound))
	})

	t.Run("becomes a value when the RenderQueue turns exact", func(t *testing.T) {
		g := NewWithT(t)
		now := metav1.NewTime(time.Now().UTC().Truncate(time.Second))
		mail.Status.Due, mail.Status.DueExact, mail.Status.DueAsOf = 9, true, &now
		g.Expect(k8s.Status().Update(ctx, mail)).To(Succeed())
		g.Eventually(func(g Gomega) {
			list, err := metrics.NamespacedMetrics(ns).List(metricsapi.MetricDue, byName("mail"))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(list.Items).To(HaveLen(1))
			g.Expect(list.Items[0].Value.Value()).To(Equal(int64(9)))
			g.Expect(list.Items[0].Timestamp.Time.Equal(now.Time)).To(BeTrue())
		}).WithTimeout(10 * time.Second).Should(Succeed())
	})

	// Stock Kubernetes already lets the HPA controller read every external metric (bootstrap
	// role system:controller:horizontal-pod-autoscaler), so the component's ClusterRole is
	// checked with a subject of its own.
	t.Run("the component's ClusterRole grants the RenderQueue metrics and nothing else", func(t *testing.T) {
		g := NewWithT(t)
		const reader = "system:serviceaccount:render:reader"
		g.Expect(k8s.Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "test-reader"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "renderqueue-external-metrics-reader"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "render", Name: "reader"}},
		})).To(Succeed())
		// RBAC is cached by the kube-apiserver's authorizer, and the metrics server's delegated
		// authorizer caches a denial for 10 s (the default unauthorized TTL): a first request that
		// raced the binding is refused for that long. Wait until the binding is seen past both.
		g.Eventually(func() int {
			_, code := get(ctx, t, as(reader), ns, metricsapi.MetricDueLowerBound, metricsapi.LabelName+"=web")
			return code
		}).WithTimeout(30 * time.Second).Should(Equal(http.StatusOK))
		_, code := get(ctx, t, as(reader), ns, metricsapi.MetricDue, metricsapi.LabelName+"=web")
		g.Expect(code).To(Equal(http.StatusOK))
		_, code = get(ctx, t, as(reader), ns, "some_other_metric", "")
		g.Expect(code).To(Equal(http.StatusForbidden), "the ClusterRole must name the RenderQueue metrics only")
	})

	// The aggregator reaches the server through the component's APIService and an ExternalName
	// Service for localhost (EndpointSlices may not point at loopback addresses), verifying its
	// certificate against the caBundle the server writes into the APIService.
	t.Run("through the kube-apiserver aggregator", func(t *testing.T) {
		g := NewWithT(t)
		g.Expect(k8s.Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "renderqueue-metrics-api", Namespace: "renderqueue-system"},
			Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost"},
		})).To(Succeed())
		apiService := readYAML(t, filepath.Join("..", "..", "config", "metrics-api", "apiservice.yaml"))
		g.Expect(unstructured.SetNestedField(apiService.Object, int64(lis.Addr().(*net.TCPAddr).Port), "spec", "service", "port")).To(Succeed())
		g.Expect(k8s.Create(ctx, apiService)).To(Succeed())

		viaAggregator := rest.CopyConfig(admin)
		viaAggregator.Impersonate = rest.ImpersonationConfig{UserName: hpaSA}
		aggregated, err := externalclient.NewForConfig(viaAggregator)
		g.Expect(err).NotTo(HaveOccurred())
		g.Eventually(func(g Gomega) {
			list, err := aggregated.NamespacedMetrics(ns).List(metricsapi.MetricDue, byName("web"))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(list.Items).To(HaveLen(1))
			g.Expect(list.Items[0].Value.Value()).To(Equal(int64(120)))
			g.Expect(list.Items[0].Timestamp.Time.Equal(asOf)).To(BeTrue())
		}).WithTimeout(60 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())

		body, code := get(ctx, t, viaAggregator, ns, metricsapi.MetricDue, metricsapi.LabelName+"=fresh")
		g.Expect(code).To(Equal(http.StatusServiceUnavailable), "body: %s", body)
		g.Expect(string(body)).To(ContainSubstring("never computed"))
		// The 200 above means the server authenticated the aggregator's front-proxy headers (it
		// refuses anonymous requests, see below); identities without RBAC stay out.
		nosy := rest.CopyConfig(admin)
		nosy.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:render:nosy"}
		_, code = get(ctx, t, nosy, ns, metricsapi.MetricDue, "")
		g.Expect(code).To(Equal(http.StatusForbidden))
	})

	t.Run("other identities are refused", func(t *testing.T) {
		g := NewWithT(t)
		_, code := get(ctx, t, as("system:serviceaccount:render:nosy"), ns, metricsapi.MetricDue, "")
		g.Expect(code).To(Equal(http.StatusForbidden))
		anon := as(hpaSA)
		anon.CertData, anon.KeyData, anon.Impersonate = nil, nil, rest.ImpersonationConfig{}
		_, code = get(ctx, t, anon, ns, metricsapi.MetricDue, "")
		g.Expect(code).To(Equal(http.StatusForbidden), "anonymous requests must be refused")
	})
}

// get sends GET /apis/external.metrics.k8s.io/v1beta1/namespaces/<ns>/<metric>?labelSelector=...
// with cfg and returns the body and status code.
func get(ctx context.Context, t *testing.T, cfg *rest.Config, ns, metric, selector string) ([]byte, int) {
	t.Helper()
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &v1beta1.SchemeGroupVersion
	c.APIPath = "/apis"
	c.NegotiatedSerializer = clientgoscheme.Codecs.WithoutConversion()
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		t.Fatalf("REST client: %v", err)
	}
	req := rc.Get().AbsPath("/apis/external.metrics.k8s.io/v1beta1/namespaces", ns, metric)
	if selector != "" {
		req = req.Param("labelSelector", selector)
	}
	var code int
	body, err := req.Do(ctx).StatusCode(&code).Raw()
	var status apierrors.APIStatus
	if err != nil && !errors.As(err, &status) {
		t.Fatalf("GET %s: %v", metric, err)
	}
	return body, code
}

func createRQ(ctx context.Context, t *testing.T, k8s client.Client, ns, name string, lbls map[string]string, status func(*rqv1.RenderQueueStatus)) *rqv1.RenderQueue {
	t.Helper()
	rq := &rqv1.RenderQueue{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: lbls},
		Spec:       rqv1.RenderQueueSpec{Store: rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "dsn"}}},
	}
	if err := k8s.Create(ctx, rq); err != nil {
		t.Fatalf("create RenderQueue %s: %v", name, err)
	}
	if status != nil {
		status(&rq.Status)
		if err := k8s.Status().Update(ctx, rq); err != nil {
			t.Fatalf("update status of RenderQueue %s: %v", name, err)
		}
	}
	return rq
}

// readYAML reads a single-object YAML file.
func readYAML(t *testing.T, path string) *unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	u := &unstructured.Unstructured{}
	if err := utilyaml.Unmarshal(b, &u.Object); err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
	return u
}

// applyYAML creates every object of a (multi-document) YAML file.
func applyYAML(ctx context.Context, t *testing.T, k8s client.Client, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer func() { _ = f.Close() }()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return
			}
			t.Fatalf("decode %s: %v", path, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := k8s.Create(ctx, u); err != nil {
			t.Fatalf("create %s %s from %s: %v", u.GetKind(), u.GetName(), path, err)
		}
	}
}

// writeKubeconfig writes a kubeconfig for the API server of admin, with admin's credentials
// impersonating user, into a test directory and returns its path.
func writeKubeconfig(t *testing.T, admin *rest.Config, user string) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: admin.Host, CertificateAuthorityData: admin.CAData}
	kc.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificateData: admin.CertData, ClientKeyData: admin.KeyData, Impersonate: user}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "user"}
	kc.CurrentContext = "envtest"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatalf("write kubeconfig: %v", err)
	}
	return path
}
