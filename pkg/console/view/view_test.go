package view

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

func TestConditionTone(t *testing.T) {
	cases := []struct {
		typ    string
		status metav1.ConditionStatus
		want   string
	}{
		{rqv1.ConditionReady, metav1.ConditionTrue, toneOK},
		{rqv1.ConditionReady, metav1.ConditionFalse, toneBad},
		{rqv1.ConditionExact, metav1.ConditionFalse, toneBad},
		{rqv1.ConditionEdgeHealthy, metav1.ConditionTrue, toneOK},
		{rqv1.ConditionWalksComplete, metav1.ConditionFalse, toneBad},
		{rqv1.ConditionProgressing, metav1.ConditionTrue, toneWarn},
		{rqv1.ConditionProgressing, metav1.ConditionFalse, toneOK},
		{rqv1.ConditionClassesServed, metav1.ConditionFalse, toneBad},
		{rqv1.ConditionClassesServed, metav1.ConditionTrue, toneOK},
		{rqv1.ConditionExact, metav1.ConditionUnknown, toneUnknown},
		{"SomethingNew", metav1.ConditionTrue, toneUnknown},
	}
	for _, c := range cases {
		if got := conditionTone(metav1.Condition{Type: c.typ, Status: c.status}); got != c.want {
			t.Errorf("%s=%s: tone %s, want %s", c.typ, c.status, got, c.want)
		}
	}
}

func TestSummarizeOrdersConditionsAndMarksStale(t *testing.T) {
	rq := &rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: "q", Namespace: "n", Generation: 3}}
	rq.Status.Conditions = []metav1.Condition{
		{Type: "Zeta", Status: metav1.ConditionTrue, ObservedGeneration: 3},
		{Type: rqv1.ConditionProgressing, Status: metav1.ConditionFalse, ObservedGeneration: 3},
		{Type: rqv1.ConditionExact, Status: metav1.ConditionTrue, ObservedGeneration: 2},
		{Type: rqv1.ConditionReady, Status: metav1.ConditionTrue, ObservedGeneration: 3},
	}
	q := Summarize(rq)
	var order []string
	for _, c := range q.Conditions {
		order = append(order, c.Type)
	}
	if strings.Join(order, ",") != "Ready,Exact,Progressing,Zeta" {
		t.Errorf("order = %v", order)
	}
	if !q.Conditions[1].Stale || q.Conditions[0].Stale {
		t.Errorf("stale flags = %+v", q.Conditions)
	}
	if q.DueKnown() {
		t.Error("a status without dueAsOf counts as known")
	}
}

func f64(v float64) *float64 { return &v }

func TestInexactReasons(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	fin := now.Add(-time.Minute)
	walked := &shardapi.Walk{StartedAt: now.Add(-2 * time.Minute), FinishedAt: &fin}
	edge := now.Add(time.Hour)
	cases := []struct {
		name string
		st   shardapi.Status
		want []string
	}{
		{"exact", shardapi.Status{Exact: true, Complete: true, LastWalk: walked}, nil},
		{"loading", shardapi.Status{}, []string{"first walk not finished"}},
		{"edge lags", shardapi.Status{LastWalk: walked, Edge: &edge, EdgeAheadSeconds: f64(-90)}, []string{"edge lags by 1m30s"}},
		{"open gap", shardapi.Status{LastWalk: walked, Complete: false, Gap: &shardapi.Gap{Since: now}}, []string{"change events lost since 03:04:05Z"}},
		{"partial", shardapi.Status{LastWalk: &shardapi.Walk{FinishedAt: &fin, Partial: true, UnreadSegments: 2}, Complete: true},
			[]string{"last walk partial (2 segments unread)"}},
		{"failed", shardapi.Status{LastWalk: &shardapi.Walk{FinishedAt: &fin, Failed: true}, Complete: true}, []string{"last walk failed"}},
		{"handoff", shardapi.Status{LastWalk: walked, Complete: true, Membership: shardapi.Membership{Incoming: "5-9"}},
			[]string{"handoff: walking incoming slots 5-9"}},
		{"no visible cause", shardapi.Status{LastWalk: walked, Complete: true}, []string{"the shard reports its count inexact"}},
		{"incomplete, no visible cause", shardapi.Status{LastWalk: walked}, []string{"not complete"}},
	}
	for _, c := range cases {
		got := inexactReasons(&c.st)
		if strings.Join(got, "|") != strings.Join(c.want, "|") {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

func TestDetailUnreachableShardUsesOperatorPollMarked(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ahead := int64(600)
	rq := &rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: "q", Namespace: "n"}}
	rq.Spec.Shards = 2
	rq.Status.Shards = []rqv1.ShardStatus{{Name: "q-shard-0", Slots: "0-511", Due: 40, Exact: true, RowsHeld: 100, RowsOwned: 130, EdgeAheadSeconds: &ahead}}
	edge := now.Add(10 * time.Minute)
	reports := []ShardReport{
		{Name: "q-shard-0", Err: errors.New("unreachable: connection refused")},
		{Name: "q-shard-1", Status: &shardapi.Status{Shard: "q-shard-1", AsOf: now, Status: "queued", Exact: true, Complete: true, Due: 7,
			Edge: &edge, Lateness: shardapi.Lateness{P99Relative: math.NaN()}, Membership: shardapi.Membership{Owned: "512-1023"},
			Coming: shardapi.Coming{ByHour: []int{1, 2, 3}}, Classes: []shardapi.Class{{Cadence: 60, Source: "submitted", Due: 7, Held: 9}}}},
	}
	d := Detail(rq, reports, nil, now)
	s0, s1 := d.Shard[0], d.Shard[1]
	if s0.Reachable || s0.Exact || s0.State != "unreachable" || s0.Error != "unreachable: connection refused" || s0.Due != 40 ||
		s0.OwnedNotHeld != 30 || s0.EdgeAheadSeconds == nil || *s0.EdgeAheadSeconds != 600 || len(s0.Inexact) != 1 {
		t.Errorf("unreachable shard = %+v", s0)
	}
	if !s1.Reachable || !s1.Exact || s1.Due != 7 || s1.Slots != "512-1023" || *s1.EdgeAheadSeconds != 600 || s1.P99Relative != 0 {
		t.Errorf("reachable shard = %+v (NaN lateness must become 0 for JSON)", s1)
	}
	if d.Reachable != 1 || d.Unreachable() != 1 || d.Coming.Shards != 1 || d.Coming.Of != 2 || d.Coming.ByHour[2].Rows != 3 ||
		len(d.Classes) != 1 || d.History == nil {
		t.Errorf("detail = reachable %d, coming %+v, classes %+v", d.Reachable, d.Coming, d.Classes)
	}
}

func TestMembershipView(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m := rqv1.MembershipStatus{
		Epoch:      8,
		Assignment: []rqv1.ShardSlots{{Shard: "a", Slots: "0-511"}, {Shard: "b", Slots: "512-1023"}},
		Incoming:   []rqv1.ShardSlots{{Shard: "c", Slots: "900-1023"}},
		Handoff: &rqv1.HandoffStatus{State: rqv1.HandoffPreparing, FromEpoch: 7, PrepareEpoch: 8, FinalEpoch: 0,
			StartedAt: metav1.NewTime(now.Add(-time.Minute)), Deadline: metav1.NewTime(now.Add(4 * time.Minute)), Waiting: []string{"c"}},
	}
	v := membershipView(m, now)
	if v.Phase != "Preparing" {
		t.Errorf("phase %q during a handoff, want Preparing", v.Phase)
	}
	if p := membershipPhase(&rqv1.MembershipStatus{Epoch: 9, Handoff: &rqv1.HandoffStatus{State: rqv1.HandoffCommitted}}); p != "Settled" {
		t.Errorf("phase %q after a commit, want Settled", p)
	}
	if v.Error != "" || v.Assignment[0].Count != 512 || len(v.Incoming) != 1 || v.Incoming[0].Count != 124 {
		t.Errorf("assignment = %+v incoming = %+v (%s)", v.Assignment, v.Incoming, v.Error)
	}
	var kinds []string
	for _, e := range v.Handoff.Events {
		kinds = append(kinds, e.Kind)
	}
	if strings.Join(kinds, ",") != "prepare,now,deadline" || v.Handoff.Events[1].Label != "now: waiting for c" {
		t.Errorf("events = %+v", v.Handoff.Events)
	}
	m.Handoff.State, m.Handoff.FinalEpoch = rqv1.HandoffRolledBack, 9
	m.Handoff.FinishedAt = &metav1.Time{Time: now}
	v = membershipView(m, now)
	if last := v.Handoff.Events[len(v.Handoff.Events)-1]; last.Kind != "rollback" || last.Label != "rollback (epoch 9)" {
		t.Errorf("rolled back: events = %+v", v.Handoff.Events)
	}
	first := membershipView(rqv1.MembershipStatus{Epoch: 1, Handoff: &rqv1.HandoffStatus{State: rqv1.HandoffCommitted, FinalEpoch: 1,
		StartedAt: metav1.NewTime(now), FinishedAt: &metav1.Time{Time: now}}}, now)
	if ev := first.Handoff.Events; len(ev) != 1 || ev[0].Label != "first assignment (epoch 1)" {
		t.Errorf("first assignment: events = %+v, want one", ev)
	}
	m.Assignment[1].Slots = "512-1023,7"
	if v = membershipView(m, now); !strings.Contains(v.Error, "shard b") {
		t.Errorf("a malformed slot set is not reported: %q", v.Error)
	}
}

// TestDetailClassLateness sums the shards' lateness buckets per class, takes the largest maximum,
// and counts the due rows of a shard that reports no buckets as unknown, not as on time.
func TestDetailClassLateness(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rq := &rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: "q", Namespace: "n"}}
	rq.Spec.Shards = 3
	st := func(name string, c shardapi.Class) ShardReport {
		return ShardReport{Name: name, Status: &shardapi.Status{Shard: name, AsOf: now, Due: c.Due, Classes: []shardapi.Class{c}}}
	}
	reports := []ShardReport{
		st("q-shard-0", shardapi.Class{Cadence: 3600, Source: "submitted", Due: 10, Held: 20, MaxLateSeconds: 900, LateBy: []int{5, 4, 1, 0, 0}}),
		st("q-shard-1", shardapi.Class{Cadence: 3600, Source: "submitted", Due: 6, Held: 8, MaxLateSeconds: 8000, LateBy: []int{1, 0, 0, 2, 3}}),
		st("q-shard-2", shardapi.Class{Cadence: 3600, Source: "submitted", Due: 4, Held: 5}), // no buckets: an older shard
	}
	d := Detail(rq, reports, nil, now)
	if len(d.Classes) != 1 {
		t.Fatalf("classes = %+v", d.Classes)
	}
	c := d.Classes[0]
	if c.Due != 20 || !slices.Equal(c.LateBy, []int{6, 4, 1, 2, 3}) || c.MaxLateSeconds != 8000 || c.LateUnknown != 4 {
		t.Errorf("class = %+v, want due 20, late by [6 4 1 2 3], max 8000 s, 4 unknown", c)
	}
	ch := lateChart(d.Classes)
	var labels []string
	for _, x := range ch.Texts {
		labels = append(labels, x.Text)
	}
	if !slices.Contains(labels, "≥ 2h13m") {
		t.Errorf("labels %q: the maximum must read as a lower bound while some rows' lateness is unknown", labels)
	}
}
