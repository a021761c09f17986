package specs

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// Child is one companion of the shard Pods, reconciled with controllerutil.CreateOrUpdate:
// Object carries its name and namespace, and Mutate turns Object (as read from the API server,
// or empty when it is to be created) into its desired state. Mutate keeps what others put there
// (labels) and fails on what it must not change (an immutable field that differs). The owner
// reference is the caller's.
type Child struct {
	// What names the child for people ("headless Service"), in errors and logs.
	What string
	// Object is the child, named; Mutate works on it.
	Object client.Object
	// Mutate sets Object's desired state.
	Mutate func() error
}

// Children are the companions of rq's shard Pods, in the order they are reconciled: the shard
// ServiceAccount with a Role reading only this RenderQueue and its RoleBinding, the headless
// Service and the PodDisruptionBudget. (The API token Secret is TokenSecret's: it is only ever
// created.)
func Children(rq *rqv1.RenderQueue) []Child {
	var out []Child
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: ShardServiceAccountName(rq), Namespace: rq.Namespace}}
	out = append(out, Child{"shard ServiceAccount", sa, func() error {
		mergeLabels(&sa.ObjectMeta, queueLabels(rq))
		return nil
	}})
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: ShardServiceAccountName(rq), Namespace: rq.Namespace}}
	out = append(out, Child{"shard Role", role, func() error {
		mergeLabels(&role.ObjectMeta, queueLabels(rq))
		role.Rules = []rbacv1.PolicyRule{{
			APIGroups:     []string{rqv1.GroupVersion.Group},
			Resources:     []string{"renderqueues"},
			ResourceNames: []string{rq.Name},
			Verbs:         []string{"get", "list", "watch"},
		}}
		return nil
	}})
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ShardServiceAccountName(rq), Namespace: rq.Namespace}}
	out = append(out, Child{"shard RoleBinding", binding, func() error {
		mergeLabels(&binding.ObjectMeta, queueLabels(rq))
		ref := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name}
		if binding.CreationTimestamp.IsZero() {
			binding.RoleRef = ref // immutable once created
		} else if binding.RoleRef != ref {
			return fmt.Errorf("RoleBinding %s refers to %s %s, not Role %s; delete it to let the operator recreate it",
				binding.Name, binding.RoleRef.Kind, binding.RoleRef.Name, role.Name)
		}
		binding.Subjects = []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: rq.Namespace}}
		return nil
	}})
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: ServiceName(rq), Namespace: rq.Namespace}}
	out = append(out, Child{"headless Service", svc, func() error {
		mergeLabels(&svc.ObjectMeta, queueLabels(rq))
		if svc.CreationTimestamp.IsZero() {
			svc.Spec.ClusterIP = corev1.ClusterIPNone
		}
		svc.Spec.Selector = ShardSelector(rq)
		svc.Spec.PublishNotReadyAddresses = false
		svc.Spec.Ports = []corev1.ServicePort{{
			Name: "http", Port: KeeperPort, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP,
		}}
		return nil
	}})
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: PDBName(rq), Namespace: rq.Namespace}}
	out = append(out, Child{"PodDisruptionBudget", pdb, func() error {
		mergeLabels(&pdb.ObjectMeta, queueLabels(rq))
		one := intstr.FromInt32(1)
		pdb.Spec.MaxUnavailable = &one
		pdb.Spec.MinAvailable = nil
		pdb.Spec.Selector = &metav1.LabelSelector{MatchLabels: ShardSelector(rq)}
		return nil
	}})
	return out
}

// TokenSecret is the API token Secret of rq's shards holding token, owner reference not yet set.
func TokenSecret(rq *rqv1.RenderQueue, token string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: TokenSecretName(rq), Namespace: rq.Namespace, Labels: queueLabels(rq)},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{TokenKey: []byte(token)},
	}
}

// mergeLabels sets labels on meta, keeping labels others put there.
func mergeLabels(meta *metav1.ObjectMeta, labels map[string]string) {
	if meta.Labels == nil {
		meta.Labels = map[string]string{}
	}
	for k, v := range labels {
		meta.Labels[k] = v
	}
}
