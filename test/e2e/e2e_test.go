//go:build e2e

// Package e2e is renderqueue's end-to-end test on a one-node cluster of real components (package
// cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the kubelet with
// containerd and runc, kube-proxy, CoreDNS), a throwaway PostgreSQL and real kubectl. Every Pod
// runs the image `make image` builds — the operator Deployment of config/default, applied as
// shipped, and the shard Pods it creates — and a HorizontalPodAutoscaler reads renderqueue_due
// through the aggregator and the metrics API's Service (kube-proxy).
//
// Run it with `make e2e` (or `go test -tags e2e ./test/e2e/...` with KUBEBUILDER_ASSETS set; without
// it the test runs hack/setup-envtest.sh, which builds the binaries once). It needs root.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/test/e2e/cluster"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/wait"
)

const (
	namespace     = "default"
	queueName     = "web" // config/samples
	operatorNS    = "renderqueue-system"
	overlayNS     = "platform-rq" // config/samples/namespace's (TestChaosTLS installs there)
	helmNS        = "rq-helm"     // TestChaos installs the Helm chart there
	operatorSA    = "renderqueue-operator"
	metricsAPISvc = "renderqueue-metrics-api"
	seedRows      = 20000
	seedOverdue   = 600
	workers       = "render-workers"
	hpaTarget     = 4 // the HPA's target is set so that the due count asks for this many workers
)

// TestMain gives controller-runtime's logger a sink before the tests' clients use it (without
// one, the first use prints a stack trace into the test's output); what they log is not read.
func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

// repoRoot is the repository root (the test runs in test/e2e).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatalf("repository root: %v", err)
	}
	return root
}

// assets returns KUBEBUILDER_ASSETS, running hack/setup-envtest.sh when it is not set.
func assets(t *testing.T) string {
	t.Helper()
	if a := os.Getenv("KUBEBUILDER_ASSETS"); a != "" {
		return a
	}
	t.Log("KUBEBUILDER_ASSETS not set: running hack/setup-envtest.sh (builds the control plane binaries once, ~10 min on 2 cores)")
	cmd := exec.Command(filepath.Join(repoRoot(t), "hack", "setup-envtest.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/setup-envtest.sh: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// kustomizeObjects renders dir with the assets' kubectl and decodes every object.
func kustomizeObjects(t *testing.T, kubectl, dir string) []*unstructured.Unstructured {
	t.Helper()
	out, err := exec.Command(kubectl, "kustomize", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, out)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decoding the output of kubectl kustomize %s: %v", dir, err)
		}
		if m == nil {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs
}

// TestKustomizeDefault renders config/default with the built kubectl and checks it installs the
// whole operator into renderqueue-system: CRD, RBAC, the Deployment (restricted security
// context) and the metrics API component, with the Service selecting the operator's Pods.
func TestKustomizeDefault(t *testing.T) {
	kubectl := filepath.Join(assets(t), "kubectl")
	objs := kustomizeObjects(t, kubectl, filepath.Join(repoRoot(t), "config", "default"))
	byKind := map[string][]*unstructured.Unstructured{}
	for _, o := range objs {
		byKind[o.GetKind()] = append(byKind[o.GetKind()], o)
		if ns := o.GetNamespace(); ns != "" && ns != operatorNS {
			t.Errorf("%s %s is in namespace %q, want %s", o.GetKind(), o.GetName(), ns, operatorNS)
		}
	}
	find := func(kind, name string) *unstructured.Unstructured {
		for _, o := range byKind[kind] {
			if o.GetName() == name {
				return o
			}
		}
		t.Errorf("config/default has no %s %s", kind, name)
		return nil
	}
	find("Namespace", operatorNS)
	find("CustomResourceDefinition", "renderqueues.renderqueue.dev")
	find("ServiceAccount", operatorSA)
	find("ClusterRole", "renderqueue-operator")
	find("ClusterRoleBinding", "renderqueue-operator")
	find("APIService", "v1beta1.external.metrics.k8s.io")
	find("ClusterRole", "renderqueue-metrics-api-auth-reader")
	find("ClusterRoleBinding", "renderqueue-metrics-api-auth-reader")
	dep := find("Deployment", "renderqueue-operator")
	svc := find("Service", metricsAPISvc)
	if dep == nil || svc == nil {
		return
	}
	var d struct {
		Spec struct {
			Template struct {
				Metadata struct{ Labels map[string]string }
				Spec     corev1.PodSpec
			}
		}
	}
	b, _ := json.Marshal(dep.Object)
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("decoding the Deployment: %v", err)
	}
	c := d.Spec.Template.Spec.Containers[0]
	if !strings.Contains(strings.Join(c.Args, " "), "--metrics-api") {
		t.Errorf("operator args %q do not turn the metrics API on", c.Args)
	}
	sc := c.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
		sc.Capabilities == nil || len(sc.Capabilities.Drop) == 0 {
		t.Errorf("operator container security context is not restricted: %+v", sc)
	}
	for _, e := range c.Env {
		if e.Name == "RENDERQUEUE_IMAGE" && e.Value != c.Image {
			t.Errorf("RENDERQUEUE_IMAGE %q differs from the operator image %q (shards would run another image)", e.Value, c.Image)
		}
	}
	sel, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
	if len(sel) == 0 {
		t.Errorf("Service %s has no selector", metricsAPISvc)
	}
	for k, v := range sel {
		if d.Spec.Template.Metadata.Labels[k] != v {
			t.Errorf("Service %s selects %s=%s, which the operator's Pods (labels %v) do not carry", metricsAPISvc, k, v, d.Spec.Template.Metadata.Labels)
		}
	}
}

// env is the running stack of TestEndToEnd.
type env struct {
	t    *testing.T
	root string
	bin  string
	c    *cluster.Cluster
	k8s  client.Client
	// images are the images the node runs (BuildImages).
	images *cluster.Images
	// wave is the wave of stepForecastWaveStart, in flight until stepForecastWave.
	wave *waveRun

	mu      sync.Mutex
	failure string // the first failure recorded (fail), repeated as the test's last line
}

// fail records msg, with the name of the test that failed, as the first failure unless one is.
// A failed test's last line repeats it: the process logs dumped on failure (dumpLogs) come after
// the message and would bury it far from the end of the output, where a CI summary shows it.
func (e *env) fail(t *testing.T, msg string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failure == "" {
		e.failure = t.Name() + ": " + msg
	}
}

// fatalf is t.Fatalf, recording the message (fail).
func (e *env) fatalf(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	e.fail(t, msg)
	t.Fatal(msg)
}

// errorf is t.Errorf, recording the message (fail).
func (e *env) errorf(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	e.fail(t, msg)
	t.Error(msg)
}

// eventually polls cond every interval until it reports true, failing the test after timeout
// with the last reason cond gave (recorded: fail).
func (e *env) eventually(t *testing.T, timeout, interval time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	if err := wait.Poll(context.Background(), timeout, interval, what, func(context.Context) (bool, string, error) {
		ok, why := cond()
		return ok, why, nil
	}); err != nil {
		e.fatalf(t, "%v", err)
	}
}

// runSteps runs steps as subtests of t in order, stopping at the first that fails.
//
// E2E_STEPS (comma-separated step names) runs only those steps, for working on one: the steps
// build on each other (seed, install and ready first), so it is for development, not a test.
func (e *env) runSteps(t *testing.T, steps []envStep) {
	t.Helper()
	only := os.Getenv("E2E_STEPS")
	for _, s := range steps {
		if only != "" && !slices.Contains(strings.Split(only, ","), s.name) {
			continue
		}
		if !t.Run(s.name, func(st *testing.T) { e.t = st; s.run(st) }) {
			e.t = t
			// a failure the step did not record: name the step at least
			e.fail(t, fmt.Sprintf("step %s failed; its message is in its --- FAIL block above", s.name))
			t.Fatalf("step %s failed; stopping", s.name)
		}
		e.t = t
	}
}

// envStep is one step of runSteps.
type envStep struct {
	name string
	run  func(t *testing.T)
}

// kubectl runs kubectl and fails the test on error.
func (e *env) kubectl(args ...string) string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := e.c.Kubectl(ctx, nil, args...)
	if err != nil {
		e.fatalf(e.t, "%v\n%s", err, out)
	}
	return out
}

// consistently polls cond every interval for d, failing the test as soon as it reports false
// (recorded: fail).
func (e *env) consistently(t *testing.T, d, interval time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if ok, why := cond(); !ok {
			e.fatalf(t, "%s: broke: %s", what, why)
		}
		time.Sleep(interval)
	}
}

func (e *env) queue() *rqv1.RenderQueue {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rq rqv1.RenderQueue
	if err := e.k8s.Get(ctx, client.ObjectKey{Namespace: namespace, Name: queueName}, &rq); err != nil {
		e.fatalf(e.t, "reading RenderQueue %s: %v", queueName, err)
	}
	return &rq
}

// sqlDue is the true due count: rows due at or before the database's now.
func (e *env) sqlDue() int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, e.c.Postgres.DSN)
	if err != nil {
		e.fatalf(e.t, "connecting to PostgreSQL: %v", err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	var n int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM render_schedule WHERE due_at <= now()`).Scan(&n); err != nil {
		e.fatalf(e.t, "counting due rows: %v", err)
	}
	return n
}

func (e *env) sql(q string) int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, e.c.Postgres.DSN)
	if err != nil {
		e.fatalf(e.t, "connecting to PostgreSQL: %v", err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	tag, err := conn.Exec(ctx, q)
	if err != nil {
		e.fatalf(e.t, "%s: %v", q, err)
	}
	return tag.RowsAffected()
}

// exactAndTrue waits until the queue reports an exact due count equal to the SQL count, with
// wantShards ready shards and the membership settled.
func (e *env) exactAndTrue(timeout time.Duration, wantShards int) {
	e.t.Helper()
	want := e.sqlDue()
	e.eventually(e.t, timeout, 500*time.Millisecond, fmt.Sprintf("RenderQueue exact with due=%d and %d ready shards", want, wantShards), func() (bool, string) {
		rq := e.queue()
		st := rq.Status
		why := fmt.Sprintf("due=%d dueExact=%v ready=%d/%d handoff=%s conditions=%s", st.Due, st.DueExact, st.ReadyShards, st.CurrentShards, handoffState(&st.Membership), conds(st.Conditions))
		return st.DueExact && st.Due == want && int(st.ReadyShards) == wantShards && int(st.CurrentShards) == wantShards &&
			!st.Membership.HandoffInProgress(), why
	})
}

func conds(cs []metav1.Condition) string {
	parts := make([]string, 0, len(cs))
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	return strings.Join(parts, "; ")
}

func (e *env) hpa() *autoscalingv2.HorizontalPodAutoscaler {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := e.c.Client.AutoscalingV2().HorizontalPodAutoscalers(namespace).Get(ctx, workers, metav1.GetOptions{})
	if err != nil {
		e.fatalf(e.t, "reading the HPA: %v", err)
	}
	return h
}

func (e *env) workerReplicas() int32 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := e.c.Client.AppsV1().Deployments(namespace).Get(ctx, workers, metav1.GetOptions{})
	if err != nil {
		e.fatalf(e.t, "reading the worker Deployment: %v", err)
	}
	if d.Spec.Replicas == nil {
		return 1
	}
	return *d.Spec.Replicas
}

func hpaCondition(h *autoscalingv2.HorizontalPodAutoscaler, typ autoscalingv2.HorizontalPodAutoscalerConditionType) *autoscalingv2.HorizontalPodAutoscalerCondition {
	for i := range h.Status.Conditions {
		if h.Status.Conditions[i].Type == typ {
			return &h.Status.Conditions[i]
		}
	}
	return nil
}

func hpaSummary(h *autoscalingv2.HorizontalPodAutoscaler) string {
	var cs []string
	for _, c := range h.Status.Conditions {
		cs = append(cs, fmt.Sprintf("%s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	var ms []string
	for _, m := range h.Status.CurrentMetrics {
		if m.External != nil {
			v := "-"
			if m.External.Current.AverageValue != nil {
				v = m.External.Current.AverageValue.String()
			}
			ms = append(ms, m.External.Metric.Name+" avg "+v)
		}
	}
	return fmt.Sprintf("current=%d desired=%d metrics=[%s] conditions=[%s]", h.Status.CurrentReplicas, h.Status.DesiredReplicas,
		strings.Join(ms, ","), strings.Join(cs, "; "))
}

// metricPath is the external metric's URL path for the sample queue.
func metricPath(metric string) string {
	return fmt.Sprintf("/apis/external.metrics.k8s.io/v1beta1/namespaces/%s/%s?labelSelector=%s",
		namespace, metric, url.QueryEscape("renderqueue.dev/name="+queueName))
}

// skipUnlessRunnable skips the test where the end-to-end tests cannot run (-short, not root).
func skipUnlessRunnable(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("e2e: skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("e2e: needs root (a real node: containerd, the kubelet, network namespaces, iptables; docs/local-cluster.md)")
	}
}

// built is what the tests that start a cluster share: the renderqueue binary and the images the
// node imports.
type built struct {
	bin    string
	images *cluster.Images
}

// buildCache builds them once per test binary: hack/images.sh takes seconds even with everything
// cached (binaries linked, four archives written), and the sources do not change while the tests
// run.
type buildCache struct {
	once sync.Once
	b    built
	err  error
}

// builds is the test binary's buildCache.
var builds buildCache

// get builds the images (hack/images.sh) on its first call and returns them on every call, with
// the binary the tests run on this machine: the renderqueue image's own (E2E_BINARY: another).
func (c *buildCache) get(root, assets string, logf func(string, ...any)) (built, error) {
	c.once.Do(func() {
		if c.b.images, c.err = cluster.BuildImages(context.Background(), root, assets, logf); c.err != nil {
			c.err = fmt.Errorf("building the images: %w", c.err)
			return
		}
		c.b.bin = c.b.images.Binary
		if b := os.Getenv("E2E_BINARY"); b != "" {
			if c.b.bin, c.err = filepath.Abs(b); c.err != nil {
				return
			}
			logf("using E2E_BINARY=%s", c.b.bin)
		}
	})
	return c.b, c.err
}

// startEnv builds the images (the binary is the renderqueue image's; E2E_BINARY: another) and
// starts the local cluster with its PostgreSQL, skipping the test where it cannot run
// (skipUnlessRunnable). The node imports the images hack/images.sh builds and the OCI archives in
// extraImages. The cluster is stopped when t ends, after the containers' logs were printed if t
// failed.
func startEnv(t *testing.T, extraImages ...string) *env {
	t.Helper()
	skipUnlessRunnable(t)
	root := repoRoot(t)
	as := assets(t)
	work := t.TempDir()
	e := &env{t: t, root: root}
	logf := func(format string, args ...any) { t.Logf(format, args...) }

	// 1. The binary and the images every Pod runs, built by the first test that starts a cluster
	// and reused by the others (builds, TestMain).
	b, err := builds.get(root, as, logf)
	if err != nil {
		t.Fatal(err)
	}
	e.bin, e.images = b.bin, b.images
	t.Logf("binary %s; images %s, %s, %s, %s", e.bin, e.images.Renderqueue, e.images.Sandbox, e.images.CoreDNS, e.images.Probe)
	help, _ := exec.Command(e.bin, "operator", "--help").CombinedOutput()
	if !strings.Contains(string(help), "-keeper-image") {
		t.Skipf("e2e: `renderqueue operator` is not available yet:\n%s", help)
	}
	if !strings.Contains(string(help), "-metrics-api-secure-port") {
		t.Fatalf("e2e: `renderqueue operator` has no --metrics-api flags (the external metrics API):\n%s", help)
	}
	ctx := context.Background()

	// 2. The stack.
	var componentLog io.Writer
	if os.Getenv("E2E_VERBOSE") != "" {
		componentLog = os.Stderr
	}
	c, err := cluster.Start(ctx, cluster.Options{
		Repo: root, Assets: as, Dir: filepath.Join(work, "cluster"),
		Images: append(slices.Clone(e.images.Archives), extraImages...), SandboxImage: e.images.Sandbox, CoreDNSImage: e.images.CoreDNS,
		WaitForNode: true, Logf: logf, ComponentLog: componentLog,
	})
	if err != nil {
		t.Fatalf("starting the local cluster: %v", err)
	}
	e.c = c
	var kept *podLogKeeper
	if dir := os.Getenv("RENDERQUEUE_E2E_LOG_DIR"); dir != "" && c.Node != nil {
		if kept, err = keepPodLogs(dir, c.Node.LogFiles, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		t.Logf("the containers' logs are copied to %s as they are written (RENDERQUEUE_E2E_LOG_DIR)", dir)
	}
	t.Cleanup(func() {
		if kept != nil {
			kept.Stop()
		}
		if !t.Failed() {
			c.Stop()
			return
		}
		e.dumpLogs()
		c.Stop()
		e.mu.Lock()
		defer e.mu.Unlock()
		t.Logf("%s failed; the first failure: %s", t.Name(), or(e.failure, "not recorded: see the first --- FAIL block above"))
	})
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := rqv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if e.k8s, err = client.New(c.RESTConfig, client.Options{Scheme: scheme}); err != nil {
		t.Fatalf("building a client: %v", err)
	}
	return e
}

// TestEndToEnd is the user's day with real parts; see the package documentation.
func TestEndToEnd(t *testing.T) {
	e := startEnv(t)
	e.runSteps(t, []envStep{
		{"seed", e.stepSeed},
		{"install", e.stepInstall},
		{"ready", e.stepReady},
		{"prometheus", func(st *testing.T) { e.stepPrometheus(st, t.Cleanup) }}, // runs until the test ends
		{"describe", e.stepDescribe},
		{"kubectl-renderqueue", e.stepPlugin},
		{"hpa", e.stepHPA},
		{"scale-to-4", e.stepScale},
		{"kill-keeper", e.stepKillKeeper},
		{"delete-pod", e.stepDeletePod},
		{"exec-port-forward-logs", e.stepExecPortForwardLogs},
		{"prometheus-alerts", e.stepPrometheusAlerts},
		{"console", e.stepConsole},
		{"postgres-outage", e.stepPostgresOutage},
		// the wave comes due while the next steps run; forecast-wave checks how it was met
		{"forecast-wave-start", func(st *testing.T) { e.stepForecastWaveStart(st, t.Cleanup) }},
		{"missing-secret", e.stepMissingSecret},
		{"bad-dsn", e.stepBadDSN},
		{"scheduling", e.stepScheduling},
		{"oom-kill", e.stepOOMKill},
		{"dns-worker", e.stepDNSWorker},
		{"workers", e.stepWorkers},
		{"objective-burn", e.stepObjectiveBurn},
		{"forecast-wave", e.stepForecastWave},
	})
}

// stepSeed migrates the schema and seeds rows, then clears the band of rows due between 10
// minutes ago and 3 hours ahead, so the true due count stays put while the test runs (rows
// becoming due between two samples would make "exact" unverifiable).
func (e *env) stepSeed(t *testing.T) {
	dsn := e.c.Postgres.DSN
	for _, args := range [][]string{
		{"schema", "migrate", "--dsn", dsn},
		{"seed", "--dsn", dsn, "--rows", fmt.Sprint(seedRows), "--overdue", fmt.Sprint(seedOverdue), "--progress", "0"},
	} {
		out, err := exec.Command(e.bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("renderqueue %s: %v\n%s", args[0], err, out)
		}
		t.Logf("renderqueue %s: %s", args[0], strings.TrimSpace(string(out)))
	}
	moved := e.sql(`UPDATE render_schedule SET due_at = now() + interval '3 hours'
		WHERE due_at > now() - interval '10 minutes' AND due_at <= now() + interval '3 hours'`)
	due := e.sqlDue()
	t.Logf("moved %d rows out of the band around now; %d rows due", moved, due)
	if due == 0 {
		t.Fatal("no rows are due after seeding")
	}
}

// stepInstall installs renderqueue as a user does: kubectl apply --server-side -k of
// config/default as shipped (the operator Deployment with leader election and the metrics API, a
// container of the image on the node, under its ServiceAccount) with the shipped config/console
// component and its token Secret, then the store Secret and config/samples; it waits for the
// operator's rollout. The console is installed here rather than by stepConsole, so that the
// steps before it do not see the operator rolled.
func (e *env) stepInstall(t *testing.T) {
	e.kubectl("create", "namespace", operatorNS)
	e.ensureConsoleToken(t)
	out := e.kubectl("apply", "--server-side", "-k", consoleOverlay(t, e.root))
	t.Logf("kubectl apply --server-side -k (config/default + config/console):\n%s", out)
	e.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/renderqueues.renderqueue.dev")
	// The shard Pods reach PostgreSQL over TCP (their /tmp is an emptyDir: the socket directory
	// is not there), as they would reach a database server in a cluster.
	e.kubectl("-n", namespace, "create", "secret", "generic", "renderqueue-db", "--from-literal=dsn="+e.c.Postgres.PodDSN)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := e.c.Kubectl(ctx, nil, "-n", operatorNS, "rollout", "status", "deployment/renderqueue-operator", "--timeout=150s"); err != nil {
		t.Fatalf("the operator did not roll out: %v\n%s\n%s", err, out, e.kubectl("-n", operatorNS, "get", "pods", "-o", "wide"))
	}
	op := e.operatorPod()
	t.Logf("operator rolled out in %s: pod %s, IP %s, node %s", time.Since(start).Round(100*time.Millisecond), op.Name, op.Status.PodIP, op.Spec.NodeName)
	out = e.kubectl("apply", "-k", samplesWithTLS(t, e.root))
	t.Logf("kubectl apply -k config/samples (with spec.tls OperatorIssued): %s", strings.TrimSpace(out))
}

// operatorPod is the operator Deployment's one Pod.
func (e *env) operatorPod() *corev1.Pod {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods, err := e.c.Client.CoreV1().Pods(operatorNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=operator"})
	if err != nil {
		e.fatalf(e.t, "listing the operator Pods: %v", err)
	}
	var live []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	if len(live) != 1 {
		e.fatalf(e.t, "%d operator Pods, want 1", len(live))
	}
	return &live[0]
}

// stepReady waits for the sample queue to be Ready and exact, with the SQL count.
func (e *env) stepReady(t *testing.T) {
	start := time.Now()
	e.kubectl("wait", "--for=condition=Ready", "--timeout=120s", "renderqueue/"+queueName)
	t.Logf("RenderQueue Ready after %s", time.Since(start).Round(100*time.Millisecond))
	e.exactAndTrue(90*time.Second, 3)
	t.Logf("RenderQueue exact after %s", time.Since(start).Round(100*time.Millisecond))
	e.checkShardsServeTLS(t)
	t.Logf("kubectl get renderqueues:\n%s", e.kubectl("get", "renderqueues"))
	t.Logf("kubectl get pods -A -o wide:\n%s", e.kubectl("get", "pods", "-A", "-o", "wide"))
	if op := e.operatorPod(); op.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the operator Pod restarted %d times:\n%s", op.Status.ContainerStatuses[0].RestartCount,
			e.kubectl("-n", operatorNS, "logs", op.Name, "--previous", "--tail=30"))
	}
}

// stepDescribe checks kubectl describe shows the conditions and every shard.
func (e *env) stepDescribe(t *testing.T) {
	out := e.kubectl("describe", "renderqueue", queueName)
	t.Logf("kubectl describe renderqueue %s:\n%s", queueName, out)
	for _, want := range []string{"Conditions:", "Ready", "Exact", "EdgeHealthy", "WalksComplete", "Progressing",
		queueName + "-shard-0", queueName + "-shard-1", queueName + "-shard-2", "Due Exact:"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl describe does not show %q", want)
		}
	}
}

// stepHPA reads the metric through the aggregator, then points an HPA at it and waits for its
// scaling decision.
func (e *env) stepHPA(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := e.c.WaitAPIServiceAvailable(ctx, "external.metrics.k8s.io", "v1beta1", 60*time.Second); err != nil {
		t.Fatal(err)
	}
	// Available through the Service: its EndpointSlice lists the operator Pod's IP.
	op := e.operatorPod()
	slices := e.kubectl("-n", operatorNS, "get", "endpointslices", "-l", "kubernetes.io/service-name="+metricsAPISvc,
		"-o", "jsonpath={.items[*].endpoints[*].addresses[*]}")
	if !strings.Contains(" "+slices+" ", " "+op.Status.PodIP+" ") {
		t.Fatalf("the EndpointSlices of Service %s list %q, not the operator Pod's IP %s", metricsAPISvc, slices, op.Status.PodIP)
	}
	t.Logf("APIService v1beta1.external.metrics.k8s.io Available through Service %s → EndpointSlice → operator Pod %s", metricsAPISvc, op.Status.PodIP)
	due := e.sqlDue()
	var raw string
	e.eventually(t, 30*time.Second, 500*time.Millisecond, "renderqueue_due through the aggregator", func() (bool, string) {
		out, err := e.c.Kubectl(ctx, nil, "get", "--raw", metricPath("renderqueue_due"))
		raw = out
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(out, fmt.Sprintf(`"value":"%d"`, due)), out
	})
	t.Logf("kubectl get --raw %s:\n%s", metricPath("renderqueue_due"), raw)

	target := int64(math.Ceil(float64(due) / hpaTarget))
	manifest := fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  replicas: 1
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
      containers:
      - {name: worker, image: %[5]q}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: %[1]s}
  minReplicas: 1
  maxReplicas: 10
  metrics:
  - type: External
    external:
      metric:
        name: renderqueue_due
        selector: {matchLabels: {renderqueue.dev/name: %[3]s}}
      target: {type: AverageValue, averageValue: "%[4]d"}
`, workers, namespace, queueName, target, e.images.Sandbox)
	out, err := e.c.Kubectl(ctx, []byte(manifest), "apply", "-f", "-")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("HPA %s: renderqueue_due target averageValue %d (due %d → %d workers)", workers, target, due, hpaTarget)
	// The decision (4 workers), then a status that shows the value: the HPA's first status after
	// a rescale still averages over the replicas it had, so wait for the one after.
	wantAvg := due * 1000 / hpaTarget // milli-units per worker
	e.eventually(t, 60*time.Second, time.Second, "the HPA to scale the workers on renderqueue_due and show the value", func() (bool, string) {
		h := e.hpa()
		active := hpaCondition(h, autoscalingv2.ScalingActive)
		if h.Status.DesiredReplicas != hpaTarget || h.Status.CurrentReplicas != hpaTarget || e.workerReplicas() != hpaTarget ||
			active == nil || active.Status != corev1.ConditionTrue || len(h.Status.CurrentMetrics) == 0 {
			return false, hpaSummary(h)
		}
		m := h.Status.CurrentMetrics[0].External
		if m == nil || m.Metric.Name != "renderqueue_due" || m.Current.AverageValue == nil {
			return false, hpaSummary(h)
		}
		got := m.Current.AverageValue.MilliValue()
		return got >= wantAvg-1 && got <= wantAvg+1, fmt.Sprintf("average %dm, want %dm; %s", got, wantAvg, hpaSummary(h))
	})
	t.Logf("kubectl describe hpa %s:\n%s", workers, e.kubectl("describe", "hpa", workers))
}

// stepScale scales the queue 3 → 4 with kubectl scale, sampling status against the SQL count (no
// writes meanwhile) until the rebalance has settled. A sample that claims an exact count must
// have the true count, always. The two-phase handoff promises more: the true count at every
// sample, flagged exact or not; a sample that misses it fails the test too.
func (e *env) stepScale(t *testing.T) {
	want := e.sqlDue()
	e.kubectl("scale", "renderqueue", queueName, "--replicas=4")
	type sample struct {
		n         int
		due       int64
		exact     bool
		epoch     int64
		handoff   string
		condition string
	}
	var samples, inexact []sample
	var wrong []sample // due != SQL count while flagged inexact
	sawRebalancing := false
	e.eventually(t, 3*time.Minute, 250*time.Millisecond, "the rebalance to 4 shards to settle", func() (bool, string) {
		st := e.queue().Status
		s := sample{n: len(samples) + 1, due: st.Due, exact: st.DueExact, epoch: st.Membership.Epoch, handoff: handoffState(&st.Membership)}
		if c := meta.FindStatusCondition(st.Conditions, rqv1.ConditionExact); c != nil {
			s.condition = fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
		}
		samples = append(samples, s)
		if st.DueExact && st.Due != want {
			t.Fatalf("sample %d claims an exact count %d, but SQL counts %d (epoch %d, handoff %s; Exact: %s)", s.n, st.Due, want, s.epoch, s.handoff, s.condition)
		}
		if !st.DueExact {
			inexact = append(inexact, s)
			if st.Due != want {
				wrong = append(wrong, s)
			}
		}
		if c := meta.FindStatusCondition(st.Conditions, rqv1.ConditionProgressing); c != nil && c.Reason == rqv1.ReasonRebalancing {
			sawRebalancing = true
		}
		why := fmt.Sprintf("current=%d ready=%d handoff=%s exact=%v", st.CurrentShards, st.ReadyShards, handoffState(&st.Membership), st.DueExact)
		return st.CurrentShards == 4 && st.ReadyShards == 4 && !st.Membership.HandoffInProgress() && st.DueExact, why
	})
	t.Logf("rebalance 3→4: %d samples against SQL count %d; every exact sample had it; %d samples flagged inexact, %d of them with another due; Rebalancing seen: %v",
		len(samples), want, len(inexact), len(wrong), sawRebalancing)
	for _, s := range wrong {
		t.Logf("  sample %d: due %d (SQL %d), dueExact false, epoch %d, handoff %s; Exact: %s", s.n, s.due, want, s.epoch, s.handoff, s.condition)
	}
	if len(wrong) > 0 {
		// the two-phase handoff keeps every slot counted once through the commit (membership.SumDue
		// takes a moved slot from its prepared receiver until the receiver adopts the commit)
		t.Errorf("status.due left the true count %d in %d of %d samples during the rebalance", want, len(wrong), len(samples))
	}
	e.exactAndTrue(30*time.Second, 4)
	t.Logf("kubectl get renderqueues:\n%s", e.kubectl("get", "renderqueues"))
}

// stepKillKeeper kills one shard's keeper process (SIGKILL to the container's process); the
// kubelet restarts the container, the Pod comes back Ready and the count is exact again.
func (e *env) stepKillKeeper(t *testing.T) {
	pod := queueName + "-shard-1"
	before := e.pod(t, namespace, pod)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pid, err := e.c.Node.KillContainer(ctx, namespace, pod, "", syscall.SIGKILL)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("killed %s (pid %d, %s)", pod, pid, before.Status.PodIP)
	e.eventually(t, 60*time.Second, 250*time.Millisecond, pod+" restarted and Ready", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p, err := e.c.Client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ready := false
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				ready = c.Status == corev1.ConditionTrue
			}
		}
		restarts := int32(0)
		if len(p.Status.ContainerStatuses) > 0 {
			restarts = p.Status.ContainerStatuses[0].RestartCount
		}
		return ready && restarts >= 1 && p.UID == before.UID, fmt.Sprintf("ready=%v restarts=%d", ready, restarts)
	})
	e.exactAndTrue(90*time.Second, 4)
	t.Logf("kubectl get pods:\n%s", e.kubectl("get", "pods", "-l", "renderqueue.dev/queue="+queueName))
}

// stepDeletePod deletes a shard Pod: the kubelet stops its containers, the operator creates the
// Pod again (a new UID), the scheduler binds it, the kubelet starts it, and the count is exact
// again.
func (e *env) stepDeletePod(t *testing.T) {
	pod := queueName + "-shard-2"
	before := e.pod(t, namespace, pod)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	pid, err := e.c.Node.ContainerPID(ctx, namespace, pod, "")
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	e.kubectl("delete", "pod", pod, "--wait=true")
	t.Logf("deleted pod %s (uid %s)", pod, before.UID)
	e.eventually(t, 90*time.Second, 250*time.Millisecond, pod+" recreated, running and Ready", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		got, err := e.c.Client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if got.UID == before.UID {
			return false, "still the deleted Pod"
		}
		for _, c := range got.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, "not Ready yet"
	})
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("the keeper process of the deleted Pod (pid %d) is still running", pid)
	}
	e.exactAndTrue(90*time.Second, 4)
}

// stepPostgresOutage stops PostgreSQL: the shards turn inexact, renderqueue_due becomes an
// error and the HPA holds its replicas; when PostgreSQL returns everything recovers.
func (e *env) stepPostgresOutage(t *testing.T) {
	want := e.sqlDue()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	replicas := e.workerReplicas()
	if err := e.c.Postgres.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = e.c.Postgres.Resume(context.Background())
		}
	}()
	t.Log("PostgreSQL stopped")
	e.eventually(t, 60*time.Second, 500*time.Millisecond, "the queue to turn inexact", func() (bool, string) {
		st := e.queue().Status
		c := meta.FindStatusCondition(st.Conditions, rqv1.ConditionExact)
		return !st.DueExact && c != nil && c.Status == metav1.ConditionFalse, conds(st.Conditions)
	})
	t.Logf("kubectl describe renderqueue (PostgreSQL down):\n%s", e.kubectl("describe", "renderqueue", queueName))
	e.eventually(t, 30*time.Second, 500*time.Millisecond, "renderqueue_due to fail", func() (bool, string) {
		out, err := e.c.Kubectl(ctx, nil, "get", "--raw", metricPath("renderqueue_due"))
		if err == nil {
			return false, "still served: " + out
		}
		t.Logf("renderqueue_due while inexact: %v", err)
		return true, ""
	})
	e.eventually(t, 60*time.Second, time.Second, "the HPA to report it cannot get the metric", func() (bool, string) {
		h := e.hpa()
		c := hpaCondition(h, autoscalingv2.ScalingActive)
		return c != nil && c.Status == corev1.ConditionFalse && strings.Contains(c.Reason, "FailedGet"), hpaSummary(h)
	})
	e.consistently(t, 10*time.Second, time.Second, "the HPA holding the workers", func() (bool, string) {
		h := e.hpa()
		n := e.workerReplicas()
		return n == replicas, fmt.Sprintf("workers %d → %d; %s", replicas, n, hpaSummary(h))
	})
	t.Logf("kubectl describe hpa (PostgreSQL down):\n%s", e.kubectl("describe", "hpa", workers))
	if err := e.c.Postgres.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	resumed = true
	t.Log("PostgreSQL back")
	if got := e.sqlDue(); got != want {
		t.Fatalf("the outage changed the true due count: %d → %d", want, got)
	}
	e.exactAndTrue(2*time.Minute, 4)
	e.eventually(t, 60*time.Second, time.Second, "the HPA to read the metric again", func() (bool, string) {
		h := e.hpa()
		c := hpaCondition(h, autoscalingv2.ScalingActive)
		return c != nil && c.Status == corev1.ConditionTrue && e.workerReplicas() == replicas, hpaSummary(h)
	})
}

// dumpLogs prints the tails of every container's log (the operator's and the shards', each
// instance's) after a failure, as the kubelet wrote them.
func (e *env) dumpLogs() {
	t := e.t
	if e.c == nil || e.c.Node == nil {
		return
	}
	for _, f := range e.c.Node.LogFiles() {
		b, _ := os.ReadFile(f.Path)
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		n := 20
		if f.Namespace == operatorNS || f.Namespace == overlayNS || f.Namespace == helmNS {
			n = 60
		}
		if len(lines) > n {
			lines = lines[len(lines)-n:]
		}
		t.Logf("pod %s/%s container %s log %s, last lines:\n%s", f.Namespace, f.Pod, f.Container, f.Path, strings.Join(lines, "\n"))
	}
	t.Logf("control plane and node logs: %s", e.c.LogDir())
}

// pod gets a Pod from the API.
func (e *env) pod(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := e.c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting Pod %s/%s: %v", ns, name, err)
	}
	return p
}

// handoffState names the state of the membership's last handoff ("none" before the first).
func handoffState(ms *rqv1.MembershipStatus) string {
	if ms.Handoff == nil {
		return "none"
	}
	return string(ms.Handoff.State)
}
