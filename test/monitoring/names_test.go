package monitoring

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/renderqueue/renderqueue/controllers"
	"github.com/renderqueue/renderqueue/internal/memlimit"
	"github.com/renderqueue/renderqueue/pkg/buildinfo"
	"github.com/renderqueue/renderqueue/pkg/client/clientmetrics"
	"github.com/renderqueue/renderqueue/pkg/keeper"
	"github.com/renderqueue/renderqueue/pkg/keeper/shardmetrics"
	"github.com/renderqueue/renderqueue/pkg/metricsapi"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store/memstore"
)

// recorder is a registry that remembers every collector registered with it, so that the names
// of labelled metrics without series yet (handoff counters before the first RenderQueue) are
// known from their descriptors.
type recorder struct {
	*prometheus.Registry
	collectors []prometheus.Collector
}

func newRecorder() *recorder { return &recorder{Registry: prometheus.NewPedanticRegistry()} }

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registry.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// fqNameRE takes the name out of a descriptor's String(): client_golang has no accessor.
var fqNameRE = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)

func describedNames(t *testing.T, c prometheus.Collector) []string {
	t.Helper()
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	var out []string
	for d := range ch {
		m := fqNameRE.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the name of descriptor %s", d)
		}
		out = append(out, m[1])
	}
	return out
}

// exported is the set of series names renderqueue exports: every metric the keeper, the operator
// and a render worker on pkg/client register, read from their real registries (plus _bucket, _sum
// and _count of the histograms), and those of the libraries they run on: the Go runtime and
// process collectors both serve, and controller-runtime's, which the operator serves.
type exported map[string]string // name -> "keeper", "operator", "worker", "runtime" or "controller-runtime"

// controllerRuntimeOnce starts, once per process, a controller named as the operator's, so that
// controller-runtime's per-controller series (controller_runtime_reconcile_errors_total, ...)
// exist in its registry. Names are unique per process.
var controllerRuntimeOnce = sync.OnceValue(func() error {
	c, err := controller.NewUnmanaged(controllers.ControllerName, controller.Options{
		Reconciler: reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) { return reconcile.Result{}, nil }),
	})
	if err != nil {
		return err
	}
	// Start creates the series first; with the context ended it returns at once
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return c.Start(ctx)
})

func exportedMetrics(t *testing.T) exported {
	t.Helper()
	out := exported{}
	add := func(component string, reg *recorder, describeOnly ...prometheus.Collector) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatalf("gathering the %s metrics: %v", component, err)
		}
		for _, mf := range mfs {
			for _, n := range seriesNames(mf) {
				out[n] = component
			}
		}
		for _, c := range append(slices.Clone(reg.collectors), describeOnly...) {
			for _, n := range describedNames(t, c) {
				if _, ok := out[n]; !ok {
					out[n] = component
				}
			}
		}
	}

	// The keeper, as cmd/renderqueue registers it, over a loaded shard (so the edge and the last
	// walk are present).
	kreg := newRecorder()
	sh, err := keeper.NewShard(keeper.Options{
		Name: "names", Store: memstore.New(memstore.Options{}), Log: logr.Discard(), Metrics: shardmetrics.New(kreg),
	}, keeper.Settings{Window: 24 * time.Hour, VerifyInterval: time.Hour, LeaseDuration: time.Minute,
		SubmittedBoost: 2, UrgentMaxShare: 0.2, Owned: schedule.AllSlots()})
	if err != nil {
		t.Fatal(err)
	}
	if rep := sh.Walk(context.Background(), true); rep.Failed {
		t.Fatalf("walk: %+v", rep)
	}
	kreg.MustRegister(keeper.NewStatusCollector(sh), buildinfo.NewCollector("keeper", buildinfo.Read("test")),
		memlimit.NewCollector(memlimit.KeeperMetric, memlimit.Reader{}))
	add("keeper", kreg)

	// The Go runtime's and the process's collectors, which the keeper registers as well and
	// controller-runtime's registry holds (process_resident_memory_bytes, go_memstats_*).
	rreg := newRecorder()
	rreg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	add("runtime", rreg)

	// A render worker on pkg/client (renderqueue_worker_*).
	wreg := newRecorder()
	wm, err := clientmetrics.New(wreg)
	if err != nil {
		t.Fatal(err)
	}
	wm.Rendered("success", time.Second) // a histogram's _bucket, _sum and _count are known from a series
	add("worker", wreg)

	// The operator, as cmd/renderqueue registers it on controller-runtime's registry; the
	// per-queue collector reads RenderQueues at scrape time, so its names come from its
	// descriptors.
	oreg := newRecorder()
	if _, err := controllers.NewMetrics(oreg); err != nil {
		t.Fatal(err)
	}
	if _, err := metricsapi.NewRequestMetrics(oreg); err != nil {
		t.Fatal(err)
	}
	oreg.MustRegister(buildinfo.NewCollector("operator", buildinfo.Read("test")))
	add("operator", oreg, controllers.NewQueueCollector(nil, nil))

	// controller-runtime's own metrics, which the operator's metrics server serves.
	if err := controllerRuntimeOnce(); err != nil {
		t.Fatalf("starting a controller: %v", err)
	}
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gathering controller-runtime's metrics: %v", err)
	}
	for _, mf := range mfs {
		for _, n := range seriesNames(mf) {
			if _, ok := out[n]; !ok {
				out[n] = "controller-runtime"
			}
		}
	}
	return out
}

// seriesNames are the names of a metric family's series: its own, and a histogram's or a
// summary's _bucket, _sum and _count.
func seriesNames(mf *dto.MetricFamily) []string {
	out := []string{mf.GetName()}
	switch mf.GetType() {
	case dto.MetricType_HISTOGRAM:
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			out = append(out, mf.GetName()+s)
		}
	case dto.MetricType_SUMMARY:
		for _, s := range []string{"_sum", "_count"} {
			out = append(out, mf.GetName()+s)
		}
	}
	return out
}

// TestExportedMetrics checks the names the tests below compare against: the naming rules
// (renderqueue_ prefix, the component's namespace, units) hold for every one of them.
func TestExportedMetrics(t *testing.T) {
	names := exportedMetrics(t)
	if len(names) < 40 {
		t.Fatalf("only %d names exported: %v", len(names), names)
	}
	for n, component := range names {
		switch {
		case n == buildinfo.MetricName:
		case component == "keeper" && !strings.HasPrefix(n, "renderqueue_keeper_"):
			t.Errorf("keeper metric %s is not named renderqueue_keeper_*", n)
		case component == "operator" && !strings.HasPrefix(n, "renderqueue_queue_") && !strings.HasPrefix(n, "renderqueue_metrics_api_"):
			t.Errorf("operator metric %s is not named renderqueue_queue_* or renderqueue_metrics_api_*", n)
		case component == "worker" && !strings.HasPrefix(n, "renderqueue_worker_"):
			t.Errorf("worker metric %s is not named renderqueue_worker_*", n)
		case component == "runtime" && !strings.HasPrefix(n, "go_") && !strings.HasPrefix(n, "process_"):
			t.Errorf("runtime metric %s is not named go_* or process_*", n)
		}
		if strings.HasPrefix(n, "renderqueue_") && (strings.HasSuffix(n, "_timestamp") || strings.Contains(n, "_milliseconds")) {
			t.Errorf("%s: timestamps and durations are in seconds (_seconds)", n)
		}
	}
	for _, want := range []string{"process_resident_memory_bytes", memlimit.KeeperMetric, "controller_runtime_reconcile_errors_total",
		"renderqueue_worker_claims_total"} {
		if _, ok := names[want]; !ok {
			t.Errorf("%s is not among the exported names", want)
		}
	}
	// the quirks of issue 12 stay fixed: the shard's due gauge is not the external metric's name
	for _, gone := range []string{metricsapi.MetricDue, "renderqueue_edge_ahead_seconds", "renderqueue_walks_total"} {
		if _, ok := names[gone]; ok {
			t.Errorf("%s is exported", gone)
		}
	}
}

// metricNames returns the metric names an expression selects.
func metricNames(t *testing.T, expr string) ([]string, error) {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			if name == "" {
				for _, m := range vs.LabelMatchers {
					if m.Name == "__name__" {
						name = m.Value
					}
				}
			}
			out = append(out, name)
		}
		return nil
	})
	return out, nil
}
