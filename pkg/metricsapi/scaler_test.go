package metricsapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/metricsapi"
)

// kedaRead reads url the way KEDA's metrics-api trigger does with authMode bearer: GET with the
// token, any status but 200 is an error, and the value is the number at valueLocation (a GJSON
// path) of the body.
func kedaRead(t *testing.T, url, token, valueLocation string) (float64, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("api returned %d: %s", resp.StatusCode, body)
	}
	v := gjson.GetBytes(body, valueLocation)
	if v.Type != gjson.Number {
		return 0, fmt.Errorf("valueLocation must point to value of type number or a string representing a Quantity got: '%s'", v.Type)
	}
	return v.Num, nil
}

// TestScalerEndpoint serves the scaler endpoint against a real kube-apiserver (envtest): the
// operator delegates with only its generated RBAC (config/rbac), callers present real
// ServiceAccount tokens, and the RenderQueues' status is what the API server stores.
func TestScalerEndpoint(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set, so there is no kube-apiserver/etcd to review tokens against: " +
			"run `make test` (hack/test.sh sets it) or `export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)`")
	}
	g := NewWithT(t)
	ctx := context.Background()
	scheme := runtime.NewScheme()
	g.Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	g.Expect(rqv1.AddToScheme(scheme)).To(Succeed())
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	admin, err := env.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	k8s, err := client.New(admin, client.Options{Scheme: scheme})
	g.Expect(err).NotTo(HaveOccurred())
	// role.yaml holds the leader election Role in the operator's namespace
	g.Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "renderqueue-system"}})).To(Succeed())
	for _, f := range []string{"role.yaml", "role_binding.yaml"} {
		applyYAML(ctx, t, k8s, filepath.Join("..", "..", "config", "rbac", f))
	}

	const ns = "render"
	g.Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	g.Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere"}})).To(Succeed())
	asOf := time.Now().UTC().Add(-30 * time.Second).Truncate(time.Second)
	createRQ(ctx, t, k8s, ns, "web", nil, func(s *rqv1.RenderQueueStatus) {
		s.Due, s.DueExact, s.DueAsOf = 48210, true, &metav1.Time{Time: asOf}
	})
	createRQ(ctx, t, k8s, ns, "mail", nil, func(s *rqv1.RenderQueueStatus) {
		s.Due, s.DueExact, s.DueAsOf = 7, false, &metav1.Time{Time: asOf}
		s.Conditions = []metav1.Condition{{Type: rqv1.ConditionExact, Status: metav1.ConditionFalse,
			Reason: rqv1.ReasonShardUnreachable, Message: "mail-shard-1 unreachable", LastTransitionTime: metav1.Time{Time: asOf}}}
	})
	createRQ(ctx, t, k8s, ns, "fresh", nil, nil)
	createRQ(ctx, t, k8s, "elsewhere", "web", nil, func(s *rqv1.RenderQueueStatus) {
		s.Due, s.DueExact, s.DueAsOf = 1, true, &metav1.Time{Time: asOf}
	})

	// The caller KEDA uses: a ServiceAccount of the workers' namespace that may get the
	// RenderQueues of its namespace; and one that may not.
	kube, err := kubernetes.NewForConfig(admin)
	g.Expect(err).NotTo(HaveOccurred())
	token := func(name string) string {
		g.Expect(k8s.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}})).To(Succeed())
		tr, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		return tr.Status.Token
	}
	scalerToken, outsiderToken := token("render-workers-scaler"), token("outsider")
	g.Expect(k8s.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "renderqueue-scaler", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{rqv1.Group}, Resources: []string{"renderqueues"},
			Verbs: []string{"get"}}},
	})).To(Succeed())
	g.Expect(k8s.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "renderqueue-scaler", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "renderqueue-scaler"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "render-workers-scaler", Namespace: ns}},
	})).To(Succeed())

	// The endpoint, delegating as the operator's ServiceAccount.
	delegation := rest.CopyConfig(admin)
	delegation.Impersonate = rest.ImpersonationConfig{UserName: operatorSA}
	authn, authz, err := metricsapi.NewDelegatingAuth(delegation)
	g.Expect(err).NotTo(HaveOccurred())
	reg := prometheus.NewPedanticRegistry()
	reqMetrics, err := metricsapi.NewRequestMetrics(reg)
	g.Expect(err).NotTo(HaveOccurred())
	h, err := metricsapi.NewScalerHandler(metricsapi.ScalerOptions{
		Reader: k8s, Authenticator: authn, Authorizer: authz, Metrics: reqMetrics, Log: testr.New(t),
	})
	g.Expect(err).NotTo(HaveOccurred())
	mux := http.NewServeMux()
	mux.Handle(metricsapi.ScalerPathPrefix, h) // as the operator's metrics server mounts it
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	url := func(ns, name string) string {
		return srv.URL + metricsapi.ScalerPathPrefix + "v1/namespaces/" + ns + "/renderqueues/" + name
	}
	errorsOf := func(ns, reason string) float64 {
		return counterValue(t, reg, "renderqueue_metrics_api_request_errors_total",
			map[string]string{"api": metricsapi.APIScaler, "namespace": ns, "reason": reason})
	}

	t.Run("the due count at valueLocation due, with a token that may get the RenderQueue", func(t *testing.T) {
		g := NewWithT(t)
		v, err := kedaRead(t, url(ns, "web"), scalerToken, metricsapi.ScalerValueLocation)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(v).To(Equal(48210.0))
		body, code := rawGet(t, url(ns, "web"), scalerToken)
		g.Expect(code).To(Equal(http.StatusOK))
		var resp metricsapi.ScalerResponse
		g.Expect(json.Unmarshal(body, &resp)).To(Succeed())
		g.Expect(resp.Exact).To(BeTrue())
		g.Expect(resp.DueAsOf.Equal(asOf)).To(BeTrue(), "dueAsOf %v", resp.DueAsOf)
	})

	t.Run("inexact: 503 and no value, so the trigger fails and the HPA holds", func(t *testing.T) {
		g := NewWithT(t)
		_, err := kedaRead(t, url(ns, "mail"), scalerToken, metricsapi.ScalerValueLocation)
		g.Expect(err).To(MatchError(ContainSubstring("api returned 503")))
		body, code := rawGet(t, url(ns, "mail"), scalerToken)
		g.Expect(code).To(Equal(http.StatusServiceUnavailable))
		g.Expect(gjson.GetBytes(body, metricsapi.ScalerValueLocation).Exists()).To(BeFalse(), "body %s", body)
		g.Expect(gjson.GetBytes(body, "dueLowerBound").Int()).To(Equal(int64(7)))
		g.Expect(string(body)).To(And(ContainSubstring("not exact"), ContainSubstring("mail-shard-1 unreachable")))
		g.Expect(errorsOf(ns, metricsapi.ReasonInexact)).To(BeNumerically(">=", 1))
	})

	t.Run("never computed: 503", func(t *testing.T) {
		g := NewWithT(t)
		_, err := kedaRead(t, url(ns, "fresh"), scalerToken, metricsapi.ScalerValueLocation)
		g.Expect(err).To(MatchError(And(ContainSubstring("api returned 503"), ContainSubstring("never computed"))))
		g.Expect(errorsOf(ns, metricsapi.ReasonNotComputed)).To(Equal(1.0))
	})

	t.Run("a RenderQueue that does not exist: 404", func(t *testing.T) {
		g := NewWithT(t)
		_, err := kedaRead(t, url(ns, "wbe"), scalerToken, metricsapi.ScalerValueLocation)
		g.Expect(err).To(MatchError(And(ContainSubstring("api returned 404"), ContainSubstring(`wbe\" not found`))))
		g.Expect(errorsOf(ns, metricsapi.ReasonNoneSelected)).To(Equal(1.0))
	})

	t.Run("no token, a bad token: 401", func(t *testing.T) {
		g := NewWithT(t)
		for _, tok := range []string{"", "not-a-token", scalerToken[:len(scalerToken)-4] + "AAAA"} {
			_, err := kedaRead(t, url(ns, "web"), tok, metricsapi.ScalerValueLocation)
			g.Expect(err).To(MatchError(ContainSubstring("api returned 401")), "token %q", tok)
		}
		g.Expect(errorsOf("", metricsapi.ReasonUnauthenticated)).To(Equal(3.0))
	})

	t.Run("a token that may not get the RenderQueue: 403", func(t *testing.T) {
		g := NewWithT(t)
		_, err := kedaRead(t, url(ns, "web"), outsiderToken, metricsapi.ScalerValueLocation)
		g.Expect(err).To(MatchError(And(ContainSubstring("api returned 403"), ContainSubstring("outsider"))))
		// the scaler's Role is for its own namespace only
		_, err = kedaRead(t, url("elsewhere", "web"), scalerToken, metricsapi.ScalerValueLocation)
		g.Expect(err).To(MatchError(ContainSubstring("api returned 403")))
		g.Expect(errorsOf("", metricsapi.ReasonForbidden)).To(Equal(2.0))
	})

	t.Run("bad names and paths", func(t *testing.T) {
		g := NewWithT(t)
		_, code := rawGet(t, url("Not_A_Namespace", "web"), scalerToken)
		g.Expect(code).To(Equal(http.StatusBadRequest))
		body, code := rawGet(t, srv.URL+metricsapi.ScalerPathPrefix+"v1/renderqueues", scalerToken)
		g.Expect(code).To(Equal(http.StatusNotFound))
		g.Expect(string(body)).To(ContainSubstring("renderqueues/<name>"))
	})

	t.Run("the external metrics provider counts into the same series", func(t *testing.T) {
		g := NewWithT(t)
		again, err := metricsapi.NewRequestMetrics(reg) // reuses the registered counters
		g.Expect(err).NotTo(HaveOccurred())
		p := metricsapi.NewProvider(k8s, testr.New(t)).WithRequestMetrics(again)
		byName := func(name string) labels.Selector {
			return labels.SelectorFromSet(labels.Set{metricsapi.LabelName: name})
		}
		_, err = p.GetExternalMetric(ctx, ns, byName("mail"), provider.ExternalMetricInfo{Metric: metricsapi.MetricDue})
		g.Expect(err).To(HaveOccurred())
		_, err = p.GetExternalMetric(ctx, ns, byName("web"), provider.ExternalMetricInfo{Metric: metricsapi.MetricDue})
		g.Expect(err).NotTo(HaveOccurred())
		_, err = p.GetExternalMetric(ctx, ns, byName("web"), provider.ExternalMetricInfo{Metric: "renderqueue_doo"})
		g.Expect(err).To(HaveOccurred())
		external := func(reason string) float64 {
			return counterValue(t, reg, "renderqueue_metrics_api_request_errors_total",
				map[string]string{"api": metricsapi.APIExternal, "namespace": ns, "reason": reason})
		}
		g.Expect(external(metricsapi.ReasonInexact)).To(Equal(1.0))
		g.Expect(external(metricsapi.ReasonUnknownMetric)).To(Equal(1.0))
		g.Expect(counterValue(t, reg, "renderqueue_metrics_api_requests_total",
			map[string]string{"api": metricsapi.APIExternal})).To(Equal(3.0))
	})

	t.Run("requests counted", func(t *testing.T) {
		g := NewWithT(t)
		n := counterValue(t, reg, "renderqueue_metrics_api_requests_total", map[string]string{"api": metricsapi.APIScaler})
		g.Expect(n).To(BeNumerically(">=", 12))
	})
}

func rawGet(t *testing.T, url, token string) ([]byte, int) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return body, resp.StatusCode
}

// counterValue returns the value of the counter name{labels} (exactly those labels) gathered
// from reg, 0 when there is no such series.
func counterValue(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
