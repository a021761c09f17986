package statusview

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

func cannedQueue(t *testing.T) Queue {
	t.Helper()
	var s1 shardapi.Status
	if err := json.Unmarshal([]byte(canned), &s1); err != nil {
		t.Fatal(err)
	}
	s1.Coming.ByHour = []int{310, 290, 0, 120, 800, 1600, 40, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 900}
	s0 := s1
	s0.Shard, s0.Due, s0.Exact, s0.Status = "web-shard-0", 10, false, shardapi.StatusUnready
	behind := -90.0
	s0.EdgeAheadSeconds = &behind
	wk := *s1.LastWalk
	wk.Partial, wk.UnreadSegments = true, 2
	s0.LastWalk = &wk
	s0.Lateness.P99Relative = 0.1
	s0.Coming.ByHour = make([]int, 24)
	s0.Coming.ByHour[5] = 1600
	s0.Error = "walk partial: 2 segments unread"
	return Queue{
		RenderQueue: &rqv1.RenderQueue{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
			Status:     rqv1.RenderQueueStatus{Due: 4221, DueExact: false, ReadyShards: 2},
		},
		Shards: []ShardRead{
			{Name: "web-shard-0", State: "unready", Status: &s0},
			{Name: "web-shard-1", State: "queued", Status: &s1},
			{Name: "web-shard-2", State: "Pending", Err: errors.New("the server is currently unable to handle the request")},
		},
		Now: s1.AsOf,
	}
}

const wantQueue = `renderqueue default/web: 3 shards (2 ready), due ≥ 4,221 (a lower bound: not every shard is reachable and exact)
  (due as the operator last polled the shards; the rows below are each shard's own figures, read now)
  SHARD        STATE    EXACT  DUE    EDGE AHEAD     LAST WALK                      P99 LATE/CADENCE
  web-shard-0  unready  NO     ≥ 10   LAGGING 1m30s  19m57s ago PARTIAL (2 unread)  0.10
  web-shard-1  queued   yes    4,211  23h20m         19m57s ago                     0.90
  web-shard-2  pending  -      -      -              -                              -
  ! web-shard-0: walk partial: 2 segments unread
  ! web-shard-2: the server is currently unable to handle the request
  coming due by hour (held rows, 2 of 3 shards): 5,665 in 24h, peak 3,200/h
    ▁▁ ▁▂█▁     ▁          ▃
    now                 +24h
`

func TestWriteQueueCanned(t *testing.T) {
	var b strings.Builder
	if err := WriteQueue(&b, cannedQueue(t)); err != nil {
		t.Fatal(err)
	}
	if b.String() != wantQueue {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), wantQueue)
	}
}

func TestWriteQueueJSON(t *testing.T) {
	var b strings.Builder
	if err := WriteQueueJSON(&b, cannedQueue(t)); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Namespace, Name string
		Due             int64
		DueExact        bool
		Shards          []struct {
			Name   string
			Status *shardapi.Status
			Error  string
		}
	}
	if err := json.Unmarshal([]byte(b.String()), &got); err != nil {
		t.Fatalf("%v in:\n%s", err, b.String())
	}
	if got.Namespace != "default" || got.Name != "web" || got.Due != 4221 || got.DueExact || len(got.Shards) != 3 {
		t.Fatalf("got %+v", got)
	}
	if s := got.Shards[1]; s.Name != "web-shard-1" || s.Status == nil || s.Status.Due != 4211 || s.Error != "" {
		t.Errorf("shard 1: %+v", s)
	}
	if s := got.Shards[2]; s.Status != nil || s.Error != "the server is currently unable to handle the request" {
		t.Errorf("shard 2: %+v", s)
	}
	for _, key := range []string{`"dueExact": false`, `"status": null`, "\n  \"shards\": ["} {
		if !strings.Contains(b.String(), key) {
			t.Errorf("missing %q in:\n%s", key, b.String())
		}
	}
	if s := got.Shards[0]; s.Error != "" || s.Status == nil || s.Status.Error == "" {
		t.Errorf("shard 0: the error of a shard read is in its status, not beside it: %+v", s)
	}
}

func TestSpark(t *testing.T) {
	for in, want := range map[string]string{"0 0": "  ", "1 8": "▁█", "8 4 1 0": "█▄▁ ", "100 1": "█▁"} {
		var counts []int
		for _, f := range strings.Fields(in) {
			var n int
			if err := json.Unmarshal([]byte(f), &n); err != nil {
				t.Fatal(err)
			}
			counts = append(counts, n)
		}
		if got := Spark(counts); got != want {
			t.Errorf("Spark(%s) = %q, want %q", in, got, want)
		}
	}
}

// TestLoadQueueThroughTheAPIServer reads a RenderQueue from a real API server. Its shard Pods do
// not exist (envtest runs no kubelet), so the Pod proxy answers each with an error, which the view
// shows per shard instead of failing; the proxy path itself is exercised by the e2e.
func TestLoadQueueThroughTheAPIServer(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set: run `make test` or `export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)`")
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "..", "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	scheme := runtime.NewScheme()
	if err := rqv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	k, err := crclient.New(cfg, crclient.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rq := &rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: rqv1.RenderQueueSpec{Shards: 2, Store: rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "db"}}}}
	if err := k.Create(ctx, rq); err != nil {
		t.Fatal(err)
	}
	rq.Status.Shards = []rqv1.ShardStatus{{Name: "web-shard-0", State: "queued", URL: "http://10.244.0.7:8080"}, {Name: "web-shard-1", State: "Pending"}}
	rq.Status.Due = 12
	if err := k.Status().Update(ctx, rq); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadQueue(ctx, cfg, "default", "nope", time.Second); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("a missing RenderQueue: %v", err)
	}
	q, err := LoadQueue(ctx, cfg, "default", "web", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Shards) != 2 || q.Shards[0].Name != "web-shard-0" || q.Shards[0].Err == nil || q.Shards[1].Err == nil {
		t.Fatalf("shards %+v: want both, each with the proxy's error", q.Shards)
	}
	if !strings.Contains(q.Shards[0].Err.Error(), "/api/v1/namespaces/default/pods/web-shard-0:8080/proxy/v1/status") {
		t.Errorf("shard 0 was not asked through the Pod proxy: %v", q.Shards[0].Err)
	}
	var b strings.Builder
	if err := WriteQueue(&b, q); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"renderqueue default/web: 2 shards (0 ready), due ≥ 12", "web-shard-1  pending", "! web-shard-0: GET "} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("missing %q in:\n%s", s, b.String())
		}
	}
	b.Reset()
	if err := WriteQueueJSON(&b, q); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`"namespace": "default"`, `"name": "web"`, `"name": "web-shard-1"`} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("missing %q in:\n%s", s, b.String())
		}
	}
}

func TestPodProxyURL(t *testing.T) {
	const host = "https://api.example:6443/"
	for _, c := range []struct {
		url  string
		tls  bool
		want string
	}{
		{"http://10.0.0.7:8080", false, "web-shard-0:8080"},
		{"https://10.0.0.7:8080", false, "https:web-shard-0:8080"},
		{"https://[fd00::7]:9443", true, "https:web-shard-0:9443"},
		{"http://10.0.0.7:8080", true, "web-shard-0:8080"}, // a shard not yet replaced after TLS was turned on
		{"", false, "web-shard-0:8080"},
		{"", true, "https:web-shard-0:8080"},
	} {
		got := podProxyURL(host, "team-a", rqv1.ShardStatus{Name: "web-shard-0", URL: c.url}, c.tls)
		if want := "https://api.example:6443/api/v1/namespaces/team-a/pods/" + c.want + "/proxy"; got != want {
			t.Errorf("podProxyURL(%q, tls %v) = %s, want %s", c.url, c.tls, got, want)
		}
	}
}

// TestWriteQueueForecast: status.forecast as one line under the summary, its lower bounds with
// their reasons.
func TestWriteQueueForecast(t *testing.T) {
	q := cannedQueue(t)
	q.RenderQueue.Status.Forecast = &rqv1.ForecastStatus{AsOf: metav1.NewTime(time.Date(2026, 12, 6, 9, 30, 5, 0, time.UTC)),
		Horizons: []rqv1.ForecastHorizon{{Horizon: "15m", Due: 4300, Exact: true}, {Horizon: "1h", Due: 5100, Exact: true},
			{Horizon: "24h", Due: 9886, Reason: "shard(s) web-shard-1 do not hold all their rows due within 24h (the edge of the window is nearer)"}}}
	var b strings.Builder
	if err := WriteQueue(&b, q); err != nil {
		t.Fatal(err)
	}
	want := "  due within 15m 4,300, 1h 5,100, 24h ≥ 9,886 (as of 09:30:05)\n" +
		"    lower bounds: 24h: shard(s) web-shard-1 do not hold all their rows due within 24h (the edge of the window is nearer)\n"
	if !strings.Contains(b.String(), want) {
		t.Errorf("got:\n%s\nwant it to contain:\n%s", b.String(), want)
	}
}

// TestWriteQueueObjectives: one line per objective of status.objectives.
func TestWriteQueueObjectives(t *testing.T) {
	q := cannedQueue(t)
	q.RenderQueue.Status.Objectives = []rqv1.ObjectiveStatus{
		{Name: "hourly", Window: metav1.Duration{Duration: 672 * time.Hour}, Good: 118406, Late: 912, Attainment: "99.24%",
			BudgetRemaining: "23.56%", BurnRate1h: "0.4", BurnRate6h: "1.12", Met: true},
		{Name: "daily", Window: metav1.Duration{Duration: 24 * time.Hour}, Met: true},
	}
	var b strings.Builder
	if err := WriteQueue(&b, q); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"  objective hourly: 99.24% good of 119,318 over 672h0m0s, met, budget left 23.56%, burn 1h 0.4, 6h 1.12\n",
		"  objective daily: no events yet over 24h0m0s, met\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("got:\n%s\nwant it to contain:\n%s", b.String(), want)
		}
	}
}
