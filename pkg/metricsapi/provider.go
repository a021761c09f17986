package metricsapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/metrics/pkg/apis/external_metrics"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"

	"github.com/go-logr/logr"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/logkeys"
)

// Provider is the custom-metrics-apiserver ExternalMetricsProvider of the RenderQueue metrics:
// it lists the RenderQueues of the requested namespace through a client.Reader and computes the
// values with [Values].
type Provider struct {
	reader  client.Reader
	log     logr.Logger
	metrics *RequestMetrics
}

var _ provider.ExternalMetricsProvider = (*Provider)(nil)

// NewProvider returns a Provider reading RenderQueues through reader (a manager's client or
// cache, whose scheme must know api/v1alpha1). Failed requests are logged to log at V(1).
// Requests are counted (api="external") in the RequestMetrics on controller-runtime's metrics
// registry; see WithRequestMetrics.
func NewProvider(reader client.Reader, log logr.Logger) *Provider {
	return &Provider{reader: reader, log: log, metrics: defaultRequestMetrics()}
}

// WithRequestMetrics makes p count its requests in m instead (nil: not at all) and returns p.
func (p *Provider) WithRequestMetrics(m *RequestMetrics) *Provider {
	p.metrics = m
	return p
}

// GetExternalMetric implements provider.ExternalMetricsProvider. Its errors are API status
// errors: 404 NotFound for an unknown metric or an empty selection, 503 ServiceUnavailable while
// a selected RenderQueue is inexact (renderqueue_due, renderqueue_due_forecast) or has never been
// computed, 400 BadRequest for renderqueue_due_forecast without a served horizon, and 500 when
// the RenderQueues cannot be listed.
func (p *Provider) GetExternalMetric(ctx context.Context, namespace string, metricSelector labels.Selector, info provider.ExternalMetricInfo) (*external_metrics.ExternalMetricValueList, error) {
	log := p.log.WithValues(logkeys.Namespace, namespace, "metric", info.Metric, "selector", metricSelector.String())
	values, err := p.values(ctx, namespace, metricSelector, info.Metric)
	p.metrics.observe(APIExternal, namespace, err)
	if err != nil {
		log.V(1).Info("external metric request failed", "error", err.Error())
		return nil, statusError(info.Metric, err)
	}
	return &external_metrics.ExternalMetricValueList{Items: values}, nil
}

func (p *Provider) values(ctx context.Context, namespace string, selector labels.Selector, metric string) ([]external_metrics.ExternalMetricValue, error) {
	if !slices.Contains(Metrics(), metric) {
		// Answer before listing: an unknown metric is not worth a read.
		return Values(nil, metric, selector)
	}
	var list rqv1.RenderQueueList
	if err := p.reader.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("list RenderQueues in namespace %q: %w", namespace, err)
	}
	values, err := Values(list.Items, metric, selector)
	if err != nil {
		return nil, fmt.Errorf("namespace %q: %w", namespace, err)
	}
	return values, nil
}

// ListAllExternalMetrics implements provider.ExternalMetricsProvider.
func (p *Provider) ListAllExternalMetrics() []provider.ExternalMetricInfo {
	names := Metrics()
	infos := make([]provider.ExternalMetricInfo, 0, len(names))
	for _, n := range names {
		infos = append(infos, provider.ExternalMetricInfo{Metric: n})
	}
	return infos
}

// statusError turns an error of Provider.values into the API status the HPA controller (and
// kubectl get --raw) sees, keeping the message.
func statusError(metric string, err error) *apierrors.StatusError {
	gr := schema.GroupResource{Group: external_metrics.GroupName, Resource: metric}
	switch {
	case errors.Is(err, ErrUnknownMetric), errors.Is(err, ErrNoneSelected):
		return &apierrors.StatusError{ErrStatus: metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusNotFound, Reason: metav1.StatusReasonNotFound,
			Message: err.Error(),
			Details: &metav1.StatusDetails{Group: gr.Group, Kind: gr.Resource},
		}}
	case errors.Is(err, ErrBadHorizon):
		return apierrors.NewBadRequest(err.Error())
	case errors.Is(err, ErrInexact), errors.Is(err, ErrNotComputed):
		return apierrors.NewServiceUnavailable(err.Error())
	default:
		return apierrors.NewInternalError(err)
	}
}
