package controllers

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/policy"
	"github.com/renderqueue/renderqueue/pkg/objective"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// The operator's per-RenderQueue metrics (renderqueue_queue_*). Every series carries the labels
// namespace and renderqueue (the RenderQueue's); per-shard series add shard. Scrape the operator
// with honor_labels (honorLabels: true), so that namespace stays the RenderQueue's namespace
// rather than the operator's.
//
// The state gauges are computed at scrape time from the RenderQueues in the manager's cache —
// what `kubectl get renderqueue -o yaml` shows — so they always match the status, and a deleted
// RenderQueue's series disappear with it. The handoff counters count the membership steps the
// reconciler wrote.

// The scaler endpoint the operator serves on its metrics port (pkg/metricsapi.NewScalerHandler)
// authenticates its callers with TokenReviews and authorizes them with SubjectAccessReviews:
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Label names of the operator's per-queue metrics.
const (
	labelNamespace   = "namespace"
	labelRenderQueue = "renderqueue"
	labelShard       = "shard"
)

// shardStates are the values of renderqueue_queue_shard_state{state}: every state
// status.shards[].state can hold — the queue states a shard reports (pkg/shardapi's Status*) and
// the operator's own (controllers/policy's State*: Pending, Unreachable, Failing).
// TestShardStatesExported checks that none is missing.
var shardStates = [...]string{shardapi.StatusQueued, shardapi.StatusEmpty, shardapi.StatusUnready,
	policy.StatePending, policy.StateUnreachable, policy.StateFailing}

// conditionStatuses are the values of renderqueue_queue_condition{status}.
var conditionStatuses = [...]metav1.ConditionStatus{metav1.ConditionTrue, metav1.ConditionFalse, metav1.ConditionUnknown}

// Metrics are the operator's event metrics: the slot handoffs of each RenderQueue. Create them
// with NewMetrics and set RenderQueueReconciler.Metrics; a nil *Metrics records nothing.
type Metrics struct {
	started, committed, rolledBack *prometheus.CounterVec
}

// NewMetrics registers the handoff counters with reg (the operator passes controller-runtime's
// metrics.Registry, which its metrics server serves).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	labels := []string{labelNamespace, labelRenderQueue}
	m := &Metrics{
		started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "renderqueue_queue_handoffs_started_total",
			Help: "Slot handoffs (rebalances) started: their prepare phase was published."}, labels),
		committed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "renderqueue_queue_handoffs_committed_total",
			Help: "Slot handoffs committed: every receiver reported its incoming slots walked and ownership moved."}, labels),
		rolledBack: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "renderqueue_queue_handoffs_rolled_back_total",
			Help: "Slot handoffs rolled back: a receiver did not report its incoming slots walked by the deadline."}, labels),
	}
	for _, c := range []prometheus.Collector{m.started, m.committed, m.rolledBack} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering the handoff metrics: %w", err)
		}
	}
	return m, nil
}

// track creates rq's counters at 0, so that the first handoff is an increase.
func (m *Metrics) track(namespace, name string) {
	if m == nil {
		return
	}
	m.started.WithLabelValues(namespace, name)
	m.committed.WithLabelValues(namespace, name)
	m.rolledBack.WithLabelValues(namespace, name)
}

// forget drops the counters of a RenderQueue that no longer exists.
func (m *Metrics) forget(namespace, name string) {
	if m == nil {
		return
	}
	for _, v := range []*prometheus.CounterVec{m.started, m.committed, m.rolledBack} {
		v.DeleteLabelValues(namespace, name)
	}
}

// handoffs counts the handoff steps among the events of a membership step whose status write
// succeeded.
func (m *Metrics) handoffs(namespace, name string, events []policy.Event) {
	if m == nil {
		return
	}
	for _, e := range events {
		switch e.Reason {
		case EventRebalanceStarted:
			m.started.WithLabelValues(namespace, name).Inc()
		case EventRebalanceCommitted:
			m.committed.WithLabelValues(namespace, name).Inc()
		case EventRebalanceRolledBack:
			m.rolledBack.WithLabelValues(namespace, name).Inc()
		}
	}
}

// QueueCollector exports every RenderQueue's status as gauges, read at scrape time from a
// client.Reader (the manager's cache).
type QueueCollector struct {
	reader  client.Reader
	elected <-chan struct{}
	timeout time.Duration
	d       queueDescs
}

type queueDescs struct {
	due, dueExact, dueAsOf, condition                          *prometheus.Desc
	shardsDesired, shardsCurrent, shardsReady, slotsMoving     *prometheus.Desc
	shardDue, shardExact, shardReady, shardState, shardHeld    *prometheus.Desc
	shardEdge, shardWalkEnd, shardWalkPartial, shardWalkFailed *prometheus.Desc
	forecast, forecastExact                                    *prometheus.Desc
	objectiveAttainment, objectiveBudget, objectiveMet         *prometheus.Desc
	scrapeErrors                                               *prometheus.Desc
}

// NewQueueCollector returns the collector of the per-RenderQueue gauges. elected, when not nil,
// holds the series back until it is closed (the manager's Elected(): only the leader, whose
// status writes they reflect, exports them; every replica has the same cache).
func NewQueueCollector(reader client.Reader, elected <-chan struct{}) *QueueCollector {
	q := []string{labelNamespace, labelRenderQueue}
	s := []string{labelNamespace, labelRenderQueue, labelShard}
	d := func(name, help string, labels []string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc("renderqueue_queue_"+name, help, append(append([]string{}, labels...), extra...), nil)
	}
	return &QueueCollector{reader: reader, elected: elected, timeout: 10 * time.Second, d: queueDescs{
		due: d("due", "status.due: due rows summed per slot over the committed assignment; a lower bound unless renderqueue_queue_due_exact is 1. "+
			"Absent until the operator first polled the shards.", q),
		dueExact: d("due_exact", "status.dueExact: 1 when every shard is reachable and exact, so renderqueue_queue_due is the true count.", q),
		dueAsOf:  d("due_as_of_timestamp_seconds", "status.dueAsOf: the shard poll at which the due count or its exactness last changed.", q),
		forecast: d("due_forecast", "status.forecast: due rows plus the rows coming due within the horizon (15m, 1h, 24h); a lower bound unless renderqueue_queue_due_forecast_exact is 1. "+
			"Absent until the operator first computed it.", q, "horizon"),
		forecastExact: d("due_forecast_exact", "1 when renderqueue_queue_due_forecast is the true count for the horizon.", q, "horizon"),
		objectiveAttainment: d("objective_attainment_ratio",
			"status.objectives[].attainment: the share of the objective's events good over its window (from its good and late counts). Absent while there are none.", q, "objective"),
		objectiveBudget: d("objective_budget_remaining_ratio",
			"status.objectives[].budgetRemaining: the share of the objective's error budget left over its window; negative when overspent. Absent while there are no events.", q, "objective"),
		objectiveMet: d("objective_met", "status.objectives[].met: 1 when the objective is met over its window.", q, "objective"),
		condition: d("condition", "1 for the status each condition of the RenderQueue has (Ready, Exact, EdgeHealthy, WalksComplete, Progressing, Reconciled, ClassesServed), 0 for the others.",
			q, "condition", "status"),
		shardsDesired: d("shards_desired", "spec.shards: the shard count asked for.", q),
		shardsCurrent: d("shards_current", "status.currentShards: shards in the committed slot assignment.", q),
		shardsReady:   d("shards_ready", "status.readyShards: shards that have finished loading.", q),
		slotsMoving:   d("slots_moving", "status.membership.slotsMoving: slots being handed off.", q),
		shardDue:      d("shard_due", "Due rows of the shard's owned slots, as it reported them.", s),
		shardExact:    d("shard_exact", "1 when the shard vouches for its due count.", s),
		shardReady:    d("shard_ready", "1 when the shard's Pod is ready and its first walk finished.", s),
		shardState: d("shard_state", "1 for the shard's state (queued, empty, unready as it reports; Pending, Unreachable, Failing as the operator sees it), 0 for the others.",
			s, "state"),
		shardHeld: d("shard_rows_held", "Rows the shard holds in memory.", s),
		shardEdge: d("shard_edge_timestamp_seconds",
			"The shard's edge: every owned row due before it is held. Lagging when below time(). Absent when unknown or unbounded (window 0).", s),
		shardWalkEnd:     d("shard_last_walk_end_timestamp_seconds", "When the shard's last walk finished.", s),
		shardWalkPartial: d("shard_last_walk_partial", "1 when the shard's last walk left segments unread.", s),
		shardWalkFailed:  d("shard_last_walk_failed", "1 when the shard's last walk failed as a whole.", s),
		scrapeErrors: prometheus.NewDesc("renderqueue_queue_collect_error",
			"1 when the RenderQueues could not be listed for this scrape (the renderqueue_queue_* gauges are then missing).", nil, nil),
	}}
}

// Describe implements prometheus.Collector.
func (c *QueueCollector) Describe(ch chan<- *prometheus.Desc) {
	d := c.d
	for _, desc := range []*prometheus.Desc{d.due, d.dueExact, d.dueAsOf, d.forecast, d.forecastExact,
		d.objectiveAttainment, d.objectiveBudget, d.objectiveMet, d.condition, d.shardsDesired, d.shardsCurrent,
		d.shardsReady, d.slotsMoving, d.shardDue, d.shardExact, d.shardReady, d.shardState, d.shardHeld, d.shardEdge,
		d.shardWalkEnd, d.shardWalkPartial, d.shardWalkFailed, d.scrapeErrors} {
		ch <- desc
	}
}

// Collect implements prometheus.Collector.
func (c *QueueCollector) Collect(ch chan<- prometheus.Metric) {
	if c.elected != nil {
		select {
		case <-c.elected:
		default:
			return // not the leader (yet)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	var list rqv1.RenderQueueList
	if err := c.reader.List(ctx, &list); err != nil {
		ch <- prometheus.MustNewConstMetric(c.d.scrapeErrors, prometheus.GaugeValue, 1)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.d.scrapeErrors, prometheus.GaugeValue, 0)
	for i := range list.Items {
		collectQueue(c.d, &list.Items[i], ch)
	}
}

// collectQueue sends the gauges of one RenderQueue.
func collectQueue(d queueDescs, rq *rqv1.RenderQueue, ch chan<- prometheus.Metric) {
	q := []string{rq.Namespace, rq.Name}
	g := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	st := &rq.Status
	if st.DueAsOf != nil {
		// before the first poll status.due is 0 by default, not a count: export nothing
		g(d.due, float64(st.Due), q...)
		g(d.dueExact, b2f(st.DueExact), q...)
		g(d.dueAsOf, unixSeconds(st.DueAsOf.Time), q...)
	}
	for _, o := range st.Objectives {
		// from the counts, not the status's rounded strings; the budget needs the spec's
		// percentile
		window := objective.Tally{Good: o.Good, Late: o.Late}
		if a, ok := window.Attainment(); ok {
			g(d.objectiveAttainment, a, rq.Namespace, rq.Name, o.Name)
			for _, so := range rq.Spec.Objectives {
				if so.Name == o.Name {
					g(d.objectiveBudget, policy.CountedObjective(so).BudgetRemaining(window), rq.Namespace, rq.Name, o.Name)
				}
			}
		}
		g(d.objectiveMet, b2f(o.Met), rq.Namespace, rq.Name, o.Name)
	}
	if st.Forecast != nil {
		for _, h := range st.Forecast.Horizons {
			g(d.forecast, float64(h.Due), rq.Namespace, rq.Name, h.Horizon)
			g(d.forecastExact, b2f(h.Exact), rq.Namespace, rq.Name, h.Horizon)
		}
	}
	for _, c := range st.Conditions {
		for _, s := range conditionStatuses {
			g(d.condition, b2f(c.Status == s), rq.Namespace, rq.Name, c.Type, string(s))
		}
	}
	shards := rq.Spec.Shards
	if shards < 1 {
		shards = rqv1.DefaultShards
	}
	g(d.shardsDesired, float64(shards), q...)
	g(d.shardsCurrent, float64(st.CurrentShards), q...)
	g(d.shardsReady, float64(st.ReadyShards), q...)
	g(d.slotsMoving, float64(st.Membership.SlotsMoving), q...)
	for i := range st.Shards {
		sh := &st.Shards[i]
		l := []string{rq.Namespace, rq.Name, sh.Name}
		g(d.shardDue, float64(sh.Due), l...)
		g(d.shardExact, b2f(sh.Exact), l...)
		g(d.shardReady, b2f(sh.Ready), l...)
		g(d.shardHeld, float64(sh.RowsHeld), l...)
		for _, p := range shardStates {
			g(d.shardState, b2f(sh.State == p), rq.Namespace, rq.Name, sh.Name, p)
		}
		if sh.Edge != nil {
			g(d.shardEdge, unixSeconds(sh.Edge.Time), l...)
		}
		if w := sh.LastWalk; w != nil && w.FinishedAt != nil {
			g(d.shardWalkEnd, unixSeconds(w.FinishedAt.Time), l...)
			g(d.shardWalkPartial, b2f(w.Partial), l...)
			g(d.shardWalkFailed, b2f(w.Failed), l...)
		}
	}
}

func b2f(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// unixSeconds is t in seconds since the epoch, as Prometheus timestamps are written.
func unixSeconds(t time.Time) float64 {
	return float64(t.UnixNano()) / 1e9
}
