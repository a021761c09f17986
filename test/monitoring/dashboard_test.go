package monitoring

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID      int     `json:"id"`
	Type    string  `json:"type"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"` // a collapsed row's panels
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

var (
	// Grafana's interval variables stand where PromQL wants a duration.
	intervalVarRE = regexp.MustCompile(`\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}`)
	// Every other variable stands in a label matcher's value.
	varRE         = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*(:[a-z]+)?\}?`)
	labelValuesRE = regexp.MustCompile(`^label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\)$`)
)

// expand replaces the dashboard's variables by values PromQL accepts, as Grafana does before it
// sends a query.
func expand(expr string) string {
	expr = intervalVarRE.ReplaceAllString(expr, "5m")
	return varRE.ReplaceAllString(expr, "x")
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, "config", "grafana", "renderqueue.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("renderqueue.json: %v", err)
	}
	return d
}

// TestDashboard parses every PromQL expression of the Grafana dashboard (panels and template
// variables) with Prometheus's parser and checks that every metric it names is one the keeper or
// the operator exports.
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Fatalf("dashboard without uid or title")
	}
	names := exportedMetrics(t)
	used := map[string]bool{}
	check := func(where, expr string) {
		t.Helper()
		ms, err := metricNames(t, expand(expr))
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", where, expr, err)
			return
		}
		if len(ms) == 0 {
			t.Errorf("%s: %q selects no metric", where, expr)
		}
		for _, m := range ms {
			used[m] = true
			if _, ok := names[m]; !ok {
				t.Errorf("%s: %q reads %s, which neither the keeper nor the operator exports", where, expr, m)
			}
		}
	}

	var walk func(ps []panel)
	ids := map[int]bool{}
	queries := 0
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				queries++
				check("panel "+p.Title, tg.Expr)
			}
		}
	}
	walk(d.Panels)
	if queries < 20 {
		t.Errorf("only %d queries", queries)
	}

	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				t.Errorf("variable %s: query %s", v.Name, v.Query)
				continue
			}
		}
		m := labelValuesRE.FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(<selector>, <label>)", v.Name, q.Query)
			continue
		}
		check("variable "+v.Name, m[1])
	}

	// What issue 12 asks the dashboard to show, each from its own metric.
	for _, want := range []string{
		"renderqueue_queue_due", "renderqueue_queue_due_exact", // due and exactness per queue
		"renderqueue_keeper_claimed_lateness_ratio_bucket", "renderqueue_keeper_lateness_p99_ratio", // lateness by class
		"renderqueue_keeper_coming_due",                  // coming due by hour
		"renderqueue_queue_shard_edge_timestamp_seconds", // edge ahead per shard
		"renderqueue_keeper_walks_total",                 // walks
		"renderqueue_keeper_claimed_rows_total",          // claim rate
		"renderqueue_keeper_completed_rows_total",        // completion rate
		"renderqueue_queue_handoffs_rolled_back_total",   // handoffs
		"renderqueue_metrics_api_request_errors_total",
		"renderqueue_worker_claims_total", "renderqueue_worker_completions_total", // the render workers
		"renderqueue_worker_render_seconds_bucket",
	} {
		if !used[want] {
			t.Errorf("the dashboard does not show %s", want)
		}
	}
}

// The test must be able to fail: an expression naming a metric nobody exports, or one that does
// not parse, is caught.
func TestDashboardCheckCatches(t *testing.T) {
	names := exportedMetrics(t)
	ms, err := metricNames(t, expand(`sum(rate(renderqueue_walks_total{namespace=~"$namespace"}[$__rate_interval]))`))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := names[ms[0]]; ok || ms[0] != "renderqueue_walks_total" {
		t.Errorf("the old walk counter %v counts as exported", ms)
	}
	if _, err := metricNames(t, expand(`sum(rate(renderqueue_keeper_walks_total[$__rate_interval])`)); err == nil {
		t.Error("an unbalanced expression parsed")
	}
}
