package metricsapi

import (
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

var asOf = time.Date(2026, 5, 4, 10, 30, 0, 0, time.UTC)

type rqOpt func(*rqv1.RenderQueue)

func withLabels(kv ...string) rqOpt {
	return func(rq *rqv1.RenderQueue) {
		rq.Labels = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			rq.Labels[kv[i]] = kv[i+1]
		}
	}
}

func inexact(rq *rqv1.RenderQueue) {
	rq.Status.DueExact = false
	rq.Status.Conditions = []metav1.Condition{{
		Type: rqv1.ConditionExact, Status: metav1.ConditionFalse,
		Reason: rqv1.ReasonShardUnreachable, Message: "shard web-shard-1 unreachable",
	}}
	rq.Status.Shards = []rqv1.ShardStatus{
		{Name: rq.Name + "-shard-0", Exact: true, Due: 1},
		{Name: rq.Name + "-shard-1", State: "Unreachable", Error: "connection refused"},
	}
}

func neverComputed(rq *rqv1.RenderQueue) { rq.Status.DueAsOf = nil; rq.Status.DueExact = false }

func at(t time.Time) rqOpt {
	return func(rq *rqv1.RenderQueue) { rq.Status.DueAsOf = &metav1.Time{Time: t} }
}

func rq(name string, due int64, opts ...rqOpt) rqv1.RenderQueue {
	r := rqv1.RenderQueue{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"},
		Status:     rqv1.RenderQueueStatus{Due: due, DueExact: true, DueAsOf: &metav1.Time{Time: asOf}},
	}
	for _, o := range opts {
		o(&r)
	}
	return r
}

func sel(t *testing.T, s string) labels.Selector {
	t.Helper()
	ls, err := labels.Parse(s)
	if err != nil {
		t.Fatalf("parse selector %q: %v", s, err)
	}
	return ls
}

// value is what a test expects of one ExternalMetricValue.
type value struct {
	name string
	due  int64
	at   time.Time
}

func TestValues(t *testing.T) {
	later := asOf.Add(7 * time.Second)
	fleet := []rqv1.RenderQueue{
		rq("web", 120, withLabels("team", "a", "tier", "front")),
		rq("batch", 4000, withLabels("team", "a"), at(later)),
		rq("mail", 7, withLabels("team", "b"), inexact),
		rq("fresh", 0, withLabels("team", "c"), neverComputed),
		rq("liar", 3, withLabels(LabelName, "someone-else")),
	}
	tests := []struct {
		name     string
		rqs      []rqv1.RenderQueue
		metric   string
		selector string
		want     []value
		wantErr  error
		errHas   []string // substrings the error message must contain
	}{
		{name: "exact, by name", rqs: fleet, metric: MetricDue, selector: LabelName + "=web",
			want: []value{{"web", 120, asOf}}},
		{name: "exact, own labels, sorted by name, own timestamps", rqs: fleet, metric: MetricDue, selector: "team=a",
			want: []value{{"batch", 4000, later}, {"web", 120, asOf}}},
		{name: "set-based selector", rqs: fleet, metric: MetricDue, selector: LabelName + " in (web,batch),tier",
			want: []value{{"web", 120, asOf}}},
		{name: "nil selector matches everything (lower bound)", rqs: fleet[:3], metric: MetricDueLowerBound,
			want: []value{{"batch", 4000, later}, {"mail", 7, asOf}, {"web", 120, asOf}}},
		{name: "empty selector matches everything", rqs: fleet[:2], metric: MetricDue, selector: "",
			want: []value{{"batch", 4000, later}, {"web", 120, asOf}}},
		{name: "synthetic name label wins over an own label of the same key", rqs: fleet, metric: MetricDue,
			selector: LabelName + "=liar", want: []value{{"liar", 3, asOf}}},
		{name: "own label of the synthetic key does not select", rqs: fleet, metric: MetricDue,
			selector: LabelName + "=someone-else", wantErr: ErrNoneSelected},
		{name: "inexact is an error naming the queue and why", rqs: fleet, metric: MetricDue, selector: LabelName + "=mail",
			wantErr: ErrInexact, errHas: []string{`"mail"`, "due 7 is a lower bound", "2026-05-04T10:30:00Z",
				"ShardUnreachable", "shard web-shard-1 unreachable", "mail-shard-1 Unreachable: connection refused",
				MetricDueLowerBound}},
		{name: "one inexact among many fails the whole request", rqs: fleet, metric: MetricDue, selector: "team in (a,b)",
			wantErr: ErrInexact, errHas: []string{`"mail"`}},
		{name: "inexact without condition or shard detail", rqs: []rqv1.RenderQueue{rq("x", 1, func(r *rqv1.RenderQueue) { r.Status.DueExact = false })},
			metric: MetricDue, wantErr: ErrInexact, errHas: []string{"status.dueExact is false"}},
		{name: "lower bound is served while inexact", rqs: fleet, metric: MetricDueLowerBound, selector: "team=b",
			want: []value{{"mail", 7, asOf}}},
		{name: "lower bound equals due when exact", rqs: fleet, metric: MetricDueLowerBound, selector: LabelName + "=batch",
			want: []value{{"batch", 4000, later}}},
		{name: "no match is an error, not 0", rqs: fleet, metric: MetricDue, selector: LabelName + "=nope",
			wantErr: ErrNoneSelected, errHas: []string{LabelName + "=nope", LabelName + "=<name>"}},
		{name: "no RenderQueues at all", rqs: nil, metric: MetricDueLowerBound,
			wantErr: ErrNoneSelected},
		{name: "missing timestamp fails renderqueue_due", rqs: fleet, metric: MetricDue, selector: "team=c",
			wantErr: ErrNotComputed, errHas: []string{`"fresh"`, "dueAsOf"}},
		{name: "missing timestamp fails the lower bound too", rqs: fleet, metric: MetricDueLowerBound, selector: "team=c",
			wantErr: ErrNotComputed, errHas: []string{`"fresh"`}},
		{name: "missing timestamp with due exact claimed still fails", rqs: []rqv1.RenderQueue{rq("odd", 5, func(r *rqv1.RenderQueue) { r.Status.DueAsOf = nil })},
			metric: MetricDue, wantErr: ErrNotComputed},
		{name: "unknown metric", rqs: fleet, metric: "renderqueue_rows", wantErr: ErrUnknownMetric,
			errHas: []string{"renderqueue_rows", MetricDue, MetricDueLowerBound}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var s labels.Selector
			if tc.selector != "" || tc.name == "empty selector matches everything" {
				s = sel(t, tc.selector)
			}
			got, err := Values(tc.rqs, tc.metric, s)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				for _, sub := range tc.errHas {
					if !strings.Contains(err.Error(), sub) {
						t.Errorf("error %q does not contain %q", err, sub)
					}
				}
				if got != nil {
					t.Errorf("values %v returned with an error", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d values %v, want %d", len(got), got, len(tc.want))
			}
			for i, w := range tc.want {
				g := got[i]
				if g.MetricName != tc.metric {
					t.Errorf("[%d] metricName %q, want %q", i, g.MetricName, tc.metric)
				}
				if g.MetricLabels[LabelName] != w.name {
					t.Errorf("[%d] %s=%q, want %q", i, LabelName, g.MetricLabels[LabelName], w.name)
				}
				if g.Value.Value() != w.due {
					t.Errorf("[%d] value %s, want %d", i, g.Value.String(), w.due)
				}
				if !g.Timestamp.Time.Equal(w.at) {
					t.Errorf("[%d] timestamp %s, want %s", i, g.Timestamp.Time, w.at)
				}
				if g.WindowSeconds != nil {
					t.Errorf("[%d] windowSeconds %d, want unset (a point value)", i, *g.WindowSeconds)
				}
			}
		})
	}
}

func TestValuesDoesNotAliasInput(t *testing.T) {
	in := []rqv1.RenderQueue{rq("web", 1, withLabels("team", "a"))}
	got, err := Values(in, MetricDue, nil)
	if err != nil {
		t.Fatal(err)
	}
	got[0].MetricLabels["team"] = "changed"
	got[0].Timestamp.Time = time.Time{}
	if in[0].Labels["team"] != "a" || !in[0].Status.DueAsOf.Time.Equal(asOf) {
		t.Fatalf("Values aliased its input: labels %v, dueAsOf %v", in[0].Labels, in[0].Status.DueAsOf)
	}
}

func TestSelectorLabels(t *testing.T) {
	r := rq("web", 0, withLabels("team", "a", LabelName, "other"))
	got := SelectorLabels(&r)
	if len(got) != 2 || got["team"] != "a" || got[LabelName] != "web" {
		t.Fatalf("SelectorLabels = %v", got)
	}
	if r.Labels[LabelName] != "other" {
		t.Fatalf("SelectorLabels modified the RenderQueue's labels: %v", r.Labels)
	}
}

// withForecast sets status.forecast as of t: 15m and 1h exact with the given figures, 24h a
// lower bound.
func withForecast(t time.Time, in15m, in1h int64) rqOpt {
	return func(rq *rqv1.RenderQueue) {
		rq.Status.Forecast = &rqv1.ForecastStatus{AsOf: metav1.NewTime(t), Horizons: []rqv1.ForecastHorizon{
			{Horizon: "15m", Due: in15m, Exact: true}, {Horizon: "1h", Due: in1h, Exact: true},
			{Horizon: "24h", Due: in1h * 10, Reason: "shard(s) web-shard-1 do not hold all their rows due within 24h"},
		}}
	}
}

func TestForecastValues(t *testing.T) {
	later := asOf.Add(40 * time.Second)
	fleet := []rqv1.RenderQueue{
		rq("web", 120, withLabels("team", "a"), withForecast(later, 150, 400)),
		rq("batch", 10, withLabels("team", "a"), withForecast(asOf, 12, 30)),
		rq("fresh", 0, withLabels("team", "c")), // polled before forecasts existed
	}
	for _, tc := range []struct {
		name     string
		selector string
		want     []value
		wantErr  error
		errHas   []string
	}{
		{name: "15m: each queue's figure, with the forecast's timestamp", selector: "team=a,horizon=15m",
			want: []value{{"batch", 12, asOf}, {"web", 150, later}}},
		{name: "1h, set-based", selector: "horizon in (1h)," + LabelName + "=web", want: []value{{"web", 400, later}}},
		{name: "a lower bound fails with its reason", selector: "team=a,horizon=24h", wantErr: ErrInexact,
			errHas: []string{`"web"`, "due within 24h 4000 is a lower bound", "web-shard-1 do not hold"}},
		{name: "no horizon", selector: "team=a", wantErr: ErrBadHorizon, errHas: []string{"names no horizon", "15m, 1h, 24h"}},
		{name: "a horizon not served", selector: "horizon=2h", wantErr: ErrBadHorizon, errHas: []string{"horizon=2h"}},
		{name: "two horizons", selector: "horizon in (15m,1h)", wantErr: ErrBadHorizon},
		{name: "a queue without a forecast yet", selector: "team=c,horizon=15m", wantErr: ErrNotComputed,
			errHas: []string{`"fresh"`, "status.forecast for 15m"}},
		{name: "the horizon selects no queue", selector: "team=z,horizon=15m", wantErr: ErrNoneSelected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Values(fleet, MetricDueForecast, sel(t, tc.selector))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || got != nil {
					t.Fatalf("values %v, err %v; want error %v", got, err, tc.wantErr)
				}
				for _, sub := range tc.errHas {
					if !strings.Contains(err.Error(), sub) {
						t.Errorf("error %q does not contain %q", err, sub)
					}
				}
				return
			}
			if err != nil || len(got) != len(tc.want) {
				t.Fatalf("values %v, err %v; want %d values", got, err, len(tc.want))
			}
			for i, w := range tc.want {
				g := got[i]
				if g.MetricName != MetricDueForecast || g.MetricLabels[LabelName] != w.name || g.Value.Value() != w.due ||
					!g.Timestamp.Time.Equal(w.at) || g.MetricLabels[LabelHorizon] == "" {
					t.Errorf("[%d] %+v, want %+v", i, g, w)
				}
			}
		})
	}
}
