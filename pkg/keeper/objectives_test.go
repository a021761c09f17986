package keeper

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/keeper/shardmetrics"
)

// TestObjectiveEvents: a shard with a freshness objective counts, on real PostgreSQL, a render
// that started in time and completed as good, a row left unrendered past maxLateness as late
// (with no completion at all: a fleet with no workers burns its budget), and a render claimed too
// late as late once; the status and the keeper's metrics carry the counts and the target.
func TestObjectiveEvents(t *testing.T) {
	s := allSlots(24 * time.Hour)
	s.Objectives = []ObjectiveSetting{{Objective: policy.Objective{Name: "hourly", MaxCadence: time.Hour, MaxLateness: 10 * time.Minute}, Percentile: 99}}
	e := newShardEnv(t, s)
	e.upsert(
		srow("https://example.com/first", t0.Add(-2*time.Minute), time.Hour), // the most overdue: claimed first
		srow("https://example.com/forgotten", t0.Add(-time.Minute), time.Hour),
		srow("https://example.com/daily", t0.Add(-time.Hour), 24*time.Hour), // another class: not counted
	)
	if rep := e.sh.Walk(e.ctx, true); rep.Failed || rep.Partial {
		t.Fatalf("load %+v", rep)
	}
	// the first row is claimed and completed within 10 minutes of due: good
	e.clock.Set(t0.Add(2 * time.Minute))
	claimed, err := e.sh.Claim(e.clock.Now(), 1, time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	if claimed[0].Key != "https://example.com/first" {
		t.Fatalf("claimed %s first", claimed[0].Key)
	}
	first := claimed[0].Key
	if errs, err := e.sh.Complete(e.ctx, []CompleteItem{{Key: first, Lease: claimed[0].Lease}}); err != nil || errs[0] != nil {
		t.Fatalf("complete: %v %v", errs, err)
	}
	if got := e.status().Objectives; len(got) != 1 || got[0].Good != 1 || got[0].Late != 0 || got[0].Percentile != 99 {
		t.Fatalf("after a render in time: %+v", got)
	}
	// nobody renders the other: 10 minutes after its due time it is late, with no completion
	e.clock.Set(t0.Add(9*time.Minute - time.Millisecond)) // it came due at t0 − 1m
	if got := e.status().Objectives[0]; got.Late != 0 {
		t.Fatalf("late before maxLateness passed: %+v", got)
	}
	e.clock.Set(t0.Add(9 * time.Minute))
	if got := e.status().Objectives[0]; got.Good != 1 || got.Late != 1 {
		t.Fatalf("after maxLateness passed unrendered: %+v", got)
	}
	// rendered now, too late: decided already, not counted again
	claimed, err = e.sh.Claim(e.clock.Now(), 2, time.Minute)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	var items []CompleteItem
	for _, c := range claimed {
		items = append(items, CompleteItem{Key: c.Key, Lease: c.Lease})
	}
	if _, err := e.sh.Complete(e.ctx, items); err != nil {
		t.Fatal(err)
	}
	got := e.status().Objectives[0]
	if got.Good != 1 || got.Late != 1 || got.Name != "hourly" || !got.Since.Equal(t0) {
		t.Fatalf("after the late render: %+v", got)
	}

	// the keeper's metrics
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(shardmetrics.NewStatusCollector(e.status))
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP renderqueue_keeper_objective_events_total Freshness events of spec.objectives decided by this keeper process: result=good (a render that started within maxLateness of due completed) or late (none had, when maxLateness passed). docs/objectives.md.
# TYPE renderqueue_keeper_objective_events_total counter
renderqueue_keeper_objective_events_total{objective="hourly",result="good"} 1
renderqueue_keeper_objective_events_total{objective="hourly",result="late"} 1
# HELP renderqueue_keeper_objective_target_ratio The share of an objective's events that must be good: its percentile / 100.
# TYPE renderqueue_keeper_objective_target_ratio gauge
renderqueue_keeper_objective_target_ratio{objective="hourly"} 0.99
`), "renderqueue_keeper_objective_events_total", "renderqueue_keeper_objective_target_ratio"); err != nil {
		t.Fatal(err)
	}

	// the same objective in new settings keeps its counts; a changed one starts again
	s2 := s
	if err := e.sh.UpdateSettings(e.ctx, s2); err != nil {
		t.Fatal(err)
	}
	if got := e.status().Objectives[0]; got.Good != 1 || got.Late != 1 {
		t.Fatalf("unchanged objective after new settings: %+v", got)
	}
	s2.Objectives = []ObjectiveSetting{{Objective: policy.Objective{Name: "hourly", MaxCadence: time.Hour, MaxLateness: 20 * time.Minute}, Percentile: 99}}
	if err := e.sh.UpdateSettings(e.ctx, s2); err != nil {
		t.Fatal(err)
	}
	if got := e.status().Objectives[0]; got.Good != 0 || got.Late != 0 || !got.Since.Equal(e.clock.Now()) {
		t.Fatalf("a changed objective: %+v", got)
	}
	// overlapping objectives are refused, and change nothing
	s3 := s2
	s3.Objectives = append(s3.Objectives, ObjectiveSetting{Objective: policy.Objective{Name: "all", MaxLateness: time.Hour}, Percentile: 90})
	if err := e.sh.UpdateSettings(e.ctx, s3); err == nil || !strings.Contains(err.Error(), "select some rows in common") {
		t.Fatalf("overlapping objectives: %v", err)
	}
	if got := e.status().Objectives; len(got) != 1 {
		t.Fatalf("objectives after a refused update: %+v", got)
	}
}
