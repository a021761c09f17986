package keeper

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// Metrics are a shard's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	eventsTotal     prometheus.Counter
	gapsTotal       prometheus.Counter
	edgeAheadSecs   prometheus.Gauge
	walkSeconds     prometheus.Histogram
	walkRows        *prometheus.CounterVec
	walksTotal      *prometheus.CounterVec
	claimsTotal     *prometheus.CounterVec
	completesTotal  *prometheus.CounterVec
	claimLatency    prometheus.Histogram
	completeLatency prometheus.Histogram
}

// NewMetrics registers the shard's metrics with reg. State gauges (rows held, due, leased, exact,
// complete, ...) are collected from the shard's status at scrape time (see StatusCollector).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		eventsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "renderqueue_events_applied_total", Help: "Change events applied from the subscription."}),
		gapsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "renderqueue_subscription_gaps_total", Help: "Times the change-event subscription lost continuity."}),
		edgeAheadSecs: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "renderqueue_edge_ahead_seconds", Help: "How far the edge is ahead of now; negative when lagging."}),
		walkSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "renderqueue_walk_duration_seconds", Help: "Duration of verification walks.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14)}),
		walkRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "renderqueue_walk_rows_total", Help: "Rows read by walks, by what the walk found: scanned, admitted, repaired, invalid, deleted."},
			[]string{"kind"}),
		walksTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "renderqueue_walks_total", Help: "Walks by result: complete, partial, failed; unread segments counted separately."},
			[]string{"result"}),
		claimsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "renderqueue_claimed_rows_total", Help: "Rows claimed, by class."},
			[]string{"cadence", "source"}),
		completesTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "renderqueue_completed_rows_total", Help: "Rows completed, by class and result: ok, lease_lost, not_held (class empty when the row is not held)."},
			[]string{"cadence", "source", "result"}),
		claimLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "renderqueue_claim_duration_seconds", Help: "Time to serve a claim request.",
			Buckets: prometheus.ExponentialBuckets(0.00001, 4, 10)}),
		completeLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "renderqueue_complete_duration_seconds", Help: "Time to serve a complete request, including the group-committed write.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
	}
	reg.MustRegister(m.eventsTotal, m.gapsTotal, m.edgeAheadSecs, m.walkSeconds, m.walkRows, m.walksTotal,
		m.claimsTotal, m.completesTotal, m.claimLatency, m.completeLatency)
	return m
}

func (m *Metrics) eventsApplied(n int) {
	if m != nil {
		m.eventsTotal.Add(float64(n))
	}
}

func (m *Metrics) gap() {
	if m != nil {
		m.gapsTotal.Inc()
	}
}

func (m *Metrics) edgeAhead(d time.Duration) {
	if m != nil {
		m.edgeAheadSecs.Set(d.Seconds())
	}
}

func (m *Metrics) walk(r WalkReport) {
	if m == nil {
		return
	}
	switch {
	case r.Failed:
		m.walksTotal.WithLabelValues("failed").Inc()
	case r.Partial:
		m.walksTotal.WithLabelValues("partial").Inc()
	default:
		m.walksTotal.WithLabelValues("complete").Inc()
	}
	m.walksTotal.WithLabelValues("unread_segments").Add(float64(r.UnreadSegments))
	if !r.FinishedAt.IsZero() {
		m.walkSeconds.Observe(r.FinishedAt.Sub(r.StartedAt).Seconds())
	}
	m.walkRows.WithLabelValues("scanned").Add(float64(r.Counts.Scanned))
	m.walkRows.WithLabelValues("admitted").Add(float64(r.Counts.Admitted))
	m.walkRows.WithLabelValues("repaired").Add(float64(r.Counts.Repaired))
	m.walkRows.WithLabelValues("invalid").Add(float64(r.Counts.Invalid))
	m.walkRows.WithLabelValues("deleted").Add(float64(r.Counts.Deleted))
}

func (m *Metrics) claimed(rows []Claimed, took time.Duration) {
	if m == nil {
		return
	}
	m.claimLatency.Observe(took.Seconds())
	for i := range rows {
		m.claimsTotal.WithLabelValues(rows[i].Cadence.String(), rows[i].Source.String()).Inc()
	}
}

// rowClass is a row's class as the metrics label it; empty when the row is not held.
type rowClass struct{ cadence, source string }

func classOf(cadence time.Duration, source schedule.Source) rowClass {
	return rowClass{cadence: cadence.String(), source: source.String()}
}

// completed counts one complete request's items by class and result.
func (m *Metrics) completed(results []error, classes []rowClass, took time.Duration) {
	if m == nil {
		return
	}
	if took > 0 {
		m.completeLatency.Observe(took.Seconds())
	}
	for i, err := range results {
		result := "ok"
		switch {
		case errors.Is(err, ErrNotHeld):
			result = "not_held"
		case err != nil:
			result = "lease_lost"
		}
		m.completesTotal.WithLabelValues(classes[i].cadence, classes[i].source, result).Inc()
	}
}
