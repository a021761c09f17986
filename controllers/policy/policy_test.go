package policy

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/membership"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

func i64(v int64) *int64 { return &v }

// healthy is a reachable, ready, exact shard with a finished complete walk and an edge ahead.
func healthy(name string) rqv1.ShardStatus {
	return rqv1.ShardStatus{Name: name, State: shardapi.StatusQueued, Ready: true, Exact: true, Due: 5,
		EdgeAheadSeconds: i64(3600), LastWalk: &rqv1.WalkSummary{}}
}

func with(s rqv1.ShardStatus, change func(*rqv1.ShardStatus)) rqv1.ShardStatus {
	change(&s)
	return s
}

func checkCondition(t *testing.T, name string, got Condition, status metav1.ConditionStatus, reason string, msgParts ...string) {
	t.Helper()
	if got.Status != status || got.Reason != reason {
		t.Errorf("%s: got %s/%s (%q), want %s/%s", name, got.Status, got.Reason, got.Message, status, reason)
	}
	for _, part := range msgParts {
		if !strings.Contains(got.Message, part) {
			t.Errorf("%s: message %q does not contain %q", name, got.Message, part)
		}
	}
}

func TestReadyCondition(t *testing.T) {
	for _, tc := range []struct {
		name   string
		shards []rqv1.ShardStatus
		status metav1.ConditionStatus
		reason string
		msg    []string
	}{
		{"no shards", nil, metav1.ConditionFalse, rqv1.ReasonShardsNotReady, []string{"no shards"}},
		{"all ready", []rqv1.ShardStatus{healthy("a"), healthy("b")}, metav1.ConditionTrue, rqv1.ReasonAllShardsReady, []string{"2 of 2"}},
		{"one pending", []rqv1.ShardStatus{healthy("a"), {Name: "b", State: StatePending, Error: "the Pod has no IP yet"}},
			metav1.ConditionFalse, rqv1.ReasonShardsNotReady, []string{"1 of 2", "shard b is Pending: the Pod has no IP yet"}},
		{"one loading", []rqv1.ShardStatus{with(healthy("a"), func(s *rqv1.ShardStatus) { s.Ready, s.State = false, "unready" })},
			metav1.ConditionFalse, rqv1.ReasonShardsNotReady, []string{"shard a is loading (unready)"}},
	} {
		got := readyCondition(tc.shards)
		checkCondition(t, tc.name, got, tc.status, tc.reason, tc.msg...)
	}
}

func TestExactCondition(t *testing.T) {
	unreachable := rqv1.ShardStatus{Name: "web-shard-1", State: StateUnreachable, Error: "unreachable: connection refused"}
	for _, tc := range []struct {
		name       string
		shards     []rqv1.ShardStatus
		sumExact   bool
		notAdopted []string
		status     metav1.ConditionStatus
		reason     string
		msg        []string
	}{
		{"exact", []rqv1.ShardStatus{healthy("a"), healthy("b")}, true, nil,
			metav1.ConditionTrue, rqv1.ReasonAllShardsExact, []string{"all 2 shards"}},
		{"no shards", nil, true, nil, metav1.ConditionFalse, rqv1.ReasonNoShardReports, nil},
		{"unreachable wins over inexact", []rqv1.ShardStatus{with(healthy("a"), func(s *rqv1.ShardStatus) { s.Exact = false }), unreachable}, true, nil,
			metav1.ConditionFalse, rqv1.ReasonShardUnreachable, []string{"shard web-shard-1 is unreachable", "connection refused", "lower bound"}},
		{"two unreachable", []rqv1.ShardStatus{unreachable, with(unreachable, func(s *rqv1.ShardStatus) { s.Name = "web-shard-2" })}, true, nil,
			metav1.ConditionFalse, rqv1.ReasonShardUnreachable, []string{"web-shard-1", "and 1 more shard"}},
		{"pending", []rqv1.ShardStatus{{Name: "p", State: StatePending}}, true, nil,
			metav1.ConditionFalse, rqv1.ReasonShardUnreachable, []string{"shard p is not serving yet"}},
		{"inexact", []rqv1.ShardStatus{healthy("a"), with(healthy("b"), func(s *rqv1.ShardStatus) { s.Exact, s.State, s.Due = false, "unready", 42 })}, true, nil,
			metav1.ConditionFalse, rqv1.ReasonShardInexact, []string{"shard b", "42", "unready"}},
		{"owner not adopted", []rqv1.ShardStatus{healthy("a"), healthy("b")}, false, []string{"b"},
			metav1.ConditionFalse, rqv1.ReasonMembershipChanging, []string{"shard b has not adopted the assignment at epoch 7"}},
	} {
		got := exactCondition(tc.shards, tc.sumExact, tc.notAdopted, 7)
		checkCondition(t, tc.name, got, tc.status, tc.reason, tc.msg...)
	}
}

func TestEdgeCondition(t *testing.T) {
	lag := func(name string, seconds int64) rqv1.ShardStatus {
		return with(healthy(name), func(s *rqv1.ShardStatus) { s.EdgeAheadSeconds = i64(seconds) })
	}
	for _, tc := range []struct {
		name   string
		shards []rqv1.ShardStatus
		status metav1.ConditionStatus
		reason string
		msg    []string
	}{
		{"ahead", []rqv1.ShardStatus{healthy("a")}, metav1.ConditionTrue, rqv1.ReasonEdgeAhead, nil},
		{"unbounded window (no edge)", []rqv1.ShardStatus{with(healthy("a"), func(s *rqv1.ShardStatus) { s.EdgeAheadSeconds = nil })},
			metav1.ConditionTrue, rqv1.ReasonEdgeAhead, nil},
		{"lagging", []rqv1.ShardStatus{healthy("web-shard-0"), lag("web-shard-1", -4800)},
			metav1.ConditionFalse, rqv1.ReasonEdgeLagging, []string{"shard web-shard-1 edge is 1h20m behind now"}},
		{"worst named", []rqv1.ShardStatus{lag("a", -90), lag("b", -7200), lag("c", -30)},
			metav1.ConditionFalse, rqv1.ReasonEdgeLagging, []string{"shard b edge is 2h behind now", "and 2 more shards"}},
		{"unreachable shards are not judged", []rqv1.ShardStatus{{Name: "a", State: StateUnreachable, EdgeAheadSeconds: i64(-100)}},
			metav1.ConditionUnknown, rqv1.ReasonNoShardReports, nil},
	} {
		checkCondition(t, tc.name, edgeCondition(tc.shards), tc.status, tc.reason, tc.msg...)
	}
}

func TestWalksCondition(t *testing.T) {
	finished := metav1.NewTime(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	partial := with(healthy("web-shard-2"), func(s *rqv1.ShardStatus) {
		s.LastWalk = &rqv1.WalkSummary{Partial: true, UnreadSegments: 3, FinishedAt: &finished}
	})
	failed := with(healthy("web-shard-0"), func(s *rqv1.ShardStatus) {
		s.LastWalk = &rqv1.WalkSummary{Failed: true}
		s.Error = "store unreachable"
	})
	for _, tc := range []struct {
		name   string
		shards []rqv1.ShardStatus
		status metav1.ConditionStatus
		reason string
		msg    []string
	}{
		{"complete", []rqv1.ShardStatus{healthy("a")}, metav1.ConditionTrue, rqv1.ReasonWalksComplete, nil},
		{"no walks yet", []rqv1.ShardStatus{{Name: "a", State: StatePending}}, metav1.ConditionUnknown, rqv1.ReasonNoShardReports, nil},
		{"partial", []rqv1.ShardStatus{healthy("a"), partial}, metav1.ConditionFalse, rqv1.ReasonPartialWalk,
			[]string{"shard web-shard-2's last walk left 3 segments unread", "2026-11-29T12:00:00Z"}},
		{"partial named before failed", []rqv1.ShardStatus{failed, partial}, metav1.ConditionFalse, rqv1.ReasonPartialWalk, []string{"web-shard-2"}},
		{"failed", []rqv1.ShardStatus{failed}, metav1.ConditionFalse, rqv1.ReasonWalkFailed, []string{"web-shard-0's last walk failed: store unreachable"}},
	} {
		checkCondition(t, tc.name, walksCondition(tc.shards), tc.status, tc.reason, tc.msg...)
	}
}

func TestProgressingCondition(t *testing.T) {
	for _, tc := range []struct {
		name   string
		p      *Progress
		shards []rqv1.ShardStatus
		status metav1.ConditionStatus
		reason string
		msg    []string
	}{
		{"settled", nil, []rqv1.ShardStatus{healthy("a")}, metav1.ConditionFalse, rqv1.ReasonSettled, []string{"1 shards settled at membership epoch 3"}},
		{"rebalancing wins", &Progress{Reason: rqv1.ReasonRebalancing, Message: "moving"}, []rqv1.ShardStatus{{Name: "a", State: StatePending}},
			metav1.ConditionTrue, rqv1.ReasonRebalancing, []string{"moving"}},
		{"loading", nil, []rqv1.ShardStatus{healthy("a"), {Name: "b", State: StatePending}}, metav1.ConditionTrue, rqv1.ReasonLoading,
			[]string{"shard b is loading", "1 of 2"}},
		{"an unreachable shard is not loading", nil, []rqv1.ShardStatus{healthy("a"), {Name: "b", State: StateUnreachable}},
			metav1.ConditionFalse, rqv1.ReasonSettled, nil},
		{"rows held back", nil, []rqv1.ShardStatus{healthy("a"), with(healthy("b"), func(s *rqv1.ShardStatus) {
			s.RowsHeldBack, s.HeldBack = 12, "slots 0-63 until 2026-12-01T12:00:30Z (the leases of an earlier keeper process of b are not known: they have ended by then)"
		})}, metav1.ConditionTrue, rqv1.ReasonRowsHeldBack, []string{"shard b holds back 12 due rows: slots 0-63 until 2026-12-01T12:00:30Z (the leases"}},
	} {
		checkCondition(t, tc.name, progressingCondition(tc.p, tc.shards, 3), tc.status, tc.reason, tc.msg...)
	}
}

func TestFormatLag(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                "0s",
		45 * time.Second:                 "45s",
		4*time.Minute + 10*time.Second:   "4m10s",
		10 * time.Minute:                 "10m",
		80 * time.Minute:                 "1h20m",
		2*time.Hour + 20*time.Second:     "2h",
		-(26*time.Hour + 31*time.Minute): "26h31m",
		59*time.Minute + 59*time.Second:  "59m59s",
		59*time.Minute + 59*time.Second + 600*time.Millisecond: "1h",
	} {
		if got := formatLag(d); got != want {
			t.Errorf("formatLag(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestShardStatusEdgeAheadIsStable(t *testing.T) {
	edge := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	report := func(ahead float64, edge time.Time) ShardReport {
		return ShardReport{Name: "s", Asked: true, Status: &shardapi.Status{
			Shard: "s", Status: shardapi.StatusQueued, Edge: &edge, EdgeAheadSeconds: &ahead}}
	}
	first := shardStatus(report(3600.7, edge), "0-1023", nil)
	if *first.EdgeAheadSeconds != 3600 {
		t.Fatalf("edgeAheadSeconds = %d, want 3600", *first.EdgeAheadSeconds)
	}
	for _, tc := range []struct {
		name  string
		ahead float64
		edge  time.Time
		want  int64
	}{
		{"a poll later: kept", 3590, edge, 3600},
		{"a minute later: kept (within a tenth)", 3540, edge, 3600},
		{"over a tenth later: refreshed", 3239, edge, 3239},
		{"new edge: refreshed", 3590, edge.Add(time.Second), 3590},
		{"now lagging: refreshed at once", -1, edge, -1},
	} {
		got := shardStatus(report(tc.ahead, tc.edge), "0-1023", &first)
		if *got.EdgeAheadSeconds != tc.want {
			t.Errorf("%s: edgeAheadSeconds = %d, want %d", tc.name, *got.EdgeAheadSeconds, tc.want)
		}
	}
}

func TestShardStatusUnreachableAndPending(t *testing.T) {
	ready := &corev1.Pod{Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	// a Ready Pod that does not answer is unreachable
	got := shardStatus(ShardReport{Name: "s", Pod: ready, Asked: true, URL: "http://10.244.0.7:8080", Err: errString("unreachable: refused")}, "0-9", nil)
	if got.URL != "http://10.244.0.7:8080" {
		t.Errorf("an unreachable shard's URL %q, want the one it was asked at (workers back off from it themselves)", got.URL)
	}
	if got.State != StateUnreachable || got.Error != "unreachable: refused" || got.Ready || got.Slots != "0-9" {
		t.Errorf("unreachable: %+v", got)
	}
	// a Pod not Ready yet (its keeper starting) is pending
	got = shardStatus(ShardReport{Name: "s", Pod: &corev1.Pod{}, Asked: true, Err: errString("unreachable: refused")}, "0-9", nil)
	if got.State != StatePending || got.Error != "unreachable: refused" {
		t.Errorf("starting: %+v", got)
	}
	got = shardStatus(ShardReport{Name: "s", Err: errString("no Pod")}, "", nil)
	if got.State != StatePending || got.Error != "no Pod" {
		t.Errorf("pending: %+v", got)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

func TestValidateReport(t *testing.T) {
	ok := &shardapi.Status{Membership: shardapi.Membership{Owned: "0-9", Incoming: "10"}, DuePerSlot: map[string]int{"3": 4}}
	d, err := validateReport(ok)
	if err != nil || d.DuePerSlot[3] != 4 || d.Owned.Len() != 10 {
		t.Fatalf("validateReport(ok) = %+v, %v", d, err)
	}
	for name, st := range map[string]*shardapi.Status{
		"bad owned":     {Membership: shardapi.Membership{Owned: "9-0"}},
		"bad incoming":  {Membership: shardapi.Membership{Incoming: "x"}},
		"bad slot key":  {DuePerSlot: map[string]int{"x": 1}},
		"slot too high": {DuePerSlot: map[string]int{"1024": 1}},
		"negative due":  {DuePerSlot: map[string]int{"1": -1}},
	} {
		if _, err := validateReport(st); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestAssignmentStatusRoundTrip(t *testing.T) {
	rq := &rqv1.RenderQueue{}
	rq.Name = "web"
	names := []string{"web-shard-0", "web-shard-1", "web-shard-2"}
	plan, err := membership.PlanRebalance(membership.Assignment{}, names)
	if err != nil {
		t.Fatal(err)
	}
	first, err := membership.Apply(membership.Assignment{}, plan.Phases[0])
	if err != nil {
		t.Fatal(err)
	}
	plan, err = membership.PlanRebalance(first, append(names, "web-shard-3"))
	if err != nil {
		t.Fatal(err)
	}
	prepared, err := membership.Apply(first, plan.Phases[0])
	if err != nil {
		t.Fatal(err)
	}
	var ms rqv1.MembershipStatus
	SetAssignment(rq, &ms, prepared)
	if ms.SlotsMoving != 256 || len(ms.Incoming) != 1 || ms.Incoming[0].Shard != "web-shard-3" {
		t.Fatalf("prepared membership status: %+v", ms)
	}
	back, err := AssignmentFromStatus(ms)
	if err != nil {
		t.Fatal(err)
	}
	if back != prepared {
		t.Errorf("round trip changed the assignment: %+v != %+v", back.Spec(), prepared.Spec())
	}
	if _, err := AssignmentFromStatus(rqv1.MembershipStatus{Epoch: 2, Assignment: []rqv1.ShardSlots{{Shard: "a", Slots: "0-10"}}}); err == nil {
		t.Error("an assignment leaving slots without owner was accepted")
	}
}

// TestHeldBackInStatusAndEvents: a shard's fences become its heldBack text and rowsHeldBack, summed
// for the queue; an event when a shard starts holding rows back for a reason (Normal while a
// handover is awaited, Warning when leases are unknown), none while only the slots or the end
// move, and one when it hands out everything again.
func TestHeldBackInStatusAndEvents(t *testing.T) {
	until := time.Date(2026, 12, 1, 12, 0, 30, 0, time.UTC)
	rep := ShardReport{Name: "web-shard-1", Status: &shardapi.Status{Status: shardapi.StatusQueued, Due: 30, HeldBack: 12,
		Fences: []shardapi.Fence{{Slots: "0-63", Reason: "awaiting the leases of web-shard-0"}, {Slots: "64-70", Until: &until, Reason: "leases not known"}}}}
	s := shardStatus(rep, "0-70", nil)
	if want := "slots 0-63 until their handover (awaiting the leases of web-shard-0); slots 64-70 until 2026-12-01T12:00:30Z (leases not known)"; s.HeldBack != want || s.RowsHeldBack != 12 {
		t.Errorf("heldBack %q (%d), want %q (12)", s.HeldBack, s.RowsHeldBack, want)
	}
	long := shardStatus(ShardReport{Name: "x", Status: &shardapi.Status{Fences: []shardapi.Fence{{Slots: "1", Reason: strings.Repeat("é", 900)}}}}, "", nil)
	if len(long.HeldBack) > maxHeldBackText || !utf8.ValidString(long.HeldBack) {
		t.Errorf("a long heldBack is %d bytes (valid UTF-8: %v)", len(long.HeldBack), utf8.ValidString(long.HeldBack))
	}
	reasons := func(evs []Event) string {
		var out []string
		for _, e := range evs {
			out = append(out, e.Type+"/"+e.Reason)
		}
		return strings.Join(out, ",")
	}
	st := func(text string) *rqv1.RenderQueueStatus {
		return &rqv1.RenderQueueStatus{Shards: []rqv1.ShardStatus{{Name: "b", State: shardapi.StatusQueued, HeldBack: text, RowsHeldBack: 3}}}
	}
	none := st("")
	awaiting := st("slots 0-63 until their handover (awaiting the leases of a)")
	moved := st("slots 0-70 until their handover (awaiting the leases of a)")
	unknown := st("slots 0-63 until 2026-12-01T12:00:30Z (the leases of an earlier keeper process of b are not known: they have ended by then)")
	for _, tc := range []struct {
		name       string
		prev, next *rqv1.RenderQueueStatus
		want       string
	}{
		{"starts awaiting a handover", none, awaiting, "Normal/RowsHeldBack"},
		{"more slots, the same reason", awaiting, moved, ""},
		{"leases unknown", awaiting, unknown, "Warning/RowsHeldBack"},
		{"released", unknown, none, "Normal/RowsReleased"},
	} {
		if got := reasons(TransitionEvents(tc.prev, tc.next, nil)); got != tc.want {
			t.Errorf("%s: events %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestTransitionEventsOnlyOnChange(t *testing.T) {
	lagging := rqv1.RenderQueueStatus{
		Conditions: []metav1.Condition{{Type: rqv1.ConditionEdgeHealthy, Status: metav1.ConditionFalse, Reason: rqv1.ReasonEdgeLagging, Message: "lag"}},
		Shards:     []rqv1.ShardStatus{{Name: "a", State: StateUnreachable, Error: "refused"}},
	}
	healthyStatus := rqv1.RenderQueueStatus{
		Conditions: []metav1.Condition{{Type: rqv1.ConditionEdgeHealthy, Status: metav1.ConditionTrue, Reason: rqv1.ReasonEdgeAhead}},
		Shards:     []rqv1.ShardStatus{{Name: "a", State: "queued"}},
	}
	reasons := func(evs []Event) string {
		var out []string
		for _, e := range evs {
			out = append(out, e.Type+"/"+e.Reason)
		}
		return strings.Join(out, ",")
	}
	if got := reasons(TransitionEvents(&healthyStatus, &lagging, nil)); got != "Warning/EdgeLagging,Warning/ShardUnreachable" {
		t.Errorf("healthy → lagging: %s", got)
	}
	if got := reasons(TransitionEvents(&lagging, &lagging, nil)); got != "" {
		t.Errorf("lagging → lagging: %s", got)
	}
	if got := reasons(TransitionEvents(&lagging, &healthyStatus, nil)); got != "Normal/EdgeAhead,Normal/ShardReachable" {
		t.Errorf("lagging → healthy: %s", got)
	}
}

func TestPodProblem(t *testing.T) {
	waiting := func(reason, msg string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: "keeper", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}}
	}
	podWith := func(change func(*corev1.PodStatus)) *corev1.Pod {
		p := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending}}
		change(&p.Status)
		return p
	}
	deleting := podWith(func(s *corev1.PodStatus) {
		s.ContainerStatuses = []corev1.ContainerStatus{waiting("CrashLoopBackOff", "back-off")}
	})
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	crashLoop := waiting("CrashLoopBackOff", "back-off 40s restarting failed container=keeper pod=web-shard-0")
	crashLoop.RestartCount = 4
	crashLoop.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error",
		Message: "time=... level=INFO msg=starting\nrenderqueue keeper: opening the store: bad DSN\n\n"}
	for _, tc := range []struct {
		name         string
		pod          *corev1.Pod
		reason, want string
	}{
		{"no Pod", nil, "", ""},
		{"being deleted", deleting, "", ""},
		{"scheduled, creating", podWith(func(s *corev1.PodStatus) {
			s.ContainerStatuses = []corev1.ContainerStatus{waiting("ContainerCreating", "")}
		}), "", ""},
		{"running", podWith(func(s *corev1.PodStatus) {
			s.Phase = corev1.PodRunning
			s.ContainerStatuses = []corev1.ContainerStatus{{Name: "keeper", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
		}), "", ""},
		{"store Secret missing", podWith(func(s *corev1.PodStatus) {
			s.ContainerStatuses = []corev1.ContainerStatus{waiting("CreateContainerConfigError", `secret "renderqueue-db" not found`)}
		}), "CreateContainerConfigError", `secret "renderqueue-db" not found`},
		{"key missing", podWith(func(s *corev1.PodStatus) {
			s.ContainerStatuses = []corev1.ContainerStatus{waiting("CreateContainerConfigError", `couldn't find key dsn in Secret default/renderqueue-db`)}
		}), "CreateContainerConfigError", "couldn't find key dsn in Secret default/renderqueue-db"},
		{"image", podWith(func(s *corev1.PodStatus) {
			s.ContainerStatuses = []corev1.ContainerStatus{waiting("ImagePullBackOff", "Back-off pulling image \"x\"\n")}
		}), "ImagePullBackOff", `Back-off pulling image "x"`},
		{"crash loop: the last exit and its last log line", podWith(func(s *corev1.PodStatus) {
			s.Phase = corev1.PodRunning
			s.ContainerStatuses = []corev1.ContainerStatus{crashLoop}
		}), "CrashLoopBackOff", "container keeper exited with code 1 (Error): renderqueue keeper: opening the store: bad DSN; restarted 4 times"},
		{"crash loop without a last state", podWith(func(s *corev1.PodStatus) {
			s.ContainerStatuses = []corev1.ContainerStatus{waiting("CrashLoopBackOff", "")}
		}), "CrashLoopBackOff", "container keeper restarted 0 times"},
		{"terminated (restartPolicy Never)", podWith(func(s *corev1.PodStatus) {
			s.ContainerStatuses = []corev1.ContainerStatus{{Name: "keeper", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 137, Reason: "OOMKilled"}}}}
		}), "OOMKilled", "container keeper exited with code 137 (OOMKilled)"},
		{"an init container first", podWith(func(s *corev1.PodStatus) {
			s.InitContainerStatuses = []corev1.ContainerStatus{{Name: "migrate", RestartCount: 3, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2, Message: "no schema"}}}}
			s.ContainerStatuses = []corev1.ContainerStatus{waiting("PodInitializing", "")}
		}), "CrashLoopBackOff", "container migrate exited with code 2: no schema; restarted 3 times"},
		{"unschedulable", podWith(func(s *corev1.PodStatus) {
			s.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable",
				Message: "0/3 nodes are available: 3 Insufficient memory."}}
		}), "Unschedulable", "0/3 nodes are available: 3 Insufficient memory."},
		{"evicted", podWith(func(s *corev1.PodStatus) {
			s.Phase, s.Reason, s.Message = corev1.PodFailed, "Evicted", "The node was low on resource: memory."
		}), "Evicted", "The node was low on resource: memory."},
		{"a long message is shortened", podWith(func(s *corev1.PodStatus) {
			s.ContainerStatuses = []corev1.ContainerStatus{waiting("CreateContainerError", strings.Repeat("x", 1000))}
		}), "CreateContainerError", strings.Repeat("x", maxProblemMessage) + "..."},
	} {
		reason, msg := podProblem(tc.pod)
		if reason != tc.reason || msg != tc.want {
			t.Errorf("%s: podProblem = (%q, %q), want (%q, %q)", tc.name, reason, msg, tc.reason, tc.want)
		}
	}
}

func TestShardStatusFailing(t *testing.T) {
	pod := &corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "keeper",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerConfigError", Message: `secret "renderqueue-db" not found`}}}}}}
	got := shardStatus(ShardReport{Name: "s", Pod: pod, Err: errString("the Pod has no IP yet")}, "0-9", nil)
	if got.State != StateFailing || got.Error != `CreateContainerConfigError: secret "renderqueue-db" not found` || got.Ready {
		t.Errorf("failing: %+v", got)
	}
	// a shard that answers speaks for itself, whatever the Pod's last state
	pod.Status.ContainerStatuses[0].State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	got = shardStatus(ShardReport{Name: "s", Pod: pod, Asked: true, Status: &shardapi.Status{Shard: "s", Status: shardapi.StatusUnready,
		Error: "database unreachable: dial tcp 10.0.0.9:5432: connect: connection refused"}}, "0-9", nil)
	if got.State != shardapi.StatusUnready || got.Error != "database unreachable: dial tcp 10.0.0.9:5432: connect: connection refused" || got.Ready {
		t.Errorf("answering: %+v", got)
	}
}

func TestReadyConditionNamesTheProblem(t *testing.T) {
	loading := rqv1.ShardStatus{Name: "a", State: shardapi.StatusUnready}
	starting := rqv1.ShardStatus{Name: "a", State: StatePending, Error: "the Pod has no IP yet"}
	failing := rqv1.ShardStatus{Name: "b", State: StateFailing, Error: `CreateContainerConfigError: secret "renderqueue-db" not found`}
	dbDown := rqv1.ShardStatus{Name: "c", State: shardapi.StatusUnready, Error: "database unreachable: connection refused"}
	for _, tc := range []struct {
		name   string
		shards []rqv1.ShardStatus
		msg    string
	}{
		{"a failing shard before a loading one", []rqv1.ShardStatus{loading, failing},
			`0 of 2 shards ready; shard b cannot run: CreateContainerConfigError: secret "renderqueue-db" not found`},
		{"a failing shard before a starting one", []rqv1.ShardStatus{starting, failing}, "shard b cannot run: CreateContainerConfigError"},
		{"a shard's own error before a loading one", []rqv1.ShardStatus{loading, dbDown, healthy("d")},
			"1 of 3 shards ready; shard c is unready: database unreachable: connection refused"},
		{"the first troubled shard", []rqv1.ShardStatus{dbDown, failing}, "shard c is unready: database unreachable"},
	} {
		checkCondition(t, tc.name, readyCondition(tc.shards), metav1.ConditionFalse, rqv1.ReasonShardsNotReady, tc.msg)
	}
	checkCondition(t, "exact: a shard's own error", exactCondition([]rqv1.ShardStatus{healthy("a"), dbDown}, true, nil, 1),
		metav1.ConditionFalse, rqv1.ReasonShardInexact, "shard c does not vouch for its due count 0 (status unready: database unreachable: connection refused)")
	checkCondition(t, "exact: a failing shard", exactCondition([]rqv1.ShardStatus{healthy("a"), failing}, true, nil, 1),
		metav1.ConditionFalse, rqv1.ReasonShardUnreachable, "shard b is not running (CreateContainerConfigError")
	checkCondition(t, "progressing: a shard with an error is not loading", progressingCondition(nil, []rqv1.ShardStatus{healthy("a"), dbDown}, 1),
		metav1.ConditionFalse, rqv1.ReasonSettled)
	checkCondition(t, "progressing: a failing shard is not loading", progressingCondition(nil, []rqv1.ShardStatus{healthy("a"), failing}, 1),
		metav1.ConditionFalse, rqv1.ReasonSettled)
}

func TestTransitionEventsOfFailingShards(t *testing.T) {
	st := func(shards ...rqv1.ShardStatus) *rqv1.RenderQueueStatus {
		return &rqv1.RenderQueueStatus{Shards: shards}
	}
	pending := rqv1.ShardStatus{Name: "a", State: StatePending}
	noSecret := rqv1.ShardStatus{Name: "a", State: StateFailing, Error: `CreateContainerConfigError: secret "renderqueue-db" not found`}
	crash1 := rqv1.ShardStatus{Name: "a", State: StateFailing, Error: "CrashLoopBackOff: container keeper exited with code 1; restarted 1 times"}
	crash2 := rqv1.ShardStatus{Name: "a", State: StateFailing, Error: "CrashLoopBackOff: container keeper exited with code 1; restarted 2 times"}
	dbDown := rqv1.ShardStatus{Name: "a", State: shardapi.StatusUnready, Error: "database unreachable: connection refused"}
	loading := rqv1.ShardStatus{Name: "a", State: shardapi.StatusUnready}
	unreachable := rqv1.ShardStatus{Name: "a", State: StateUnreachable, Error: "refused"}
	events := func(prev, next rqv1.ShardStatus) string {
		var out []string
		for _, e := range TransitionEvents(st(prev), st(next), nil) {
			out = append(out, e.Type+"/"+e.Reason+": "+e.Message)
		}
		return strings.Join(out, " | ")
	}
	for _, tc := range []struct {
		name       string
		prev, next rqv1.ShardStatus
		want       string
	}{
		{"starts failing", pending, noSecret, `Warning/ShardFailing: shard a cannot run: CreateContainerConfigError: secret "renderqueue-db" not found`},
		{"still failing", noSecret, noSecret, ""},
		{"fails differently", noSecret, crash1, "Warning/ShardFailing: shard a cannot run: CrashLoopBackOff: container keeper exited with code 1; restarted 1 times"},
		{"same reason, new message", crash1, crash2, ""},
		{"database down", loading, dbDown, "Warning/ShardFailing: shard a is unready: database unreachable: connection refused"},
		{"database back", dbDown, loading, "Normal/ShardRecovered: shard a recovered (was: database unreachable: connection refused); now unready"},
		{"Secret back", noSecret, pending, `Normal/ShardRecovered: shard a recovered (was: CreateContainerConfigError: secret "renderqueue-db" not found); now Pending`},
		{"failing to unreachable is the unreachable event only", crash1, unreachable, "Warning/ShardUnreachable: shard a is unreachable: refused"},
		{"unreachable to failing", unreachable, crash1, "Warning/ShardFailing: shard a cannot run: CrashLoopBackOff: container keeper exited with code 1; restarted 1 times"},
	} {
		if got := events(tc.prev, tc.next); got != tc.want {
			t.Errorf("%s: events %q, want %q", tc.name, got, tc.want)
		}
	}
}
