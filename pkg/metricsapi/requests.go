package metricsapi

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// APIs whose requests RequestMetrics counts (label api).
const (
	// APIExternal is the external metrics API (external.metrics.k8s.io, the Provider).
	APIExternal = "external"
	// APIScaler is the scaler endpoint (ScalerHandler, for KEDA's metrics-api trigger).
	APIScaler = "scaler"
)

// Reasons of failed requests (label reason of renderqueue_metrics_api_request_errors_total).
const (
	ReasonInexact         = "inexact"
	ReasonNotComputed     = "not_computed"
	ReasonNoneSelected    = "none_selected"
	ReasonUnknownMetric   = "unknown_metric"
	ReasonBadRequest      = "bad_request"
	ReasonUnauthenticated = "unauthenticated"
	ReasonForbidden       = "forbidden"
	ReasonInternal        = "internal"
)

// RequestMetrics count the requests of the metrics APIs and their failures:
//
//	renderqueue_metrics_api_requests_total{api}
//	renderqueue_metrics_api_request_errors_total{api, namespace, reason}
//
// namespace is the namespace the request asked about, empty when the request was not
// authenticated and authorized (so that anonymous clients cannot add series). A nil
// *RequestMetrics counts nothing.
type RequestMetrics struct {
	requests *prometheus.CounterVec
	errors   *prometheus.CounterVec
}

// NewRequestMetrics registers the request counters with reg, or, when reg already holds them
// (an earlier call), returns those, so that the external metrics API and the scaler endpoint of
// one process count into the same series.
func NewRequestMetrics(reg prometheus.Registerer) (*RequestMetrics, error) {
	requests, err := registerOrReuse(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "renderqueue_metrics_api_requests_total",
		Help: "Requests served by the metrics APIs: api=external (external.metrics.k8s.io) or scaler (the JSON endpoint for KEDA).",
	}, []string{"api"}))
	if err != nil {
		return nil, err
	}
	errs, err := registerOrReuse(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "renderqueue_metrics_api_request_errors_total",
		Help: "Requests of the metrics APIs that got an error, by api, namespace and reason: inexact, not_computed, none_selected, " +
			"unknown_metric, bad_request, unauthenticated, forbidden, internal.",
	}, []string{"api", "namespace", "reason"}))
	if err != nil {
		return nil, err
	}
	m := &RequestMetrics{requests: requests, errors: errs}
	for _, api := range []string{APIExternal, APIScaler} {
		m.requests.WithLabelValues(api)
	}
	return m, nil
}

// registerOrReuse registers c with reg, or returns the equal collector reg already holds.
func registerOrReuse(reg prometheus.Registerer, c *prometheus.CounterVec) (*prometheus.CounterVec, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
			return existing, nil
		}
	}
	return nil, fmt.Errorf("registering the metrics API request metrics: %w", err)
}

// defaultRequestMetrics are the request counters on controller-runtime's metrics registry (which
// the operator's metrics server serves), or nil when they cannot be registered there.
func defaultRequestMetrics() *RequestMetrics {
	m, err := NewRequestMetrics(ctrlmetrics.Registry)
	if err != nil {
		return nil
	}
	return m
}

// observe counts one request of api about namespace that ended with err (nil: success).
func (m *RequestMetrics) observe(api, namespace string, err error) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(api).Inc()
	if err != nil {
		m.errors.WithLabelValues(api, namespace, reasonOf(err)).Inc()
	}
}

// observeUnauthorized counts a request of api that was refused before its namespace could be
// trusted.
func (m *RequestMetrics) observeUnauthorized(api, reason string) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(api).Inc()
	m.errors.WithLabelValues(api, "", reason).Inc()
}

// reasonOf maps an error of Values (or of reading the RenderQueues) to its reason label.
func reasonOf(err error) string {
	switch {
	case errors.Is(err, ErrInexact):
		return ReasonInexact
	case errors.Is(err, ErrNotComputed):
		return ReasonNotComputed
	case errors.Is(err, ErrNoneSelected):
		return ReasonNoneSelected
	case errors.Is(err, ErrUnknownMetric):
		return ReasonUnknownMetric
	case errors.Is(err, ErrBadHorizon):
		return ReasonBadRequest
	default:
		return ReasonInternal
	}
}
