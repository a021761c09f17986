package config_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/specs"
)

const (
	operatorNS     = "renderqueue-system"
	operatorName   = "renderqueue-operator"
	apiServiceName = "v1beta1.external.metrics.k8s.io"
)

// key identifies an object in a manifest.
type key struct{ Kind, Namespace, Name string }

func keyOf(o *unstructured.Unstructured) key {
	return key{o.GetKind(), o.GetNamespace(), o.GetName()}
}

// manifest is a multi-document YAML file's objects, in order.
type manifest struct {
	path string
	objs []*unstructured.Unstructured
}

func readManifest(t *testing.T, path string) manifest {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s: %v (run `make dist`)", path, err)
	}
	m := manifest{path: path}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("decoding %s: %v", path, err)
		}
		if obj == nil {
			continue
		}
		m.objs = append(m.objs, &unstructured.Unstructured{Object: obj})
	}
	if len(m.objs) == 0 {
		t.Fatalf("%s holds no objects", path)
	}
	return m
}

func (m manifest) byKey() map[key]*unstructured.Unstructured {
	out := map[key]*unstructured.Unstructured{}
	for _, o := range m.objs {
		out[keyOf(o)] = o
	}
	return out
}

// get returns the object, failing the test when the manifest lacks it.
func (m manifest) get(t *testing.T, k key) *unstructured.Unstructured {
	t.Helper()
	o := m.byKey()[k]
	if o == nil {
		t.Fatalf("%s has no %s %s/%s", m.path, k.Kind, k.Namespace, k.Name)
	}
	return o
}

// readObject reads a single-object YAML file.
func readObject(t *testing.T, path string) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(data, &obj); err != nil {
		t.Fatalf("decoding %s: %v", path, err)
	}
	return &unstructured.Unstructured{Object: obj}
}

// readKustomization reads a kustomization.yaml as a map.
func readKustomization(t *testing.T, dir string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k map[string]any
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatalf("decoding %s/kustomization.yaml: %v", dir, err)
	}
	return k
}

// metricsAPIObjects are the objects of the metrics-api component, as config/default renders them
// (the namespace transformer fills in renderqueue-system where a file has none).
func metricsAPIObjects(t *testing.T) []key {
	t.Helper()
	comp := readKustomization(t, "metrics-api")
	res, _ := comp["resources"].([]any)
	if len(res) == 0 {
		t.Fatal("metrics-api/kustomization.yaml lists no resources")
	}
	var out []key
	for _, r := range res {
		o := readObject(t, filepath.Join("metrics-api", r.(string)))
		k := keyOf(o)
		if k.Namespace == "" && namespaced(k.Kind) {
			k.Namespace = operatorNS
		}
		out = append(out, k)
	}
	return out
}

func namespaced(kind string) bool {
	switch kind {
	case "Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "APIService":
		return false
	}
	return true
}

// operatorContainer returns the Deployment's operator container (itself, not a copy).
func operatorContainer(t *testing.T, m manifest) map[string]any {
	t.Helper()
	return operatorContainerIn(t, m, operatorNS)
}

// operatorContainerIn is operatorContainer of a Deployment in namespace ns.
func operatorContainerIn(t *testing.T, m manifest, ns string) map[string]any {
	t.Helper()
	dep := m.get(t, key{"Deployment", ns, operatorName})
	containers, _, _ := unstructured.NestedFieldNoCopy(dep.Object, "spec", "template", "spec", "containers")
	list, _ := containers.([]any)
	for _, c := range list {
		if c := c.(map[string]any); c["name"] == "operator" {
			return c
		}
	}
	t.Fatalf("%s: the operator Deployment has no container named operator", m.path)
	return nil
}

func args(c map[string]any) []string {
	var out []string
	for _, a := range c["args"].([]any) {
		out = append(out, a.(string))
	}
	return out
}

func envValue(c map[string]any, name string) (string, bool) {
	env, _ := c["env"].([]any)
	for _, e := range env {
		if e := e.(map[string]any); e["name"] == name {
			v, _ := e["value"].(string)
			return v, true
		}
	}
	return "", false
}

// TestInstallYAML checks dist/install.yaml: the whole operator (what config/default declares and
// test/e2e installs with kubectl apply -k) in renderqueue-system, with a pinned image.
func TestInstallYAML(t *testing.T) {
	m := readManifest(t, filepath.Join("..", "dist", "install.yaml"))
	objs := m.byKey()
	if len(objs) != len(m.objs) {
		t.Errorf("%s holds an object twice", m.path)
	}

	for _, k := range []key{
		{"Namespace", "", operatorNS},
		{"CustomResourceDefinition", "", "renderqueues.renderqueue.dev"},
		{"ServiceAccount", operatorNS, operatorName},
		{"ClusterRole", "", operatorName},
		{"ClusterRoleBinding", "", operatorName},
		{"Deployment", operatorNS, operatorName},
	} {
		m.get(t, k)
	}
	for _, k := range metricsAPIObjects(t) {
		m.get(t, k)
	}
	for k := range objs {
		if namespaced(k.Kind) && k.Namespace != operatorNS {
			t.Errorf("%s %s is in namespace %q, want %s", k.Kind, k.Name, k.Namespace, operatorNS)
		}
	}

	// The CRD is the generated one, whole.
	crd := readObject(t, filepath.Join("crd", "bases", "renderqueue.dev_renderqueues.yaml"))
	if got := m.get(t, keyOf(crd)); !equality.Semantic.DeepEqual(got.Object, crd.Object) {
		t.Errorf("the CRD in %s differs from crd/bases (run `make manifests dist`)", m.path)
	}
	// So are the operator's ClusterRole and leader election Role, each bound to the operator.
	for _, role := range readManifest(t, filepath.Join("rbac", "role.yaml")).objs {
		k := keyOf(role)
		if got := m.get(t, k); !equality.Semantic.DeepEqual(got.Object["rules"], role.Object["rules"]) {
			t.Errorf("the %s %s in %s differs from rbac/role.yaml (run `make manifests dist`)", k.Kind, k.Name, m.path)
		}
		if !boundToOperator(m, k) {
			t.Errorf("%s: no binding gives the %s %s to the operator's ServiceAccount", m.path, k.Kind, k.Name)
		}
	}

	c := operatorContainer(t, m)
	img, _ := c["image"].(string)
	last := img[strings.LastIndex(img, "/")+1:]
	if !strings.Contains(img, "@") && (!strings.Contains(last, ":") || strings.HasSuffix(last, ":latest")) {
		t.Errorf("the operator image %q is not pinned to a release tag or digest", img)
	}
	if v, ok := envValue(c, "RENDERQUEUE_IMAGE"); !ok || v != img {
		t.Errorf("RENDERQUEUE_IMAGE %q (set: %v) differs from the operator image %q: shards would run another image", v, ok, img)
	}
	if !slices.Contains(args(c), "--metrics-api") {
		t.Errorf("operator args %q do not turn the metrics API on", args(c))
	}
	data, _ := os.ReadFile(m.path)
	if first, _, _ := strings.Cut(string(data), "\n"); !strings.Contains(first, img) {
		t.Errorf("the header %q does not name the image %s", first, img)
	}

	// The APIService points at the Service, which selects the operator's Pods.
	api := m.get(t, key{"APIService", "", apiServiceName})
	svcNS, _, _ := unstructured.NestedString(api.Object, "spec", "service", "namespace")
	svcName, _, _ := unstructured.NestedString(api.Object, "spec", "service", "name")
	svc := m.get(t, key{"Service", svcNS, svcName})
	sel, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
	podLabels, _, _ := unstructured.NestedStringMap(m.get(t, key{"Deployment", operatorNS, operatorName}).Object,
		"spec", "template", "metadata", "labels")
	if len(sel) == 0 {
		t.Errorf("Service %s/%s has no selector", svcNS, svcName)
	}
	for k, v := range sel {
		if podLabels[k] != v {
			t.Errorf("Service %s selects %s=%s, which the operator's Pods (labels %v) do not carry", svcName, k, v, podLabels)
		}
	}
}

// boundToOperator reports whether a binding in m gives the role k to the operator's ServiceAccount.
func boundToOperator(m manifest, k key) bool {
	for _, o := range m.objs {
		if o.GetKind() != "RoleBinding" && o.GetKind() != "ClusterRoleBinding" {
			continue
		}
		if o.GetKind() == "RoleBinding" && o.GetNamespace() != k.Namespace && k.Kind == "Role" {
			continue
		}
		kind, _, _ := unstructured.NestedString(o.Object, "roleRef", "kind")
		name, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
		if kind != k.Kind || name != k.Name {
			continue
		}
		subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
		for _, s := range subjects {
			s := s.(map[string]any)
			if s["kind"] == "ServiceAccount" && s["name"] == operatorName && s["namespace"] == operatorNS {
				return true
			}
		}
	}
	return false
}

// TestInstallWithoutMetricsAPI checks dist/install-without-metrics-api.yaml against
// dist/install.yaml: the same objects, byte for byte, except the metrics API component's (no
// APIService at all) and the operator's --metrics-api flag.
func TestInstallWithoutMetricsAPI(t *testing.T) {
	full := readManifest(t, filepath.Join("..", "dist", "install.yaml"))
	without := readManifest(t, filepath.Join("..", "dist", "install-without-metrics-api.yaml"))
	component := map[key]bool{}
	for _, k := range metricsAPIObjects(t) {
		component[k] = true
	}

	for _, o := range without.objs {
		if o.GetKind() == "APIService" {
			t.Errorf("%s installs the APIService %s", without.path, o.GetName())
		}
		if component[keyOf(o)] {
			t.Errorf("%s installs %s %s of the metrics API component", without.path, o.GetKind(), o.GetName())
		}
	}
	wantObjs := full.byKey()
	for k := range component {
		delete(wantObjs, k)
	}
	got := without.byKey()
	for k, want := range wantObjs {
		o := got[k]
		if o == nil {
			t.Errorf("%s lacks %s %s/%s, which install.yaml has", without.path, k.Kind, k.Namespace, k.Name)
			continue
		}
		if k.Kind == "Deployment" && k.Name == operatorName {
			want = want.DeepCopy()
			c := operatorContainer(t, manifest{path: full.path, objs: []*unstructured.Unstructured{want}})
			c["args"] = slices.DeleteFunc(c["args"].([]any), func(a any) bool {
				s, _ := a.(string)
				return s == "--metrics-api" || strings.HasPrefix(s, "--metrics-api-")
			})
			if slices.Contains(args(operatorContainer(t, without)), "--metrics-api") {
				t.Errorf("%s runs the operator with --metrics-api, without the component's bindings", without.path)
			}
		}
		if !equality.Semantic.DeepEqual(o.Object, want.Object) {
			t.Errorf("%s %s/%s differs between the two install files", k.Kind, k.Namespace, k.Name)
		}
	}
	for k := range got {
		if wantObjs[k] == nil {
			t.Errorf("%s has %s %s/%s, which install.yaml does not", without.path, k.Kind, k.Namespace, k.Name)
		}
	}
}

// TestOverlaysAgree keeps config/without-metrics-api equal to config/default without its
// components (namespace handling, image, the RENDERQUEUE_IMAGE replacement).
func TestOverlaysAgree(t *testing.T) {
	def := readKustomization(t, "default")
	without := readKustomization(t, "without-metrics-api")
	if comps, _ := def["components"].([]any); !slices.Contains(comps, any("../metrics-api")) {
		t.Errorf("config/default does not include the metrics-api component: %v", def["components"])
	}
	delete(def, "components")
	if !equality.Semantic.DeepEqual(def, without) {
		a, _ := yaml.Marshal(def)
		b, _ := yaml.Marshal(without)
		t.Errorf("config/without-metrics-api is not config/default without its components:\ndefault minus components:\n%s\nwithout-metrics-api:\n%s", a, b)
	}
}

// TestInstallFilesApply applies both install files with kubectl to a real kube-apiserver
// (envtest; skipped without KUBEBUILDER_ASSETS): the one without the metrics API first, then
// install.yaml over it, as a user adding the metrics API later would. Every object must be
// accepted, and the RenderQueue API must be served.
func TestInstallFilesApply(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set, so there is no kube-apiserver to apply dist/ to: run `make test` or " +
			"`export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)`")
	}
	env := &envtest.Environment{}
	if _, err := env.Start(); err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping envtest: %v", err)
		}
	})
	user, err := env.AddUser(envtest.User{Name: "installer", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubectl, err := user.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		stdout, stderr, err := kubectl.Run(args...)
		out, _ := io.ReadAll(stdout)
		errText, _ := io.ReadAll(stderr)
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, out, errText)
		}
		return string(out)
	}
	for _, file := range []string{"install-without-metrics-api.yaml", "install.yaml"} {
		out := run("apply", "-f", filepath.Join("..", "dist", file))
		t.Logf("kubectl apply -f dist/%s:\n%s", file, out)
	}
	// the NetworkPolicy sample is one the API server takes
	run("apply", "--dry-run=server", "--namespace", "default", "-f", filepath.Join("samples", "networkpolicy.yaml"))
	run("wait", "--for=condition=Established", "crd/renderqueues.renderqueue.dev", "--timeout=60s")
	if out := run("get", "apiservice", apiServiceName, "-o", "jsonpath={.spec.service.namespace}/{.spec.service.name}"); out != operatorNS+"/renderqueue-metrics-api" {
		t.Errorf("the APIService points at %q, want %s/renderqueue-metrics-api", out, operatorNS)
	}
	run("get", "renderqueues", "--all-namespaces")
	if out := run("-n", operatorNS, "get", "deployment", operatorName, "-o", "jsonpath={.spec.template.spec.containers[0].args}"); !strings.Contains(out, "--metrics-api") {
		t.Errorf("after applying install.yaml the operator's args are %s, without --metrics-api", out)
	}
}

// kustomize renders the overlay dir with the kubectl of KUBEBUILDER_ASSETS (kubectl's built-in
// kustomize; skipped without it).
func kustomize(t *testing.T, dir string) manifest {
	t.Helper()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set, so there is no kubectl to render config/ with: run `make test` or " +
			"`export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)`")
	}
	out, err := exec.Command(filepath.Join(assets, "kubectl"), "kustomize", dir).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, exit.Stderr)
		}
		t.Fatalf("kubectl kustomize %s: %v", dir, err)
	}
	path := filepath.Join(t.TempDir(), "rendered.yaml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	m := readManifest(t, path)
	m.path = "config/" + dir
	return m
}

// TestNamespacedOverlay checks config/namespaced against config/default: the same objects except
// that the operator's ClusterRole is bound by one RoleBinding per namespace of --watch-namespaces
// (and by no ClusterRoleBinding), and the operator gets that flag.
func TestNamespacedOverlay(t *testing.T) {
	def := kustomize(t, "default")
	nsd := kustomize(t, "namespaced")

	if o := nsd.byKey()[key{"ClusterRoleBinding", "", operatorName}]; o != nil {
		t.Errorf("%s binds the operator's ClusterRole cluster-wide", nsd.path)
	}
	var watched []string
	for _, a := range args(operatorContainer(t, nsd)) {
		if v, ok := strings.CutPrefix(a, "--watch-namespaces="); ok {
			watched = append(watched, strings.Split(v, ",")...)
		}
	}
	if len(watched) == 0 {
		t.Fatalf("%s: the operator has no --watch-namespaces", nsd.path)
	}
	bound := map[string]bool{}
	for _, o := range nsd.objs {
		kind, _, _ := unstructured.NestedString(o.Object, "roleRef", "kind")
		name, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
		if o.GetKind() == "RoleBinding" && kind == "ClusterRole" && name == operatorName {
			if !boundToOperator(manifest{objs: []*unstructured.Unstructured{o}}, key{"ClusterRole", "", operatorName}) {
				t.Errorf("RoleBinding %s/%s does not name the operator's ServiceAccount", o.GetNamespace(), o.GetName())
			}
			bound[o.GetNamespace()] = true
		}
	}
	for _, ns := range watched {
		if !bound[ns] {
			t.Errorf("%s watches namespace %s but grants the operator nothing there (no RoleBinding to ClusterRole %s)", nsd.path, ns, operatorName)
		}
		delete(bound, ns)
	}
	for ns := range bound {
		t.Errorf("%s grants the operator namespace %s, which it does not watch", nsd.path, ns)
	}
	if !boundToOperator(nsd, key{"Role", operatorNS, operatorName}) {
		t.Errorf("%s: the leader election Role is not bound", nsd.path)
	}

	// everything else is config/default's
	want := def.byKey()
	delete(want, key{"ClusterRoleBinding", "", operatorName})
	for k, o := range nsd.byKey() {
		w := want[k]
		switch {
		case k.Kind == "RoleBinding" && watchedBinding(o):
			continue
		case w == nil:
			t.Errorf("%s has %s %s/%s, which config/default does not", nsd.path, k.Kind, k.Namespace, k.Name)
			continue
		case k.Kind == "Deployment" && k.Name == operatorName:
			o = o.DeepCopy()
			c := operatorContainer(t, manifest{path: nsd.path, objs: []*unstructured.Unstructured{o}})
			c["args"] = slices.DeleteFunc(c["args"].([]any), func(a any) bool {
				return strings.HasPrefix(a.(string), "--watch-namespaces=")
			})
		}
		if !equality.Semantic.DeepEqual(o.Object, w.Object) {
			t.Errorf("%s %s/%s differs between config/default and config/namespaced", k.Kind, k.Namespace, k.Name)
		}
		delete(want, k)
	}
	for k := range want {
		t.Errorf("%s lacks %s %s/%s of config/default", nsd.path, k.Kind, k.Namespace, k.Name)
	}
}

// watchedBinding reports whether o binds the operator's ClusterRole in a namespace.
func watchedBinding(o *unstructured.Unstructured) bool {
	kind, _, _ := unstructured.NestedString(o.Object, "roleRef", "kind")
	name, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
	return kind == "ClusterRole" && name == operatorName
}

// TestNetworkPolicySample checks that config/samples/networkpolicy.yaml selects the shard Pods of
// the sample RenderQueue (the selector the operator gives them), on their API port, and lets in
// exactly the sample workers' Pods and the operator's Pods in its namespace.
func TestNetworkPolicySample(t *testing.T) {
	np := readObject(t, filepath.Join("samples", "networkpolicy.yaml"))
	var rq rqv1.RenderQueue
	data, err := os.ReadFile(filepath.Join("samples", "renderqueue_v1alpha1_renderqueue.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &rq); err != nil {
		t.Fatal(err)
	}
	sel, _, _ := unstructured.NestedStringMap(np.Object, "spec", "podSelector", "matchLabels")
	if want := specs.ShardSelector(&rq); !equality.Semantic.DeepEqual(sel, want) {
		t.Errorf("the NetworkPolicy selects %v, the shard Pods of %s carry %v", sel, rq.Name, want)
	}
	if types, _, _ := unstructured.NestedStringSlice(np.Object, "spec", "policyTypes"); !slices.Equal(types, []string{"Ingress"}) {
		t.Errorf("policyTypes %v, want [Ingress]", types)
	}
	rules, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
	if len(rules) != 1 {
		t.Fatalf("%d ingress rules, want 1", len(rules))
	}
	rule := rules[0].(map[string]any)
	ports, _, _ := unstructured.NestedSlice(rule, "ports")
	if len(ports) != 1 || (ports[0].(map[string]any)["port"] != "http" && ports[0].(map[string]any)["port"] != int64(specs.KeeperPort)) {
		t.Errorf("ports %v, want the keeper's port (http, %d) only", ports, specs.KeeperPort)
	}

	podLabels := func(path, kind, name string) map[string]string {
		t.Helper()
		for _, o := range readManifest(t, path).objs {
			if o.GetKind() == kind && o.GetName() == name {
				l, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
				return l
			}
		}
		t.Fatalf("%s has no %s %s", path, kind, name)
		return nil
	}
	workers := podLabels(filepath.Join("samples", "workers", "deployment.yaml"), "Deployment", "render-workers")
	operator := podLabels(filepath.Join("manager", "manager.yaml"), "Deployment", operatorName)
	matches := func(sel, labels map[string]string) bool {
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}
	from, _, _ := unstructured.NestedSlice(rule, "from")
	var gotWorkers, gotOperator bool
	for _, p := range from {
		p := p.(map[string]any)
		pods, _, _ := unstructured.NestedStringMap(p, "podSelector", "matchLabels")
		nsSel, hasNS, _ := unstructured.NestedStringMap(p, "namespaceSelector", "matchLabels")
		switch {
		case !hasNS && matches(pods, workers):
			gotWorkers = true
		case hasNS && nsSel["kubernetes.io/metadata.name"] == operatorNS && len(nsSel) == 1 && matches(pods, operator):
			gotOperator = true
		default:
			t.Errorf("peer %v lets in neither the sample workers (%v) nor the operator (%v)", p, workers, operator)
		}
	}
	if !gotWorkers || !gotOperator {
		t.Errorf("the workers (%v) or the operator (%v) cannot reach the shards", gotWorkers, gotOperator)
	}
}
