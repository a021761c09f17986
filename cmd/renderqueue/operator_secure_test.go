package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// createManifest creates every object of a YAML file of the repository (config/rbac/...).
func createManifest(t *testing.T, ctx context.Context, c client.Client, path ...string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(append([]string{"..", ".."}, path...)...))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(data), "\n---") {
		var u unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("%s: %v", filepath.Join(path...), err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := c.Create(ctx, &u); err != nil {
			t.Fatalf("creating %s %s of %s: %v", u.GetKind(), u.GetName(), filepath.Join(path...), err)
		}
	}
}

// TestOperatorMetricsSecure runs `renderqueue operator --metrics-secure` against a real
// kube-apiserver (envtest), as a user holding only the operator's generated ClusterRole
// (config/rbac/role.yaml, from the kubebuilder markers), and reads its metrics port as Prometheus
// and KEDA do: /metrics is served over HTTPS to a token whose ServiceAccount is bound to
// renderqueue-metrics-reader (config/rbac/metrics_reader_role.yaml) only — 401 without a token,
// 403 for any other identity — while the scaler endpoint keeps its own check (get on the
// RenderQueue), so KEDA's token reads it and the metrics reader's does not.
func TestOperatorMetricsSecure(t *testing.T) {
	env, cfg, admin := startAPIServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	const ns = "render"
	for _, n := range []string{ns, "renderqueue-system"} {
		if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	createManifest(t, ctx, admin, "config", "rbac", "role.yaml")
	createManifest(t, ctx, admin, "config", "rbac", "metrics_reader_role.yaml")
	bind := func(name, role string, subject rbacv1.Subject) client.Object {
		return &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role}, Subjects: []rbacv1.Subject{subject}}
	}
	for _, obj := range []client.Object{
		bind("renderqueue-operator", "renderqueue-operator", rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "operator"}),
		&rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns}, Spec: rqv1.RenderQueueSpec{
			Shards: 1, Store: rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "pg", Key: "dsn"}}}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "prometheus", Namespace: ns}},
		bind("prometheus", "renderqueue-metrics-reader", rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: ns}),
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "keda", Namespace: ns}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "keda", Namespace: ns}, Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{rqv1.Group}, Resources: []string{"renderqueues"}, ResourceNames: []string{"web"}, Verbs: []string{"get"}}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "keda", Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "keda"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "keda", Namespace: ns}}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "stranger", Namespace: ns}},
	} {
		if err := admin.Create(ctx, obj); err != nil {
			t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
		}
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		tr, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	kubeconfig := writeKubeconfig(t, env, envtest.User{Name: "operator"})

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	logs := &syncBuffer{}
	op := execSelf(t, ctx, logs, "operator", "--kubeconfig", kubeconfig, "--keeper-image", "renderqueue:test",
		"--metrics-bind-address", addr, "--metrics-secure", "--health-probe-bind-address", "0", "--shard-ca-secret", "")
	t.Cleanup(func() {
		cancel()
		err := op.Wait()
		if op.ProcessState == nil || !op.ProcessState.Success() {
			t.Errorf("the operator did not stop cleanly on SIGTERM: %v\n%s", err, logs.String())
		}
	})

	// the certificate is self-signed (no --metrics-cert-dir), as Prometheus's insecureSkipVerify
	// takes it
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(scheme, path, bearer string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	prom, keda, stranger := token("prometheus"), token("keda"), token("stranger")
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, body := get("https", "/metrics", prom)
		if code == http.StatusOK && strings.Contains(body, `renderqueue_build_info{component="operator"`) &&
			strings.Contains(body, `controller_runtime_reconcile_errors_total{controller="renderqueue"}`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics with the metrics reader's token: HTTP %d within 60 s: %.300s\noperator log:\n%s", code, body, logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}

	scaler := "/scaler/v1/namespaces/" + ns + "/renderqueues/web"
	for _, tc := range []struct {
		what, scheme, path, token string
		want                      int
	}{
		{"/metrics without a token", "https", "/metrics", "", http.StatusUnauthorized},
		{"/metrics as a ServiceAccount without renderqueue-metrics-reader", "https", "/metrics", stranger, http.StatusForbidden},
		{"/metrics as KEDA (may get the RenderQueue, not /metrics)", "https", "/metrics", keda, http.StatusForbidden},
		{"the scaler endpoint as KEDA: its own check passes (503: no shard runs)", "https", scaler, keda, http.StatusServiceUnavailable},
		{"the scaler endpoint as the metrics reader (may not get the RenderQueue)", "https", scaler, prom, http.StatusForbidden},
		{"the scaler endpoint without a token", "https", scaler, "", http.StatusUnauthorized},
	} {
		if code, body := get(tc.scheme, tc.path, tc.token); code != tc.want {
			t.Errorf("%s: HTTP %d, want %d: %.300s", tc.what, code, tc.want, body)
		}
	}
	// controller-runtime's filter answers a token the TokenReview calls invalid with 500
	// ("Authentication failed"), not 401: refused all the same
	if code, body := get("https", "/metrics", "not-a-token"); code == http.StatusOK || strings.Contains(body, "renderqueue_build_info") {
		t.Errorf("/metrics with an invalid token: HTTP %d: %.200s", code, body)
	}
	if code, body := get("http", "/metrics", prom); code == http.StatusOK {
		t.Errorf("plain HTTP served /metrics: %.200s", body)
	}
	if t.Failed() {
		fmt.Fprintf(os.Stderr, "operator log:\n%s\n", logs.String())
	}
}
