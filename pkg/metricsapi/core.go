package metricsapi

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/metrics/pkg/apis/external_metrics"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// Metric names served by the provider.
const (
	// MetricDue is status.due of each selected RenderQueue; an error while any is inexact.
	MetricDue = "renderqueue_due"
	// MetricDueLowerBound is status.due of each selected RenderQueue, exact or not.
	MetricDueLowerBound = "renderqueue_due_lower_bound"
	// MetricDueForecast is status.forecast's figure for the horizon the selector names
	// (LabelHorizon): the rows due now plus those coming due within it; an error while any
	// selected RenderQueue's figure for it is inexact.
	MetricDueForecast = "renderqueue_due_forecast"
)

// LabelHorizon is the metric selector label that names MetricDueForecast's horizon: 15m, 1h or
// 24h (status.forecast.horizons[].horizon). It selects no RenderQueue: it is taken out of the
// selector before RenderQueues are matched.
const LabelHorizon = "horizon"

// LabelName is the synthetic label every RenderQueue carries for metric selectors: its name.
const LabelName = rqv1.Group + "/name"

// Errors of [Values], to be tested with errors.Is. The messages wrapping them name the
// RenderQueues and the reasons.
var (
	// ErrUnknownMetric: the metric is not one of MetricDue and MetricDueLowerBound.
	ErrUnknownMetric = errors.New("unknown metric")
	// ErrNoneSelected: the selector matches no RenderQueue.
	ErrNoneSelected = errors.New("no RenderQueue selected")
	// ErrNotComputed: a selected RenderQueue has no status.dueAsOf yet.
	ErrNotComputed = errors.New("due count never computed")
	// ErrInexact: a selected RenderQueue's due count is a lower bound (MetricDue), or its
	// forecast for the horizon is (MetricDueForecast).
	ErrInexact = errors.New("due count is not exact")
	// ErrBadHorizon: MetricDueForecast without a horizon label, or with one it does not serve.
	ErrBadHorizon = errors.New("no horizon served")
)

// Metrics lists the metric names served, in a stable order.
func Metrics() []string { return []string{MetricDue, MetricDueLowerBound, MetricDueForecast} }

// Horizons are MetricDueForecast's horizons, as its selector names them.
func Horizons() []string { return []string{"15m", "1h", "24h"} }

// horizonOf takes MetricDueForecast's horizon (LabelHorizon=<h>, one of Horizons) out of
// selector and returns it with the rest of the selector.
func horizonOf(selector labels.Selector) (string, labels.Selector, error) {
	reqs, _ := selector.Requirements()
	rest := labels.NewSelector()
	var horizon string
	for _, r := range reqs {
		if r.Key() != LabelHorizon {
			rest = rest.Add(r)
			continue
		}
		vals := r.Values().UnsortedList()
		if (r.Operator() != selection.Equals && r.Operator() != selection.DoubleEquals && r.Operator() != selection.In) || len(vals) != 1 || horizon != "" {
			return "", nil, fmt.Errorf("%s: %w: want one %s=<horizon> in the selector, got %q (served: %s)", MetricDueForecast, ErrBadHorizon,
				LabelHorizon, r.String(), strings.Join(Horizons(), ", "))
		}
		horizon = vals[0]
	}
	if horizon == "" {
		return "", nil, fmt.Errorf("%s: %w: the selector %q names no %s (served: %s; e.g. %s=15m)", MetricDueForecast, ErrBadHorizon,
			selector.String(), LabelHorizon, strings.Join(Horizons(), ", "), LabelHorizon)
	}
	if !slices.Contains(Horizons(), horizon) {
		return "", nil, fmt.Errorf("%s: %w: %s=%s (served: %s)", MetricDueForecast, ErrBadHorizon, LabelHorizon, horizon, strings.Join(Horizons(), ", "))
	}
	return horizon, rest, nil
}

// forecastFor returns rq's status.forecast figure for horizon, nil when there is none.
func forecastFor(rq *rqv1.RenderQueue, horizon string) *rqv1.ForecastHorizon {
	if rq.Status.Forecast == nil {
		return nil
	}
	for i := range rq.Status.Forecast.Horizons {
		if rq.Status.Forecast.Horizons[i].Horizon == horizon {
			return &rq.Status.Forecast.Horizons[i]
		}
	}
	return nil
}

// SelectorLabels returns the labels a metric selector is matched against for rq: its own labels
// plus LabelName=<rq.Name>, which overrides an own label of the same key.
func SelectorLabels(rq *rqv1.RenderQueue) labels.Set {
	set := make(labels.Set, len(rq.Labels)+1)
	maps.Copy(set, rq.Labels)
	set[LabelName] = rq.Name
	return set
}

// Values computes metric for the RenderQueues among rqs that selector matches (a nil selector
// matches all), one value per RenderQueue sorted by name. Each value carries status.due, the
// RenderQueue's selector labels and status.dueAsOf as its timestamp.
//
// It fails (wrapping the matching sentinel error) when metric is unknown, when nothing is
// selected, when a selected RenderQueue has no status.dueAsOf, and, for MetricDue only, when a
// selected RenderQueue has status.dueExact false. Every offending RenderQueue is named.
func Values(rqs []rqv1.RenderQueue, metric string, selector labels.Selector) ([]external_metrics.ExternalMetricValue, error) {
	if !slices.Contains(Metrics(), metric) {
		return nil, fmt.Errorf("%w %q (served: %s)", ErrUnknownMetric, metric, strings.Join(Metrics(), ", "))
	}
	if selector == nil {
		selector = labels.Everything()
	}
	var horizon string
	if metric == MetricDueForecast {
		var err error
		if horizon, selector, err = horizonOf(selector); err != nil {
			return nil, err
		}
	}
	var selected []*rqv1.RenderQueue
	for i := range rqs {
		if selector.Matches(SelectorLabels(&rqs[i])) {
			selected = append(selected, &rqs[i])
		}
	}
	if len(selected) == 0 {
		return nil, fmt.Errorf("%s: %w by selector %q (RenderQueues carry their own labels plus %s=<name>)",
			metric, ErrNoneSelected, selector.String(), LabelName)
	}
	slices.SortFunc(selected, func(a, b *rqv1.RenderQueue) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})

	var notComputed, inexact []string
	for _, rq := range selected {
		f := forecastFor(rq, horizon)
		switch {
		case rq.Status.DueAsOf == nil || (metric == MetricDueForecast && f == nil):
			notComputed = append(notComputed, fmt.Sprintf("%q", rq.Name))
		case metric == MetricDueForecast && !f.Exact:
			inexact = append(inexact, fmt.Sprintf("%q (due within %s %d is a lower bound as of %s: %s)",
				rq.Name, horizon, f.Due, rq.Status.Forecast.AsOf.UTC().Format("2006-01-02T15:04:05Z"), f.Reason))
		case metric == MetricDue && !rq.Status.DueExact:
			inexact = append(inexact, fmt.Sprintf("%q (due %d is a lower bound as of %s: %s)",
				rq.Name, rq.Status.Due, rq.Status.DueAsOf.UTC().Format("2006-01-02T15:04:05Z"), inexactReason(rq)))
		}
	}
	if len(notComputed) > 0 {
		field := "status.dueAsOf"
		if metric == MetricDueForecast {
			field = "status.forecast for " + horizon
		}
		return nil, fmt.Errorf("%s: %w for RenderQueue %s: %s is unset (the operator has not yet polled its shards)",
			metric, ErrNotComputed, strings.Join(notComputed, ", "), field)
	}
	if len(inexact) > 0 && metric == MetricDueForecast {
		return nil, fmt.Errorf("%s: %w for RenderQueue %s; holding rather than scaling on a lower bound",
			metric, ErrInexact, strings.Join(inexact, "; "))
	}
	if len(inexact) > 0 {
		return nil, fmt.Errorf("%s: %w for RenderQueue %s; holding rather than scaling on a lower bound (%s is served regardless)",
			metric, ErrInexact, strings.Join(inexact, "; "), MetricDueLowerBound)
	}

	values := make([]external_metrics.ExternalMetricValue, 0, len(selected))
	for _, rq := range selected {
		v := external_metrics.ExternalMetricValue{
			MetricName:   metric,
			MetricLabels: SelectorLabels(rq),
			Timestamp:    *rq.Status.DueAsOf.DeepCopy(),
			Value:        *resource.NewQuantity(rq.Status.Due, resource.DecimalSI),
		}
		if metric == MetricDueForecast {
			v.MetricLabels[LabelHorizon] = horizon
			v.Timestamp = *rq.Status.Forecast.AsOf.DeepCopy()
			v.Value = *resource.NewQuantity(forecastFor(rq, horizon).Due, resource.DecimalSI)
		}
		values = append(values, v)
	}
	return values, nil
}

// inexactReason says why rq's due count is inexact, from its Exact condition and the shards that
// do not vouch for their counts.
func inexactReason(rq *rqv1.RenderQueue) string {
	var parts []string
	if c := meta.FindStatusCondition(rq.Status.Conditions, rqv1.ConditionExact); c != nil && c.Status != "True" {
		s := "condition Exact=" + string(c.Status)
		if c.Reason != "" {
			s += " reason " + c.Reason
		}
		if c.Message != "" {
			s += ": " + c.Message
		}
		parts = append(parts, s)
	}
	var shards []string
	for _, sh := range rq.Status.Shards {
		if sh.Exact {
			continue
		}
		s := sh.Name
		if sh.State != "" {
			s += " " + sh.State
		}
		if sh.Error != "" {
			s += ": " + sh.Error
		}
		shards = append(shards, s)
	}
	if len(shards) > 0 {
		parts = append(parts, "inexact shards: "+strings.Join(shards, ", "))
	}
	if len(parts) == 0 {
		return "status.dueExact is false"
	}
	return strings.Join(parts, "; ")
}
