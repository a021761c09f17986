package specs

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

func childQueue() *rqv1.RenderQueue {
	return &rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "prod"}}
}

// child returns the child described as what, failing the test when there is none.
func child(t *testing.T, children []Child, what string) Child {
	t.Helper()
	for _, c := range children {
		if c.What == what {
			return c
		}
	}
	t.Fatalf("no child %q", what)
	return Child{}
}

func TestChildrenNamesLabelsAndOrder(t *testing.T) {
	rq := childQueue()
	var got []string
	for _, c := range Children(rq) {
		c.Object.SetLabels(map[string]string{"someone": "else"})
		if err := c.Mutate(); err != nil {
			t.Fatalf("%s: %v", c.What, err)
		}
		if c.Object.GetNamespace() != "prod" || c.Object.GetLabels()[rqv1.LabelQueue] != "web" || c.Object.GetLabels()["someone"] != "else" {
			t.Errorf("%s: namespace %q, labels %v: want prod, the queue label and the others' label kept",
				c.What, c.Object.GetNamespace(), c.Object.GetLabels())
		}
		got = append(got, c.What+"="+c.Object.GetName())
	}
	want := "shard ServiceAccount=web-shard shard Role=web-shard shard RoleBinding=web-shard headless Service=web-shards PodDisruptionBudget=web-shards"
	if strings.Join(got, " ") != want {
		t.Errorf("children %v, want %s", got, want)
	}
}

// The Service is headless when it is created and its cluster IP is never touched afterwards; a
// RoleBinding's roleRef is set on creation and a different one is refused, not rewritten.
func TestChildrenImmutableFields(t *testing.T) {
	rq := childQueue()
	children := Children(rq)
	svc := child(t, children, "headless Service")
	if err := svc.Mutate(); err != nil {
		t.Fatal(err)
	}
	s := svc.Object.(*corev1.Service)
	if s.Spec.ClusterIP != corev1.ClusterIPNone || s.Spec.Ports[0].Port != KeeperPort {
		t.Errorf("new Service: clusterIP %q, port %d", s.Spec.ClusterIP, s.Spec.Ports[0].Port)
	}
	s.CreationTimestamp = metav1.Now()
	s.Spec.ClusterIP = "10.0.0.9"
	if err := svc.Mutate(); err != nil || s.Spec.ClusterIP != "10.0.0.9" {
		t.Errorf("existing Service: clusterIP %q (%v), want it kept", s.Spec.ClusterIP, err)
	}

	rb := child(t, children, "shard RoleBinding")
	if err := rb.Mutate(); err != nil {
		t.Fatal(err)
	}
	b := rb.Object.(*rbacv1.RoleBinding)
	if b.RoleRef.Name != "web-shard" || len(b.Subjects) != 1 || b.Subjects[0].Name != "web-shard" {
		t.Errorf("new RoleBinding: roleRef %+v, subjects %+v", b.RoleRef, b.Subjects)
	}
	b.CreationTimestamp = metav1.Now()
	b.RoleRef.Name = "other"
	if err := rb.Mutate(); err == nil || !strings.Contains(err.Error(), "delete it") {
		t.Errorf("a RoleBinding to another Role: err = %v, want a refusal", err)
	}
}

func TestTokenSecret(t *testing.T) {
	s := TokenSecret(childQueue(), "abc")
	if s.Name != TokenSecretName(childQueue()) || s.Namespace != "prod" || string(s.Data[TokenKey]) != "abc" ||
		s.Labels[rqv1.LabelQueue] != "web" {
		t.Errorf("token Secret %+v", s)
	}
}
