//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/specs"
)

// What grows while the system runs (issue 39, "hours, not minutes"): the soak samples every
// keeper's and operator replica's resident memory, goroutines and open file descriptors (from
// their /metrics: process_resident_memory_bytes, go_goroutines, process_open_fds, and
// process_start_time_seconds to tell one process from its replacement), and the PostgreSQL
// connections opened from the Pods (pg_stat_activity), at the start, every resourceEvery, and at
// the end.
//
// How growth is judged (growthProblems): chaos replaces processes all the time, so a figure is
// followed per process. A process seen in at least three samples over at least
// resourceMinSpan is growing without bound when, from its first sample to its last, its
// resident memory grew by more than half plus 64 MiB, or its goroutines or file descriptors
// more than doubled plus 100 and 50. The connections from the Pods are judged per keeper (they
// scale with the shard count, which the mix changes): at the end at most 1.5 × the start's plus
// 2. Bounds this loose pass the warm-up of a young process and the noise of a busy one; a leak
// of a goroutine or a connection per claim, per handoff or per walk crosses them within an hour.

const (
	// resourceEvery is the soak's sampling interval.
	resourceEvery = 5 * time.Minute
	// resourceMinSpan is the least time a process is followed before its growth is judged.
	resourceMinSpan = 20 * time.Minute
	// operatorMetricsPort is the operator's --metrics-bind-address port (config/manager).
	operatorMetricsPort = 8080
)

// procSample is one process's figures in one sample.
type procSample struct {
	kind, pod  string // "keeper" or "operator"; its Pod
	started    float64
	rss        float64 // bytes
	goroutines float64
	fds        float64
}

// resourceSample is one sample of every process and the connections from the Pods.
type resourceSample struct {
	at      time.Time
	procs   []procSample
	pgConns int64
	keepers int
	notes   []string // processes that did not answer (killed meanwhile)
}

// resources collects the samples of a soak.
type resources struct {
	mu       sync.Mutex
	samples  []resourceSample
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// startResources takes the first sample and then one every resourceEvery until stopResources.
func (ch *chaos) startResources(t *testing.T) {
	ch.res = &resources{stop: make(chan struct{}), done: make(chan struct{})}
	ch.takeResources(t, "start")
	go func() {
		defer close(ch.res.done)
		tick := time.NewTicker(resourceEvery)
		defer tick.Stop()
		for {
			select {
			case <-ch.res.stop:
				return
			case <-tick.C:
				ch.takeResources(t, "every "+resourceEvery.String())
			}
		}
	}()
}

// stopResources stops the sampling and takes the last sample.
func (ch *chaos) stopResources(t *testing.T) {
	if ch.res == nil {
		return
	}
	ch.res.halt(func() { ch.takeResources(t, "end") })
}

// halt stops the sampling goroutine, once, then runs last (nil: nothing).
func (r *resources) halt(last func()) {
	r.stopOnce.Do(func() {
		close(r.stop)
		<-r.done
		if last != nil {
			last()
		}
	})
}

// takeResources takes one sample and logs it.
func (ch *chaos) takeResources(t *testing.T, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := resourceSample{at: time.Now()}
	hc := &http.Client{Timeout: 5 * time.Second}
	scrape := func(kind string, pods []corev1.Pod, port int) {
		for _, p := range pods {
			if p.Status.PodIP == "" || p.DeletionTimestamp != nil {
				continue
			}
			ps, err := scrapeProcess(ctx, hc, fmt.Sprintf("http://%s:%d/metrics", p.Status.PodIP, port))
			if err != nil {
				s.notes = append(s.notes, fmt.Sprintf("%s %s: %v", kind, p.Name, err))
				continue
			}
			ps.kind, ps.pod = kind, p.Name
			s.procs = append(s.procs, ps)
			if kind == "keeper" {
				s.keepers++
			}
		}
	}
	if !ch.tls { // the shards' /metrics are served over HTTPS with TLS on: the soak runs without
		shards, err := ch.e.c.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: rqv1.LabelQueue + "=" + queueName})
		if err != nil {
			s.notes = append(s.notes, fmt.Sprintf("listing the shard Pods: %v", err))
		} else {
			scrape("keeper", shards.Items, specs.KeeperPort)
		}
	}
	ops, err := ch.e.c.Client.CoreV1().Pods(ch.opNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		s.notes = append(s.notes, fmt.Sprintf("listing the operator Pods: %v", err))
	} else {
		scrape("operator", ops.Items, operatorMetricsPort)
	}
	// connections from the Pods' addresses (the node's own, the test's, excluded)
	if err := ch.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND client_addr << '10.244.0.0/24'::inet AND client_addr <> '10.244.0.1'::inet`).Scan(&s.pgConns); err != nil {
		s.notes = append(s.notes, fmt.Sprintf("counting PostgreSQL connections: %v", err))
		s.pgConns = -1
	}
	ch.res.mu.Lock()
	ch.res.samples = append(ch.res.samples, s)
	ch.res.mu.Unlock()
	t.Logf("resources (%s): %s", why, s.row())
}

// scrapeProcess reads a process's figures from its /metrics (Prometheus text format).
func scrapeProcess(ctx context.Context, hc *http.Client, url string) (procSample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return procSample{}, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return procSample{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return procSample{}, fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	var ps procSample
	found := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		var dst *float64
		switch name {
		case "process_resident_memory_bytes":
			dst = &ps.rss
		case "go_goroutines":
			dst = &ps.goroutines
		case "process_open_fds":
			dst = &ps.fds
		case "process_start_time_seconds":
			dst = &ps.started
		default:
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return procSample{}, fmt.Errorf("%s: %s %q: %w", url, name, val, err)
		}
		*dst = v
		found++
	}
	if err := sc.Err(); err != nil {
		return procSample{}, fmt.Errorf("reading %s: %w", url, err)
	}
	if found < 4 {
		return procSample{}, fmt.Errorf("%s: the process metrics are missing (%d of 4)", url, found)
	}
	return ps, nil
}

// row is the sample as a summary table row: the keepers' largest figures, the operator
// replicas' largest, and the connections.
func (s resourceSample) row() string {
	var k, o procSample
	ops := 0
	for _, p := range s.procs {
		m := &k
		if p.kind == "operator" {
			m = &o
			ops++
		}
		m.rss, m.goroutines, m.fds = max(m.rss, p.rss), max(m.goroutines, p.goroutines), max(m.fds, p.fds)
	}
	conns := "?"
	if s.pgConns >= 0 {
		conns = strconv.FormatInt(s.pgConns, 10)
	}
	r := fmt.Sprintf("| %s | %d | %.0f | %.0f | %.0f | %d | %.0f | %.0f | %.0f | %s |", s.at.Format("15:04:05"), s.keepers,
		k.rss/(1<<20), k.goroutines, k.fds, ops, o.rss/(1<<20), o.goroutines, o.fds, conns)
	if len(s.notes) > 0 {
		r += " " + strings.Join(s.notes, "; ")
	}
	return r
}

// resourceTable is the samples as a Markdown table, for the summary.
func (r *resources) table() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	b.WriteString("| at | keepers | keeper RSS MiB (largest) | goroutines | FDs | operator replicas | operator RSS MiB (largest) | goroutines | FDs | PostgreSQL connections from the Pods |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, s := range r.samples {
		b.WriteString(s.row() + "\n")
	}
	return b.String()
}

// growthProblems judges the samples (see the top of this file) and returns what grew without
// bound, and how many processes were followed long enough to be judged.
func (r *resources) growthProblems() (problems []string, judged int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	type id struct {
		kind, pod string
		started   float64
	}
	series := map[id][]struct {
		at time.Time
		p  procSample
	}{}
	for _, s := range r.samples {
		for _, p := range s.procs {
			k := id{p.kind, p.pod, p.started}
			series[k] = append(series[k], struct {
				at time.Time
				p  procSample
			}{s.at, p})
		}
	}
	keys := make([]id, 0, len(series))
	for k := range series {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b id) int { return strings.Compare(a.kind+a.pod, b.kind+b.pod) })
	for _, k := range keys {
		ss := series[k]
		if len(ss) < 3 || ss[len(ss)-1].at.Sub(ss[0].at) < resourceMinSpan {
			continue
		}
		judged++
		first, last := ss[0].p, ss[len(ss)-1].p
		span := ss[len(ss)-1].at.Sub(ss[0].at).Round(time.Minute)
		if last.rss > first.rss*1.5+64<<20 {
			problems = append(problems, fmt.Sprintf("%s %s: resident memory %.0f → %.0f MiB in %s", k.kind, k.pod, first.rss/(1<<20), last.rss/(1<<20), span))
		}
		if last.goroutines > first.goroutines*2+100 {
			problems = append(problems, fmt.Sprintf("%s %s: goroutines %.0f → %.0f in %s", k.kind, k.pod, first.goroutines, last.goroutines, span))
		}
		if last.fds > first.fds*2+50 {
			problems = append(problems, fmt.Sprintf("%s %s: open file descriptors %.0f → %.0f in %s", k.kind, k.pod, first.fds, last.fds, span))
		}
	}
	if n := len(r.samples); n >= 3 {
		first, last := r.samples[0], r.samples[n-1]
		if first.pgConns >= 0 && last.pgConns >= 0 && first.keepers > 0 && last.keepers > 0 {
			a, b := float64(first.pgConns)/float64(first.keepers), float64(last.pgConns)/float64(last.keepers)
			if b > a*1.5+2 {
				problems = append(problems, fmt.Sprintf("PostgreSQL connections from the Pods: %.1f → %.1f per keeper (%d → %d)", a, b, first.pgConns, last.pgConns))
			}
		}
	}
	return problems, judged
}
