package controllers

import (
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
// cached children.
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

// shardTLS is what reconcileTLS settled for a RenderQueue with spec.tls OperatorIssued: the
// status.tls to record and the CA bundle its shards are verified with. Zero when TLS is off.
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
// (ShardTLSUnavailable): no Pod is created or replaced without its certificate.
func (r *RenderQueueReconciler) reconcileTLS(ctx context.Context, rq *rqv1.RenderQueue, missingPod bool,
	now time.Time) (shardTLS, []policy.Event, *policy.Blocker, error) {
	if !rq.Spec.TLSEnabled() {
		return shardTLS{}, nil, nil, nil
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

	cm := &corev1.ConfigMap{}
	cm.Name, cm.Namespace = rqv1.ShardCAConfigMapName(rq.Name), rq.Namespace
	op, err := controllerutil.CreateOrUpdate(ctx, r.Client, cm, func() error {
		specs.ShardCAConfigMap(rq, cm, ca.Bundle)
		return controllerutil.SetControllerReference(rq, cm, r.Scheme)
	})
	if apierrors.IsAlreadyExists(err) {
		err = &childConflictError{what: "shard CA ConfigMap", name: cm.Name, queue: rq.Name, err: err}
	}
	if err != nil {
		return out, nil, nil, fmt.Errorf("reconciling the shard CA ConfigMap %s: %w", cm.Name, err)
	}
	if op != controllerutil.OperationResultNone {
		log.FromContext(ctx).V(1).Info("Reconciled child", "kind", "shard CA ConfigMap", "name", cm.Name, "operation", op)
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
	if r.ShardCA == nil {
		return nil, fmt.Errorf("RenderQueue %s/%s serves TLS and the operator has no shard CA", rq.Namespace, rq.Name)
	}
	ca, err := r.ShardCA.CA(ctx)
	if err != nil {
		return nil, err
	}
	return r.tlsClients.Get(rqv1.ShardServerName(rq.Namespace, rq.Name), ca.Bundle)
}

// ShardCASource gives the operator's current shard CA (shardtls.CAStore).
type ShardCASource interface {
	CA(ctx context.Context) (*certs.CA, error)
}

// pollTLS completes st (reconcileTLS's, zero when it did not run) for the poll and the status:
// the status.tls shardtls.StatusToKeep keeps and, while shards serve TLS, the shard CA bundle to
// poll them with over HTTPS.
func (r *RenderQueueReconciler) pollTLS(ctx context.Context, rq *rqv1.RenderQueue, st shardTLS, pods map[string]*corev1.Pod) shardTLS {
	var tlsPods bool
	st.status, tlsPods = shardtls.StatusToKeep(rq, st.status, pods)
	if st.bundle != nil || !tlsPods || r.ShardCA == nil {
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
