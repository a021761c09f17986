package controllers

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// BenchmarkManyQueues runs the operator as it runs in a cluster (its RBAC, its cache options, its
// defaults: a shard poll interval of 10 s, DefaultMaxConcurrentReconciles) against a real
// kube-apiserver and etcd (envtest) with BENCH_QUEUES RenderQueues (default 500) of one shard
// each. No kubelet runs: a test-side stand-in marks the shard Pods Ready, and one HTTP server
// stands in for every shard's /v1/status (fakeShard, reading the RenderQueue from the operator's
// cache, so it costs the API server nothing). It measures, in order:
//
//   - settle-s: from the first RenderQueue created to every one Ready at its generation;
//   - the idle phase: after a warm-up of BENCH_WARMUP_SECONDS (default 20), nothing changes for
//     BENCH_IDLE_SECONDS (default 60); idle-req/queue/min is what the operator's client sent to
//     the API server in that window (every request, watches included, counted by a
//     rest.Config.Wrap round tripper), per RenderQueue and minute; reconciles/queue/min is
//     controller-runtime's count;
//   - memory after the idle phase, after a GC: heap-MB is the Go heap in use (HeapInuse) and
//     rss-MB the resident set (VmRSS) of the whole test process, which holds the operator and
//     the test's own stand-ins (its cache of the shard Pods and RenderQueues, a few MB);
//     maxrss-MB is the process's peak so far (VmHWM);
//   - the change phase: BENCH_CHANGES spec changes (default 300; spec.verifyWalkRate, which
//     changes no Pod) at BENCH_CHANGE_RATE a second (default 5) to random RenderQueues; the
//     latency of each is from just before the patch is sent to the test's informer seeing
//     status.observedGeneration reach the new generation (p50-ms, p99-ms, max-ms);
//     change-req/queue/min and req/change count the operator's requests over that phase;
//   - the same changes (to the other RenderQueues) once the shards of BENCH_HANGING RenderQueues
//     (default 10, 2% of 500; 0 skips this phase) answer nothing until the poll's timeout, as
//     shards on a node that is gone (hang-p50-ms, hang-p99-ms, hang-max-ms); and how often each
//     RenderQueue was reconciled meanwhile (hang-reconciles/queue/min: 6 when the 10 s poll
//     interval is kept).
//
// The breakdown of the requests by verb and resource and the load average are logged. The
// benchmark runs its scenario once whatever b.N is; run it with -benchtime 1x:
//
//	go test -run '^$' -bench BenchmarkManyQueues -benchtime 1x -timeout 30m ./controllers/
func BenchmarkManyQueues(b *testing.B) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		b.Skip("KUBEBUILDER_ASSETS is not set: no kube-apiserver/etcd to run the operator against " +
			"(export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1))")
	}
	opts := manyQueuesOptions{
		queues:     benchEnvInt(b, "BENCH_QUEUES", 500, 1),
		namespaces: 10,
		warmup:     time.Duration(benchEnvInt(b, "BENCH_WARMUP_SECONDS", 20, 0)) * time.Second,
		idle:       time.Duration(benchEnvInt(b, "BENCH_IDLE_SECONDS", 60, 1)) * time.Second,
		changes:    benchEnvInt(b, "BENCH_CHANGES", 300, 1),
		hanging:    benchEnvInt(b, "BENCH_HANGING", 10, 0),
		changeRate: float64(benchEnvInt(b, "BENCH_CHANGE_RATE", 5, 1)),
	}
	b.StopTimer() // the figures are the reported metrics, not the time of one "op"
	runManyQueues(b, opts)
}

// manyQueuesOptions are BenchmarkManyQueues' parameters.
type manyQueuesOptions struct {
	queues, namespaces int
	warmup, idle       time.Duration
	changes            int
	hanging            int     // RenderQueues whose shards hang in the second change phase
	changeRate         float64 // changes a second
}

// benchEnvInt is the whole number in the environment variable name, def when unset; at least
// least.
func benchEnvInt(b *testing.B, name string, def, least int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < least {
		b.Fatalf("%s=%q: want a whole number of at least %d", name, v, least)
	}
	return n
}

func runManyQueues(b *testing.B, o manyQueuesOptions) {
	b.Logf("%d cores, load average %s", runtime.NumCPU(), loadAverage())
	defer func() { b.Logf("load average after: %s", loadAverage()) }()
	logf.SetLogger(logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		b.Fatal(err)
	}
	if err := rqv1.AddToScheme(scheme); err != nil {
		b.Fatal(err)
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	adminCfg, err := env.Start()
	if err != nil {
		b.Fatalf("starting envtest: %v", err)
	}
	defer func() {
		if err := env.Stop(); err != nil {
			b.Errorf("stopping envtest: %v", err)
		}
	}()
	admin, err := client.New(adminCfg, client.Options{Scheme: scheme})
	if err != nil {
		b.Fatal(err)
	}

	// the operator: its user, with its RBAC, no client-side rate limit (as ctrl.GetConfig sets it
	// up in a cluster), every request counted
	opCfg, err := bindOperatorUser(ctx, env, admin, filepath.Join("..", "config", "rbac", "role.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	opCfg = rest.CopyConfig(opCfg)
	opCfg.QPS, opCfg.Burst = -1, 0
	requests := &requestCounter{}
	opCfg.Wrap(requests.wrap)

	mgr, err := ctrl.NewManager(opCfg, ctrl.Options{
		Scheme:     scheme,
		Cache:      CacheOptions(),
		Metrics:    metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		b.Fatal(err)
	}
	shards := &sharedFakeShards{reader: mgr.GetCache(), shards: map[string]*fakeShard{}}
	shards.srv = httptest.NewServer(shards)
	defer shards.srv.Close()
	rec := &RenderQueueReconciler{
		Client:          mgr.GetClient(),
		Scheme:          mgr.GetScheme(),
		Recorder:        mgr.GetEventRecorder("renderqueue-operator"),
		KeeperImage:     testImage,
		ResolveShardURL: shards.resolve,
	}
	if rec.Metrics, err = NewMetrics(prometheus.NewRegistry()); err != nil {
		b.Fatal(err)
	}
	if err := rec.SetupWithManager(mgr); err != nil {
		b.Fatal(err)
	}

	// the test's side: a cache of the shard Pods (for the kubelet) and the RenderQueues (to
	// see their status), through the admin's own connection, not counted
	testCache, err := cache.New(adminCfg, cache.Options{Scheme: scheme, ByObject: map[client.Object]cache.ByObject{
		&corev1.Pod{}: {Label: ChildSelector()},
	}})
	if err != nil {
		b.Fatal(err)
	}
	cached, err := client.New(adminCfg, client.Options{Scheme: scheme, Cache: &client.CacheOptions{Reader: testCache}})
	if err != nil {
		b.Fatal(err)
	}
	watcher := &generationWatcher{pending: map[types.NamespacedName]pendingChange{}}
	inf, err := testCache.GetInformer(ctx, &rqv1.RenderQueue{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    watcher.seen,
		UpdateFunc: func(_, obj any) { watcher.seen(obj) },
	}); err != nil {
		b.Fatal(err)
	}
	if _, err := testCache.GetInformer(ctx, &corev1.Pod{}); err != nil {
		b.Fatal(err)
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		if err := mgr.Start(ctx); err != nil {
			b.Errorf("the manager stopped: %v", err)
		}
	})
	wg.Go(func() {
		if err := testCache.Start(ctx); err != nil {
			b.Errorf("the test's cache stopped: %v", err)
		}
	})
	if !testCache.WaitForCacheSync(ctx) {
		b.Fatal("the test's cache did not sync")
	}
	kubelet := &fakeKubelet{c: cached, every: time.Second}
	wg.Go(func() { kubelet.run(ctx) })

	// the RenderQueues, spread over namespaces
	start := time.Now()
	keys := make([]types.NamespacedName, o.queues)
	for i := range keys {
		keys[i] = types.NamespacedName{Namespace: fmt.Sprintf("bench-%d", i%o.namespaces), Name: fmt.Sprintf("q-%03d", i)}
	}
	for i := range o.namespaces {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%d", i)}}
		if err := admin.Create(ctx, ns); err != nil {
			b.Fatal(err)
		}
	}
	if err := createConcurrently(ctx, admin, keys, 4); err != nil {
		b.Fatal(err)
	}
	b.Logf("created %d RenderQueues in %s", len(keys), time.Since(start).Round(time.Millisecond))
	if err := waitSettled(ctx, cached, keys, 10*time.Minute); err != nil {
		b.Fatalf("%v (after %s)", err, time.Since(start).Round(time.Second))
	}
	settle := time.Since(start)
	b.Logf("every RenderQueue Ready after %s; %d API requests so far", settle.Round(time.Millisecond), requests.total())

	// idle: nothing changes
	time.Sleep(o.warmup)
	idle0, rec0 := requests.snapshot(), readReconcileStats(b)
	time.Sleep(o.idle) // the measurement window
	idle1, rec1 := requests.snapshot(), readReconcileStats(b)
	idleMin := o.idle.Minutes()
	idleReq := float64(idle1.total() - idle0.total())
	b.Logf("idle for %s: %s", o.idle, idle1.minus(idle0))
	b.Logf("idle reconciles: %s", rec1.minus(rec0))

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, maxRSS := procStatusKB("VmRSS"), procStatusKB("VmHWM")

	// changes, every shard answering
	gens, err := generations(ctx, admin, keys)
	if err != nil {
		b.Fatal(err)
	}
	healthy := measureChanges(ctx, b, "healthy", admin, watcher, requests, keys, gens, o.changes, o.changeRate)

	// changes while the shards of some RenderQueues hang until the poll's timeout
	var hanging changePhase
	if o.hanging > 0 {
		hung := keys[:min(o.hanging, len(keys)-1)]
		for _, k := range hung {
			if err := shards.set(k, func(f *fakeShard) { f.hang = true }); err != nil {
				b.Fatal(err)
			}
		}
		time.Sleep(2 * DefaultPollInterval) // every hung RenderQueue polled at least once more
		hanging = measureChanges(ctx, b, "hanging", admin, watcher, requests, keys[len(hung):], gens, o.changes, o.changeRate)
	}

	b.ReportMetric(settle.Seconds(), "settle-s")
	b.ReportMetric(idleReq/float64(o.queues)/idleMin, "idle-req/queue/min")
	b.ReportMetric(float64(rec1.total-rec0.total)/float64(o.queues)/idleMin, "reconciles/queue/min")
	b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MB")
	b.ReportMetric(float64(rss)/1024, "rss-MB")
	b.ReportMetric(float64(maxRSS)/1024, "maxrss-MB")
	healthy.report(b, "", o.queues)
	if o.hanging > 0 {
		hanging.report(b, "hang-", o.queues)
	}
}

// changePhase is what measureChanges measured.
type changePhase struct {
	latencies  []time.Duration // sorted
	requests   int64
	reconciles float64
	duration   time.Duration
}

func (p changePhase) report(b *testing.B, prefix string, queues int) {
	b.ReportMetric(durationMS(quantile(p.latencies, 0.50)), prefix+"p50-ms")
	b.ReportMetric(durationMS(quantile(p.latencies, 0.99)), prefix+"p99-ms")
	b.ReportMetric(durationMS(quantile(p.latencies, 1)), prefix+"max-ms")
	if prefix == "" {
		b.ReportMetric(float64(p.requests)/float64(queues)/p.duration.Minutes(), "change-req/queue/min")
		b.ReportMetric(float64(p.requests)/float64(len(p.latencies)), "req/change")
	} else {
		b.ReportMetric(p.reconciles/float64(queues)/p.duration.Minutes(), prefix+"reconciles/queue/min")
	}
}

// measureChanges runs changeSpecs on keys and counts the operator's requests and reconciles
// meanwhile.
func measureChanges(ctx context.Context, b *testing.B, name string, c client.Client, w *generationWatcher, requests *requestCounter,
	keys []types.NamespacedName, gens map[types.NamespacedName]int64, n int, rate float64) changePhase {
	req0, rec0 := requests.snapshot(), readReconcileStats(b)
	start := time.Now()
	lat, err := changeSpecs(ctx, c, w, keys, gens, n, rate)
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	p := changePhase{latencies: lat, duration: time.Since(start)}
	req1, rec1 := requests.snapshot(), readReconcileStats(b)
	p.requests = req1.total() - req0.total()
	p.reconciles = rec1.total - rec0.total
	slices.Sort(p.latencies)
	b.Logf("%s: %d changes in %s: p50 %s, p99 %s, max %s; %s", name, n, p.duration.Round(time.Millisecond),
		quantile(lat, 0.5).Round(time.Millisecond), quantile(lat, 0.99).Round(time.Millisecond),
		quantile(lat, 1).Round(time.Millisecond), req1.minus(req0))
	b.Logf("%s: %s", name, rec1.minus(rec0))
	return p
}

// generations reads the generation of each RenderQueue of keys.
func generations(ctx context.Context, c client.Client, keys []types.NamespacedName) (map[types.NamespacedName]int64, error) {
	gens := map[types.NamespacedName]int64{}
	for _, k := range keys {
		var rq rqv1.RenderQueue
		if err := c.Get(ctx, k, &rq); err != nil {
			return nil, fmt.Errorf("reading RenderQueue %s: %w", k, err)
		}
		gens[k] = rq.Generation
	}
	return gens, nil
}

func durationMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// quantile is the q-quantile of sorted (nearest rank); 0 when empty.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// createConcurrently creates a RenderQueue of one shard for each key, with workers at once.
func createConcurrently(ctx context.Context, c client.Client, keys []types.NamespacedName, workers int) error {
	var next atomic.Int64
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(keys) {
					errs <- nil
					return
				}
				rq := &rqv1.RenderQueue{
					ObjectMeta: metav1.ObjectMeta{Name: keys[i].Name, Namespace: keys[i].Namespace},
					Spec: rqv1.RenderQueueSpec{
						Shards: 1,
						Store:  rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "pg", Key: "dsn"}},
					},
				}
				if err := c.Create(ctx, rq); err != nil {
					errs <- fmt.Errorf("creating RenderQueue %s: %w", keys[i], err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// waitSettled waits until every RenderQueue of keys is Ready at its generation, reading c (the
// test's cache) every second.
func waitSettled(ctx context.Context, c client.Client, keys []types.NamespacedName, timeout time.Duration) error {
	want := map[types.NamespacedName]bool{}
	for _, k := range keys {
		want[k] = true
	}
	deadline := time.Now().Add(timeout)
	for {
		var list rqv1.RenderQueueList
		if err := c.List(ctx, &list); err != nil {
			return err
		}
		ready := 0
		var notReady string
		for i := range list.Items {
			rq := &list.Items[i]
			if !want[client.ObjectKeyFromObject(rq)] {
				continue
			}
			c := meta.FindStatusCondition(rq.Status.Conditions, rqv1.ConditionReady)
			if rq.Status.ObservedGeneration == rq.Generation && rq.Status.ReadyShards == rq.Spec.Shards &&
				c != nil && c.Status == metav1.ConditionTrue {
				ready++
			} else if notReady == "" {
				notReady = fmt.Sprintf("%s/%s (observedGeneration %d of %d, Ready %+v)", rq.Namespace, rq.Name,
					rq.Status.ObservedGeneration, rq.Generation, c)
			}
		}
		if ready == len(keys) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d RenderQueues Ready after %s; first not: %s", ready, len(keys), timeout, notReady)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// changeSpecs patches spec.verifyWalkRate of n random RenderQueues of keys (none with a change
// still pending), rate a second, and returns each change's latency as w measures it. gens holds
// each RenderQueue's generation, and is kept up to date. It waits up to a minute after the last
// change for the last to be seen.
func changeSpecs(ctx context.Context, c client.Client, w *generationWatcher, keys []types.NamespacedName,
	gens map[types.NamespacedName]int64, n int, rate float64) ([]time.Duration, error) {
	rng := rand.New(rand.NewPCG(uint64(len(keys)), uint64(n)))
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	for range n {
		k := keys[rng.IntN(len(keys))]
		for w.isPending(k) {
			k = keys[rng.IntN(len(keys))]
		}
		gens[k]++
		w.expect(k, gens[k], time.Now())
		patch := fmt.Appendf(nil, `{"spec":{"verifyWalkRate":%d}}`, 100000+gens[k])
		rq := &rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: k.Name, Namespace: k.Namespace}}
		if err := c.Patch(ctx, rq, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return nil, fmt.Errorf("changing RenderQueue %s: %w", k, err)
		}
		if rq.Generation != gens[k] {
			return nil, fmt.Errorf("RenderQueue %s: generation %d after the change, want %d (does something else change it?)",
				k, rq.Generation, gens[k])
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
	deadline := time.Now().Add(time.Minute)
	for {
		lat, pending := w.results()
		if pending == 0 {
			return lat, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d changes not observed a minute after the last", pending, n)
		}
		time.Sleep(100 * time.Millisecond) // polling a counter, not waiting for a condition to hold
	}
}

// generationWatcher times spec changes: from expect to an informer's event showing
// status.observedGeneration at the generation expected.
type generationWatcher struct {
	mu      sync.Mutex
	pending map[types.NamespacedName]pendingChange
	done    []time.Duration
}

type pendingChange struct {
	generation int64
	since      time.Time
}

func (w *generationWatcher) expect(k types.NamespacedName, generation int64, since time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending[k] = pendingChange{generation: generation, since: since}
}

func (w *generationWatcher) isPending(k types.NamespacedName) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.pending[k]
	return ok
}

func (w *generationWatcher) seen(obj any) {
	rq, ok := obj.(*rqv1.RenderQueue)
	if !ok {
		return
	}
	now := time.Now()
	k := client.ObjectKeyFromObject(rq)
	w.mu.Lock()
	defer w.mu.Unlock()
	if p, ok := w.pending[k]; ok && rq.Status.ObservedGeneration >= p.generation {
		w.done = append(w.done, now.Sub(p.since))
		delete(w.pending, k)
	}
}

// results returns the latencies so far and how many changes are still pending.
func (w *generationWatcher) results() ([]time.Duration, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.done), len(w.pending)
}

// sharedFakeShards serves the /v1/status of every shard from one server: shard <name> of
// namespace <ns> at /<ns>/<name>/v1/status, a fakeShard created when its Pod is first resolved.
type sharedFakeShards struct {
	reader client.Reader
	srv    *httptest.Server

	mu     sync.Mutex
	shards map[string]*fakeShard // namespace/name
}

func (s *sharedFakeShards) resolve(pod *corev1.Pod) (string, error) {
	if pod.Status.PodIP == "" {
		return "", fmt.Errorf("the Pod has no IP yet")
	}
	key := pod.Namespace + "/" + pod.Name
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shards[key] == nil {
		s.shards[key] = newFakeShardState(s.reader, pod.Namespace, pod.Labels[rqv1.LabelQueue], pod.Name)
	}
	return s.srv.URL + "/" + key, nil
}

// set changes the fake shards of the RenderQueue k.
func (s *sharedFakeShards) set(k types.NamespacedName, change func(f *fakeShard)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	found := false
	for _, f := range s.shards {
		if f.namespace == k.Namespace && f.queue == k.Name {
			f.set(change)
			found = true
		}
	}
	if !found {
		return fmt.Errorf("no fake shard of RenderQueue %s", k)
	}
	return nil
}

func (s *sharedFakeShards) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	parts := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 3)
	if len(parts) != 3 {
		http.NotFound(w, r)
		return
	}
	s.mu.Lock()
	f := s.shards[parts[0]+"/"+parts[1]]
	s.mu.Unlock()
	if f == nil {
		http.NotFound(w, r)
		return
	}
	http.StripPrefix("/"+parts[0]+"/"+parts[1], http.HandlerFunc(f.serve)).ServeHTTP(w, r)
}

// requestCounter counts the requests of a rest.Config by verb and resource.
type requestCounter struct {
	mu     sync.Mutex
	counts map[string]int64 // "verb resource[/subresource]"
}

type requestCounts map[string]int64

func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		c.mu.Lock()
		if c.counts == nil {
			c.counts = map[string]int64{}
		}
		c.counts[requestKind(req)]++
		c.mu.Unlock()
		return rt.RoundTrip(req)
	})
}

func (c *requestCounter) snapshot() requestCounts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.counts)
}

func (c *requestCounter) total() int64 { return c.snapshot().total() }

func (rc requestCounts) total() int64 {
	var n int64
	for _, v := range rc {
		n += v
	}
	return n
}

// minus is rc less before, only the kinds that changed.
func (rc requestCounts) minus(before requestCounts) requestCounts {
	out := requestCounts{}
	for k, v := range rc {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

func (rc requestCounts) String() string {
	keys := slices.Sorted(maps.Keys(rc))
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d requests", rc.total())
	for _, k := range keys {
		fmt.Fprintf(&sb, "; %s %d", k, rc[k])
	}
	return sb.String()
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// requestKind is "verb resource[/subresource]" of a request to the API server: verb as RBAC
// names it (get, list, watch, create, update, patch, delete).
func requestKind(r *http.Request) string {
	segs := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(segs) > 0 && segs[0] == "api":
		segs = segs[min(2, len(segs)):]
	case len(segs) > 0 && segs[0] == "apis":
		segs = segs[min(3, len(segs)):]
	default:
		return r.Method + " " + r.URL.Path
	}
	if len(segs) > 2 && segs[0] == "namespaces" {
		segs = segs[2:]
	}
	resource, named := "?", false
	if len(segs) > 0 {
		resource = segs[0]
	}
	if len(segs) > 1 {
		named = true
	}
	if len(segs) > 2 {
		resource += "/" + segs[2]
	}
	verb := strings.ToLower(r.Method)
	switch {
	case r.Method == http.MethodGet && r.URL.Query().Get("watch") == "true":
		verb = "watch"
	case r.Method == http.MethodGet && !named:
		verb = "list"
	case r.Method == http.MethodGet:
		verb = "get"
	case r.Method == http.MethodPost:
		verb = "create"
	case r.Method == http.MethodPut:
		verb = "update"
	}
	return verb + " " + resource
}

// reconcileStats are controller-runtime's counts for the renderqueue controller.
type reconcileStats struct {
	total, errors float64
	byResult      map[string]float64
	seconds       float64 // the sum of the reconciles' durations
}

func (s reconcileStats) minus(before reconcileStats) string {
	n := s.total - before.total
	mean := 0.0
	if n > 0 {
		mean = (s.seconds - before.seconds) / n * 1000
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(s.byResult)) {
		parts = append(parts, fmt.Sprintf("%s %v", k, s.byResult[k]-before.byResult[k]))
	}
	return fmt.Sprintf("%v reconciles (%s), %v errors, mean %.2f ms", n, strings.Join(parts, ", "), s.errors-before.errors, mean)
}

func readReconcileStats(b *testing.B) reconcileStats {
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		b.Fatalf("reading controller-runtime's metrics: %v", err)
	}
	out := reconcileStats{byResult: map[string]float64{}}
	ours := func(m *dto.Metric) (string, bool) {
		var result string
		ok := false
		for _, l := range m.GetLabel() {
			if l.GetName() == "controller" && l.GetValue() == ControllerName {
				ok = true
			}
			if l.GetName() == "result" {
				result = l.GetValue()
			}
		}
		return result, ok
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			result, ok := ours(m)
			if !ok {
				continue
			}
			switch mf.GetName() {
			case "controller_runtime_reconcile_total":
				out.total += m.GetCounter().GetValue()
				out.byResult[result] += m.GetCounter().GetValue()
			case "controller_runtime_reconcile_errors_total":
				out.errors += m.GetCounter().GetValue()
			case "controller_runtime_reconcile_time_seconds":
				out.seconds += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}

// loadAverage is the 1-, 5- and 15-minute load average; "?" when unknown.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// procStatusKB reads a "kB" field of /proc/self/status (VmRSS, VmHWM); 0 when unknown.
func procStatusKB(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		v, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0
		}
		return v
	}
	return 0
}
