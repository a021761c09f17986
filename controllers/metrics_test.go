package controllers

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/policy"
)

// oneQueue collects the gauges of one RenderQueue object (collectQueue without a reader).
type oneQueue struct {
	d  queueDescs
	rq *rqv1.RenderQueue
}

func (o oneQueue) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(o, ch) }
func (o oneQueue) Collect(ch chan<- prometheus.Metric) { collectQueue(o.d, o.rq, ch) }

func mtime(s string) *metav1.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	mt := metav1.NewTime(t)
	return &mt
}

func TestCollectQueue(t *testing.T) {
	d := NewQueueCollector(nil, nil).d
	rq := &rqv1.RenderQueue{
		ObjectMeta: metav1.ObjectMeta{Namespace: "render", Name: "web"},
		Spec:       rqv1.RenderQueueSpec{Shards: 3},
		Status: rqv1.RenderQueueStatus{
			Due: 1234, DueExact: false, DueAsOf: mtime("2026-05-04T10:30:00Z"),
			CurrentShards: 2, ReadyShards: 1,
			Conditions: []metav1.Condition{
				{Type: rqv1.ConditionExact, Status: metav1.ConditionFalse, Reason: rqv1.ReasonShardUnreachable},
			},
			Membership: rqv1.MembershipStatus{SlotsMoving: 256},
			Shards: []rqv1.ShardStatus{
				{Name: "web-shard-0", State: "queued", Ready: true, Due: 1234, Exact: true, RowsHeld: 5000,
					Edge:     mtime("2026-05-05T10:00:00Z"),
					LastWalk: &rqv1.WalkSummary{FinishedAt: mtime("2026-05-04T10:00:00Z"), Partial: true, UnreadSegments: 2}},
				{Name: "web-shard-1", State: policy.StateUnreachable, Error: "connection refused"},
			},
		},
	}
	want := `
# HELP renderqueue_queue_condition 1 for the status each condition of the RenderQueue has (Ready, Exact, EdgeHealthy, WalksComplete, Progressing, Reconciled, ClassesServed), 0 for the others.
# TYPE renderqueue_queue_condition gauge
renderqueue_queue_condition{condition="Exact",namespace="render",renderqueue="web",status="False"} 1
renderqueue_queue_condition{condition="Exact",namespace="render",renderqueue="web",status="True"} 0
renderqueue_queue_condition{condition="Exact",namespace="render",renderqueue="web",status="Unknown"} 0
# HELP renderqueue_queue_due status.due: due rows summed per slot over the committed assignment; a lower bound unless renderqueue_queue_due_exact is 1. Absent until the operator first polled the shards.
# TYPE renderqueue_queue_due gauge
renderqueue_queue_due{namespace="render",renderqueue="web"} 1234
# HELP renderqueue_queue_due_as_of_timestamp_seconds status.dueAsOf: the shard poll at which the due count or its exactness last changed.
# TYPE renderqueue_queue_due_as_of_timestamp_seconds gauge
renderqueue_queue_due_as_of_timestamp_seconds{namespace="render",renderqueue="web"} 1.7778906e+09
# HELP renderqueue_queue_due_exact status.dueExact: 1 when every shard is reachable and exact, so renderqueue_queue_due is the true count.
# TYPE renderqueue_queue_due_exact gauge
renderqueue_queue_due_exact{namespace="render",renderqueue="web"} 0
# HELP renderqueue_queue_shard_edge_timestamp_seconds The shard's edge: every owned row due before it is held. Lagging when below time(). Absent when unknown or unbounded (window 0).
# TYPE renderqueue_queue_shard_edge_timestamp_seconds gauge
renderqueue_queue_shard_edge_timestamp_seconds{namespace="render",renderqueue="web",shard="web-shard-0"} 1.777975200e+09
# HELP renderqueue_queue_shard_last_walk_partial 1 when the shard's last walk left segments unread.
# TYPE renderqueue_queue_shard_last_walk_partial gauge
renderqueue_queue_shard_last_walk_partial{namespace="render",renderqueue="web",shard="web-shard-0"} 1
# HELP renderqueue_queue_shard_last_walk_end_timestamp_seconds When the shard's last walk finished.
# TYPE renderqueue_queue_shard_last_walk_end_timestamp_seconds gauge
renderqueue_queue_shard_last_walk_end_timestamp_seconds{namespace="render",renderqueue="web",shard="web-shard-0"} 1.7778888e+09
# HELP renderqueue_queue_shard_state 1 for the shard's state (queued, empty, unready as it reports; Pending, Unreachable, Failing as the operator sees it), 0 for the others.
# TYPE renderqueue_queue_shard_state gauge
renderqueue_queue_shard_state{namespace="render",renderqueue="web",shard="web-shard-0",state="Failing"} 0
renderqueue_queue_shard_state{namespace="render",renderqueue="web",shard="web-shard-1",state="Failing"} 0
renderqueue_queue_shard_state{namespace="render",renderqueue="web",shard="web-shard-0",state="Pending"} 0
renderqueue_queue_shard_state{namespace="render",renderqueue="web",shard="web-shard-1",state="Pending"} 0
renderqueue_queue_shard_state{namespace="render",renderqueue="web",shard="web-shard-0",state="Unreachable"} 0
renderqueue_queue_shard_state{namespace="render",renderqueue="web",shard="web-shard-1",state="Unreachable"} 1
renderqueue_queue_shard_state{namespace="render",renderqueue="web",shard="web-shard-0",state="empty"} 0
renderqueue_queue_shard_state{namespace="render",renderqueue="web",shard="web-shard-1",state="empty"} 0
renderqueue_queue_shard_state{namespace="render",renderqueue="web",shard="web-shard-0",state="queued"} 1
renderqueue_queue_shard_state{namespace="render",renderqueue="web",shard="web-shard-1",state="queued"} 0
renderqueue_queue_shard_state{namespace="render",renderqueue="web",shard="web-shard-0",state="unready"} 0
renderqueue_queue_shard_state{namespace="render",renderqueue="web",shard="web-shard-1",state="unready"} 0
# HELP renderqueue_queue_shards_current status.currentShards: shards in the committed slot assignment.
# TYPE renderqueue_queue_shards_current gauge
renderqueue_queue_shards_current{namespace="render",renderqueue="web"} 2
# HELP renderqueue_queue_shards_desired spec.shards: the shard count asked for.
# TYPE renderqueue_queue_shards_desired gauge
renderqueue_queue_shards_desired{namespace="render",renderqueue="web"} 3
# HELP renderqueue_queue_shards_ready status.readyShards: shards that have finished loading.
# TYPE renderqueue_queue_shards_ready gauge
renderqueue_queue_shards_ready{namespace="render",renderqueue="web"} 1
# HELP renderqueue_queue_slots_moving status.membership.slotsMoving: slots being handed off.
# TYPE renderqueue_queue_slots_moving gauge
renderqueue_queue_slots_moving{namespace="render",renderqueue="web"} 256
`
	names := []string{"renderqueue_queue_condition", "renderqueue_queue_due", "renderqueue_queue_due_as_of_timestamp_seconds",
		"renderqueue_queue_due_exact", "renderqueue_queue_shard_edge_timestamp_seconds", "renderqueue_queue_shard_last_walk_partial",
		"renderqueue_queue_shard_last_walk_end_timestamp_seconds", "renderqueue_queue_shard_state", "renderqueue_queue_shards_current",
		"renderqueue_queue_shards_desired", "renderqueue_queue_shards_ready", "renderqueue_queue_slots_moving"}
	if err := testutil.CollectAndCompare(oneQueue{d, rq}, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	// the unreachable shard has no edge and no walk: those series are absent, not 0
	if n := testutil.CollectAndCount(oneQueue{d, rq}, "renderqueue_queue_shard_edge_timestamp_seconds",
		"renderqueue_queue_shard_last_walk_end_timestamp_seconds", "renderqueue_queue_shard_last_walk_failed"); n != 3 {
		t.Errorf("%d edge/walk series, want 3 (web-shard-0 only)", n)
	}

	// the forecast per horizon, with its exactness
	rq.Status.Forecast = &rqv1.ForecastStatus{AsOf: *mtime("2026-05-04T10:30:00Z"), Horizons: []rqv1.ForecastHorizon{
		{Horizon: "15m", Due: 1300, Exact: true}, {Horizon: "24h", Due: 9000, Reason: "short"}}}
	if err := testutil.CollectAndCompare(oneQueue{d, rq}, strings.NewReader(`
# HELP renderqueue_queue_due_forecast status.forecast: due rows plus the rows coming due within the horizon (15m, 1h, 24h); a lower bound unless renderqueue_queue_due_forecast_exact is 1. Absent until the operator first computed it.
# TYPE renderqueue_queue_due_forecast gauge
renderqueue_queue_due_forecast{horizon="15m",namespace="render",renderqueue="web"} 1300
renderqueue_queue_due_forecast{horizon="24h",namespace="render",renderqueue="web"} 9000
# HELP renderqueue_queue_due_forecast_exact 1 when renderqueue_queue_due_forecast is the true count for the horizon.
# TYPE renderqueue_queue_due_forecast_exact gauge
renderqueue_queue_due_forecast_exact{horizon="15m",namespace="render",renderqueue="web"} 1
renderqueue_queue_due_forecast_exact{horizon="24h",namespace="render",renderqueue="web"} 0
`), "renderqueue_queue_due_forecast", "renderqueue_queue_due_forecast_exact"); err != nil {
		t.Fatal(err)
	}

	// objectives: attainment and budget as ratios from the counts (the budget with the spec's
	// percentile), met as 0/1; no attainment series without events
	rq.Spec.Objectives = []rqv1.Objective{{Name: "hourly", Percentile: "50"}, {Name: "daily", Percentile: "99"}}
	rq.Status.Objectives = []rqv1.ObjectiveStatus{{Name: "hourly", Good: 1, Late: 3, Attainment: "25%", BudgetRemaining: "-50%"},
		{Name: "daily", Met: true}}
	if err := testutil.CollectAndCompare(oneQueue{d, rq}, strings.NewReader(`
# HELP renderqueue_queue_objective_attainment_ratio status.objectives[].attainment: the share of the objective's events good over its window (from its good and late counts). Absent while there are none.
# TYPE renderqueue_queue_objective_attainment_ratio gauge
renderqueue_queue_objective_attainment_ratio{namespace="render",objective="hourly",renderqueue="web"} 0.25
# HELP renderqueue_queue_objective_budget_remaining_ratio status.objectives[].budgetRemaining: the share of the objective's error budget left over its window; negative when overspent. Absent while there are no events.
# TYPE renderqueue_queue_objective_budget_remaining_ratio gauge
renderqueue_queue_objective_budget_remaining_ratio{namespace="render",objective="hourly",renderqueue="web"} -0.5
# HELP renderqueue_queue_objective_met status.objectives[].met: 1 when the objective is met over its window.
# TYPE renderqueue_queue_objective_met gauge
renderqueue_queue_objective_met{namespace="render",objective="daily",renderqueue="web"} 1
renderqueue_queue_objective_met{namespace="render",objective="hourly",renderqueue="web"} 0
`), "renderqueue_queue_objective_attainment_ratio", "renderqueue_queue_objective_budget_remaining_ratio", "renderqueue_queue_objective_met"); err != nil {
		t.Fatal(err)
	}

	// never polled: no due figures at all (status.due is 0 by default, not a count)
	rq.Status.DueAsOf = nil
	if n := testutil.CollectAndCount(oneQueue{d, rq}, "renderqueue_queue_due", "renderqueue_queue_due_exact"); n != 0 {
		t.Errorf("%d due series before the first poll", n)
	}
}

func TestMetricsNilSafe(t *testing.T) {
	var m *Metrics
	m.track("a", "b")
	m.handoffs("a", "b", []policy.Event{{Reason: EventRebalanceStarted}})
	m.forget("a", "b")
}

// sampleOf returns the value of the series name{labels} in testMetrics, and whether it exists.
func sampleOf(g Gomega, name string, labels map[string]string) (float64, bool) {
	mfs, err := testMetrics.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m, labels) {
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue(), true
				}
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

func matches(m *dto.Metric, want map[string]string) bool {
	have := map[string]string{}
	for _, lp := range m.GetLabel() {
		have[lp.GetName()] = lp.GetValue()
	}
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// queueSeries counts the series of any renderqueue_queue_* metric labelled with rq.
func queueSeries(g Gomega, rq *rqv1.RenderQueue) int {
	mfs, err := testMetrics.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	n := 0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if matches(m, map[string]string{"namespace": rq.Namespace, "renderqueue": rq.Name}) {
				n++
			}
		}
	}
	return n
}

var _ = Describe("Operator metrics", func() {
	It("export each RenderQueue's status as it is, count its handoffs, and go with it", func() {
		rq, fs := newQueue("mon", 2, 3)
		fs[2].set(func(f *fakeShard) { f.autoPrepare = false })
		q := map[string]string{"namespace": rq.Namespace, "renderqueue": rq.Name}
		shard := func(i int) map[string]string {
			return map[string]string{"namespace": rq.Namespace, "renderqueue": rq.Name, "shard": rqv1.ShardName(rq.Name, i)}
		}
		with := func(base map[string]string, k, v string) map[string]string {
			out := map[string]string{k: v}
			for bk, bv := range base {
				out[bk] = bv
			}
			return out
		}
		expectValue := func(g Gomega, name string, labels map[string]string, want float64) {
			v, ok := sampleOf(g, name, labels)
			g.Expect(ok).To(BeTrue(), "%s%v missing", name, labels)
			g.Expect(v).To(Equal(want), "%s%v", name, labels)
		}
		st := settled(rq, 2)
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			expectValue(g, "renderqueue_queue_due", q, float64(got.Status.Due))
			expectValue(g, "renderqueue_queue_due_exact", q, 1)
			expectValue(g, "renderqueue_queue_due_as_of_timestamp_seconds", q, float64(got.Status.DueAsOf.Unix()))
			expectValue(g, "renderqueue_queue_shards_desired", q, 2)
			expectValue(g, "renderqueue_queue_shards_ready", q, 2)
			expectValue(g, "renderqueue_queue_condition", with(with(q, "condition", rqv1.ConditionExact), "status", "True"), 1)
			expectValue(g, "renderqueue_queue_condition", with(with(q, "condition", rqv1.ConditionExact), "status", "False"), 0)
			expectValue(g, "renderqueue_queue_shard_edge_timestamp_seconds", shard(0), float64(got.Status.Shards[0].Edge.Unix()))
			expectValue(g, "renderqueue_queue_shard_last_walk_end_timestamp_seconds", shard(1),
				float64(got.Status.Shards[1].LastWalk.FinishedAt.Unix()))
			expectValue(g, "renderqueue_queue_shard_last_walk_partial", shard(0), 0)
			expectValue(g, "renderqueue_queue_shard_state", with(shard(0), "state", "queued"), 1)
			// created at 0 on the first reconcile, so the first handoff is an increase
			expectValue(g, "renderqueue_queue_handoffs_started_total", q, 0)
			expectValue(g, "renderqueue_queue_handoffs_rolled_back_total", q, 0)
		}).Should(Succeed())
		Expect(st.Status.Due).To(BeEquivalentTo(20))

		By("a partial walk and an unreachable shard")
		fs[0].set(func(f *fakeShard) { f.partial, f.unread, f.exact = true, 3, false })
		fs[1].set(func(f *fakeShard) { f.failWith = 500 })
		Eventually(func(g Gomega) {
			got := getQueue(g, rq)
			g.Expect(got.Status.DueExact).To(BeFalse())
			expectValue(g, "renderqueue_queue_due_exact", q, 0)
			expectValue(g, "renderqueue_queue_due", q, float64(got.Status.Due))
			expectValue(g, "renderqueue_queue_condition", with(with(q, "condition", rqv1.ConditionExact), "status", "False"), 1)
			expectValue(g, "renderqueue_queue_shard_last_walk_partial", shard(0), 1)
			expectValue(g, "renderqueue_queue_shard_state", with(shard(1), "state", policy.StateUnreachable), 1)
			expectValue(g, "renderqueue_queue_shard_state", with(shard(1), "state", "queued"), 0)
			_, hasEdge := sampleOf(g, "renderqueue_queue_shard_edge_timestamp_seconds", shard(1))
			g.Expect(hasEdge).To(BeFalse(), "an unreachable shard's edge is not known")
		}).Should(Succeed())
		fs[0].set(func(f *fakeShard) { f.partial, f.unread, f.exact = false, 0, true })
		fs[1].set(func(f *fakeShard) { f.failWith = 0 })
		settled(rq, 2)

		By("a handoff that rolls back")
		scaleViaSpec(rq, 3)
		Eventually(func(g Gomega) {
			expectValue(g, "renderqueue_queue_handoffs_started_total", q, 1)
			expectValue(g, "renderqueue_queue_shards_desired", q, 3)
			expectValue(g, "renderqueue_queue_slots_moving", q, float64(getQueue(g, rq).Status.Membership.SlotsMoving))
		}).WithTimeout(15 * time.Second).Should(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(getQueue(g, rq).Status.Membership.Handoff.State).To(Equal(rqv1.HandoffRolledBack))
			expectValue(g, "renderqueue_queue_handoffs_rolled_back_total", q, 1)
			expectValue(g, "renderqueue_queue_handoffs_committed_total", q, 0)
		}).WithTimeout(testRebalanceTimeout + 15*time.Second).Should(Succeed())

		By("deleting the RenderQueue")
		Expect(k8sClient.Delete(suiteCtx, rq)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(queueSeries(g, rq)).To(BeZero())
		}).Should(Succeed())
	})

	It("count a committed handoff", func() {
		rq, _ := newQueue("monc", 2, 3)
		q := map[string]string{"namespace": rq.Namespace, "renderqueue": rq.Name}
		settled(rq, 2)
		scaleViaSpec(rq, 3)
		settled(rq, 3)
		Eventually(func(g Gomega) {
			for name, want := range map[string]float64{
				"renderqueue_queue_handoffs_started_total":     1,
				"renderqueue_queue_handoffs_committed_total":   1,
				"renderqueue_queue_handoffs_rolled_back_total": 0,
			} {
				v, ok := sampleOf(g, name, q)
				g.Expect(ok).To(BeTrue(), name)
				g.Expect(v).To(Equal(want), name)
			}
		}).Should(Succeed())
		Expect(k8sClient.Delete(suiteCtx, rq, client.PropagationPolicy(metav1.DeletePropagationBackground))).To(Succeed())
	})
})

// stringConsts returns the string constants of the Go files in dir whose names start with
// prefix, read from the source (so a state added there is seen here without a list to update).
func stringConsts(t *testing.T, dir, prefix string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatalf("parsing %s: %v", path, err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if !strings.HasPrefix(n.Name, prefix) || i >= len(vs.Values) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, err := strconv.Unquote(lit.Value)
						if err != nil {
							t.Fatal(err)
						}
						out[n.Name] = v
					}
				}
			}
		}
	}
	return out
}

// TestShardStatesExported checks that renderqueue_queue_shard_state has a series for every state
// status.shards[].state can hold: the queue states a keeper reports (pkg/shardapi's Status*
// constants) and those the operator sets itself (controllers/policy's State* constants), read
// from their source. A shard in a state without a series would be invisible to the alerts (every
// state series 0).
func TestShardStatesExported(t *testing.T) {
	states := stringConsts(t, filepath.Join("..", "pkg", "shardapi"), "Status")
	for k, v := range stringConsts(t, "policy", "State") {
		states[k] = v
	}
	if len(states) < 6 {
		t.Fatalf("found only %d shard states in the source: %v", len(states), states)
	}
	d := NewQueueCollector(nil, nil).d
	for name, state := range states {
		rq := &rqv1.RenderQueue{
			ObjectMeta: metav1.ObjectMeta{Namespace: "render", Name: "web"},
			Status:     rqv1.RenderQueueStatus{Shards: []rqv1.ShardStatus{{Name: "web-shard-0", State: state}}},
		}
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(oneQueue{d, rq})
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		ones := 0
		for _, mf := range mfs {
			if mf.GetName() != "renderqueue_queue_shard_state" {
				continue
			}
			for _, m := range mf.GetMetric() {
				if m.GetGauge().GetValue() == 1 {
					ones++
					if !matches(m, map[string]string{"state": state, "shard": "web-shard-0"}) {
						t.Errorf("%s (%q): the series at 1 is %v", name, state, m.GetLabel())
					}
				}
			}
		}
		if ones != 1 {
			t.Errorf("%s (%q): %d renderqueue_queue_shard_state series at 1, want 1: the state is not exported", name, state, ones)
		}
	}
}
