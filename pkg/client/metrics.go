package client

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/renderqueue/renderqueue/pkg/client/clientmetrics"
)

// Metrics are a worker's Prometheus metrics: clientmetrics.Metrics (kept here for callers of
// NewMetrics).
type Metrics = clientmetrics.Metrics

// NewMetrics registers the worker metrics with reg: clientmetrics.New.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) { return clientmetrics.New(reg) }
