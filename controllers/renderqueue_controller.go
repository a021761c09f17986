package controllers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/policy"
	"github.com/renderqueue/renderqueue/controllers/shardtls"
	"github.com/renderqueue/renderqueue/controllers/specs"
	"github.com/renderqueue/renderqueue/pkg/logkeys"
)

// Defaults of RenderQueueReconciler's tunables.
const (
	// DefaultPollInterval is how often each RenderQueue's shards are polled.
	DefaultPollInterval = 10 * time.Second
	// DefaultRebalanceTimeout is how long receivers have to report a prepare walked before the
	// handoff rolls back.
	DefaultRebalanceTimeout = 5 * time.Minute
	// DefaultRebalanceRetryAfter is how long after a rollback the rebalance is tried again.
	DefaultRebalanceRetryAfter = time.Minute
	// DefaultMaxConcurrentReconciles is how many RenderQueues are reconciled at once. A
	// reconcile waits for its shards' polls, up to the poll timeout for a shard that does not
	// answer: with one at a time, the RenderQueues of a few such shards held up every other one
	// (BenchmarkManyQueues, docs/benchmarks-history.md "Many queues").
	DefaultMaxConcurrentReconciles = 10
)

// RenderQueueReconciler reconciles RenderQueue objects: children, shard Pods, membership,
// rolling replacement and status (see the package documentation).
type RenderQueueReconciler struct {
	client.Client
	// Scheme knows the RenderQueue and core types (for owner references).
	Scheme *runtime.Scheme
	// Recorder emits the events of RenderQueues.
	Recorder events.EventRecorder
	// KeeperImage is the image of shard Pods whose RenderQueue does not set spec.image (the
	// operator's own image).
	KeeperImage string
	// PollInterval is how often the shards are polled; DefaultPollInterval when zero.
	PollInterval time.Duration
	// PollTimeout bounds each shard's GET /v1/status; DefaultShardPollTimeout when zero.
	PollTimeout time.Duration
	// RebalanceTimeout is how long a prepare may wait for its receivers; DefaultRebalanceTimeout
	// when zero.
	RebalanceTimeout time.Duration
	// RebalanceRetryAfter is the pause after a rollback; DefaultRebalanceRetryAfter when zero.
	RebalanceRetryAfter time.Duration
	// MaxConcurrentReconciles is how many RenderQueues are reconciled at once (one RenderQueue is
	// never reconciled twice at once); DefaultMaxConcurrentReconciles when zero.
	MaxConcurrentReconciles int
	// ResolveShardURL gives the base URL of a shard's API; PodIPResolver when nil.
	ResolveShardURL ShardURLResolver
	// HTTPClient polls the shards; a plain client when nil.
	HTTPClient *http.Client
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Metrics counts the handoffs of each RenderQueue; nil counts nothing.
	Metrics *Metrics
	// AllowedImages are the keeper images the operator runs besides KeeperImage; the zero value
	// allows any. A RenderQueue whose spec.image it does not allow gets no Pods and the condition
	// Reconciled=False, reason ImageNotAllowed.
	AllowedImages policy.ImageAllowlist
	// ShardCA is the CA the shards' certificates are issued from (spec.tls OperatorIssued); nil
	// refuses such RenderQueues (Reconciled=False, ShardTLSUnavailable).
	ShardCA ShardCASource
	// APIReader reads a RenderQueue past the cache before its shards' certificate is reissued
	// (the manager's API reader); nil trusts the cache.
	APIReader client.Reader

	// tlsClients poll the shards that serve HTTPS.
	tlsClients shardtls.Clients
	// tokens maps a RenderQueue's namespace/name to its UID once this process has created or
	// found its API token Secret (see ensureTokenSecret).
	tokens sync.Map
}

func (r *RenderQueueReconciler) pollInterval() time.Duration {
	if r.PollInterval > 0 {
		return r.PollInterval
	}
	return DefaultPollInterval
}

func (r *RenderQueueReconciler) pollTimeout() time.Duration {
	if r.PollTimeout > 0 {
		return r.PollTimeout
	}
	return DefaultShardPollTimeout
}

func (r *RenderQueueReconciler) rebalanceTimeout() time.Duration {
	if r.RebalanceTimeout > 0 {
		return r.RebalanceTimeout
	}
	return DefaultRebalanceTimeout
}

func (r *RenderQueueReconciler) rebalanceRetryAfter() time.Duration {
	if r.RebalanceRetryAfter > 0 {
		return r.RebalanceRetryAfter
	}
	return DefaultRebalanceRetryAfter
}

func (r *RenderQueueReconciler) maxConcurrentReconciles() int {
	if r.MaxConcurrentReconciles > 0 {
		return r.MaxConcurrentReconciles
	}
	return DefaultMaxConcurrentReconciles
}

func (r *RenderQueueReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// The operator's RBAC (config/rbac/role.yaml, generated from these markers; docs/security.md
// says why each rule is there). Everything below is namespaced: the ClusterRole is bound
// cluster-wide by default, or per namespace with --watch-namespaces (config/namespaced). Secrets
// are only created (the token Secret) and updated (the shards' certificate, tls.go), never read:
// RBAC cannot grant reading by label, and the operator needs no Secret's content; tls.go has the
// secrets and configmaps rules. Leader election's Lease is in the operator's own namespace only,
// and so are the core/v1 events leader election records on it ("became leader"): the operator's
// own events are events.k8s.io ones.
//
// +kubebuilder:rbac:groups=renderqueue.dev,resources=renderqueues,verbs=get;list;watch
// +kubebuilder:rbac:groups=renderqueue.dev,resources=renderqueues/status,verbs=get;patch
// +kubebuilder:rbac:groups=renderqueue.dev,resources=renderqueues/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=services;serviceaccounts,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=renderqueue-system,resources=leases,verbs=get;create;update
// +kubebuilder:rbac:groups="",namespace=renderqueue-system,resources=events,verbs=create;patch

// Reconcile brings one RenderQueue's children, shard Pods and slot membership towards its spec
// and writes what its shards report into its status. The steps, in order:
//
//  1. what stops it: a spec that does not decode or breaks the API's rules, an image the
//     operator does not run (Reconciled=False; steps 2, 3, 5 and 6 are skipped, the existing
//     shards are still polled);
//  2. children: ServiceAccount/Role/RoleBinding, headless Service, PDB (a name taken by an
//     object the operator does not manage is a ChildConflict: as in 1); with spec.tls, the CA
//     ConfigMap and the shards' certificate (reconcileTLS; no CA is ShardTLSUnavailable, a
//     provided Secret that cannot be used ShardTLSSecretInvalid: as in 1);
//  3. Pods: create missing shard Pods (the target shards and every shard the persisted
//     assignment gives slots to) and, before that, the API token Secret; delete surplus ones that
//     own no slots. A Pod the API server refuses is ShardPodRefused; the rest goes on;
//  4. poll every shard's /v1/status in parallel;
//  5. membership: first assignment, handoff steps, new rebalances;
//  6. rolling replacement of outdated Pods, one at a time, while the membership is settled;
//  7. status and conditions, patched only when they changed; then the events.
//
// It requeues after the poll interval to poll again, at a priority below a change's
// (pollPriority), or sooner when a handoff step is due.
func (r *RenderQueueReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	var rq rqv1.RenderQueue
	if err := r.Get(ctx, req.NamespacedName, &rq); err != nil {
		if apierrors.IsNotFound(err) {
			r.Metrics.forget(req.Namespace, req.Name)
			r.tokens.Delete(req.NamespacedName)
			r.tlsClients.Forget(rqv1.ShardServerName(req.Namespace, req.Name))
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("reading RenderQueue %s: %w", req.NamespacedName, err)
	}
	if rq.DeletionTimestamp != nil {
		r.tokens.Delete(req.NamespacedName)
		return ctrl.Result{}, nil // the garbage collector removes the children
	}
	now := r.now().Truncate(time.Second) // the API server stores times to the second
	r.Metrics.track(rq.Namespace, rq.Name)

	// status.membership is parsed once, here; a malformed one is not retried (see
	// invalidMembership). The membership step updates assign as it publishes, and the status is
	// computed from it.
	assign, err := policy.AssignmentFromStatus(rq.Status.Membership)
	if err != nil {
		return ctrl.Result{}, r.invalidMembership(ctx, &rq, now, err)
	}
	blocked := policy.SpecBlocker(&rq, r.KeeperImage, r.AllowedImages)
	if blocked == nil {
		if err := r.reconcileChildren(ctx, &rq); err != nil {
			var conflict *childConflictError
			if !errors.As(err, &conflict) {
				return ctrl.Result{}, err
			}
			blocked = &policy.Blocker{Reason: rqv1.ReasonChildConflict, Message: conflict.Error()}
		}
	}
	pods, err := r.listShardPods(ctx, &rq)
	if err != nil {
		return ctrl.Result{}, err
	}
	hash := specs.PodTemplateHash(&rq, r.KeeperImage)
	var keep []string
	var tlsState shardTLS
	if blocked == nil {
		keep = policy.ShardsToKeep(&rq, assign)
		var tlsEvents []policy.Event
		tlsState, tlsEvents, blocked, err = r.reconcileTLS(ctx, &rq, policy.MissingPod(keep, pods), now)
		r.emit(&rq, tlsEvents)
		if err != nil {
			return ctrl.Result{}, err
		}
	}
	if blocked != nil {
		// only the shards that exist: nothing is created for a spec the operator cannot act on
		keep = assign.Shards()
		specs.SortShards(&rq, keep)
		logger.V(1).Info("Not reconciling the shards", "reason", blocked.Reason, "message", blocked.Message)
	} else {
		if err := r.ensureTokenSecret(ctx, &rq, keep, pods); err != nil {
			return ctrl.Result{}, err
		}
		podEvents, refused, err := r.reconcilePods(ctx, &rq, keep, pods, hash)
		r.emit(&rq, podEvents)
		if err != nil {
			return ctrl.Result{}, err
		}
		blocked = refused
	}

	hc := r.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	tlsState = r.pollTLS(ctx, &rq, tlsState, pods)
	if tlsState.bundle != nil {
		// verifies https:// shards for the RenderQueue's server name; http:// ones as they are
		if hc, err = r.tlsClients.Get(rqv1.ShardServerName(rq.Namespace, rq.Name), tlsState.bundle); err != nil {
			return ctrl.Result{}, err
		}
	}
	resolve := r.ResolveShardURL
	if resolve == nil {
		resolve = PodIPResolver
	}
	reports := pollShards(ctx, hc, resolve, r.pollTimeout(), keep, pods)
	byName := make(map[string]policy.ShardReport, len(reports))
	for _, rep := range reports {
		byName[rep.Name] = rep
	}

	next := rq.Status.DeepCopy()
	var mstep membershipStep
	var prog *policy.Progress
	if blocked == nil || blocked.Reason == rqv1.ReasonShardPodRefused {
		mstep, err = r.reconcileMembership(ctx, &rq, &assign, next, reports, pods, now)
		if err != nil {
			return ctrl.Result{}, err
		}
		prog = mstep.Progress
		// replace Pods only while no handoff runs and the assignment did not change in this
		// reconcile (a commit or rollback is written first)
		if prog == nil && !next.Membership.HandoffInProgress() && rq.Status.Membership.Epoch == next.Membership.Epoch {
			var rollEvents []policy.Event
			prog, rollEvents, err = r.reconcileRollingUpdate(ctx, &rq, keep, pods, byName, hash)
			r.emit(&rq, rollEvents)
			if err != nil {
				return ctrl.Result{}, err
			}
		}
	}

	if err := policy.ComputeStatus(&rq, next, policy.StatusInputs{Committed: assign, Reports: reports, Progress: prog, Blocked: blocked, Now: now}); err != nil {
		return ctrl.Result{}, err
	}
	next.TLS = tlsState.status
	if err := r.reconcileObjectives(ctx, &rq, next, reports, now); err != nil {
		return ctrl.Result{}, err
	}
	prev := rq.Status.DeepCopy()
	wrote, err := patchStatus(ctx, r.Client, &rq, next)
	if err != nil {
		if apierrors.IsConflict(err) {
			logger.V(1).Info("Status write conflicted; retrying with a fresh read")
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		return ctrl.Result{}, err
	}
	if wrote {
		logger.V(1).Info("Status updated", "due", next.Due, "dueExact", next.DueExact, "epoch", next.Membership.Epoch)
		r.emit(&rq, mstep.Events)
		r.Metrics.handoffs(rq.Namespace, rq.Name, mstep.Events)
		r.emit(&rq, policy.TransitionEvents(prev, next, pods))
	}

	if mstep.RequeueAfter > 0 && mstep.RequeueAfter < r.pollInterval() {
		// a handoff step is due: as urgent as a change
		return ctrl.Result{RequeueAfter: mstep.RequeueAfter, Priority: ptr.To(0)}, nil
	}
	return ctrl.Result{RequeueAfter: r.pollInterval(), Priority: ptr.To(pollPriority)}, nil
}

// pollPriority is the priority of the periodic reconcile that only polls the shards again, below
// that of a change to a RenderQueue or its children (0): when reconciles wait for workers (every
// worker held by polls of shards that do not answer), a spec change is not queued behind the
// polls of every other RenderQueue. The priority of the initial list, controller-runtime's
// handler.LowPriority.
const pollPriority = handler.LowPriority

// invalidMembership handles a status.membership that does not parse: the record of the slot
// assignment and of any handoff is unreadable, so the operator must not act on it and retrying
// changes nothing. It says so in the Reconciled condition (InvalidMembership, with a warning
// event when the condition turns so) and returns a terminal error: controller-runtime logs it and
// does not requeue. A later change to the RenderQueue or its Pods reconciles again.
func (r *RenderQueueReconciler) invalidMembership(ctx context.Context, rq *rqv1.RenderQueue, now time.Time, cause error) error {
	err := fmt.Errorf("RenderQueue %s/%s: %w", rq.Namespace, rq.Name, cause)
	next := rq.Status.DeepCopy()
	policy.SetCondition(next, rq.Generation, now, rqv1.ConditionReconciled, policy.Condition{Status: metav1.ConditionFalse,
		Reason: rqv1.ReasonInvalidMembership, Message: fmt.Sprintf(
			"the operator changes no shard, Pod or slot until it is fixed: %v", cause)})
	prev := rq.Status.DeepCopy()
	wrote, perr := patchStatus(ctx, r.Client, rq, next)
	if perr != nil {
		return errors.Join(err, perr) // not terminal: the condition must be written
	}
	if wrote {
		r.emit(rq, policy.TransitionEvents(prev, next, nil))
	}
	return reconcile.TerminalError(err)
}

// ControllerName is the RenderQueue controller's name: the controller label of
// controller-runtime's metrics (controller_runtime_reconcile_errors_total{controller="renderqueue"},
// which RenderQueueReconcileErrors reads) and the logger's name.
const ControllerName = "renderqueue"

// SetupWithManager registers the reconciler with mgr: it watches RenderQueues (spec changes,
// including the scale subresource) and every child kind it owns except the token Secret, which
// it only creates (it may not read Secrets; see ensureTokenSecret). It reconciles up to
// MaxConcurrentReconciles RenderQueues at once.
func (r *RenderQueueReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&rqv1.RenderQueue{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&corev1.Pod{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&corev1.Service{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&rbacv1.Role{}).
		Owns(&rbacv1.RoleBinding{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Named(ControllerName).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.maxConcurrentReconciles()}).
		WithLogConstructor(func(req *reconcile.Request) logr.Logger {
			// the keys every renderqueue process uses (pkg/logkeys), instead of
			// controller-runtime's RenderQueue={name, namespace}, namespace and name
			l := mgr.GetLogger().WithValues("controller", ControllerName)
			if req != nil {
				l = l.WithValues(logkeys.RenderQueue, req.Name, logkeys.Namespace, req.Namespace)
			}
			return l
		}).
		Complete(r)
}
