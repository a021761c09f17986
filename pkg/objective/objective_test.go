package objective

import (
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

func ptr[T any](v T) *T { return &v }

func TestSelectorMatches(t *testing.T) {
	for _, tc := range []struct {
		sel     Selector
		cadence time.Duration // the row's
		source  schedule.Source
		urgent  bool
		want    bool
	}{
		{Selector{}, 96 * time.Hour, schedule.SourceDiscovered, true, true},                                                 // the zero selector: every row
		{Selector{MinCadence: time.Hour, MaxCadence: time.Hour}, time.Hour, schedule.SourceDiscovered, false, true},         // bounds are inclusive
		{Selector{MinCadence: time.Hour, MaxCadence: time.Hour}, 90 * time.Minute, schedule.SourceDiscovered, false, false}, // above
		{Selector{MinCadence: 2 * time.Hour}, time.Hour, schedule.SourceDiscovered, false, false},                           // below, open above
		{Selector{MaxCadence: 24 * time.Hour}, time.Minute, schedule.SourceDiscovered, false, true},                         // open below
		{Selector{Source: ptr(schedule.SourceSubmitted)}, time.Hour, schedule.SourceDiscovered, false, false},               // another source
		{Selector{Source: ptr(schedule.SourceSubmitted)}, time.Hour, schedule.SourceSubmitted, false, true},
		{Selector{Urgent: ptr(true)}, time.Hour, schedule.SourceSubmitted, false, false}, // urgent only
		{Selector{Urgent: ptr(false)}, time.Hour, schedule.SourceSubmitted, false, true}, // ordinary only
	} {
		if got := tc.sel.Matches(tc.cadence, tc.source, tc.urgent); got != tc.want {
			t.Errorf("%s matches (%v, %v, urgent %v) = %v, want %v", tc.sel, tc.cadence, tc.source, tc.urgent, got, tc.want)
		}
	}
}

func TestArithmetic(t *testing.T) {
	o := Objective{Name: "hourly", Percentile: 99, MaxLateness: 10 * time.Minute}
	for _, tc := range []struct {
		tally     Tally
		met       bool
		burn      float64 // late share / 1%
		remaining float64
	}{
		{Tally{}, true, 0, 1},                    // nothing decided yet: kept, nothing spent
		{Tally{Good: 990, Late: 10}, true, 1, 0}, // exactly the budget: met, spent
		{Tally{Good: 989, Late: 11}, false, 1.1, -0.1},
		{Tally{Good: 1000}, true, 0, 1},
		{Tally{Late: 5}, false, 100, -99}, // workers at 0: every decided event late
	} {
		if got := o.Met(tc.tally); got != tc.met {
			t.Errorf("%+v: met %v, want %v", tc.tally, got, tc.met)
		}
		if got := o.BurnRate(tc.tally); !near(got, tc.burn) {
			t.Errorf("%+v: burn rate %v, want %v", tc.tally, got, tc.burn)
		}
		if got := o.BudgetRemaining(tc.tally); !near(got, tc.remaining) {
			t.Errorf("%+v: budget remaining %v, want %v", tc.tally, got, tc.remaining)
		}
	}
	if !o.Good(10*time.Minute) || o.Good(10*time.Minute+time.Millisecond) {
		t.Error("an event is good up to and including MaxLateness, late after it")
	}
	// 99.9%: a tenth of a percent of budget, compared in counts (no rounding away of the edge)
	o.Percentile = 99.9
	if !o.Met(Tally{Good: 999, Late: 1}) || o.Met(Tally{Good: 998, Late: 2}) {
		t.Error("99.9%: 999 of 1000 keeps it, 998 does not")
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func TestParse(t *testing.T) {
	objs, err := Parse([]byte(`
objectives:
  - name: hourly
    class: {minCadence: 1h, maxCadence: 1h, source: submitted}
    percentile: "99"
    maxLateness: 10m
  - name: daily-and-slower
    class: {minCadence: 24h, urgent: false}
    percentile: 99.5
    maxLateness: 2h
  - name: everything
    class: {}
    percentile: "90"
    maxLateness: 24h
`))
	if err != nil {
		t.Fatal(err)
	}
	got := make([]string, len(objs))
	for i, o := range objs {
		got[i] = o.String()
	}
	want := []string{
		"hourly: 99% of cadence 1h, submitted within 10m of due",
		"daily-and-slower: 99.5% of cadence ≥ 24h, not urgent within 2h of due",
		"everything: 90% of every row within 24h of due",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("parsed\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// a RenderQueue manifest: spec.objectives, the rest ignored
	objs, err = Parse([]byte(`apiVersion: renderqueue.dev/v1alpha1
kind: RenderQueue
metadata: {name: web}
spec:
  shards: 3
  objectives:
    - name: hourly
      class: {maxCadence: 1h}
      percentile: "99.9"
      maxLateness: 5m
      window: 672h
`))
	if err != nil || len(objs) != 1 || objs[0].Percentile != 99.9 || objs[0].Class.MaxCadence != time.Hour {
		t.Errorf("from a manifest: %+v, %v", objs, err)
	}
}

func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want string // in the error
	}{
		{``, "empty"},
		{`objectives: []`, "no objectives"},
		{`kind: RenderQueue`, "no objectives"},
		{"objectives:\n- {name: a, percentile: 99, maxLateness: 1m, cadence: 1h}", `unknown field "cadence"`},
		{"objectives:\n- {name: a, percentile: 100, maxLateness: 1m}", "within (0, 100)"},
		{"objectives:\n- {name: a, percentile: 0, maxLateness: 1m}", "within (0, 100)"},
		{"objectives:\n- {name: a, percentile: ninety, maxLateness: 1m}", "not a number"},
		{"objectives:\n- {name: a, maxLateness: 1m}", "percentile is required"},
		{"objectives:\n- {name: a, percentile: 99}", "maxLateness is required"},
		{"objectives:\n- {name: a, percentile: 99, maxLateness: -1m}", "positive duration"},
		{"objectives:\n- {name: a, percentile: 99, maxLateness: soon}", "maxLateness: time: invalid duration"},
		{"objectives:\n- {name: Hourly, percentile: 99, maxLateness: 1m}", `name "Hourly"`},
		{"objectives:\n- {name: a, percentile: 99, maxLateness: 1m, class: {minCadence: 2h, maxCadence: 1h}}", "above maxCadence"},
		{"objectives:\n- {name: a, percentile: 99, maxLateness: 1m, class: {source: sitemap}}", "class.source"},
		{"objectives:\n- {name: a, percentile: 99, maxLateness: 1m}\n- {name: a, percentile: 90, maxLateness: 1h}", "named twice"},
		{"objectives:\n- {name: a, percentile: 99, maxLateness: 1m}\nspec:\n  objectives:\n  - {name: b, percentile: 99, maxLateness: 1m}", "both"},
	} {
		_, err := Parse([]byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an error with %q", tc.doc, err, tc.want)
		}
	}
}

func TestShort(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Hour: "1h", 90 * time.Minute: "1h30m", 10 * time.Minute: "10m", 90 * time.Second: "1m30s",
		45 * time.Second: "45s", 96 * time.Hour: "96h", 1500 * time.Millisecond: "1.5s",
	} {
		if got := Short(d); got != want {
			t.Errorf("Short(%v) = %q, want %q", d, got, want)
		}
	}
}
