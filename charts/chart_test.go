// Package charts holds the Helm chart (charts/renderqueue) and this test, which keeps it what
// config/ installs: with the default values it must render config/default's objects, and every
// option must render objects a real API server takes.
package charts_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

// chartLabels are the labels the chart adds to every object (its _helpers.tpl), which config/
// does not have.
var chartLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}

// helm is the helm binary (RENDERQUEUE_HELM, set by hack/test.sh from hack/helm.sh).
func helm(t *testing.T) string {
	t.Helper()
	h := os.Getenv("RENDERQUEUE_HELM")
	if h == "" {
		t.Skip("RENDERQUEUE_HELM is not set: run `make test`, or `export RENDERQUEUE_HELM=$(hack/helm.sh | tail -n 1)`")
	}
	return h
}

func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// objects decodes a multi-document YAML stream, leaving out empty documents.
func objects(t *testing.T, b []byte) map[string]*unstructured.Unstructured {
	t.Helper()
	out := map[string]*unstructured.Unstructured{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatal(err)
		}
		if len(u.Object) == 0 {
			continue
		}
		k := u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
		if out[k] != nil {
			t.Errorf("%s twice", k)
		}
		out[k] = &u
	}
}

// template renders the chart into namespace ns with the values files and --set flags given.
func template(t *testing.T, ns string, args ...string) map[string]*unstructured.Unstructured {
	t.Helper()
	return objects(t, run(t, helm(t), append([]string{"template", "renderqueue", "renderqueue", "--namespace", ns, "--include-crds"}, args...)...))
}

// TestChartIsConfigDefault renders the chart with its default values into renderqueue-system and
// config/default with kubectl's kustomize, and wants the same objects (but the Namespace, which
// Helm does not own, and the chart's own labels): the chart and config/ cannot drift apart.
func TestChartIsConfigDefault(t *testing.T) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set: no kubectl to render config/default with")
	}
	chart := template(t, "renderqueue-system")
	want := objects(t, run(t, filepath.Join(assets, "kubectl"), "kustomize", filepath.Join("..", "config", "default")))
	delete(want, "Namespace /renderqueue-system")
	for k, o := range chart {
		labels := o.GetLabels()
		for _, l := range chartLabels {
			if _, ok := labels[l]; !ok && o.GetKind() != "CustomResourceDefinition" { // crds/ is not templated
				t.Errorf("%s lacks the chart label %s", k, l)
			}
			delete(labels, l)
		}
		if len(labels) == 0 {
			labels = nil
		}
		o.SetLabels(labels)
	}
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		got := chart[k]
		if got == nil {
			t.Errorf("the chart has no %s (config/default has)", k)
			continue
		}
		if !equality.Semantic.DeepEqual(got.Object, want[k].Object) {
			g, _ := yaml.Marshal(got.Object)
			w, _ := yaml.Marshal(want[k].Object)
			t.Errorf("%s differs between the chart and config/default:\nchart:\n%s\nconfig/default:\n%s", k, g, w)
		}
		delete(chart, k)
	}
	for k := range chart {
		t.Errorf("the chart has %s, config/default has not", k)
	}
}

// allValues turns every option of the chart on (but the prometheus-operator objects, whose
// kinds a bare API server does not know: TestChartMonitoring renders them).
var allValues = []string{
	"--set", "image.digest=sha256:" + strings.Repeat("ab", 32),
	"--set", "imagePullSecrets[0].name=regcred",
	"--set", "operator.replicas=2",
	"--set", "operator.watchNamespaces={team-a,team-b}",
	"--set", "operator.allowedImages={registry.example/renderqueue:*}",
	"--set", "operator.logFormat=json",
	"--set", "operator.logLevel=debug",
	"--set", "operator.shardCASecret=my-shard-ca",
	"--set", "operator.nodeSelector.pool=system",
	"--set", "operator.tolerations[0].key=dedicated",
	"--set", "operator.tolerations[0].operator=Exists",
	"--set", "podDisruptionBudget.enabled=true",
	"--set", "metricsAPI.enabled=false",
	"--set", "console.enabled=true",
	"--set", "commonLabels.team=platform",
}

// TestChartLint runs helm lint with the defaults and with every option on.
func TestChartLint(t *testing.T) {
	h := helm(t)
	run(t, h, "lint", "--strict", "renderqueue")
	run(t, h, append([]string{"lint", "--strict", "renderqueue"}, allValues...)...)
}

// TestChartOptions renders every option into a namespace of its own and applies the result,
// server side, to a real API server (envtest), which must take every object; and checks what the
// options change.
func TestChartOptions(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set: no API server to apply the chart to")
	}
	objs := template(t, "platform-rq", allValues...)
	dep := objs["Deployment platform-rq/renderqueue-operator"]
	if dep == nil {
		t.Fatal("no operator Deployment")
	}
	b, _ := yaml.Marshal(dep.Object)
	for _, want := range []string{"@sha256:abab", "--watch-namespaces=team-a,team-b", "--allowed-images=registry.example/renderqueue:*",
		"--log-format=json", "--log-level=debug", "--shard-ca-secret=my-shard-ca", "--console", "regcred", "pool: system", "dedicated",
		"replicas: 2", "team: platform"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("the Deployment lacks %q:\n%s", want, b)
		}
	}
	if bytes.Contains(b, []byte("--metrics-api")) {
		t.Error("metricsAPI.enabled=false, but the operator runs --metrics-api")
	}
	for _, k := range []string{"RoleBinding team-a/renderqueue-operator", "RoleBinding team-b/renderqueue-operator",
		"PodDisruptionBudget platform-rq/renderqueue-operator", "Service platform-rq/renderqueue-console"} {
		if objs[k] == nil {
			t.Errorf("no %s", k)
		}
	}
	for _, k := range []string{"ClusterRoleBinding /renderqueue-operator", "APIService /v1beta1.external.metrics.k8s.io"} {
		if objs[k] != nil {
			t.Errorf("%s rendered, but the options leave it out", k)
		}
	}

	env := &envtest.Environment{}
	if _, err := env.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	user, err := env.AddUser(envtest.User{Name: "installer", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubectl, err := user.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, ns := range []string{"platform-rq", "team-a", "team-b"} {
		docs = append(docs, "apiVersion: v1\nkind: Namespace\nmetadata: {name: "+ns+"}\n")
	}
	for _, o := range objs {
		y, _ := yaml.Marshal(o.Object)
		docs = append(docs, string(y))
	}
	path := filepath.Join(t.TempDir(), "chart.yaml")
	if err := os.WriteFile(path, []byte(strings.Join(docs, "---\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := kubectl.Run("apply", "--server-side", "-f", path)
	if err != nil {
		out, _ := io.ReadAll(stdout)
		e, _ := io.ReadAll(stderr)
		t.Fatalf("kubectl apply --server-side of the chart with every option: %v\n%s%s", err, out, e)
	}
}

// TestChartMonitoring renders the PodMonitors and the PrometheusRule: config/prometheus's, in the
// release's namespace, with the labels asked for and their alert texts untouched by Helm.
func TestChartMonitoring(t *testing.T) {
	objs := template(t, "platform-rq", "--set", "monitoring.podMonitors.enabled=true", "--set", "monitoring.podMonitors.labels.release=prom",
		"--set", "monitoring.prometheusRule.enabled=true", "--set", "monitoring.prometheusRule.labels.release=prom")
	for _, name := range []string{"PodMonitor platform-rq/renderqueue-operator", "PodMonitor platform-rq/renderqueue-keepers",
		"PodMonitor platform-rq/renderqueue-workers", "PrometheusRule platform-rq/renderqueue"} {
		o := objs[name]
		if o == nil {
			t.Errorf("no %s", name)
			continue
		}
		if o.GetLabels()["release"] != "prom" {
			t.Errorf("%s: labels %v, want release=prom", name, o.GetLabels())
		}
		file := map[string]string{"PrometheusRule": "prometheusrule.yaml"}[o.GetKind()]
		if file == "" {
			file = "podmonitor-" + strings.TrimPrefix(o.GetName(), "renderqueue-") + ".yaml"
		}
		b, err := os.ReadFile(filepath.Join("..", "config", "prometheus", file))
		if err != nil {
			t.Fatal(err)
		}
		var want unstructured.Unstructured
		if err := yaml.Unmarshal(b, &want.Object); err != nil {
			t.Fatal(err)
		}
		if !equality.Semantic.DeepEqual(o.Object["spec"], want.Object["spec"]) {
			t.Errorf("%s: its spec is not config/prometheus/%s's", name, file)
		}
	}
}

// TestChartCopies: the chart's CRD and prometheus files are config/'s (make manifests copies
// them).
func TestChartCopies(t *testing.T) {
	for chart, config := range map[string]string{
		"renderqueue/crds/renderqueue.dev_renderqueues.yaml": "../config/crd/bases/renderqueue.dev_renderqueues.yaml",
		"renderqueue/files/podmonitor-operator.yaml":         "../config/prometheus/podmonitor-operator.yaml",
		"renderqueue/files/podmonitor-keepers.yaml":          "../config/prometheus/podmonitor-keepers.yaml",
		"renderqueue/files/podmonitor-workers.yaml":          "../config/prometheus/podmonitor-workers.yaml",
		"renderqueue/files/prometheusrule.yaml":              "../config/prometheus/prometheusrule.yaml",
	} {
		a, err := os.ReadFile(chart)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(config)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("charts/%s is not config/%s: run `make manifests`", chart, strings.TrimPrefix(config, "../config/"))
		}
	}
}
