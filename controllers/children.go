package controllers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// reconcileChildren makes sure the companions of the shard Pods exist and are current: the shard
// ServiceAccount with a Role reading only this RenderQueue, the headless Service and the
// PodDisruptionBudget. Every one is owned by rq. (The API token Secret is ensureTokenSecret's.)
func (r *RenderQueueReconciler) reconcileChildren(ctx context.Context, rq *rqv1.RenderQueue) error {
	var steps []childStep
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: ShardServiceAccountName(rq), Namespace: rq.Namespace}}
	steps = append(steps, childStep{"shard ServiceAccount", sa, func() error {
		mergeLabels(&sa.ObjectMeta, queueLabels(rq))
		return nil
	}})
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: ShardServiceAccountName(rq), Namespace: rq.Namespace}}
	steps = append(steps, childStep{"shard Role", role, func() error {
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
	steps = append(steps, childStep{"shard RoleBinding", binding, func() error {
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
	steps = append(steps, childStep{"headless Service", svc, func() error {
		mergeLabels(&svc.ObjectMeta, queueLabels(rq))
		if svc.CreationTimestamp.IsZero() {
			svc.Spec.ClusterIP = corev1.ClusterIPNone
		}
		svc.Spec.Selector = selectorLabels(rq)
		svc.Spec.PublishNotReadyAddresses = false
		svc.Spec.Ports = []corev1.ServicePort{{
			Name: "http", Port: KeeperPort, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP,
		}}
		return nil
	}})
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: PDBName(rq), Namespace: rq.Namespace}}
	steps = append(steps, childStep{"PodDisruptionBudget", pdb, func() error {
		mergeLabels(&pdb.ObjectMeta, queueLabels(rq))
		one := intstr.FromInt32(1)
		pdb.Spec.MaxUnavailable = &one
		pdb.Spec.MinAvailable = nil
		pdb.Spec.Selector = &metav1.LabelSelector{MatchLabels: selectorLabels(rq)}
		return nil
	}})

	for _, s := range steps {
		obj, set := s.obj, s.set
		op, err := controllerutil.CreateOrUpdate(ctx, r.Client, obj, func() error {
			if err := set(); err != nil {
				return err
			}
			return controllerutil.SetControllerReference(rq, obj, r.Scheme)
		})
		if apierrors.IsAlreadyExists(err) {
			return &childConflictError{what: s.what, name: obj.GetName(), queue: rq.Name, err: err}
		}
		if err != nil {
			return fmt.Errorf("reconciling the %s %s: %w", s.what, obj.GetName(), err)
		}
		if op != controllerutil.OperationResultNone {
			log.FromContext(ctx).V(1).Info("Reconciled child", "kind", s.what, "name", obj.GetName(), "operation", op)
		}
	}
	return nil
}

// EventChildConflict: a child's name is taken by an object the operator does not manage.
const EventChildConflict = "ChildConflict"

// childConflictError: creating a child failed because an object of its name exists that the
// operator does not see. Its cache holds only objects labelled renderqueue.dev/queue
// (CacheOptions), so the object is someone else's — or, for a moment, one the cache has not
// caught up with.
type childConflictError struct {
	what, name, queue string
	err               error
}

func (e *childConflictError) Error() string {
	return fmt.Sprintf("the %s %s exists and is not labelled %s=%s: the operator leaves it alone; "+
		"delete or rename it, or label it to let the operator take it over (%v)", e.what, e.name, rqv1.LabelQueue, e.queue, e.err)
}

func (e *childConflictError) Unwrap() error { return e.err }

// childStep is one child reconciled with CreateOrUpdate: set mutates obj into its desired state.
type childStep struct {
	what string
	obj  client.Object
	set  func() error
}

// ensureTokenSecret creates the API token Secret with a random token unless it exists. The
// operator may create Secrets but not read them (RBAC cannot grant reading only the Secrets it
// labels), so it never looks: a creation the API server refuses as AlreadyExists means the Secret
// is there, and an existing Secret is never rewritten, so the token is not rotated by accident
// (an operator rotates it by deleting the Secret and the shard Pods). It tries once per
// RenderQueue and process, and again before creating any shard Pod, so a deleted Secret is
// recreated before a Pod that mounts it.
func (r *RenderQueueReconciler) ensureTokenSecret(ctx context.Context, rq *rqv1.RenderQueue, keep []string, pods map[string]*corev1.Pod) error {
	missingPod := false
	for _, name := range keep {
		if pods[name] == nil {
			missingPod = true
			break
		}
	}
	key := client.ObjectKeyFromObject(rq)
	if uid, known := r.tokens.Load(key); known && uid == rq.UID && !missingPod {
		return nil
	}
	name := TokenSecretName(rq)
	token, err := randomToken()
	if err != nil {
		return err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: rq.Namespace, Labels: queueLabels(rq)},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{TokenKey: []byte(token)},
	}
	if err := controllerutil.SetControllerReference(rq, secret, r.Scheme); err != nil {
		return fmt.Errorf("owning the token Secret %s: %w", name, err)
	}
	switch err := r.Create(ctx, secret); {
	case err == nil:
		log.FromContext(ctx).Info("Created the API token Secret", "secret", name)
	case apierrors.IsAlreadyExists(err):
		// there already; kept as it is
	default:
		return fmt.Errorf("creating the token Secret %s: %w", name, err)
	}
	r.tokens.Store(key, rq.UID)
	return nil
}

// randomToken returns 32 random bytes in hex.
func randomToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating an API token: %w", err)
	}
	return hex.EncodeToString(b), nil
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
