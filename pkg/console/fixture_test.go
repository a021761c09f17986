package console

import (
	"context"
	"math"
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// fixture is a namespace with two RenderQueues as a user would see them mid-incident:
//
//   - "web": 3 shards, a 12 h window; web-shard-0 exact, web-shard-1 inexact (a change-event
//     gap not yet covered by a walk, and a partial last walk), web-shard-2's Pod has an address
//     where nothing answers (unreachable); status.due 1,194, not exact; the last handoff
//     (2 → 3 shards) committed 41 minutes ago;
//   - "images": 1 shard, exact, nothing due.
type fixture struct {
	ns       string
	now      time.Time
	web      *rqv1.RenderQueue
	images   *rqv1.RenderQueue
	shards   map[string]*fakeShard
	registry *shardRegistry
	history  *History
}

const fixtureWebDue = 1194

func mtime(t time.Time) *metav1.Time { m := metav1.NewTime(t); return &m }

func cond(typ string, status metav1.ConditionStatus, reason, msg string, since time.Time) metav1.Condition {
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, LastTransitionTime: metav1.NewTime(since)}
}

// comingByHour is a plausible shape of rows coming due over 24 hours, scaled by f, with nothing
// held past windowHours.
func comingByHour(f float64, windowHours int) []int {
	out := make([]int, 24)
	for h := range out {
		if h >= windowHours {
			continue
		}
		v := 2600 + 900*math.Sin(float64(h)/3.2) - 40*float64(h)
		out[h] = int(v * f)
	}
	return out
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// lateBy splits n due rows over the lateness buckets up to bucket last: most in the first.
func lateBy(n, last int) []int {
	b := make([]int, shardapi.LateBuckets)
	for i := last; i > 0; i-- {
		b[i] = n / (4 * (i + 1))
	}
	b[0] = n - sum(b)
	return b
}

func shardStatus(name, owned string, due int, now time.Time, scale float64) shardapi.Status {
	edge := now.Add(11*time.Hour + 52*time.Minute)
	ahead := edge.Sub(now).Seconds()
	started := now.Add(-4*time.Minute - 10*time.Second)
	finished := started.Add(9 * time.Second)
	byHour := comingByHour(scale, 12)
	held := int(66100*scale) + due + sum(byHour)
	asOf := finished
	return shardapi.Status{
		Shard: name, AsOf: now, Status: shardapi.StatusQueued, Complete: true, Exact: true,
		Window: 12 * 3600, VerifyInterval: 3600, Edge: &edge, EdgeAheadSeconds: &ahead,
		Membership: shardapi.Membership{Epoch: 7, Owned: owned, PreparedEpoch: 6},
		Rows:       shardapi.Rows{Held: held, OwnedNotHeld: int(64000 * scale), OwnedNotHeldAsOf: &asOf, OwnedNotHeldApproximate: true},
		Due:        due,
		Lateness:   shardapi.Lateness{MaxSeconds: 5400, P50Seconds: 310, P99Seconds: 2900, MaxRelative: 1.8, P50Relative: 0.05, P99Relative: 0.42},
		Classes: []shardapi.Class{
			{Cadence: 3600, Source: "submitted", Due: due / 4, Held: int(900 * scale), MaxLateSeconds: 5400, LateBy: lateBy(due/4, 3)},
			{Cadence: 86400, Source: "discovered", Due: due / 3, Held: int(20000 * scale), MaxLateSeconds: 40000, LateBy: lateBy(due/3, 1)},
			{Cadence: 345600, Source: "discovered", Due: due - due/4 - due/3 - due/10, Held: int(60000 * scale), MaxLateSeconds: 30000, LateBy: lateBy(due-due/4-due/3-due/10, 0)},
			{Cadence: 345600, Source: "submitted", Due: due / 10, Held: int(7000 * scale), MaxLateSeconds: 20000, LateBy: lateBy(due/10, 0)},
		},
		Coming:   shardapi.Coming{Next15m: int(610 * scale), Next60m: int(2450 * scale), Next24h: sum(byHour), ByHour: byHour, CutAtWindow: true},
		LastWalk: &shardapi.Walk{StartedAt: started, FinishedAt: &finished, Scanned: int(131000 * scale), Admitted: 212},
	}
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	needAPIServer(t)
	now := time.Now().UTC().Truncate(time.Second)
	f := &fixture{ns: newNamespace(t), now: now, shards: map[string]*fakeShard{}, registry: newRegistry()}

	s0 := shardStatus("web-shard-0", "0-340", 412, now, 1)
	s1 := shardStatus("web-shard-1", "341-681", 377, now, 0.97)
	s1.Exact, s1.Complete = false, false
	gapSince, gapResumed := now.Add(-3*time.Minute), now.Add(-2*time.Minute-30*time.Second)
	s1.Gap = &shardapi.Gap{Since: gapSince, Resumed: &gapResumed, Reason: "listener: connection reset by peer"}
	s1.LastWalk.Partial, s1.LastWalk.UnreadSegments = true, 3
	s1.Error = "walk: 3 segments unread: reading slot 402: connection reset by peer"
	for _, st := range []shardapi.Status{s0, s1} {
		fs := newFakeShard(t, st)
		f.shards[st.Shard] = fs
	}
	dead := httptest.NewServer(nil)
	deadURL := dead.URL
	dead.Close() // web-shard-2's address: nothing listens there any more

	edgeAhead := int64((11*time.Hour + 52*time.Minute).Seconds())
	walk := &rqv1.WalkSummary{StartedAt: mtime(now.Add(-4 * time.Minute)), FinishedAt: mtime(now.Add(-4*time.Minute + 9*time.Second)), Scanned: 131000}
	web := rqv1.RenderQueueStatus{
		Conditions: []metav1.Condition{
			cond(rqv1.ConditionReady, metav1.ConditionTrue, rqv1.ReasonAllShardsReady, "3 of 3 shards ready", now.Add(-40*time.Minute)),
			cond(rqv1.ConditionExact, metav1.ConditionFalse, rqv1.ReasonShardInexact, "web-shard-1 does not vouch for its count (change-event gap)", now.Add(-3*time.Minute)),
			cond(rqv1.ConditionEdgeHealthy, metav1.ConditionTrue, rqv1.ReasonEdgeAhead, "every edge is ahead of now", now.Add(-40*time.Minute)),
			cond(rqv1.ConditionWalksComplete, metav1.ConditionFalse, rqv1.ReasonPartialWalk, "web-shard-1: 3 segments unread", now.Add(-4*time.Minute)),
			cond(rqv1.ConditionProgressing, metav1.ConditionFalse, rqv1.ReasonSettled, "", now.Add(-41*time.Minute)),
		},
		Shards: []rqv1.ShardStatus{
			{Name: "web-shard-0", Slots: "0-340", State: "queued", Ready: true, RowsHeld: 91000, RowsOwned: 155000, Due: 412, Exact: true, EdgeAheadSeconds: &edgeAhead, LastWalk: walk, Epoch: 7, PreparedEpoch: 6},
			{Name: "web-shard-1", Slots: "341-681", State: "queued", Ready: true, RowsHeld: 88000, RowsOwned: 150000, Due: 377, EdgeAheadSeconds: &edgeAhead, LastWalk: walk, Epoch: 7, PreparedEpoch: 6},
			{Name: "web-shard-2", Slots: "682-1023", State: "queued", Ready: true, RowsHeld: 90500, RowsOwned: 154000, Due: 405, Exact: true, EdgeAheadSeconds: &edgeAhead, LastWalk: walk, Epoch: 7, PreparedEpoch: 6},
		},
		CurrentShards: 3, ReadyShards: 3, Due: fixtureWebDue, DueExact: false, DueAsOf: mtime(now.Add(-20 * time.Second)),
		Membership: rqv1.MembershipStatus{
			Epoch:      7,
			Assignment: []rqv1.ShardSlots{{Shard: "web-shard-0", Slots: "0-340"}, {Shard: "web-shard-1", Slots: "341-681"}, {Shard: "web-shard-2", Slots: "682-1023"}},
			Handoff: &rqv1.HandoffStatus{
				State: rqv1.HandoffCommitted, FromEpoch: 5, PrepareEpoch: 6, FinalEpoch: 7,
				Moves:     []rqv1.SlotMove{{From: "web-shard-0", To: "web-shard-2", Slots: "682-852"}, {From: "web-shard-1", To: "web-shard-2", Slots: "853-1023"}},
				StartedAt: metav1.NewTime(now.Add(-42 * time.Minute)), Deadline: metav1.NewTime(now.Add(-32 * time.Minute)),
				FinishedAt: mtime(now.Add(-41*time.Minute + 10*time.Second)),
			},
		},
		Selector: "renderqueue.dev/queue=web",
	}
	f.web = createQueue(t, f.ns, "web", 3, 12*time.Hour, web)
	for _, name := range []string{"web-shard-0", "web-shard-1", "web-shard-2"} {
		createShardPod(t, f.ns, "web", name)
	}
	f.registry.add(f.ns, "web-shard-0", f.shards["web-shard-0"].srv.URL)
	f.registry.add(f.ns, "web-shard-1", f.shards["web-shard-1"].srv.URL)
	f.registry.add(f.ns, "web-shard-2", deadURL)

	img := shardStatus("images-shard-0", "0-1023", 0, now, 0.2)
	img.Status = shardapi.StatusEmpty
	img.Classes = nil
	f.shards["images-shard-0"] = newFakeShard(t, img)
	f.images = createQueue(t, f.ns, "images", 1, 24*time.Hour, rqv1.RenderQueueStatus{
		Conditions: []metav1.Condition{
			cond(rqv1.ConditionReady, metav1.ConditionTrue, rqv1.ReasonAllShardsReady, "1 of 1 shards ready", now.Add(-2*time.Hour)),
			cond(rqv1.ConditionExact, metav1.ConditionTrue, rqv1.ReasonAllShardsExact, "", now.Add(-2*time.Hour)),
			cond(rqv1.ConditionEdgeHealthy, metav1.ConditionTrue, rqv1.ReasonEdgeAhead, "", now.Add(-2*time.Hour)),
			cond(rqv1.ConditionWalksComplete, metav1.ConditionTrue, rqv1.ReasonWalksComplete, "", now.Add(-2*time.Hour)),
			cond(rqv1.ConditionProgressing, metav1.ConditionFalse, rqv1.ReasonSettled, "", now.Add(-2*time.Hour)),
		},
		Shards:        []rqv1.ShardStatus{{Name: "images-shard-0", Slots: "0-1023", State: "empty", Ready: true, Exact: true}},
		CurrentShards: 1, ReadyShards: 1, Due: 0, DueExact: true, DueAsOf: mtime(now.Add(-5 * time.Minute)),
		Membership: rqv1.MembershipStatus{Epoch: 1,
			Assignment: []rqv1.ShardSlots{{Shard: "images-shard-0", Slots: "0-1023"}}},
	})
	createShardPod(t, f.ns, "images", "images-shard-0")
	f.registry.add(f.ns, "images-shard-0", f.shards["images-shard-0"].srv.URL)

	// An hour of status.due samples every 10 s: a slow wave, inexact for the last 3 minutes.
	hist, err := NewHistory(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i := 360; i >= 0; i-- {
		at := now.Add(-time.Duration(i) * 10 * time.Second)
		w := *f.web.DeepCopy()
		w.Status.Due = int64(1150 + 260*math.Sin(float64(i)/40) + 60*math.Cos(float64(i)/7))
		w.Status.DueExact = i > 18
		im := *f.images.DeepCopy()
		hist.Record(at, []rqv1.RenderQueue{w, im})
	}
	f.history = hist
	return f
}

// handler returns the console handler over the fixture, with a fixed clock.
func (f *fixture) handler(t *testing.T, timeout time.Duration) *handler {
	t.Helper()
	h, err := newHandler(HandlerOptions{
		Reader: k8sClient, ShardURL: f.registry.resolve, ShardTimeout: timeout,
		History: f.history, SampleInterval: 10 * time.Second, Now: func() time.Time { return f.now },
	})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// shardPod reads a shard's Pod.
func (f *fixture) shardPod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	if err := k8sClient.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: name}, &pod); err != nil {
		t.Fatalf("reading Pod %s: %v", name, err)
	}
	return &pod
}

func clientKey(o client.Object) client.ObjectKey { return client.ObjectKeyFromObject(o) }
