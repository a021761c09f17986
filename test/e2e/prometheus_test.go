//go:build e2e

package e2e

// A real Prometheus in the end-to-end test. hack/prometheus.sh starts the prometheus server (Debian's
// package, installed when missing) with the plain scrape configuration of docs/monitoring.md —
// Kubernetes service discovery of Pods, here through the local cluster's admin kubeconfig, with the
// relabelling of config/prometheus's PodMonitors — and the alert rules of config/prometheus, every
// `for:` shortened to promRulesFor. stepPrometheus starts it once the queue is ready and checks that
// the per-queue series say what the RenderQueue's status says; the server keeps running through the
// rebalance and the Pod replacements of the next steps. stepPrometheusAlerts checks that it followed
// them (every current shard Pod scraped at its current IP), then stops PostgreSQL and watches
// RenderQueueDueInexact go pending, then firing, and resolve once PostgreSQL is back. The server
// runs on until the test ends: stepOOMKill watches RenderQueueShardFailing fire for a shard whose
// keeper is OOMKilled, and stepObjectiveBurn (objectives_test.go) watches
// RenderQueueObjectiveFastBurn fire while the render workers are scaled to 0 and resolve after.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

const (
	promRulesFor = 10 * time.Second // every alert's `for:` in the e2e (PROM_RULES_FOR)
	promInterval = "1s"             // scrape and evaluation interval (PROM_INTERVAL)
	alertInexact = "RenderQueueDueInexact"
	// the job names of the scrape configuration in docs/monitoring.md
	jobOperator = "renderqueue-operator"
	jobKeepers  = "renderqueue-keepers"
)

// promAPI queries a Prometheus server's HTTP API.
type promAPI struct {
	url string
	hc  *http.Client
}

func newPromAPI(u string) promAPI {
	return promAPI{url: u, hc: &http.Client{Timeout: 10 * time.Second}}
}

// get decodes the data of the API's answer to path into data.
func (p promAPI) get(path string, data any) error {
	resp, err := p.hc.Get(p.url + path)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	var r struct {
		Status    string          `json:"status"`
		Data      json.RawMessage `json:"data"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return fmt.Errorf("GET %s: %s: decoding the answer: %w", path, resp.Status, err)
	}
	if r.Status != "success" {
		return fmt.Errorf("GET %s: %s: %s: %s", path, resp.Status, r.ErrorType, r.Error)
	}
	if err := json.Unmarshal(r.Data, data); err != nil {
		return fmt.Errorf("GET %s: decoding data: %w", path, err)
	}
	return nil
}

type promSample struct {
	Labels map[string]string
	Value  float64
}

// query evaluates expr (an instant vector) now.
func (p promAPI) query(expr string) ([]promSample, error) {
	var d struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	if err := p.get("/api/v1/query?query="+url.QueryEscape(expr), &d); err != nil {
		return nil, err
	}
	if d.ResultType != "vector" {
		return nil, fmt.Errorf("%s: result type %q, want vector", expr, d.ResultType)
	}
	out := make([]promSample, 0, len(d.Result))
	for _, r := range d.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: value %q: %w", expr, s, err)
		}
		out = append(out, promSample{Labels: r.Metric, Value: v})
	}
	return out, nil
}

// one is the value of the one series expr selects.
func (p promAPI) one(expr string) (float64, error) {
	s, err := p.query(expr)
	if err != nil {
		return 0, err
	}
	if len(s) != 1 {
		return 0, fmt.Errorf("%s: %d series, want 1", expr, len(s))
	}
	return s[0].Value, nil
}

type promAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
	ActiveAt    time.Time         `json:"activeAt"`
	Value       string            `json:"value"`
}

// alerts are the pending and firing alerts (resolved ones are not listed).
func (p promAPI) alerts() ([]promAlert, error) {
	var d struct {
		Alerts []promAlert `json:"alerts"`
	}
	err := p.get("/api/v1/alerts", &d)
	return d.Alerts, err
}

// queueAlert is the alert name of the sample queue, nil when it is inactive.
func (p promAPI) queueAlert(name string) (*promAlert, error) {
	return p.alertOf(name, namespace, queueName)
}

// alertOf is the alert name of the RenderQueue ns/rq, nil when it is inactive.
func (p promAPI) alertOf(name, ns, rq string) (*promAlert, error) {
	as, err := p.alerts()
	if err != nil {
		return nil, err
	}
	for i, a := range as {
		if a.Labels["alertname"] == name && a.Labels["namespace"] == ns && a.Labels["renderqueue"] == rq {
			return &as[i], nil
		}
	}
	return nil, nil
}

// runningProm is the API of stepPrometheus's server while it runs (ok false when it was never
// started, as when E2E_STEPS leaves the step out).
func (e *env) runningProm() (api promAPI, ok bool) {
	b, err := os.ReadFile(e.promURLFile())
	if err != nil {
		return promAPI{}, false
	}
	return newPromAPI(strings.TrimSpace(string(b))), true
}

type promTarget struct {
	Labels     map[string]string `json:"labels"`
	ScrapePool string            `json:"scrapePool"`
	ScrapeURL  string            `json:"scrapeUrl"`
	Health     string            `json:"health"`
	LastError  string            `json:"lastError"`
}

func (p promAPI) targets() ([]promTarget, error) {
	var d struct {
		ActiveTargets []promTarget `json:"activeTargets"`
	}
	err := p.get("/api/v1/targets?state=active", &d)
	return d.ActiveTargets, err
}

// promBase is where hack/prometheus.sh keeps this test's server (RENDERQUEUE_PROM_BASE), inside
// the cluster's directory.
func (e *env) promBase() string { return filepath.Join(e.c.Dir, "prometheus") }

// promURLFile holds the URL of the running server, for the steps after stepPrometheus.
func (e *env) promURLFile() string { return filepath.Join(e.promBase(), "url") }

// promScript runs hack/prometheus.sh and returns the last line of its output and its stderr. The
// binaries hack/test.sh located (RENDERQUEUE_PROMETHEUS, RENDERQUEUE_PROMTOOL) are used when set.
func (e *env) promScript(args ...string) (string, string, error) {
	cmd := exec.Command(filepath.Join(e.root, "hack", "prometheus.sh"), args...)
	cmd.Dir = e.root
	cmd.Env = append(os.Environ(), "RENDERQUEUE_PROM_BASE="+e.promBase(),
		"PROM_RULES_FOR="+promRulesFor.String(), "PROM_INTERVAL="+promInterval)
	if p := os.Getenv("RENDERQUEUE_PROMETHEUS"); p != "" {
		cmd.Env = append(cmd.Env, "PROMETHEUS="+p)
	}
	if p := os.Getenv("RENDERQUEUE_PROMTOOL"); p != "" {
		cmd.Env = append(cmd.Env, "PROMTOOL="+p)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", stderr.String(), fmt.Errorf("hack/prometheus.sh %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1]), strings.TrimSpace(stderr.String()), nil
}

// stopPrometheus stops the server of stepPrometheus if it still runs.
func (e *env) stopPrometheus() {
	if e.c == nil {
		return
	}
	if _, err := os.Stat(e.promBase()); err != nil {
		return // never started
	}
	if _, stderr, err := e.promScript("stop-all"); err != nil {
		e.t.Errorf("stopping Prometheus: %v", err)
	} else if stderr != "" {
		e.t.Log(stderr)
	}
}

// docsScrapeConfig is the scrape configuration of docs/monitoring.md's "Plain Prometheus"
// section. It returns the jobs twice: as written (to hand to Prometheus) and decoded (to check).
func docsScrapeConfig(t *testing.T, root string) ([]map[string]any, []docsJob) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "monitoring.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "### Plain Prometheus")
	if i < 0 {
		t.Fatal(`docs/monitoring.md has no section "### Plain Prometheus"`)
	}
	s = s[i:]
	j := strings.Index(s, "```yaml\n")
	if j < 0 {
		t.Fatal(`docs/monitoring.md: no yaml block in "Plain Prometheus"`)
	}
	s = s[j+len("```yaml\n"):]
	block := s[:strings.Index(s, "```")]
	var raw struct {
		ScrapeConfigs []map[string]any `json:"scrape_configs"`
	}
	var typed struct {
		ScrapeConfigs []docsJob `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal([]byte(block), &raw); err != nil {
		t.Fatalf("docs/monitoring.md, Plain Prometheus: %v\n%s", err, block)
	}
	if err := yaml.Unmarshal([]byte(block), &typed); err != nil {
		t.Fatalf("docs/monitoring.md, Plain Prometheus: %v\n%s", err, block)
	}
	return raw.ScrapeConfigs, typed.ScrapeConfigs
}

type docsJob struct {
	JobName        string `json:"job_name"`
	HonorLabels    bool   `json:"honor_labels"`
	RelabelConfigs []struct {
		SourceLabels []string `json:"source_labels"`
		TargetLabel  string   `json:"target_label"`
		Regex        string   `json:"regex"`
		Action       string   `json:"action"`
	} `json:"relabel_configs"`
}

// checkMirrorsPodMonitors fails the test unless the documented plain scrape configuration does
// what the PodMonitors of config/prometheus do: the same port, honorLabels and relabellings.
func checkMirrorsPodMonitors(t *testing.T, root string, jobs []docsJob) {
	t.Helper()
	for file, job := range map[string]string{"podmonitor-operator.yaml": jobOperator, "podmonitor-keepers.yaml": jobKeepers} {
		b, err := os.ReadFile(filepath.Join(root, "config", "prometheus", file))
		if err != nil {
			t.Fatal(err)
		}
		var pm struct {
			Spec struct {
				PodMetricsEndpoints []struct {
					Port        string `json:"port"`
					HonorLabels bool   `json:"honorLabels"`
					Relabelings []struct {
						SourceLabels []string `json:"sourceLabels"`
						TargetLabel  string   `json:"targetLabel"`
					} `json:"relabelings"`
				} `json:"podMetricsEndpoints"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(b, &pm); err != nil {
			t.Fatalf("config/prometheus/%s: %v", file, err)
		}
		var dj *docsJob
		for i := range jobs {
			if jobs[i].JobName == job {
				dj = &jobs[i]
			}
		}
		if dj == nil || len(pm.Spec.PodMetricsEndpoints) != 1 {
			t.Fatalf("docs/monitoring.md has no job %s, or config/prometheus/%s not one endpoint", job, file)
		}
		ep := pm.Spec.PodMetricsEndpoints[0]
		if ep.HonorLabels != dj.HonorLabels {
			t.Errorf("%s: honorLabels %v, docs/monitoring.md's job %s honor_labels %v", file, ep.HonorLabels, job, dj.HonorLabels)
		}
		keepsPort := false
		for _, r := range dj.RelabelConfigs {
			if r.Action == "keep" && strings.HasSuffix(r.Regex, ";"+ep.Port) {
				keepsPort = true
			}
		}
		if !keepsPort {
			t.Errorf("docs/monitoring.md's job %s does not keep the port %s of config/prometheus/%s", job, ep.Port, file)
		}
		for _, want := range ep.Relabelings {
			found := false
			for _, r := range dj.RelabelConfigs {
				found = found || (r.TargetLabel == want.TargetLabel && strings.Join(r.SourceLabels, ",") == strings.Join(want.SourceLabels, ","))
			}
			if !found {
				t.Errorf("docs/monitoring.md's job %s lacks the relabelling %v → %s of config/prometheus/%s", job, want.SourceLabels, want.TargetLabel, file)
			}
		}
	}
}

// podTargetGroup is a target group of Prometheus's HTTP service discovery.
type podTargetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// podDiscovery serves Prometheus HTTP service discovery (http_sd_configs) at /pods: the local
// cluster's Pods as Kubernetes service discovery (kubernetes_sd_configs, role pod) gives them — one
// target per container port at the Pod's IP, with its __meta_kubernetes_* labels — read from the
// API server at every refresh, of the namespaces named by the parameters `namespace` (all when
// none). It stands in for kubernetes_sd_configs, which Debian's prometheus package is built
// without, so that a scrape configuration's relabel_configs run unchanged on the same labels.
func (e *env) podDiscovery() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/pods" {
			http.NotFound(w, r)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		nss := r.URL.Query()["namespace"]
		if len(nss) == 0 {
			nss = []string{metav1.NamespaceAll}
		}
		groups := []podTargetGroup{}
		for _, ns := range nss {
			pods, err := e.c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			for i := range pods.Items {
				groups = append(groups, podTargets(&pods.Items[i])...)
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(groups)
	}))
}

// podTargets are pod's targets with the labels of Prometheus's Kubernetes service discovery
// (role pod): none before the Pod has an IP; one per container port, or one per container without
// ports.
func podTargets(pod *corev1.Pod) []podTargetGroup {
	if pod.Status.PodIP == "" {
		return nil
	}
	base := map[string]string{
		"__meta_kubernetes_namespace":     pod.Namespace,
		"__meta_kubernetes_pod_name":      pod.Name,
		"__meta_kubernetes_pod_ip":        pod.Status.PodIP,
		"__meta_kubernetes_pod_uid":       string(pod.UID),
		"__meta_kubernetes_pod_node_name": pod.Spec.NodeName,
		"__meta_kubernetes_pod_host_ip":   pod.Status.HostIP,
		"__meta_kubernetes_pod_phase":     string(pod.Status.Phase),
		"__meta_kubernetes_pod_ready":     "unknown",
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			base["__meta_kubernetes_pod_ready"] = strings.ToLower(string(c.Status))
		}
	}
	for k, v := range pod.Labels {
		base["__meta_kubernetes_pod_label_"+sanitizeLabelName(k)] = v
		base["__meta_kubernetes_pod_labelpresent_"+sanitizeLabelName(k)] = "true"
	}
	for k, v := range pod.Annotations {
		base["__meta_kubernetes_pod_annotation_"+sanitizeLabelName(k)] = v
		base["__meta_kubernetes_pod_annotationpresent_"+sanitizeLabelName(k)] = "true"
	}
	var groups []podTargetGroup
	add := func(address string, extra map[string]string) {
		l := make(map[string]string, len(base)+len(extra))
		for k, v := range base {
			l[k] = v
		}
		for k, v := range extra {
			l[k] = v
		}
		groups = append(groups, podTargetGroup{Targets: []string{address}, Labels: l})
	}
	for _, c := range pod.Spec.Containers {
		container := map[string]string{
			"__meta_kubernetes_pod_container_name":  c.Name,
			"__meta_kubernetes_pod_container_image": c.Image,
			"__meta_kubernetes_pod_container_init":  "false",
		}
		if len(c.Ports) == 0 {
			add(pod.Status.PodIP, container)
			continue
		}
		for _, p := range c.Ports {
			port := strconv.Itoa(int(p.ContainerPort))
			extra := map[string]string{
				"__meta_kubernetes_pod_container_port_name":     p.Name,
				"__meta_kubernetes_pod_container_port_number":   port,
				"__meta_kubernetes_pod_container_port_protocol": string(p.Protocol),
			}
			for k, v := range container {
				extra[k] = v
			}
			add(net.JoinHostPort(pod.Status.PodIP, port), extra)
		}
	}
	return groups
}

// sanitizeLabelName is a Kubernetes label or annotation name as Prometheus's Kubernetes service
// discovery puts it into a label name: every character other than [a-zA-Z0-9_] becomes _.
func sanitizeLabelName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			return r
		}
		return '_'
	}, s)
}

// toHTTPDiscovery replaces the kubernetes_sd_configs (role pod, optionally limited to namespaces)
// of a scrape job by http_sd_configs of sd (podDiscovery), refreshed every second. Any other
// setting of a kubernetes_sd_config fails the test rather than being dropped.
func toHTTPDiscovery(t *testing.T, job map[string]any, sd string) {
	t.Helper()
	sds, _ := job["kubernetes_sd_configs"].([]any)
	if len(sds) == 0 {
		t.Fatalf("docs/monitoring.md: job %v has no kubernetes_sd_configs", job["job_name"])
	}
	var out []any
	for _, x := range sds {
		m, _ := x.(map[string]any)
		if m["role"] != "pod" {
			t.Fatalf("docs/monitoring.md: job %v: kubernetes_sd_configs role %v: the e2e's discovery serves only role pod", job["job_name"], m["role"])
		}
		q := url.Values{}
		for k, v := range m {
			switch k {
			case "role":
			case "namespaces":
				ns, _ := v.(map[string]any)
				for nk, nv := range ns {
					names, _ := nv.([]any)
					if nk != "names" || len(names) == 0 {
						t.Fatalf("docs/monitoring.md: job %v: kubernetes_sd_configs namespaces.%s is not supported by the e2e's discovery", job["job_name"], nk)
					}
					for _, n := range names {
						q.Add("namespace", fmt.Sprint(n))
					}
				}
			default:
				t.Fatalf("docs/monitoring.md: job %v: kubernetes_sd_configs %s is not supported by the e2e's discovery", job["job_name"], k)
			}
		}
		out = append(out, map[string]any{"url": sd + "/pods?" + q.Encode(), "refresh_interval": "1s"})
	}
	delete(job, "kubernetes_sd_configs")
	job["http_sd_configs"] = out
}

// stepPrometheus starts Prometheus on the local cluster and checks that it scrapes the operator
// and every shard Pod, and that the per-queue series are the RenderQueue's status. Prometheus and
// its service discovery keep running for the later steps; cleanup (TestEndToEnd's t.Cleanup)
// registers their end.
func (e *env) stepPrometheus(t *testing.T, cleanup func(func())) {
	base := e.promBase()
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	sd := e.podDiscovery()
	cleanup(func() {
		e.stopPrometheus()
		sd.Close()
	})
	raw, jobs := docsScrapeConfig(t, e.root)
	checkMirrorsPodMonitors(t, e.root, jobs)
	for _, job := range raw {
		toHTTPDiscovery(t, job, sd.URL)
		if job["job_name"] == jobKeepers {
			// the queue's shards serve HTTPS (spec.tls): verified with the CA the operator
			// publishes and the queue's server name, as docs/monitoring.md says
			job["scheme"] = "https"
			job["tls_config"] = map[string]any{"ca_file": e.shardCAFile(t, base), "server_name": rqv1.ShardServerName(namespace, queueName)}
		}
	}
	scrapeYAML, err := yaml.Marshal(map[string]any{"scrape_configs": raw})
	if err != nil {
		t.Fatal(err)
	}
	scrape, rules := filepath.Join(base, "scrape.yaml"), filepath.Join(base, "renderqueue-alerts.yaml")
	if err := os.WriteFile(scrape, scrapeYAML, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.promScript("rules", rules); err != nil {
		t.Fatal(err)
	}
	u, stderr, err := e.promScript("start", scrape, rules)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(u, "http://127.0.0.1:") {
		t.Fatalf("hack/prometheus.sh start printed %q as its URL", u)
	}
	if err := os.WriteFile(e.promURLFile(), []byte(u), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s; %s (every for: %s), with the scrape configuration of docs/monitoring.md, Kubernetes service discovery served by the test at %s:\n%s",
		stderr, u, promRulesFor, sd.URL, scrapeYAML)
	api := newPromAPI(u)
	start := time.Now()
	e.eventually(t, 60*time.Second, time.Second, "Prometheus scraping the operator and every shard Pod", func() (bool, string) {
		return e.promTargetsMatch(api)
	})
	t.Logf("Prometheus scrapes the operator and the shards after %s", time.Since(start).Round(100*time.Millisecond))
	e.promSeriesMatch(t, api)
}

// stepPrometheusAlerts checks that Prometheus followed the shards (4 now, shard 2 in a new Pod),
// then stops PostgreSQL: RenderQueueDueInexact goes pending when the queue turns inexact, fires
// promRulesFor later, and resolves when PostgreSQL is back and the count is exact again.
// Prometheus runs on for the later steps.
func (e *env) stepPrometheusAlerts(t *testing.T) {
	api, ok := e.runningProm()
	if !ok {
		t.Fatal("no Prometheus running (stepPrometheus did not run?)")
	}
	e.eventually(t, 30*time.Second, time.Second, "Prometheus scraping the operator and every current shard Pod", func() (bool, string) {
		return e.promTargetsMatch(api)
	})
	e.promSeriesMatch(t, api)
	// The queue is exact: the alert is inactive once Prometheus has scraped and evaluated that.
	e.eventually(t, 30*time.Second, 500*time.Millisecond, alertInexact+" inactive while the queue is exact", func() (bool, string) {
		a, err := api.queueAlert(alertInexact)
		if err != nil {
			return false, err.Error()
		}
		if a != nil {
			return false, fmt.Sprintf("%s since %s", a.State, a.ActiveAt.Format("15:04:05.000"))
		}
		return e.queue().Status.DueExact, "status.dueExact false"
	})

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := e.c.Postgres.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = e.c.Postgres.Resume(context.Background())
		}
	}()
	stopped := time.Now()
	t.Logf("%s PostgreSQL stopped", stopped.Format("15:04:05.000"))

	// Every poll: the queue's exactness and the alert's state; log each change.
	state, exact := "inactive", true
	var pendingAt, firingAt time.Time
	var activeAt time.Time
	watch := func(what string, until func() bool) {
		t.Helper()
		e.eventually(t, 90*time.Second, 250*time.Millisecond, what, func() (bool, string) {
			st := e.queue().Status
			if st.DueExact != exact {
				exact = st.DueExact
				cond := "no Exact condition"
				if c := meta.FindStatusCondition(st.Conditions, rqv1.ConditionExact); c != nil {
					cond = fmt.Sprintf("Exact %s %s: %s", c.Status, c.Reason, c.Message)
				}
				t.Logf("%s +%s status.dueExact=%v (%s)", time.Now().Format("15:04:05.000"),
					time.Since(stopped).Round(100*time.Millisecond), exact, cond)
			}
			a, err := api.queueAlert(alertInexact)
			if err != nil {
				return false, err.Error()
			}
			now := "inactive"
			if a != nil {
				now = a.State
			}
			if now != state {
				line := fmt.Sprintf("%s +%s %s %s → %s", time.Now().Format("15:04:05.000"), time.Since(stopped).Round(100*time.Millisecond),
					alertInexact, state, now)
				if a != nil {
					line += fmt.Sprintf(" (activeAt %s, value %s, severity %s; summary: %s)", a.ActiveAt.Format("15:04:05.000"),
						a.Value, a.Labels["severity"], a.Annotations["summary"])
				}
				t.Log(line)
				switch {
				case now == "pending" && state == "inactive":
					pendingAt, activeAt = time.Now(), a.ActiveAt
				case now == "firing" && state == "pending":
					firingAt = time.Now()
				case now == "inactive" && state == "firing":
				default:
					t.Errorf("%s went %s → %s: want inactive → pending → firing → inactive", alertInexact, state, now)
				}
				state = now
			}
			return until(), fmt.Sprintf("alert %s, dueExact %v", state, exact)
		})
	}
	watch(alertInexact+" firing while PostgreSQL is down", func() bool { return state == "firing" })
	if pendingAt.IsZero() {
		t.Errorf("%s fired without being seen pending", alertInexact)
	}
	if firingAt.Sub(activeAt) < promRulesFor {
		t.Errorf("%s fired at %s, less than its for (%s) after it became active at %s", alertInexact,
			firingAt.Format("15:04:05.000"), promRulesFor, activeAt.Format("15:04:05.000"))
	}
	if exact {
		t.Errorf("%s fires, but status.dueExact is true", alertInexact)
	}
	if v, err := api.one(fmt.Sprintf(`renderqueue_queue_due_exact{namespace=%q, renderqueue=%q}`, namespace, queueName)); err != nil || v != 0 {
		t.Errorf("renderqueue_queue_due_exact is %v (%v) while %s fires", v, err, alertInexact)
	}
	if others, err := api.alerts(); err == nil {
		for _, a := range others {
			if a.Labels["alertname"] != alertInexact {
				t.Logf("  also %s: %s %v", a.State, a.Labels["alertname"], a.Labels)
			}
		}
	}

	if err := e.c.Postgres.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	resumed = true
	back := time.Now()
	t.Logf("%s +%s PostgreSQL back", back.Format("15:04:05.000"), back.Sub(stopped).Round(100*time.Millisecond))
	watch(alertInexact+" resolved after PostgreSQL is back", func() bool { return state == "inactive" && exact })
	t.Logf("%s resolved %s after PostgreSQL came back", alertInexact, time.Since(back).Round(100*time.Millisecond))
	e.exactAndTrue(time.Minute, 4)
	e.promSeriesMatch(t, api)
	// Prometheus keeps running: stepOOMKill watches RenderQueueShardFailing fire.
}

// promTargetsMatch reports whether Prometheus's active targets are the operator's Pod and exactly
// the sample queue's shard Pods, at their current IPs, with the labels the PodMonitors give
// (namespace, pod, renderqueue, shard), all up.
func (e *env) promTargetsMatch(api promAPI) (bool, string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods, err := e.c.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: rqv1.LabelQueue + "=" + queueName})
	if err != nil {
		return false, err.Error()
	}
	want := map[string]string{} // shard Pod → scrape address
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.PodIP != "" {
			want[p.Name] = p.Status.PodIP + ":8080"
		}
	}
	op := e.operatorPod()
	ts, err := api.targets()
	if err != nil {
		return false, err.Error()
	}
	var problems []string
	got := map[string]string{}
	operators := 0
	for _, tg := range ts {
		u, err := url.Parse(tg.ScrapeURL)
		if err != nil {
			return false, err.Error()
		}
		if tg.Health != "up" {
			problems = append(problems, fmt.Sprintf("%s %s is %s (%s)", tg.ScrapePool, tg.ScrapeURL, tg.Health, tg.LastError))
		}
		switch tg.ScrapePool {
		case jobOperator:
			operators++
			if u.Host != op.Status.PodIP+":8080" {
				problems = append(problems, fmt.Sprintf("operator target %s, but the operator Pod is at %s", tg.ScrapeURL, op.Status.PodIP))
			}
		case jobKeepers:
			l := tg.Labels
			got[l["pod"]] = u.Host
			if l["namespace"] != namespace || l["renderqueue"] != queueName || l["shard"] != l["pod"] {
				problems = append(problems, fmt.Sprintf("keeper target %s has the labels %v", tg.ScrapeURL, l))
			}
		default:
			problems = append(problems, "unexpected target "+tg.ScrapePool+" "+tg.ScrapeURL)
		}
	}
	if operators != 1 {
		problems = append(problems, fmt.Sprintf("%d operator targets, want 1", operators))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		problems = append(problems, fmt.Sprintf("keeper targets %v, shard Pods %v", got, want))
	}
	return len(problems) == 0, strings.Join(problems, "; ")
}

// promSeriesMatch waits until, in one sample, Prometheus's per-queue series (the operator's) are
// the RenderQueue's status — due, due_exact, desired/current/ready shards, the Exact condition, each
// shard's due, exactness and edge — and each shard's own renderqueue_keeper_due (scraped from its
// Pod, labelled by the relabelling) is the due the status shows for it. It logs the matching sample.
func (e *env) promSeriesMatch(t *testing.T, api promAPI) {
	t.Helper()
	sel := fmt.Sprintf(`namespace=%q, renderqueue=%q`, namespace, queueName)
	var report string
	e.eventually(t, 30*time.Second, time.Second, "Prometheus's series to match the RenderQueue's status", func() (bool, string) {
		rq := e.queue()
		st := &rq.Status
		exact := meta.FindStatusCondition(st.Conditions, rqv1.ConditionExact)
		if st.DueAsOf == nil || exact == nil {
			return false, "the status has no due count or no Exact condition yet"
		}
		b2f := func(b bool) float64 {
			if b {
				return 1
			}
			return 0
		}
		var lines, problems []string
		for _, c := range []struct {
			expr string
			want float64
		}{
			{fmt.Sprintf(`renderqueue_queue_due{%s}`, sel), float64(st.Due)},
			{fmt.Sprintf(`renderqueue_queue_due_exact{%s}`, sel), b2f(st.DueExact)},
			{fmt.Sprintf(`renderqueue_queue_shards_desired{%s}`, sel), float64(rq.Spec.Shards)},
			{fmt.Sprintf(`renderqueue_queue_shards_current{%s}`, sel), float64(st.CurrentShards)},
			{fmt.Sprintf(`renderqueue_queue_shards_ready{%s}`, sel), float64(st.ReadyShards)},
			{fmt.Sprintf(`renderqueue_queue_condition{%s, condition="Exact", status=%q}`, sel, exact.Status), 1},
		} {
			v, err := api.one(c.expr)
			if err != nil {
				problems = append(problems, err.Error())
				continue
			}
			lines = append(lines, fmt.Sprintf("%s = %g", c.expr, v))
			if v != c.want {
				problems = append(problems, fmt.Sprintf("%s = %g, status says %g", c.expr, v, c.want))
			}
		}
		perShard := func(metric string) map[string]promSample {
			s, err := api.query(fmt.Sprintf(`%s{%s}`, metric, sel))
			if err != nil {
				problems = append(problems, err.Error())
			}
			m := map[string]promSample{}
			for _, x := range s {
				m[x.Labels["shard"]] = x
			}
			return m
		}
		edges := perShard("renderqueue_queue_shard_edge_timestamp_seconds")
		shardDue := perShard("renderqueue_queue_shard_due")
		shardExact := perShard("renderqueue_queue_shard_exact")
		keeperDue := perShard("renderqueue_keeper_due")
		if len(shardDue) != len(st.Shards) || len(keeperDue) != len(st.Shards) {
			problems = append(problems, fmt.Sprintf("%d shards in the status, %d in renderqueue_queue_shard_due, %d in renderqueue_keeper_due",
				len(st.Shards), len(shardDue), len(keeperDue)))
		}
		shards := append([]rqv1.ShardStatus(nil), st.Shards...)
		sort.Slice(shards, func(i, j int) bool { return shards[i].Name < shards[j].Name })
		for _, sh := range shards {
			edge, hasEdge := edges[sh.Name]
			switch {
			case sh.Edge == nil && hasEdge:
				problems = append(problems, fmt.Sprintf("%s: edge series %g, status has no edge", sh.Name, edge.Value))
			case sh.Edge != nil && !hasEdge:
				problems = append(problems, fmt.Sprintf("%s: no edge series, status edge %s", sh.Name, sh.Edge.UTC().Format(time.RFC3339)))
			case sh.Edge != nil && math.Abs(edge.Value-float64(sh.Edge.UnixNano())/1e9) > 1e-3:
				problems = append(problems, fmt.Sprintf("%s: edge series %s, status edge %s", sh.Name,
					time.Unix(0, int64(edge.Value*1e9)).UTC().Format(time.RFC3339Nano), sh.Edge.UTC().Format(time.RFC3339)))
			}
			if d, ok := shardDue[sh.Name]; !ok || d.Value != float64(sh.Due) {
				problems = append(problems, fmt.Sprintf("%s: renderqueue_queue_shard_due %v, status due %d", sh.Name, d.Value, sh.Due))
			}
			if x, ok := shardExact[sh.Name]; !ok || x.Value != b2f(sh.Exact) {
				problems = append(problems, fmt.Sprintf("%s: renderqueue_queue_shard_exact %v, status exact %v", sh.Name, x.Value, sh.Exact))
			}
			k, ok := keeperDue[sh.Name]
			if !ok || k.Value != float64(sh.Due) || k.Labels["pod"] != sh.Name {
				problems = append(problems, fmt.Sprintf("%s: renderqueue_keeper_due %v (labels %v), status due %d", sh.Name, k.Value, k.Labels, sh.Due))
			}
			edgeText := "none"
			if sh.Edge != nil {
				edgeText = fmt.Sprintf("%.0f (%s)", edge.Value, sh.Edge.UTC().Format(time.RFC3339))
			}
			lines = append(lines, fmt.Sprintf("%s: queue_shard_due %g, keeper_due %g, shard_exact %g, edge %s",
				sh.Name, shardDue[sh.Name].Value, k.Value, shardExact[sh.Name].Value, edgeText))
		}
		report = fmt.Sprintf("status: due %d, dueExact %v, shards %d/%d/%d, Exact %s\n  %s", st.Due, st.DueExact,
			rq.Spec.Shards, st.CurrentShards, st.ReadyShards, exact.Status, strings.Join(lines, "\n  "))
		return len(problems) == 0, strings.Join(problems, "; ")
	})
	t.Logf("Prometheus's series match the RenderQueue's status:\n%s", report)
}
