package controllers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/policy"
	"github.com/renderqueue/renderqueue/controllers/specs"
)

// reconcileChildren makes sure the companions of the shard Pods exist and are current: the shard
// ServiceAccount with a Role reading only this RenderQueue, the headless Service and the
// PodDisruptionBudget. Every one is owned by rq. (The API token Secret is ensureTokenSecret's.)
func (r *RenderQueueReconciler) reconcileChildren(ctx context.Context, rq *rqv1.RenderQueue) error {
	for _, c := range specs.Children(rq) {
		obj, mutate := c.Object, c.Mutate
		op, err := controllerutil.CreateOrUpdate(ctx, r.Client, obj, func() error {
			if err := mutate(); err != nil {
				return err
			}
			return controllerutil.SetControllerReference(rq, obj, r.Scheme)
		})
		if apierrors.IsAlreadyExists(err) {
			return &childConflictError{what: c.What, name: obj.GetName(), queue: rq.Name, err: err}
		}
		if err != nil {
			return fmt.Errorf("reconciling the %s %s: %w", c.What, obj.GetName(), err)
		}
		if op != controllerutil.OperationResultNone {
			log.FromContext(ctx).V(1).Info("Reconciled child", "kind", c.What, "name", obj.GetName(), "operation", op)
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

// ensureTokenSecret creates the API token Secret with a random token unless it exists. The
// operator may create Secrets but not read them (RBAC cannot grant reading only the Secrets it
// labels), so it never looks: a creation the API server refuses as AlreadyExists means the Secret
// is there, and an existing Secret is never rewritten, so the token is not rotated by accident
// (an operator rotates it by deleting the Secret and the shard Pods). It tries once per
// RenderQueue and process, and again before creating any shard Pod, so a deleted Secret is
// recreated before a Pod that mounts it.
func (r *RenderQueueReconciler) ensureTokenSecret(ctx context.Context, rq *rqv1.RenderQueue, keep []string, pods map[string]*corev1.Pod) error {
	key := client.ObjectKeyFromObject(rq)
	if uid, known := r.tokens.Load(key); known && uid == rq.UID && !policy.MissingPod(keep, pods) {
		return nil
	}
	token, err := randomToken()
	if err != nil {
		return err
	}
	secret := specs.TokenSecret(rq, token)
	name := secret.Name
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
