package policy

import (
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/membership"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

func TestClassesServedCondition(t *testing.T) {
	asOf := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	since := func(ago time.Duration) *time.Time { at := asOf.Add(-ago); return &at }
	class := func(cadence time.Duration, source string, waiting *time.Time) shardapi.Class {
		return shardapi.Class{Cadence: cadence.Seconds(), Source: source, Due: 1, WaitingSince: waiting}
	}
	report := func(name string, classes ...shardapi.Class) ShardReport {
		return ShardReport{Name: name, Asked: true, Status: &shardapi.Status{Shard: name, AsOf: asOf, Classes: classes}}
	}
	unreachable := ShardReport{Name: "web-shard-2", Asked: true, Err: errors.New("connection refused")}
	served := report("web-shard-0", class(time.Hour, "discovered", since(59*time.Minute)), class(96*time.Hour, "submitted", nil))
	for _, tc := range []struct {
		name    string
		reports []ShardReport
		status  metav1.ConditionStatus
		reason  string
		msg     string // the whole message
	}{
		{"no shards", nil, metav1.ConditionUnknown, rqv1.ReasonNoShardReports, "no shard could be asked"},
		{"no shard answered", []ShardReport{unreachable}, metav1.ConditionUnknown, rqv1.ReasonNoShardReports, "no shard could be asked"},
		{"every class within its cadence", []ShardReport{served, report("web-shard-1"), unreachable},
			metav1.ConditionTrue, rqv1.ReasonAllClassesServed,
			"no class has gone longer than its cadence without a render on the 2 shards that answered"},
		{"exactly one cadence is not yet longer", []ShardReport{report("web-shard-0", class(time.Hour, "discovered", since(time.Hour)))},
			metav1.ConditionTrue, rqv1.ReasonAllClassesServed,
			"no class has gone longer than its cadence without a render on the 1 shard that answered"},
		{"a keeper without waitingSince cannot tell", []ShardReport{report("web-shard-0", class(time.Hour, "discovered", nil))},
			metav1.ConditionTrue, rqv1.ReasonAllClassesServed,
			"no class has gone longer than its cadence without a render on the 1 shard that answered"},
		{"waiting since after the shard's asOf is no wait", []ShardReport{report("web-shard-0", class(time.Hour, "discovered", since(-2*time.Hour)))},
			metav1.ConditionTrue, rqv1.ReasonAllClassesServed,
			"no class has gone longer than its cadence without a render on the 1 shard that answered"},
		{"one class starving", []ShardReport{served, report("web-shard-1", class(time.Hour, "discovered", since(61*time.Minute+500*time.Millisecond)))},
			metav1.ConditionFalse, rqv1.ReasonClassStarving,
			"class 1h/discovered on shard web-shard-1 has had due rows and no render since 2026-12-05T10:58:59Z, longer than its cadence (1h)"},
		{"the class that has waited the most cadences is named", []ShardReport{
			report("web-shard-0", class(96*time.Hour, "discovered", since(200*time.Hour)), class(15*time.Minute, "submitted", since(20*time.Minute))),
			report("web-shard-1", class(90*time.Minute, "submitted", since(6*time.Hour)))},
			metav1.ConditionFalse, rqv1.ReasonClassStarving,
			"class 1h30m/submitted on shard web-shard-1 has had due rows and no render since 2026-12-05T06:00:00Z, longer than its cadence (1h30m) (and 2 more starving classes)"},
	} {
		got := classesServedCondition(tc.reports)
		if got.Status != tc.status || got.Reason != tc.reason || got.Message != tc.msg {
			t.Errorf("%s:\n got %s/%s %q\nwant %s/%s %q", tc.name, got.Status, got.Reason, got.Message, tc.status, tc.reason, tc.msg)
		}
	}
}

// The message of a starving class does not change while the same wait goes on, so a starving
// queue does not rewrite its status on every poll.
func TestClassesServedMessageIsStable(t *testing.T) {
	since := time.Date(2026, 12, 5, 10, 58, 59, 400_000_000, time.UTC)
	at := func(asOf time.Time) Condition {
		return classesServedCondition([]ShardReport{{Name: "web-shard-0", Status: &shardapi.Status{AsOf: asOf,
			Classes: []shardapi.Class{{Cadence: 3600, Source: "discovered", Due: 3, WaitingSince: &since}}}}})
	}
	first, later := at(since.Add(61*time.Minute)), at(since.Add(3*time.Hour))
	if first != later || first.Status != metav1.ConditionFalse {
		t.Errorf("the condition changed while the same wait went on:\n%+v\n%+v", first, later)
	}
}

// ComputeStatus sets ClassesServed from the shards that answered, and TransitionEvents warns when
// a class starts starving and says when it is served again.
func TestClassesServedInStatusAndEvents(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	waiting := now.Add(-2 * time.Hour)
	rq := &rqv1.RenderQueue{}
	rq.Name, rq.Namespace, rq.Generation = "web", "render", 3
	reports := func(since *time.Time) []ShardReport {
		return []ShardReport{{Name: "web-shard-0", Asked: true, Status: &shardapi.Status{Shard: "web-shard-0", AsOf: now, Status: shardapi.StatusQueued,
			Membership: shardapi.Membership{Owned: "0-1023"}, Due: 1, DuePerSlot: map[string]int{"7": 1},
			Classes: []shardapi.Class{{Cadence: 3600, Source: "submitted", Due: 1, Held: 1, WaitingSince: since}}}}}
	}
	committed, err := membership.NewAssignment(1, map[string]schedule.SlotSet{"web-shard-0": schedule.AllSlots()})
	if err != nil {
		t.Fatal(err)
	}
	status := func(rs []ShardReport) *rqv1.RenderQueueStatus {
		next := &rqv1.RenderQueueStatus{}
		if err := ComputeStatus(rq, next, StatusInputs{Committed: committed, Reports: rs, Now: now}); err != nil {
			t.Fatal(err)
		}
		return next
	}
	servedSt, starvingSt := status(reports(nil)), status(reports(&waiting))
	cond := func(st *rqv1.RenderQueueStatus) string {
		for _, c := range st.Conditions {
			if c.Type == rqv1.ConditionClassesServed {
				return string(c.Status) + "/" + c.Reason + ": " + c.Message
			}
		}
		return "none"
	}
	if got, want := cond(starvingSt), "False/ClassStarving: class 1h/submitted on shard web-shard-0 has had due rows and no render since 2026-12-05T10:00:00Z, longer than its cadence (1h)"; got != want {
		t.Errorf("starving: %s, want %s", got, want)
	}
	if got := cond(servedSt); got != "True/AllClassesServed: no class has gone longer than its cadence without a render on the 1 shard that answered" {
		t.Errorf("served: %s", got)
	}
	events := func(prev, next *rqv1.RenderQueueStatus) []string {
		var out []string
		for _, e := range TransitionEvents(prev, next, nil) {
			out = append(out, e.Type+"/"+e.Reason+": "+e.Message)
		}
		return out
	}
	if got := events(servedSt, starvingSt); len(got) != 1 || !strings.HasPrefix(got[0], "Warning/ClassStarving: class 1h/submitted on shard web-shard-0") {
		t.Errorf("served → starving: %q", got)
	}
	if got := events(starvingSt, starvingSt); len(got) != 0 {
		t.Errorf("starving → starving: %q", got)
	}
	if got := events(starvingSt, servedSt); len(got) != 1 || !strings.HasPrefix(got[0], "Normal/AllClassesServed") {
		t.Errorf("starving → served: %q", got)
	}
}
