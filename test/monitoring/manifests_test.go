package monitoring

import (
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/renderqueue/renderqueue/pkg/metricsapi"
)

// docs reads the YAML documents of a manifest file.
func docs(t *testing.T, path ...string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(append([]string{repo}, path...)...))
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(d) == "" {
			continue
		}
		var m map[string]any
		if err := yaml.Unmarshal([]byte(d), &m); err != nil {
			t.Fatalf("%s: %v", filepath.Join(path...), err)
		}
		if m != nil {
			out = append(out, m)
		}
	}
	return out
}

// at walks m along keys (string keys, int indexes).
func at(m any, keys ...any) any {
	for _, k := range keys {
		switch k := k.(type) {
		case string:
			mm, _ := m.(map[string]any)
			m = mm[k]
		case int:
			l, _ := m.([]any)
			if k >= len(l) {
				return nil
			}
			m = l[k]
		}
	}
	return m
}

func kindOf(t *testing.T, ds []map[string]any, kind string) map[string]any {
	t.Helper()
	for _, d := range ds {
		if d["kind"] == kind {
			return d
		}
	}
	t.Fatalf("no %s", kind)
	return nil
}

// TestManifestsAgree checks that what users install points at what the operator serves: the
// operator PodMonitor's port exists on the operator's container, and the KEDA sample reads the
// scaler endpoint through the operator's metrics Service, at the value location it answers with.
func TestManifestsAgree(t *testing.T) {
	deploy := kindOf(t, docs(t, "config", "manager", "manager.yaml"), "Deployment")
	ports := map[string]float64{}
	for _, p := range at(deploy, "spec", "template", "spec", "containers", 0, "ports").([]any) {
		ports[at(p, "name").(string)] = at(p, "containerPort").(float64)
	}

	pm := kindOf(t, docs(t, "config", "prometheus", "podmonitor-operator.yaml"), "PodMonitor")
	port, _ := at(pm, "spec", "podMetricsEndpoints", 0, "port").(string)
	if _, ok := ports[port]; !ok {
		t.Errorf("the operator PodMonitor scrapes port %q; the operator's container has %v", port, ports)
	}
	if at(pm, "spec", "podMetricsEndpoints", 0, "honorLabels") != true {
		t.Error("the operator PodMonitor must keep the series' namespace label (honorLabels: true)")
	}

	svc := kindOf(t, docs(t, "config", "manager", "service.yaml"), "Service")
	svcHost := at(svc, "metadata", "name").(string) + "." + at(svc, "metadata", "namespace").(string) + ".svc"
	svcPort := at(svc, "spec", "ports", 0, "port").(float64)
	if target := at(svc, "spec", "ports", 0, "targetPort"); target != "metrics" || ports["metrics"] == 0 {
		t.Errorf("the metrics Service targets %v; the container's ports are %v", target, ports)
	}

	so := kindOf(t, docs(t, "config", "samples", "keda", "scaledobject.yaml"), "ScaledObject")
	trigger := at(so, "spec", "triggers", 0)
	if at(trigger, "type") != "metrics-api" || at(trigger, "metadata", "authMode") != "bearer" ||
		at(trigger, "metadata", "valueLocation") != metricsapi.ScalerValueLocation || at(trigger, "metadata", "format") != "json" {
		t.Errorf("the KEDA trigger %v", trigger)
	}
	u, err := url.Parse(at(trigger, "metadata", "url").(string))
	if err != nil {
		t.Fatal(err)
	}
	if u.Hostname() != svcHost || u.Port() != strconv.FormatFloat(svcPort, 'f', -1, 64) {
		t.Errorf("the KEDA trigger reads %s, not the metrics Service %s:%v", u.Host, svcHost, svcPort)
	}
	if !regexp.MustCompile(`^` + regexp.QuoteMeta(metricsapi.ScalerPathPrefix) + `v1/namespaces/[a-z0-9-]+/renderqueues/[a-z0-9.-]+$`).MatchString(u.Path) {
		t.Errorf("the KEDA trigger's path %s is not the scaler endpoint's", u.Path)
	}
	if at(so, "spec", "fallback") != nil {
		t.Error("the KEDA sample must not fall back to fixed replicas while the count is inexact")
	}
	auth := at(trigger, "authenticationRef", "name")
	ta := kindOf(t, docs(t, "config", "samples", "keda", "scaledobject.yaml"), "TriggerAuthentication")
	if at(ta, "metadata", "name") != auth || at(ta, "spec", "secretTargetRef", 0, "parameter") != "token" {
		t.Errorf("the TriggerAuthentication %v does not hand KEDA a token", ta)
	}
	role := kindOf(t, docs(t, "config", "samples", "keda", "role.yaml"), "Role")
	rule := at(role, "rules", 0)
	if !slices.Contains(toStrings(at(rule, "verbs")), "get") || !slices.Contains(toStrings(at(rule, "resources")), "renderqueues") {
		t.Errorf("the sample Role %v does not allow getting the RenderQueue", rule)
	}
}

func toStrings(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, x := range l {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// TestWorkerPodMonitor checks that the workers' PodMonitor scrapes the sample render workers: the
// label it selects on is on their Pod template, the port it scrapes is their container's, and
// the sample serves pkg/client's metrics there.
func TestWorkerPodMonitor(t *testing.T) {
	pm := kindOf(t, docs(t, "config", "prometheus", "podmonitor-workers.yaml"), "PodMonitor")
	if at(pm, "spec", "namespaceSelector", "any") != true {
		t.Error("render workers run in the RenderQueues' namespaces: the PodMonitor must select any")
	}
	expr := at(pm, "spec", "selector", "matchExpressions", 0)
	label, _ := at(expr, "key").(string)
	if at(expr, "operator") != "Exists" || label == "" {
		t.Fatalf("the workers' PodMonitor selects %v", at(pm, "spec", "selector"))
	}
	relabel := at(pm, "spec", "podMetricsEndpoints", 0, "relabelings", 0)
	if src := toStrings(at(relabel, "sourceLabels")); len(src) != 1 || src[0] != "__meta_kubernetes_pod_label_"+sanitize(label) ||
		at(relabel, "targetLabel") != "renderqueue" {
		t.Errorf("the workers' PodMonitor relabels %v, not %s to renderqueue", relabel, label)
	}

	deploy := kindOf(t, docs(t, "config", "samples", "workers", "deployment.yaml"), "Deployment")
	podLabels, _ := at(deploy, "spec", "template", "metadata", "labels").(map[string]any)
	if podLabels[label] != "web" {
		t.Errorf("the sample workers' Pods are not labelled %s=web (the RenderQueue they work for): %v", label, podLabels)
	}
	port, _ := at(pm, "spec", "podMetricsEndpoints", 0, "port").(string)
	c := at(deploy, "spec", "template", "spec", "containers", 0)
	var containerPort float64
	for _, p := range at(c, "ports").([]any) {
		if at(p, "name") == port {
			containerPort, _ = at(p, "containerPort").(float64)
		}
	}
	if containerPort == 0 {
		t.Fatalf("the sample workers have no port %q: %v", port, at(c, "ports"))
	}
	if want := "--metrics-listen=:" + strconv.FormatFloat(containerPort, 'f', -1, 64); !slices.Contains(toStrings(at(c, "args")), want) {
		t.Errorf("the sample workers do not serve their metrics on port %q (%s): %v", port, want, at(c, "args"))
	}
}

// sanitize is Prometheus's Kubernetes discovery's label name for a Pod label key: every character
// outside [a-zA-Z0-9_] becomes _.
func sanitize(key string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			return r
		}
		return '_'
	}, key)
}
