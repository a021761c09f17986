package simulate

import (
	"math"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/objective"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

func testObjectives() []objective.Objective {
	return []objective.Objective{
		{Name: "hourly", Class: objective.Selector{MaxCadence: time.Hour}, Percentile: 99, MaxLateness: 10 * time.Minute},
		{Name: "daily", Class: objective.Selector{MinCadence: 24 * time.Hour, MaxCadence: 24 * time.Hour}, Percentile: 99, MaxLateness: 2 * time.Hour},
		{Name: "slow", Class: objective.Selector{MinCadence: 96 * time.Hour}, Percentile: 95, MaxLateness: 12 * time.Hour},
	}
}

// TestObjectiveTally checks the events an objective counts against the run's own figures: with
// room to spare every render of the class is a good event; with no room at all (a trickle of
// capacity) the rows left unrendered beyond MaxLateness are late events although nothing renders.
func TestObjectiveTally(t *testing.T) {
	base := Config{Fleet: testFleet(0), Keeper: DefaultKeeper(), Duration: 24 * time.Hour, MeasureFrom: 6 * time.Hour, Seed: 3, Objectives: testObjectives()}
	cfg := base
	cfg.Load = 0.5
	r := run(t, cfg)
	if !r.Met() {
		t.Fatalf("at 50%% load the objectives are not kept: %+v", r.Objectives)
	}
	hourly := 0
	for _, c := range r.Classes {
		if c.Cadence <= time.Hour {
			hourly += c.Renders
		}
	}
	if got := r.Objectives[0].Tally; got.Good != int64(hourly) || got.Late != 0 {
		t.Errorf("hourly at 50%% load: %+v, want every one of the %d renders of the class good", got, hourly)
	}

	cfg = base
	cfg.Capacity = 1 // a render an hour for 20,000 rows
	r = run(t, cfg)
	for _, o := range r.Objectives {
		if o.Met || o.Tally.Late == 0 {
			t.Errorf("%s at 1 render/h: %+v, want late events and the objective missed", o.Objective.Name, o.Tally)
		}
	}
	// the slow class's rows due between 6h − 12h and 24h − 12h and never rendered are late
	if got := r.Objectives[2].Tally.Late; got < 10 {
		t.Errorf("slow at 1 render/h: %d late events", got)
	}
}

// TestNeededWorkers checks the search against runs of the simulator made apart from it: the
// answer keeps every objective, one worker fewer does not.
func TestNeededWorkers(t *testing.T) {
	cfg := Config{Fleet: testFleet(0.3), Keeper: DefaultKeeper(), Duration: 48 * time.Hour, MeasureFrom: 24 * time.Hour, Seed: 5, Objectives: testObjectives()}
	renderTime := 30 * time.Second
	s, err := NeededWorkers(cfg, renderTime, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if s.Workers < 2 || s.Below == nil || !s.At.Met() || s.Below.Met() {
		t.Fatalf("search: %d workers, at: %+v, below: %v", s.Workers, s.At.Objectives, s.Below != nil)
	}
	for n, want := range map[int]bool{s.Workers: true, s.Workers - 1: false} {
		c := cfg
		c.Capacity = float64(n) * float64(time.Hour) / float64(renderTime)
		r := run(t, c)
		if r.Met() != want {
			t.Errorf("a run at %d workers keeps the objectives: %v, want %v (%+v)", n, r.Met(), want, r.Objectives)
		}
	}
	// the demand alone needs this many: the answer is at least that
	if floor := int(math.Ceil(cfg.Fleet.withDefaults().Demand() * renderTime.Hours())); s.Workers < floor {
		t.Errorf("%d workers needed, fewer than the %d the demand takes", s.Workers, floor)
	}
	t.Logf("%d workers needed (%d runs)", s.Workers, s.Runs)

	// an objective no count can keep: a render within a millisecond of due, with one-minute ticks
	cfg.Objectives = []objective.Objective{{Name: "instant", Percentile: 99.9, MaxLateness: time.Millisecond, Class: objective.Selector{Source: ptr(schedule.SourceSubmitted)}}}
	s, err = NeededWorkers(cfg, renderTime, 64)
	if err != nil {
		t.Fatal(err)
	}
	if s.Workers != 0 || s.At == nil || s.At.Met() {
		t.Errorf("an objective no count keeps: %d workers, %+v", s.Workers, s.At)
	}
	if _, err := NeededWorkers(Config{Fleet: testFleet(0), Duration: time.Hour}, renderTime, 10); err == nil {
		t.Error("a search without objectives must be refused")
	}
}

func ptr[T any](v T) *T { return &v }
