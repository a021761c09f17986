package controllers

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/policy"
	"github.com/renderqueue/renderqueue/controllers/shardtls"
	"github.com/renderqueue/renderqueue/controllers/specs"
	"github.com/renderqueue/renderqueue/pkg/certs"
)

// The shard CA's RBAC: the operator creates Secrets in its own namespace (RBAC cannot limit
// creation by name) and reads and updates the CA Secret by name; config/rbac/role.yaml's Role
// renderqueue-operator in renderqueue-system. The certificate Secrets of RenderQueues are
// created and updated (never read): the ClusterRole's secrets rule. The CA ConfigMaps are
// cached children. A Secret of spec.tls Provided is read with a grant its owner gives
// (config/samples/shard-tls-secret-rbac.yaml): none here.
//
// +kubebuilder:rbac:groups="",namespace=renderqueue-system,resources=secrets,verbs=create
// +kubebuilder:rbac:groups="",namespace=renderqueue-system,resources=secrets,resourceNames=renderqueue-shard-ca,verbs=get;update
// +kubebuilder:rbac:groups="",resources=secrets,verbs=create;update
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;update

// Events of the shards' TLS.
const (
	// EventShardCertificateIssued: the operator wrote a new serving certificate for the shards.
	EventShardCertificateIssued = "ShardCertificateIssued"
)

// shardTLS is what reconcileTLS settled for a RenderQueue with spec.tls OperatorIssued or
// Provided: the status.tls to record and the CA bundle its shards are verified with. Zero when
// TLS is off.
type shardTLS struct {
	status *rqv1.ShardTLSStatus
	bundle []byte
}

// reconcileTLS makes the shards' certificate what spec.tls asks (nothing when it is disabled):
// the CA ConfigMap <name>-shard-ca follows the shard CA's bundle, and a serving certificate is
// issued into the Secret <name>-shard-tls when shardtls.Decide says so — created, or, when it
// exists, overwritten with an unconditional update (the operator never reads it). When a shard
// Pod is about to be created (missingPod) and no certificate is due, the Secret is created
// with a new certificate unless it exists (AlreadyExists: kept as it is), so that a deleted
// Secret is back before a Pod mounts it. A CA the operator cannot have is a blocker
// (ShardTLSUnavailable): no Pod is created or replaced without its certificate. With Provided,
// reconcileProvidedTLS does it all.
func (r *RenderQueueReconciler) reconcileTLS(ctx context.Context, rq *rqv1.RenderQueue, missingPod bool,
	now time.Time) (shardTLS, []policy.Event, *policy.Blocker, error) {
	if !rq.Spec.TLSEnabled() {
		return shardTLS{}, nil, nil, nil
	}
	if rq.Spec.TLS.Mode == rqv1.ShardTLSProvided {
		st, blocker, err := r.reconcileProvidedTLS(ctx, rq, now)
		return st, nil, blocker, err
	}
	if r.ShardCA == nil {
		return shardTLS{status: rq.Status.TLS}, nil, &policy.Blocker{Reason: rqv1.ReasonShardTLSUnavailable,
			Message: "spec.tls.mode is OperatorIssued but the operator runs without a shard CA (--shard-ca-secret is empty); no shard Pod is created or replaced"}, nil
	}
	ca, err := r.ShardCA.CA(ctx)
	if err != nil {
		log.FromContext(ctx).Info("No shard CA", "error", err.Error())
		return shardTLS{status: rq.Status.TLS}, nil, &policy.Blocker{Reason: rqv1.ReasonShardTLSUnavailable,
			Message: fmt.Sprintf("the operator cannot issue the shards' certificate; no shard Pod is created or replaced until it can: %v", err)}, nil
	}
	out := shardTLS{status: rq.Status.TLS, bundle: ca.Bundle}
	if err := r.publishShardCA(ctx, rq, ca.Bundle); err != nil {
		return out, nil, nil, err
	}

	d, err := shardtls.Decide(rq, ca, now)
	if err != nil {
		return out, nil, nil, err
	}
	if d.Issue && r.APIReader != nil {
		// The cache may not have caught up with the status.tls this reconciler wrote last time:
		// deciding from that would overwrite the Secret with a certificate the status never
		// records. Reconciles of one RenderQueue do not overlap, so the API server's status is
		// the last word.
		var fresh rqv1.RenderQueue
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(rq), &fresh); err != nil {
			return out, nil, nil, fmt.Errorf("reading RenderQueue %s/%s before issuing its shards' certificate: %w", rq.Namespace, rq.Name, err)
		}
		if !equality.Semantic.DeepEqual(fresh.Status.TLS, rq.Status.TLS) {
			out.status = fresh.Status.TLS
			fresh.Spec = rq.Spec
			if d, err = shardtls.Decide(&fresh, ca, now); err != nil {
				return out, nil, nil, err
			}
		}
	}
	if !d.Issue && !missingPod {
		return out, nil, nil, nil
	}
	issued, err := shardtls.Issue(rq, ca, specs.ChildLabels(rq), now)
	if err != nil {
		return out, nil, nil, err
	}
	sec := issued.Secret
	if err := controllerutil.SetControllerReference(rq, sec, r.Scheme); err != nil {
		return out, nil, nil, fmt.Errorf("owning the shard certificate Secret %s: %w", sec.Name, err)
	}
	err = r.Create(ctx, sec)
	switch {
	case err == nil:
	case apierrors.IsAlreadyExists(err) && !d.Issue:
		return out, nil, nil, nil // there, and nothing due: kept as it is
	case apierrors.IsAlreadyExists(err):
		// overwrite without reading: no resourceVersion, an unconditional update
		sec.ResourceVersion = ""
		if err := r.Update(ctx, sec); err != nil {
			return out, nil, nil, fmt.Errorf("renewing the shard certificate Secret %s (%s): %w", sec.Name, d.Why, err)
		}
	default:
		return out, nil, nil, fmt.Errorf("creating the shard certificate Secret %s: %w", sec.Name, err)
	}
	why := d.Why
	if !d.Issue {
		why = "the Secret was missing before a shard Pod was created"
	}
	log.FromContext(ctx).Info("Issued the shards' certificate", "secret", sec.Name, "serial", issued.Status.Serial,
		"notAfter", issued.Status.NotAfter.Time, "reason", why)
	out.status = &issued.Status
	return out, []policy.Event{{Type: corev1.EventTypeNormal, Reason: EventShardCertificateIssued, Action: "Issue",
		Message: fmt.Sprintf("issued the shards' certificate %s (serial %s, valid until %s) in the Secret %s: %s",
			issued.Status.ServerName, issued.Status.Serial, issued.Status.NotAfter.UTC().Format(time.RFC3339), sec.Name, why)}}, nil, nil
}

// publishShardCA makes the ConfigMap rqv1.ShardCAConfigMapName of rq publish bundle, the CA bundle
// its shards' certificate verifies with, for render workers.
func (r *RenderQueueReconciler) publishShardCA(ctx context.Context, rq *rqv1.RenderQueue, bundle []byte) error {
	cm := &corev1.ConfigMap{}
	cm.Name, cm.Namespace = rqv1.ShardCAConfigMapName(rq.Name), rq.Namespace
	op, err := controllerutil.CreateOrUpdate(ctx, r.Client, cm, func() error {
		specs.ShardCAConfigMap(rq, cm, bundle)
		return controllerutil.SetControllerReference(rq, cm, r.Scheme)
	})
	if apierrors.IsAlreadyExists(err) {
		err = &childConflictError{what: "shard CA ConfigMap", name: cm.Name, queue: rq.Name, err: err}
	}
	if err != nil {
		return fmt.Errorf("reconciling the shard CA ConfigMap %s: %w", cm.Name, err)
	}
	if op != controllerutil.OperationResultNone {
		log.FromContext(ctx).V(1).Info("Reconciled child", "kind", "shard CA ConfigMap", "name", cm.Name, "operation", op)
	}
	return nil
}

// reconcileProvidedTLS is reconcileTLS for spec.tls Provided: it reads the Secret
// spec.tls.secretName past the cache (the operator may read it only when its owner grants
// that), checks it (shardtls.CheckProvided) and publishes its ca.crt in the CA ConfigMap. A
// Secret that is missing, unreadable or unusable is a blocker (ShardTLSSecretInvalid, the
// message saying what is wrong and what to do): no shard Pod is created or replaced, and the
// recorded status.tls is kept. The Secret is read at every reconcile, so a renewal (by
// cert-manager, say) reaches the status and the ConfigMap within a poll interval; the shards
// reload the files the kubelet updates.
func (r *RenderQueueReconciler) reconcileProvidedTLS(ctx context.Context, rq *rqv1.RenderQueue, now time.Time) (shardTLS, *policy.Blocker, error) {
	kept := shardTLS{status: rq.Status.TLS}
	name := rq.Spec.TLS.SecretName
	blocker := func(msg string) *policy.Blocker {
		return &policy.Blocker{Reason: rqv1.ReasonShardTLSSecretInvalid, Message: msg + "; no shard Pod is created or replaced until then"}
	}
	var reader client.Reader = r.Client
	if r.APIReader != nil {
		reader = r.APIReader
	}
	var sec corev1.Secret
	err := reader.Get(ctx, client.ObjectKey{Namespace: rq.Namespace, Name: name}, &sec)
	switch {
	case apierrors.IsNotFound(err):
		return kept, blocker(fmt.Sprintf("the Secret %s (spec.tls.secretName) does not exist in namespace %s: create it, or let cert-manager write it", name, rq.Namespace)), nil
	case apierrors.IsForbidden(err):
		return kept, blocker(fmt.Sprintf("the operator may not read the Secret %s (spec.tls.secretName): grant it get on that Secret with a Role and RoleBinding in namespace %s, as config/samples/shard-tls-secret-rbac.yaml does", name, rq.Namespace)), nil
	case err != nil:
		return kept, nil, fmt.Errorf("reading the shards' TLS Secret %s/%s: %w", rq.Namespace, name, err)
	}
	p, problem := shardtls.CheckProvided(rq, &sec, now)
	if problem != "" {
		return kept, blocker(problem), nil
	}
	if err := r.publishShardCA(ctx, rq, p.Bundle); err != nil {
		return kept, nil, err
	}
	return shardTLS{status: &p.Status, bundle: r.providedPollBundle(ctx, p.Bundle)}, nil, nil
}

// providedPollBundle is the CA bundle the operator verifies the shards of a RenderQueue with
// spec.tls Provided with: the Secret's ca.crt and, when the operator has a shard CA, its bundle
// too — shards created while the RenderQueue was OperatorIssued serve its certificate until
// they are replaced.
func (r *RenderQueueReconciler) providedPollBundle(ctx context.Context, provided []byte) []byte {
	out := bytes.Clone(provided)
	if r.ShardCA == nil {
		return out
	}
	ca, err := r.ShardCA.CA(ctx)
	if err != nil {
		return out
	}
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, ca.Bundle...)
}

// ShardHTTPClient is the HTTP client to ask rq's shards with, for others in the operator that
// do (the web console): the base client (HTTPClient, or http.DefaultClient) while rq has no TLS
// (spec.tls disabled and nothing recorded in status.tls), otherwise one that verifies https://
// shards with the shard CA and rq's server name (and asks http:// ones as they are).
func (r *RenderQueueReconciler) ShardHTTPClient(ctx context.Context, rq *rqv1.RenderQueue) (*http.Client, error) {
	base := r.HTTPClient
	if base == nil {
		base = http.DefaultClient
	}
	if !rq.Spec.TLSEnabled() && rq.Status.TLS == nil {
		return base, nil
	}
	if rq.Spec.TLS.Mode == rqv1.ShardTLSProvided {
		bundle, err := r.publishedBundle(ctx, rq)
		if err != nil {
			return nil, err
		}
		return r.tlsClients.Get(rqv1.ShardServerName(rq.Namespace, rq.Name), bundle)
	}
	if r.ShardCA == nil {
		return nil, fmt.Errorf("RenderQueue %s/%s serves TLS and the operator has no shard CA", rq.Namespace, rq.Name)
	}
	ca, err := r.ShardCA.CA(ctx)
	if err != nil {
		return nil, err
	}
	return r.tlsClients.Get(rqv1.ShardServerName(rq.Namespace, rq.Name), ca.Bundle)
}

// publishedBundle is providedPollBundle of the CA bundle rq's CA ConfigMap publishes (spec.tls
// Provided: the Secret's ca.crt as the reconciler last found it valid).
func (r *RenderQueueReconciler) publishedBundle(ctx context.Context, rq *rqv1.RenderQueue) ([]byte, error) {
	var cm corev1.ConfigMap
	if err := r.Get(ctx, client.ObjectKey{Namespace: rq.Namespace, Name: rqv1.ShardCAConfigMapName(rq.Name)}, &cm); err != nil {
		return nil, fmt.Errorf("reading the CA bundle of RenderQueue %s/%s's shards: %w", rq.Namespace, rq.Name, err)
	}
	return r.providedPollBundle(ctx, []byte(cm.Data[rqv1.ShardCAKey])), nil
}

// ShardCASource gives the operator's current shard CA (shardtls.CAStore).
type ShardCASource interface {
	CA(ctx context.Context) (*certs.CA, error)
}

// pollTLS completes st (reconcileTLS's, zero when it did not run) for the poll and the status:
// the status.tls shardtls.StatusToKeep keeps and, while shards serve TLS, the CA bundle to poll
// them with over HTTPS: the shard CA's, or with spec.tls Provided the one last published (when
// reconcileTLS did not run or was blocked).
func (r *RenderQueueReconciler) pollTLS(ctx context.Context, rq *rqv1.RenderQueue, st shardTLS, pods map[string]*corev1.Pod) shardTLS {
	var tlsPods bool
	st.status, tlsPods = shardtls.StatusToKeep(rq, st.status, pods)
	if st.bundle != nil || !tlsPods {
		return st
	}
	if rq.Spec.TLS.Mode == rqv1.ShardTLSProvided {
		bundle, err := r.publishedBundle(ctx, rq)
		if err == nil {
			st.bundle = bundle
			return st
		}
		log.FromContext(ctx).Info("No published CA bundle to poll the TLS shards with", "error", err.Error())
	}
	if r.ShardCA == nil {
		return st
	}
	ca, err := r.ShardCA.CA(ctx)
	if err != nil {
		log.FromContext(ctx).Info("No shard CA to poll the TLS shards with", "error", err.Error())
		return st
	}
	st.bundle = ca.Bundle
	return st
}
