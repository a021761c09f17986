package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/client/clientmetrics"
	"github.com/renderqueue/renderqueue/pkg/client/discovery"
	"github.com/renderqueue/renderqueue/pkg/client/discovery/kube"
	"github.com/renderqueue/renderqueue/pkg/logkeys"
	"github.com/renderqueue/renderqueue/pkg/workersim"
)

// WorkerSim is `renderqueue worker-sim`: simulated render workers against keeper shards
// (pkg/workersim on pkg/client).
func WorkerSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("worker-sim", flag.ContinueOnError)
	fs.Usage = func() {
		w := fs.Output()
		_, _ = fmt.Fprintln(w, "usage: renderqueue worker-sim (--renderqueue NAME [--namespace NS] | --dns HOST:PORT | --shard URL[,URL...]) [flags]")
		_, _ = fmt.Fprintln(w, "\nClaims due rows from keeper shards, sleeps a simulated render time, completes them.")
		_, _ = fmt.Fprintln(w, "Shards are found through the RenderQueue object (status.shards[].url, followed as it")
		_, _ = fmt.Fprintln(w, "changes), the headless Service's DNS name, or a fixed list.")
		fs.PrintDefaults()
	}
	shards := fs.String("shard", os.Getenv("RENDERQUEUE_SHARDS"), "keeper shard base URL(s), comma-separated (default $RENDERQUEUE_SHARDS)")
	dnsName := fs.String("dns", "", "discover the shards as the addresses of this name, HOST:PORT (the headless Service <name>-shards, port 8080)")
	rqName := fs.String("renderqueue", "", "discover the shards through this RenderQueue's status (needs get/list/watch on it)")
	namespace := fs.String("namespace", os.Getenv("POD_NAMESPACE"), "namespace of --renderqueue (default $POD_NAMESPACE)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file for --renderqueue (default: $KUBECONFIG, then in-cluster)")
	tokenFile := fs.String("token-file", "", "file holding the API bearer token (default: $RENDERQUEUE_TOKEN)")
	caFile := fs.String("tls-ca-file", "", "verify shards serving HTTPS (spec.tls OperatorIssued) against the CA bundle of this file, the ConfigMap <name>-shard-ca's ca.crt (read again when it changes); with --dns, the shards are dialled over HTTPS")
	serverName := fs.String("tls-server-name", "", "the name the shards' certificate is verified for (default: <name>-shards.<namespace>.svc with --renderqueue, HOST with --dns, each URL's host with --shard)")
	concurrency := fs.Int("concurrency", 8, "rows rendering at once")
	batch := fs.Int("batch", 10, "most rows per claim")
	renderTime := fs.Duration("render-time", 50*time.Millisecond, "mean simulated render time per row (0: none, claim and complete as fast as the shards answer)")
	jitter := fs.Float64("jitter", 0.5, "render time spread: uniform within render-time·[1−jitter, 1+jitter]")
	lease := fs.Duration("lease", 0, "lease to ask for and extend by (0: the shard's default)")
	duration := fs.Duration("duration", 0, "stop after this long (0: run until interrupted)")
	backoff := fs.Duration("backoff", 100*time.Millisecond, "first wait after an empty claim, a 503 or an error (per shard, doubles up to 5s, jittered)")
	seedVal := fs.Uint64("seed", 1, "random seed of the render time jitter")
	progressEvery := fs.Duration("progress", 5*time.Second, "progress line interval on stderr (0: none); a log record with --log-format=json")
	metricsAddr := fs.String("metrics-listen", "", "serve the worker's Prometheus metrics at this address's /metrics (e.g. :9090; empty: none)")
	var logs LogFlags
	logs.Bind(fs, "log the client's decisions (back-off, failed renders)")
	if err := ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	log, err := logs.Logger(stderr)
	if err != nil {
		return err
	}
	if *rqName != "" {
		log = log.WithValues(logkeys.RenderQueue, *rqName, logkeys.Namespace, *namespace)
	}
	json := logs.Format == LogFormatJSON

	disc, where, err := workerDiscovery(*shards, *dnsName, *rqName, *namespace, *kubeconfig, *caFile != "")
	if err != nil {
		return err
	}
	var tlsOpts *client.TLSOptions
	switch {
	case *caFile != "":
		tlsOpts = &client.TLSOptions{CAFile: *caFile, ServerName: workerServerName(*serverName, *dnsName, *rqName, *namespace)}
	case *serverName != "":
		return errors.New("--tls-server-name needs --tls-ca-file")
	}
	token, err := ReadToken(*tokenFile)
	if err != nil {
		return err
	}
	if *duration < 0 {
		return fmt.Errorf("--duration %v is negative", *duration)
	}
	if *backoff <= 0 {
		return fmt.Errorf("--backoff %v is not positive", *backoff)
	}
	reg := prometheus.NewRegistry()
	metrics, err := clientmetrics.New(reg)
	if err != nil {
		return err
	}
	bo := client.DefaultBackoff
	bo.Duration = *backoff
	c, err := client.New(client.Options{Discovery: disc, Token: token, TLS: tlsOpts, Batch: *batch, Lease: *lease, Backoff: bo, Metrics: metrics, Log: log})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	sim, err := workersim.New(workersim.Config{Client: c, Concurrency: *concurrency, RenderTime: *renderTime, Jitter: *jitter, Seed: *seedVal})
	if err != nil {
		return err
	}
	if *metricsAddr != "" {
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		ln, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer func() { _ = srv.Close() }()
	}
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	start := time.Now()
	line := func(st client.Stats) string {
		el := time.Since(start).Seconds()
		s := fmt.Sprintf("%.1fs: %d shards, claimed %d in %d claims, completed %d (%.1f/s), rejected %d, released %d, extended %d, empty claims %d, 503s %d, errors %d",
			el, len(c.Shards()), st.Claimed, st.Claims, st.Completed, float64(st.Completed)/max(el, 1e-9), st.Rejected, st.Released, st.Extended,
			st.Empty, st.Unavailable, st.Errors)
		if st.LastError != "" {
			s += " (last: " + st.LastError + ")"
		}
		return s
	}
	if json {
		log.Info("Worker simulator starting", "workers", *concurrency, "batch", *batch, "renderTime", renderTime.String(),
			"jitter", *jitter, "shardsFrom", where)
	} else {
		_, _ = fmt.Fprintf(stderr, "worker-sim: %d workers, batch %d, render %v ±%.0f%%, shards from %s\n", *concurrency, *batch, *renderTime, *jitter*100, where)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- sim.Run(ctx) }()
	var tick <-chan time.Time
	if *progressEvery > 0 {
		t := time.NewTicker(*progressEvery)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-tick:
			if json {
				st := sim.Stats()
				log.Info("Progress", "shards", len(c.Shards()), "claimed", st.Claimed, "claims", st.Claims, "completed", st.Completed,
					"rejected", st.Rejected, "released", st.Released, "extended", st.Extended, "emptyClaims", st.Empty,
					"unavailable", st.Unavailable, "errors", st.Errors, "lastError", st.LastError)
				continue
			}
			_, _ = fmt.Fprintln(stderr, "worker-sim:", line(sim.Stats()))
		case err := <-runErr:
			if _, werr := fmt.Fprintln(stdout, "worker-sim done:", line(sim.Stats())); werr != nil && err == nil {
				err = werr
			}
			return err
		}
	}
}

// workerServerName is the TLS server name of the shards: the flag's, else the operator's name for
// the RenderQueue's shards, else the DNS name's host, else "" (each URL's host).
func workerServerName(flag, dnsName, rqName, namespace string) string {
	switch {
	case flag != "":
		return flag
	case rqName != "":
		return rqv1.ShardServerName(namespace, rqName)
	case dnsName != "":
		host, _, _ := net.SplitHostPort(dnsName)
		return strings.TrimSuffix(host, ".")
	}
	return ""
}

// workerDiscovery builds the one discovery the flags name, and says where it looks. With https,
// a DNS discovery dials the shards over HTTPS.
func workerDiscovery(shards, dnsName, rqName, namespace, kubeconfig string, https bool) (client.Discovery, string, error) {
	var urls []string
	for _, u := range strings.Split(shards, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	given := 0
	for _, set := range []bool{len(urls) > 0, dnsName != "", rqName != ""} {
		if set {
			given++
		}
	}
	switch {
	case given == 0:
		return nil, "", errors.New("say where the shards are: --renderqueue NAME, --dns HOST:PORT or --shard URL (or RENDERQUEUE_SHARDS)")
	case given > 1:
		return nil, "", errors.New("--renderqueue, --dns and --shard exclude each other: give one")
	case rqName != "":
		if namespace == "" {
			return nil, "", errors.New("--renderqueue needs --namespace (or POD_NAMESPACE)")
		}
		cfg, err := RESTConfig(kubeconfig)
		if err != nil {
			return nil, "", err
		}
		d, err := kube.RenderQueue(cfg, namespace, rqName)
		return d, "renderqueue " + namespace + "/" + rqName, err
	case dnsName != "":
		host, p, err := net.SplitHostPort(dnsName)
		if err != nil {
			return nil, "", fmt.Errorf("--dns %q: want HOST:PORT, e.g. web-shards.default.svc:8080: %w", dnsName, err)
		}
		port, err := strconv.Atoi(p)
		if err != nil {
			return nil, "", fmt.Errorf("--dns %q: port %q is not a number", dnsName, p)
		}
		if https {
			d, err := discovery.DNSHTTPS(host, port, 0)
			return d, "DNS name " + dnsName + " (HTTPS)", err
		}
		d, err := discovery.DNS(host, port, 0)
		return d, "DNS name " + dnsName, err
	default:
		d, err := discovery.Static(urls...)
		return d, strings.Join(urls, ", "), err
	}
}
