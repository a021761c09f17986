package policy

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// forecastReport is a shard's valid report whose edge lies ahead of its asOf by edgeAhead (nil
// edge when edgeAhead is 0: a window of 0), with coming counts c.
func forecastReport(name string, now time.Time, edgeAhead time.Duration, c shardapi.Coming) ShardReport {
	st := &shardapi.Status{AsOf: now, Exact: true, Coming: c}
	if edgeAhead != 0 {
		st.Edge = new(now.Add(edgeAhead))
	}
	return ShardReport{Name: name, Status: st, Asked: true}
}

func TestForecast(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	day := 25 * time.Hour // a window longer than the 24 h horizon
	two := []ShardReport{
		forecastReport("web-shard-0", now, day, shardapi.Coming{Next15m: 5, Next60m: 20, Next24h: 300}),
		forecastReport("web-shard-1", now, day, shardapi.Coming{Next15m: 1, Next60m: 2, Next24h: 3}),
	}
	for _, tc := range []struct {
		name string
		in   ForecastInputs
		want []rqv1.ForecastHorizon // Reason compared by a fragment
	}{{
		name: "exact: Due plus every shard's coming rows",
		in:   ForecastInputs{Now: now, Due: 100, DueExact: true, Reports: two},
		want: []rqv1.ForecastHorizon{{Horizon: "15m", Due: 106, Exact: true}, {Horizon: "1h", Due: 122, Exact: true}, {Horizon: "24h", Due: 403, Exact: true}},
	}, {
		name: "a window of 0 (no edge) holds every row",
		in: ForecastInputs{Now: now, Due: 7, DueExact: true, Reports: []ShardReport{
			forecastReport("web-shard-0", now, 0, shardapi.Coming{Next15m: 1, Next60m: 2, Next24h: 3})}},
		want: []rqv1.ForecastHorizon{{Horizon: "15m", Due: 8, Exact: true}, {Horizon: "1h", Due: 9, Exact: true}, {Horizon: "24h", Due: 10, Exact: true}},
	}, {
		name: "an edge 2 hours ahead: the day is a lower bound, the hour is exact",
		in: ForecastInputs{Now: now, Due: 0, DueExact: true, Reports: []ShardReport{
			two[0], forecastReport("web-shard-1", now, 2*time.Hour, shardapi.Coming{Next15m: 1, Next60m: 2, Next24h: 3})}},
		want: []rqv1.ForecastHorizon{{Horizon: "15m", Due: 6, Exact: true}, {Horizon: "1h", Due: 22, Exact: true},
			{Horizon: "24h", Due: 303, Reason: "web-shard-1 do not hold all their rows due within 24h"}},
	}, {
		name: "an inexact due count makes every horizon inexact",
		in:   ForecastInputs{Now: now, Due: 100, Reports: two},
		want: []rqv1.ForecastHorizon{{Horizon: "15m", Due: 106, Reason: "due count is not exact"}, {Horizon: "1h", Due: 122, Reason: "due count is not exact"},
			{Horizon: "24h", Due: 403, Reason: "due count is not exact"}},
	}, {
		name: "a handoff in progress: a moving slot's coming rows may be counted twice or not at all",
		in:   ForecastInputs{Now: now, Due: 100, DueExact: true, Handoff: true, Reports: two},
		want: []rqv1.ForecastHorizon{{Horizon: "15m", Due: 106, Reason: "handoff is in progress"}, {Horizon: "1h", Due: 122, Reason: "handoff is in progress"},
			{Horizon: "24h", Due: 403, Reason: "handoff is in progress"}},
	}, {
		name: "a shard that has not adopted the commit",
		in:   ForecastInputs{Now: now, Due: 100, DueExact: true, NotAdopted: []string{"web-shard-1"}, Reports: two},
		want: []rqv1.ForecastHorizon{{Horizon: "15m", Due: 106, Reason: "web-shard-1 do not serve the committed assignment"},
			{Horizon: "1h", Due: 122, Reason: "web-shard-1 do not serve"}, {Horizon: "24h", Due: 403, Reason: "web-shard-1 do not serve"}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := Forecast(nil, tc.in)
			if !got.AsOf.Time.Equal(now) || len(got.Horizons) != len(tc.want) {
				t.Fatalf("got %+v", got)
			}
			for i, w := range tc.want {
				g := got.Horizons[i]
				if g.Horizon != w.Horizon || g.Due != w.Due || g.Exact != w.Exact || (w.Reason == "") != (g.Reason == "") || !strings.Contains(g.Reason, w.Reason) {
					t.Errorf("horizon %d: %+v, want %+v", i, g, w)
				}
			}
		})
	}
}

// TestForecastRefresh: a still queue (the due count unchanged) rewrites its forecast at most every
// ForecastRefresh; a change of the due count or of exactness refreshes it at once.
func TestForecastRefresh(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	reports := func(now time.Time, next15m int) []ShardReport {
		return []ShardReport{forecastReport("web-shard-0", now, 25*time.Hour, shardapi.Coming{Next15m: next15m, Next60m: 50, Next24h: 500})}
	}
	prev := Forecast(nil, ForecastInputs{Now: t0, Due: 10, DueExact: true, Reports: reports(t0, 5)})
	for _, tc := range []struct {
		name string
		at   time.Duration // after t0
		in   ForecastInputs
		more int  // rows coming due within 15 minutes beyond prev's 5
		kept bool // prev returned, the status not rewritten
	}{
		{"the same figures: kept, whatever its age", 10 * time.Minute, ForecastInputs{Due: 10, DueExact: true}, 0, true},
		{"a row more within 15m, the due count unchanged, prev 30s old: kept", 30 * time.Second, ForecastInputs{Due: 10, DueExact: true}, 1, true},
		{"the same, prev a minute old: refreshed", time.Minute, ForecastInputs{Due: 10, DueExact: true}, 1, false},
		{"the due count changed: refreshed at once", 10 * time.Second, ForecastInputs{Due: 11, DueExact: true, DueChanged: true}, 1, false},
		{"exactness changed: refreshed at once", 10 * time.Second, ForecastInputs{Due: 10, DueExact: true, Handoff: true}, 0, false},
	} {
		in := tc.in
		in.Now = t0.Add(tc.at)
		in.Reports = reports(in.Now, 5+tc.more)
		got := Forecast(prev, in)
		if (got == prev) != tc.kept {
			t.Errorf("%s: kept %v, want %v (%+v)", tc.name, got == prev, tc.kept, got)
		}
		if !tc.kept && !got.AsOf.Time.Equal(in.Now) {
			t.Errorf("%s: refreshed as of %v, want %v", tc.name, got.AsOf, in.Now)
		}
	}
	// an old status without horizons of these names is replaced
	if got := Forecast(&rqv1.ForecastStatus{AsOf: metav1.NewTime(t0)}, ForecastInputs{Now: t0, DueExact: true, Reports: reports(t0, 1)}); len(got.Horizons) != 3 {
		t.Errorf("replacing an empty forecast: %+v", got)
	}
}
