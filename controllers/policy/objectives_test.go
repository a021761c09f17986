package policy

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// counted is a shard report carrying objective counters.
func counted(shard string, since time.Time, name string, good, late uint64) ShardReport {
	return ShardReport{Name: shard, Status: &shardapi.Status{Objectives: []shardapi.ObjectiveCount{{Name: name, Percentile: 99, Good: good, Late: late, Since: since}}}}
}

// TestObjectiveHistory follows a history through polls: differences of the shards' cumulative
// counters, a keeper that restarts, an operator that restarts (the history read back from its
// JSON), a definition that changes, the window and the burn rates.
func TestObjectiveHistory(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	objs := []rqv1.Objective{{Name: "hourly", Percentile: "99", MaxLateness: metav1.Duration{Duration: 10 * time.Minute},
		Window: &metav1.Duration{Duration: 24 * time.Hour}}}
	k0, k1 := t0.Add(-time.Hour), t0.Add(-30*time.Minute) // when the two keepers began counting
	h := &ObjectiveHistory{}

	// first poll: the record begins now; what the keepers counted before it is not taken
	if changed, structural := h.Observe(t0, objs, []ShardReport{counted("web-shard-0", k0, "hourly", 500, 5), counted("web-shard-1", k1, "hourly", 100, 0)}); !changed || !structural {
		t.Fatal("the first poll is not a structural change")
	}
	st := h.ObjectiveStatuses(t0, objs)
	if st[0].Good != 0 || st[0].Late != 0 || !st[0].Met || st[0].Attainment != "" || !st[0].Since.Time.Equal(t0) {
		t.Fatalf("first poll: %+v", st[0])
	}
	if c := ObjectivesCondition(objs, st); c.Status != metav1.ConditionUnknown || c.Reason != rqv1.ReasonNoObjectiveEvents {
		t.Errorf("condition with no events: %+v", c)
	}

	// differences: 990 good and 10 late more
	t1 := t0.Add(10 * time.Minute)
	if changed, structural := h.Observe(t1, objs, []ShardReport{counted("web-shard-0", k0, "hourly", 1400, 14), counted("web-shard-1", k1, "hourly", 190, 1)}); !changed || structural {
		t.Fatal("counts that grew are a change, not a structural one")
	}
	st = h.ObjectiveStatuses(t1, objs)
	if st[0].Good != 990 || st[0].Late != 10 || st[0].Attainment != "99%" || st[0].BudgetRemaining != "0%" || !st[0].Met ||
		st[0].BurnRate1h != "1" || st[0].BurnRate6h != "1" {
		t.Fatalf("after 1,000 events: %+v", st[0])
	}

	// the operator restarts: the history comes back from its JSON, and the next differences
	// continue from the counters stored with it
	data, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	h = &ObjectiveHistory{}
	if err := json.Unmarshal(data, h); err != nil {
		t.Fatal(err)
	}
	// web-shard-1's keeper restarted meanwhile (a later since): its new counters are new events
	t2 := t1.Add(10 * time.Minute)
	k1b := t2.Add(-2 * time.Minute)
	if _, structural := h.Observe(t2, objs, []ShardReport{counted("web-shard-0", k0, "hourly", 1400, 30), counted("web-shard-1", k1b, "hourly", 0, 4)}); !structural {
		t.Fatal("a keeper that started counting again is a structural change")
	}
	st = h.ObjectiveStatuses(t2, objs)
	if st[0].Good != 990 || st[0].Late != 30 || st[0].Met || st[0].Attainment != "97.06%" || st[0].BudgetRemaining != "-194.12%" {
		t.Fatalf("after the restarts: %+v", st[0])
	}
	c := ObjectivesCondition(objs, st)
	if c.Status != metav1.ConditionFalse || c.Reason != rqv1.ReasonObjectiveMissed ||
		!strings.Contains(c.Message, "hourly: 97.06% of 1,020 events good over 24h0m0s, below 99%") {
		t.Errorf("condition: %+v", c)
	}

	// a day and an hour later the window has moved past those events; the burn rates see none
	t3 := t2.Add(25 * time.Hour)
	h.Observe(t3, objs, []ShardReport{counted("web-shard-0", k0, "hourly", 1500, 30)})
	st = h.ObjectiveStatuses(t3, objs)
	if st[0].Good != 100 || st[0].Late != 0 || !st[0].Met || st[0].BurnRate1h != "0" || len(h.Objectives["hourly"].Hours) != 1 ||
		len(h.Objectives["hourly"].Steps) != 1 {
		t.Fatalf("a day later: %+v, history %+v", st[0], h.Objectives["hourly"])
	}
	if c := ObjectivesCondition(objs, st); c.Status != metav1.ConditionTrue || c.Reason != rqv1.ReasonObjectivesMet {
		t.Errorf("condition: %+v", c)
	}

	// web-shard-1, not polled at all a day later (the RenderQueue no longer has it), left no
	// counters behind
	if _, ok := h.Shards["web-shard-1/hourly"]; ok || len(h.Shards) != 1 {
		t.Fatalf("counters after web-shard-1 went: %+v", h.Shards)
	}

	// a changed definition starts the record again, and an objective removed from the spec goes
	objs[0].MaxLateness = metav1.Duration{Duration: 20 * time.Minute}
	h.Observe(t3.Add(time.Minute), objs, nil)
	if r := h.Objectives["hourly"]; len(r.Hours) != 0 || !r.Since.Equal(t3.Add(time.Minute)) || len(h.Shards) != 0 {
		t.Fatalf("after a changed definition: %+v, shards %+v", r, h.Shards)
	}
	h.Observe(t3.Add(2*time.Minute), nil, nil)
	if len(h.Objectives) != 0 {
		t.Fatalf("after the objective went: %+v", h.Objectives)
	}
}
