package config_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

// overlayNS is the namespace of config/samples/namespace.
const overlayNS = "platform-rq"

// TestNamespaceOverlay renders config/samples/namespace, config/default under a plain kustomize
// `namespace: platform-rq`, and checks that nothing of the operator is left in, or points at,
// renderqueue-system: every namespaced object is in platform-rq, the bindings name the
// ServiceAccount there, the APIService its Service there, and the operator learns its namespace
// from the downward API and names its Secrets and Service without one.
func TestNamespaceOverlay(t *testing.T) {
	m := kustomize(t, filepath.Join("samples", "namespace"))
	for _, o := range m.objs {
		k := keyOf(o)
		if namespaced(k.Kind) && k.Namespace != overlayNS {
			t.Errorf("%s %s is in namespace %q, want %s", k.Kind, k.Name, k.Namespace, overlayNS)
		}
		b, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), operatorNS) {
			t.Errorf("%s %s still names %s", k.Kind, k.Name, operatorNS)
		}
		subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
		for _, s := range subjects {
			s := s.(map[string]any)
			if s["kind"] == "ServiceAccount" && s["name"] == operatorName && s["namespace"] != overlayNS {
				t.Errorf("%s %s binds the operator's ServiceAccount in %v", k.Kind, k.Name, s["namespace"])
			}
		}
	}
	svcNS, _, _ := unstructured.NestedString(m.get(t, key{"APIService", "", apiServiceName}).Object, "spec", "service", "namespace")
	if svcNS != overlayNS {
		t.Errorf("the APIService's Service is in %q, want %s", svcNS, overlayNS)
	}
	c := operatorContainerIn(t, m, overlayNS)
	env, _ := c["env"].([]any)
	var downward bool
	for _, e := range env {
		e := e.(map[string]any)
		path, _, _ := unstructured.NestedString(e, "valueFrom", "fieldRef", "fieldPath")
		downward = downward || (e["name"] == "POD_NAMESPACE" && path == "metadata.namespace")
	}
	if !downward {
		t.Error("the operator has no POD_NAMESPACE from the downward API (metadata.namespace)")
	}
	for _, a := range args(c) {
		if v, ok := strings.CutPrefix(a, "--metrics-api-cert-secret="); ok && strings.Contains(v, "/") {
			t.Errorf("the operator's %s names a namespace: it would not follow the overlay's", a)
		}
		if v, ok := strings.CutPrefix(a, "--metrics-api-service="); ok && strings.Contains(v, "/") {
			t.Errorf("the operator's %s names a namespace: it would not follow the overlay's", a)
		}
	}
}

// TestOperatorGrantsInAnyNamespace applies config/default, then config/samples/namespace, to a
// real kube-apiserver (envtest) and asks its authorizer, for the operator's ServiceAccount in
// each, what the operator needs outside its RenderQueues: reading the aggregator's settings in
// kube-system (get, and list and watch by name as the metrics API's informer does), and in its
// own namespace its shard CA Secret, the metrics API's certificate Secret and the leader election
// Lease. The operator's ClusterRole, which reads every ConfigMap, is unbound first (as where it
// is bound per watched namespace, config/namespaced): kube-system's is then readable through the
// metrics API's own grant, for that name only.
func TestOperatorGrantsInAnyNamespace(t *testing.T) {
	def := kustomize(t, "default")
	overlay := kustomize(t, filepath.Join("samples", "namespace"))
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
	cs, err := kubernetes.NewForConfig(user.Config())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ns string
		m  manifest
	}{{operatorNS, def}, {overlayNS, overlay}} {
		path := filepath.Join(t.TempDir(), "install.yaml")
		var docs []string
		for _, o := range tc.m.objs {
			b, err := yaml.Marshal(o.Object)
			if err != nil {
				t.Fatal(err)
			}
			docs = append(docs, string(b))
		}
		if err := os.WriteFile(path, []byte(strings.Join(docs, "---\n")), 0o600); err != nil {
			t.Fatal(err)
		}
		stdout, stderr, err := kubectl.Run("apply", "--server-side", "-f", path)
		if err != nil {
			out, _ := io.ReadAll(stdout)
			errText, _ := io.ReadAll(stderr)
			t.Fatalf("kubectl apply %s: %v\n%s%s", tc.m.path, err, out, errText)
		}
		if err := cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), operatorName, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		sa := "system:serviceaccount:" + tc.ns + ":" + operatorName
		for _, q := range []struct {
			verb, group, resource, ns, name string
			want                            bool
		}{
			{"get", "", "configmaps", "kube-system", "extension-apiserver-authentication", true},
			{"list", "", "configmaps", "kube-system", "extension-apiserver-authentication", true},
			{"watch", "", "configmaps", "kube-system", "extension-apiserver-authentication", true},
			{"get", "", "configmaps", "kube-system", "kubeadm-config", false},
			{"get", "", "secrets", tc.ns, "renderqueue-shard-ca", true},
			{"update", "", "secrets", tc.ns, "renderqueue-metrics-api-tls", true},
			{"update", "coordination.k8s.io", "leases", tc.ns, "renderqueue-operator.renderqueue.dev", true},
			// leader election records its events (core/v1) on the Lease, in the operator's namespace
			{"create", "", "events", tc.ns, "", true},
			{"create", "", "events", "kube-system", "", false},
		} {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:   sa,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + tc.ns, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Verb: q.verb, Group: q.group, Resource: q.resource, Namespace: q.ns, Name: q.name,
				},
			}}
			got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), sar, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Status.Allowed != q.want {
				t.Errorf("%s: the operator in %s may %s %s %s/%s: %v, want %v (%s)", tc.m.path, tc.ns, q.verb, q.resource,
					q.ns, q.name, got.Status.Allowed, q.want, got.Status.Reason)
			}
		}
	}
}
