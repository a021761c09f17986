package monitoring

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/renderqueue/renderqueue/pkg/buildinfo"
	"github.com/renderqueue/renderqueue/pkg/keeper"
	"github.com/renderqueue/renderqueue/pkg/keeper/shardmetrics"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store/memstore"
)

// EnvPrometheus names the variable holding the prometheus server's path (hack/test.sh sets it).
const EnvPrometheus = "RENDERQUEUE_PROMETHEUS"

func prometheusServer(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(EnvPrometheus); p != "" {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("%s=%s: %v", EnvPrometheus, p, err)
		}
		return p
	}
	if p, err := exec.LookPath("prometheus"); err == nil {
		return p
	}
	t.Skipf("prometheus is not installed and %s is not set: run `make test` (hack/test.sh installs it) or "+
		"`export %s=$(hack/prometheus.sh prometheus | tail -n 1)`", EnvPrometheus, EnvPrometheus)
	return ""
}

// promAPI queries a Prometheus server's HTTP API.
type promAPI struct {
	t   *testing.T
	url string
}

func (p promAPI) get(path string, v any) error {
	resp, err := http.Get(p.url + path)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// query returns the value of the one series expr selects, and whether there is exactly one.
func (p promAPI) query(expr string) (float64, bool, error) {
	var r struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := p.get("/api/v1/query?query="+url.QueryEscape(expr), &r); err != nil {
		return 0, false, err
	}
	if len(r.Data.Result) != 1 {
		return 0, false, nil
	}
	s, _ := r.Data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	return v, err == nil, err
}

// alertState returns the state (pending, firing) of the alert named name, "" when inactive.
func (p promAPI) alertState(name string) (string, error) {
	var r struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := p.get("/api/v1/alerts", &r); err != nil {
		return "", err
	}
	for _, a := range r.Data.Alerts {
		if a.Labels["alertname"] == name {
			return a.State, nil
		}
	}
	return "", nil
}

// eventually polls cond every 200 ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v (last: %s)", what, timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestThrowawayPrometheus runs a real Prometheus with hack/prometheus.sh (as the end-to-end test
// does): it scrapes a real keeper shard's /metrics and evaluates the alert rules, with every
// `for:` shortened. The keeper's series arrive with their values, and the keeper-side alert
// (lateness) and the operator-absent alert fire.
func TestThrowawayPrometheus(t *testing.T) {
	prom := prometheusServer(t)
	tool := promtool(t)
	ctx := context.Background()

	// A keeper shard over an in-memory store: 200 rows of cadence 1 h, due 3 h ago (relative
	// lateness 3) and 100 due in the future.
	st := memstore.New(memstore.Options{})
	now := time.Now()
	var rows []schedule.Row
	for i := range 300 {
		due := now.Add(-3 * time.Hour)
		if i >= 200 {
			due = now.Add(2 * time.Hour)
		}
		rows = append(rows, schedule.Row{Key: fmt.Sprintf("https://example.com/%d", i), Due: due, HasDue: true, Cadence: time.Hour, Route: "page"})
	}
	if _, err := st.Upsert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	sh, err := keeper.NewShard(keeper.Options{Name: "web-shard-0", Store: st, Log: logr.Discard(), Metrics: shardmetrics.New(reg)},
		keeper.Settings{Window: 24 * time.Hour, VerifyInterval: time.Hour, LeaseDuration: time.Minute,
			SubmittedBoost: 2, UrgentMaxShare: 0.2, Owned: schedule.AllSlots()})
	if err != nil {
		t.Fatal(err)
	}
	if rep := sh.Walk(ctx, true); rep.Failed || rep.Partial {
		t.Fatalf("walk %+v", rep)
	}
	reg.MustRegister(keeper.NewStatusCollector(sh), buildinfo.NewCollector("keeper", buildinfo.Read("test")))
	target := httptest.NewServer(sh.Handler(keeper.HandlerOptions{Gatherer: reg}))
	t.Cleanup(target.Close)

	dir := t.TempDir()
	scrape := filepath.Join(dir, "scrape.yaml")
	// the labels config/prometheus's PodMonitor gives a shard Pod's series
	cfg := fmt.Sprintf(`scrape_configs:
  - job_name: keepers
    static_configs:
      - targets: [%q]
        labels: {namespace: render, renderqueue: web, shard: web-shard-0, pod: web-shard-0}
`, strings.TrimPrefix(target.URL, "http://"))
	if err := os.WriteFile(scrape, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	rules := filepath.Join(dir, "renderqueue-alerts.yaml")
	run(t, repo, filepath.Join("hack", "prometheus.sh"), "rules", rules)

	env := append(os.Environ(), "PROMETHEUS="+prom, "PROMTOOL="+tool, "PROM_RULES_FOR=2s",
		"PROM_INTERVAL=500ms", "RENDERQUEUE_PROM_BASE="+filepath.Join(dir, "servers"))
	start := exec.Command(filepath.Join("hack", "prometheus.sh"), "start", scrape, rules)
	start.Dir, start.Env, start.Stderr = repo, env, os.Stderr
	out, err := start.Output()
	if err != nil {
		t.Fatalf("hack/prometheus.sh start: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	api := promAPI{t: t, url: lines[len(lines)-1]}
	t.Cleanup(func() {
		stop := exec.Command(filepath.Join("hack", "prometheus.sh"), "stop", api.url)
		stop.Dir, stop.Env = repo, env
		if b, err := stop.CombinedOutput(); err != nil {
			t.Errorf("hack/prometheus.sh stop: %v\n%s", err, b)
		}
	})
	if !strings.HasPrefix(api.url, "http://127.0.0.1:") {
		t.Fatalf("hack/prometheus.sh start printed %q", out)
	}

	status := sh.Status(time.Now())
	eventually(t, 30*time.Second, "the shard's due count in Prometheus", func() (bool, string) {
		v, ok, err := api.query(`renderqueue_keeper_due{namespace="render", renderqueue="web", shard="web-shard-0"}`)
		return ok && v == float64(status.Due), fmt.Sprintf("%v %v %v, want %d", v, ok, err, status.Due)
	})
	if status.Due != 200 {
		t.Fatalf("the shard counts %d due rows, want 200", status.Due)
	}
	eventually(t, 30*time.Second, "the edge as a timestamp", func() (bool, string) {
		v, ok, err := api.query(`renderqueue_keeper_edge_timestamp_seconds{renderqueue="web"} - time()`)
		return ok && v > 23*3600 && v <= 24*3600, fmt.Sprintf("%v %v %v", v, ok, err)
	})
	for _, alert := range []string{"RenderQueueLatenessHigh", "RenderQueueOperatorMetricsAbsent"} {
		eventually(t, 60*time.Second, alert+" firing", func() (bool, string) {
			state, err := api.alertState(alert)
			return state == "firing", fmt.Sprintf("state %q, %v", state, err)
		})
	}
	if state, err := api.alertState("RenderQueueEdgeLagging"); err != nil || state != "" {
		t.Errorf("RenderQueueEdgeLagging is %q (%v) with the edge 24 h ahead", state, err)
	}
}
