package statusview

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// Queue is what the queue view shows: a RenderQueue and each of its shards' /v1/status.
type Queue struct {
	// RenderQueue is the object as read from the API server.
	RenderQueue *rqv1.RenderQueue
	// Shards has one entry per shard of the RenderQueue's status, in its order.
	Shards []ShardRead
	// Now is when the shards were read (for "last walk ... ago").
	Now time.Time
}

// ShardRead is one shard's /v1/status, or why it could not be read.
type ShardRead struct {
	Name string
	// State is the shard's state in the RenderQueue's status (used when Status is nil).
	State  string
	Status *shardapi.Status
	Err    error
}

// KeeperPort is the port of a shard's HTTP API when its status carries no URL to take it from.
const KeeperPort = 8080

// LoadQueue reads the RenderQueue namespace/name and every shard's GET /v1/status through the
// API server's Pod proxy (GET /api/v1/namespaces/NS/pods/[https:]SHARD:PORT/proxy/v1/status), with cfg's
// credentials: the user needs get on renderqueues and on pods/proxy, and no network path to the
// Pods. Shards are read in parallel, each bounded by timeout; one that cannot be read is shown
// with its error.
func LoadQueue(ctx context.Context, cfg *rest.Config, namespace, name string, timeout time.Duration) (Queue, error) {
	rq, err := getRenderQueue(ctx, cfg, namespace, name)
	if err != nil {
		return Queue{}, err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return Queue{}, fmt.Errorf("building an HTTP client for the API server: %w", err)
	}
	q := Queue{RenderQueue: rq, Shards: make([]ShardRead, len(rq.Status.Shards)), Now: time.Now()}
	var wg sync.WaitGroup
	for i, s := range rq.Status.Shards {
		q.Shards[i] = ShardRead{Name: s.Name, State: s.State}
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			q.Shards[i].Status, q.Shards[i].Err = client.GetStatus(sctx, hc, podProxyURL(cfg.Host, namespace, s, rq.Spec.TLSEnabled()))
		})
	}
	wg.Wait()
	return q, nil
}

// getRenderQueue reads the RenderQueue namespace/name with cfg's credentials.
func getRenderQueue(ctx context.Context, cfg *rest.Config, namespace, name string) (*rqv1.RenderQueue, error) {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building a Kubernetes client: %w", err)
	}
	u, err := dc.Resource(rqv1.GroupVersion.WithResource("renderqueues")).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading renderqueue %s/%s: %w", namespace, name, err)
	}
	var rq rqv1.RenderQueue
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &rq); err != nil {
		return nil, fmt.Errorf("decoding renderqueue %s/%s: %w", namespace, name, err)
	}
	return &rq, nil
}

// podProxyURL is the API server's proxy to the shard's Pod port (the port of its status URL),
// over HTTPS ("https:<pod>:<port>") when the shard serves it (its URL's scheme, or spec.tls when
// it has no URL). The API server does not verify the shard's certificate (it never does for the
// Pod proxy); the user's own credentials are checked by the API server. /v1/status needs no
// token; /v1/rows takes it in shardapi.ProxiedAuthorizationHeader (the proxy drops Authorization).
func podProxyURL(host, namespace string, s rqv1.ShardStatus, tls bool) string {
	port := strconv.Itoa(KeeperPort)
	if u, err := url.Parse(s.URL); err == nil && u.Host != "" {
		if u.Port() != "" {
			port = u.Port()
		}
		tls = u.Scheme == "https"
	}
	target := net.JoinHostPort(s.Name, port)
	if tls {
		target = "https:" + target
	}
	return strings.TrimRight(host, "/") + "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods/" +
		url.PathEscape(target) + "/proxy"
}

// queueJSON is the JSON form of the queue view (WriteQueueJSON).
type queueJSON struct {
	Namespace string      `json:"namespace"`
	Name      string      `json:"name"`
	Due       int64       `json:"due"`
	DueExact  bool        `json:"dueExact"`
	Shards    []shardJSON `json:"shards"`
}

type shardJSON struct {
	Name   string           `json:"name"`
	Status *shardapi.Status `json:"status"`
	Error  string           `json:"error,omitempty"`
}

// WriteQueueJSON prints the queue view as indented JSON (`renderqueue status NAME --json`): the
// RenderQueue's namespace, name, due and dueExact from its status, and per shard its name and
// /v1/status or the error reading it.
func WriteQueueJSON(w io.Writer, q Queue) error {
	rq := q.RenderQueue
	out := queueJSON{Namespace: rq.Namespace, Name: rq.Name, Due: rq.Status.Due, DueExact: rq.Status.DueExact}
	for _, s := range q.Shards {
		sj := shardJSON{Name: s.Name, Status: s.Status}
		if s.Err != nil {
			sj.Error = s.Err.Error()
		}
		out.Shards = append(out.Shards, sj)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// WriteQueue prints the queue view: a summary line, a table of the shards (state, exact, due,
// edge ahead, last walk, p99 lateness relative to cadence) and the coming-due-by-hour profile of
// the shards read, as a text chart.
func WriteQueue(w io.Writer, q Queue) error {
	p := &printer{w: w}
	rq := q.RenderQueue
	due := "due " + num(int(rq.Status.Due)) + " (exact)"
	if !rq.Status.DueExact {
		due = "due ≥ " + num(int(rq.Status.Due)) + " (a lower bound: not every shard is reachable and exact)"
	}
	p.f("renderqueue %s/%s: %d shards (%d ready), %s\n", rq.Namespace, rq.Name, len(q.Shards), rq.Status.ReadyShards, due)
	if f := rq.Status.Forecast; f != nil && len(f.Horizons) > 0 {
		parts := make([]string, 0, len(f.Horizons))
		var why []string
		for _, h := range f.Horizons {
			if h.Exact {
				parts = append(parts, h.Horizon+" "+num(int(h.Due)))
				continue
			}
			parts = append(parts, h.Horizon+" ≥ "+num(int(h.Due)))
			why = append(why, h.Horizon+": "+h.Reason)
		}
		p.f("  due within %s (as of %s)\n", strings.Join(parts, ", "), f.AsOf.UTC().Format("15:04:05"))
		if len(why) > 0 {
			p.f("    lower bounds: %s\n", strings.Join(why, "; "))
		}
	}
	for _, o := range rq.Status.Objectives {
		kept := "met"
		if !o.Met {
			kept = "MISSED"
		}
		att := "no events yet"
		if o.Attainment != "" {
			att = fmt.Sprintf("%s good of %s", o.Attainment, num(int(o.Good+o.Late)))
		}
		line := fmt.Sprintf("  objective %s: %s over %s, %s", o.Name, att, o.Window.Duration, kept)
		if o.BudgetRemaining != "" {
			line += ", budget left " + o.BudgetRemaining
		}
		if o.BurnRate1h != "" {
			line += ", burn 1h " + o.BurnRate1h
		}
		if o.BurnRate6h != "" {
			line += ", 6h " + o.BurnRate6h
		}
		p.f("%s\n", line)
	}
	if len(q.Shards) > 0 {
		// the line above is the operator's last poll; the table is read now, so the two may differ
		p.f("  (due as the operator last polled the shards; the rows below are each shard's own figures, read now)\n")
	}
	if len(q.Shards) == 0 {
		p.f("  no shards in the status yet\n")
		return p.err
	}
	var tb strings.Builder
	tw := tabwriter.NewWriter(&tb, 0, 0, 2, ' ', 0)
	_, _ = fmt.Fprintf(tw, "SHARD\tSTATE\tEXACT\tDUE\tEDGE AHEAD\tLAST WALK\tP99 LATE/CADENCE\n")
	var coming [24]int
	read, cut := 0, false
	var problems []string
	for _, s := range q.Shards {
		st := s.Status
		if st == nil {
			state := strings.ToLower(orDash(s.State))
			_, _ = fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\n", s.Name, state)
			if s.Err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", s.Name, s.Err))
			}
			continue
		}
		read++
		for h := 0; h < len(st.Coming.ByHour) && h < len(coming); h++ {
			coming[h] += st.Coming.ByHour[h]
		}
		cut = cut || st.Coming.CutAtWindow
		dueCell := num(st.Due)
		if !st.Exact {
			dueCell = "≥ " + dueCell
		}
		_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.2f\n", s.Name, orDash(st.Status), yesNo(st.Exact), dueCell,
			edgeAhead(st), lastWalk(st, q.Now), st.Lateness.P99Relative)
		if st.Error != "" {
			problems = append(problems, fmt.Sprintf("%s: %s", s.Name, st.Error))
		}
	}
	_ = tw.Flush() // a strings.Builder does not fail
	for _, line := range strings.SplitAfter(tb.String(), "\n") {
		if line != "" {
			p.f("  %s", line)
		}
	}
	for _, pr := range problems {
		p.f("  ! %s\n", pr)
	}
	if read > 0 {
		total, peak := 0, 0
		for _, n := range coming {
			total += n
			peak = max(peak, n)
		}
		of := ""
		if read < len(q.Shards) {
			of = fmt.Sprintf(", %d of %d shards", read, len(q.Shards))
		}
		note := ""
		if cut {
			note = "; cut at the window"
		}
		p.f("  coming due by hour (held rows%s%s): %s in 24h, peak %s/h\n", of, note, num(total), num(peak))
		p.f("    %s\n", Spark(coming[:]))
		p.f("    %-12s%12s\n", "now", "+24h")
	}
	return p.err
}

func edgeAhead(st *shardapi.Status) string {
	switch {
	case st.EdgeAheadSeconds != nil && *st.EdgeAheadSeconds < 0:
		return "LAGGING " + Seconds(-*st.EdgeAheadSeconds)
	case st.EdgeAheadSeconds != nil:
		return Seconds(*st.EdgeAheadSeconds)
	case st.Window == 0 && st.LastWalk != nil && st.LastWalk.FinishedAt != nil:
		return "unbounded"
	default:
		return "-"
	}
}

func lastWalk(st *shardapi.Status, now time.Time) string {
	wk := st.LastWalk
	if wk == nil {
		if st.WalkingSince != nil {
			return "loading"
		}
		return "none yet"
	}
	var s string
	if wk.FinishedAt != nil {
		s = Seconds(now.Sub(*wk.FinishedAt).Seconds()) + " ago"
	} else {
		s = "started " + Seconds(now.Sub(wk.StartedAt).Seconds()) + " ago"
	}
	switch {
	case wk.Failed:
		s += " FAILED"
	case wk.Partial:
		s += fmt.Sprintf(" PARTIAL (%d unread)", wk.UnreadSegments)
	}
	return s
}

// sparks are the bar heights of Spark, lowest first.
var sparks = []rune("▁▂▃▄▅▆▇█")

// Spark draws counts as a line of bars scaled to the largest: a zero is a space, any other count
// at least the lowest bar.
func Spark(counts []int) string {
	peak := 0
	for _, n := range counts {
		peak = max(peak, n)
	}
	out := make([]rune, len(counts))
	for i, n := range counts {
		switch {
		case n <= 0:
			out[i] = ' '
		default:
			out[i] = sparks[min(len(sparks)-1, (n*len(sparks)-1)/peak)]
		}
	}
	return string(out)
}
