// Package clientmetrics is the Prometheus metrics of a render worker on pkg/client
// (renderqueue_worker_*): claims, completions, releases, lease extensions, render times and the
// rows in flight. Create them with New and pass them in client.Options.Metrics; the client
// records into them, and a nil *Metrics records nothing.
package clientmetrics

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a worker's Prometheus metrics. Create them with New and pass them in
// client.Options.Metrics; a nil *Metrics records nothing.
type Metrics struct {
	claims      *prometheus.CounterVec
	claimedRows prometheus.Counter
	completions *prometheus.CounterVec
	releases    prometheus.Counter
	extensions  *prometheus.CounterVec
	renders     *prometheus.HistogramVec
	inFlight    prometheus.Gauge
}

// New registers the worker metrics with reg:
//
//	renderqueue_worker_claims_total{result="rows|empty|unavailable|error"}
//	renderqueue_worker_claimed_rows_total
//	renderqueue_worker_completions_total{result="completed|rejected|error"}
//	renderqueue_worker_releases_total
//	renderqueue_worker_lease_extensions_total{result="extended|refused|error"}
//	renderqueue_worker_render_seconds{result="success|error|lease_lost"} (histogram)
//	renderqueue_worker_in_flight
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "renderqueue_worker_claims_total",
			Help: "Claim requests by result: rows handed out, empty, 503 (shard loading or its store down), error.",
		}, []string{"result"}),
		claimedRows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "renderqueue_worker_claimed_rows_total",
			Help: "Rows handed out by claims.",
		}),
		completions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "renderqueue_worker_completions_total",
			Help: "Rows sent for completion by result: completed, rejected by the shard (lease no longer current), error (not delivered).",
		}, []string{"result"}),
		releases: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "renderqueue_worker_releases_total",
			Help: "Rows handed back unrendered (render errors, shutdown).",
		}),
		extensions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "renderqueue_worker_lease_extensions_total",
			Help: "Lease extensions by result: extended, refused (lease no longer current), error.",
		}, []string{"result"}),
		renders: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "renderqueue_worker_render_seconds",
			Help:    "Time the handler took per row, by result.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16), // 10 ms .. ~5.5 min
		}, []string{"result"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "renderqueue_worker_in_flight",
			Help: "Rows being rendered now.",
		}),
	}
	for _, c := range []prometheus.Collector{m.claims, m.claimedRows, m.completions, m.releases, m.extensions, m.renders, m.inFlight} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering the worker metrics: %w", err)
		}
	}
	return m, nil
}

// Claim counts a claim request by result: rows, empty, unavailable or error.
func (m *Metrics) Claim(result string) {
	if m != nil {
		m.claims.WithLabelValues(result).Inc()
	}
}

// Claimed counts n rows handed out by a claim.
func (m *Metrics) Claimed(n int) {
	if m != nil {
		m.claimedRows.Add(float64(n))
	}
}

// Completion counts n rows sent for completion by result: completed, rejected or error.
func (m *Metrics) Completion(result string, n int) {
	if m != nil && n > 0 {
		m.completions.WithLabelValues(result).Add(float64(n))
	}
}

// Release counts n rows handed back unrendered.
func (m *Metrics) Release(n int) {
	if m != nil && n > 0 {
		m.releases.Add(float64(n))
	}
}

// Extension counts n lease extensions by result: extended, refused or error.
func (m *Metrics) Extension(result string, n int) {
	if m != nil && n > 0 {
		m.extensions.WithLabelValues(result).Add(float64(n))
	}
}

// Rendered observes a render of d by result: success, error or lease_lost.
func (m *Metrics) Rendered(result string, d time.Duration) {
	if m != nil {
		m.renders.WithLabelValues(result).Observe(d.Seconds())
	}
}

// InFlightAdd adds n (negative: removes) to the rows being rendered now.
func (m *Metrics) InFlightAdd(n int) {
	if m != nil {
		m.inFlight.Add(float64(n))
	}
}
