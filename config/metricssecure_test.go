package config_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// overlay writes a kustomization using config/default and the given components of config/ and
// renders it. kustomize takes only relative paths, so the overlay lives in the repository's
// scratch directory (.tmp, ignored by git) for the test's duration.
func overlay(t *testing.T, components ...string) manifest {
	t.Helper()
	if err := os.MkdirAll(filepath.Join("..", ".tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(filepath.Join("..", ".tmp"), "overlay")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	rel := func(p string) string {
		r, err := filepath.Rel(dir, p)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := "resources:\n  - " + rel(filepath.Join("..", "config", "default")) + "\ncomponents:\n"
	for _, c := range components {
		k += "  - " + rel(filepath.Join("..", "config", c)) + "\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return kustomize(t, dir)
}

// TestMetricsSecureComponent checks config/metrics-secure: the operator gets --metrics-secure and
// may review tokens and access, the ClusterRole renderqueue-metrics-reader (config/rbac) grants
// get on /metrics, and with config/prometheus the operator's PodMonitor scrapes https with the
// token of a ServiceAccount bound to that ClusterRole. Without config/prometheus the component
// renders too.
func TestMetricsSecureComponent(t *testing.T) {
	m := overlay(t, "prometheus", "metrics-secure")
	if a := args(operatorContainer(t, m)); !slices.Contains(a, "--metrics-secure") {
		t.Errorf("the operator's args %v lack --metrics-secure", a)
	}

	reader := m.get(t, key{"ClusterRole", "", "renderqueue-metrics-reader"})
	rules, _, _ := unstructured.NestedSlice(reader.Object, "rules")
	if len(rules) != 1 || !slices.Equal(stringList(rules[0], "nonResourceURLs"), []string{"/metrics"}) ||
		!slices.Equal(stringList(rules[0], "verbs"), []string{"get"}) {
		t.Errorf("renderqueue-metrics-reader grants %v, not get on /metrics", rules)
	}

	// the operator's ServiceAccount may create TokenReviews and SubjectAccessReviews
	delegator := m.get(t, key{"ClusterRoleBinding", "", "renderqueue-metrics-auth:system:auth-delegator"})
	dep := m.get(t, key{"Deployment", operatorNS, operatorName})
	sa, _, _ := unstructured.NestedString(dep.Object, "spec", "template", "spec", "serviceAccountName")
	if !bindsServiceAccount(delegator, operatorNS, sa) {
		t.Errorf("the auth-delegator binding does not bind the operator's ServiceAccount %s: %v", sa, delegator.Object["subjects"])
	}
	if ref, _, _ := unstructured.NestedString(delegator.Object, "roleRef", "name"); ref != "system:auth-delegator" {
		t.Errorf("the auth-delegator binding binds %s", ref)
	}

	// the PodMonitor presents the scraper's token over https
	pm := m.get(t, key{"PodMonitor", operatorNS, "renderqueue-operator"})
	eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	ep := eps[0].(map[string]any)
	secretName, _, _ := unstructured.NestedString(ep, "authorization", "credentials", "name")
	secretKey, _, _ := unstructured.NestedString(ep, "authorization", "credentials", "key")
	skip, _, _ := unstructured.NestedBool(ep, "tlsConfig", "insecureSkipVerify")
	if ep["scheme"] != "https" || !skip || secretKey != "token" {
		t.Errorf("the operator's PodMonitor endpoint %v does not scrape https with a token", ep)
	}
	secret := m.get(t, key{"Secret", operatorNS, secretName})
	scraper := secret.GetAnnotations()["kubernetes.io/service-account.name"]
	if secret.Object["type"] != "kubernetes.io/service-account-token" || scraper == "" {
		t.Fatalf("Secret %s is not a ServiceAccount token: %v", secretName, secret.Object)
	}
	m.get(t, key{"ServiceAccount", operatorNS, scraper})
	bound := false
	for _, o := range m.objs {
		ref, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
		if o.GetKind() == "ClusterRoleBinding" && ref == "renderqueue-metrics-reader" && bindsServiceAccount(o, operatorNS, scraper) {
			bound = true
		}
	}
	if !bound {
		t.Errorf("no ClusterRoleBinding binds renderqueue-metrics-reader to the scraper %s", scraper)
	}

	// without config/prometheus: the flag, no PodMonitor
	plain := overlay(t, "metrics-secure")
	if a := args(operatorContainer(t, plain)); !slices.Contains(a, "--metrics-secure") {
		t.Errorf("without config/prometheus the operator's args %v lack --metrics-secure", a)
	}
	if o := plain.byKey()[key{"PodMonitor", operatorNS, "renderqueue-operator"}]; o != nil {
		t.Error("config/metrics-secure alone adds a PodMonitor")
	}
	// and config/default serves /metrics as before, with the reader role installed
	def := kustomize(t, "default")
	if a := args(operatorContainer(t, def)); slices.Contains(a, "--metrics-secure") {
		t.Errorf("config/default's operator runs with --metrics-secure: %v", a)
	}
	def.get(t, key{"ClusterRole", "", "renderqueue-metrics-reader"})
}

func stringList(m any, field string) []string {
	l, _ := m.(map[string]any)[field].([]any)
	out := make([]string, 0, len(l))
	for _, v := range l {
		s, _ := v.(string)
		out = append(out, s)
	}
	return out
}

func bindsServiceAccount(binding *unstructured.Unstructured, namespace, name string) bool {
	subjects, _, _ := unstructured.NestedSlice(binding.Object, "subjects")
	for _, s := range subjects {
		s := s.(map[string]any)
		if s["kind"] == "ServiceAccount" && s["namespace"] == namespace && s["name"] == name {
			return true
		}
	}
	return false
}
