// Command go-worker is a complete render worker for renderqueue, to copy and adapt: it finds the
// shards of one RenderQueue, claims the most overdue rows, renders each (here: an HTTP GET of
// the row's key, where a prerender fleet would drive a browser) and completes it on the shard
// that leased it, or releases it on failure so that another attempt comes at once. SIGTERM and
// SIGINT stop it gracefully: it claims no more, lets the renders in progress finish and sends
// their completions before it exits.
//
// Configuration, from the environment (as a Deployment sets it):
//
//	RENDERQUEUE_SHARDS      comma-separated shard base URLs (http://10.244.0.7:8080), or
//	RENDERQUEUE_DNS         the headless Service and port: web-shards.default.svc:8080
//	RENDERQUEUE_TOKEN_FILE  the Secret <name>-api-token mounted (key "token")
//	RENDERQUEUE_CA_FILE     with spec.tls: the ConfigMap <name>-shard-ca mounted (key ca.crt)
//	RENDERQUEUE_SERVER_NAME with spec.tls: <name>-shards.<namespace>.svc
//	CONCURRENCY             renders at once (default 8)
//	METRICS_ADDR            where to serve the worker's Prometheus metrics (default :9090; "" off)
//
// It needs no Kubernetes API access and links no Kubernetes package: package discovery finds the
// shards by URL or DNS. To follow the RenderQueue object instead (rebalances as they happen,
// each shard's due count), use pkg/client/discovery/kube's RenderQueue.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/client/clientmetrics"
	"github.com/renderqueue/renderqueue/pkg/client/discovery"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, log); err != nil {
		log.Error("worker stopped", "error", err.Error())
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger) error {
	disc, err := shards()
	if err != nil {
		return err
	}
	token, err := readToken(os.Getenv("RENDERQUEUE_TOKEN_FILE"))
	if err != nil {
		return err
	}
	concurrency := 8
	if v := os.Getenv("CONCURRENCY"); v != "" {
		if concurrency, err = strconv.Atoi(v); err != nil || concurrency < 1 {
			return fmt.Errorf("CONCURRENCY=%q: want a positive number", v)
		}
	}
	reg := prometheus.NewRegistry()
	metrics, err := clientmetrics.New(reg)
	if err != nil {
		return err
	}
	opts := client.Options{Discovery: disc, Token: token, Metrics: metrics, Log: logr.FromSlogHandler(log.Handler())}
	if ca := os.Getenv("RENDERQUEUE_CA_FILE"); ca != "" {
		opts.TLS = &client.TLSOptions{CAFile: ca, ServerName: os.Getenv("RENDERQUEUE_SERVER_NAME")}
	}
	c, err := client.New(opts)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	if addr, ok := os.LookupEnv("METRICS_ADDR"); !ok || addr != "" {
		if !ok {
			addr = ":9090"
		}
		if err := serveMetrics(ctx, addr, reg, log); err != nil {
			return err
		}
	}

	renderer := &http.Client{Timeout: 30 * time.Second}
	log.Info("worker started", "concurrency", concurrency)
	err = c.Run(ctx, concurrency, func(ctx context.Context, it client.Item) (client.Result, error) {
		if err := render(ctx, renderer, it.Key); err != nil {
			log.Info("render failed; released", "key", it.Key, "error", err.Error())
			return client.Result{}, err // released: handed out again at once
		}
		return client.Result{}, nil // completed: next render per the row's cadence
	})
	log.Info("worker stopped")
	return err
}

// render fetches the page at key: stand-in for the real render (a headless browser, a template
// engine, a cache fill). A page that answers 5xx fails the render, so that it is tried again.
func render(ctx context.Context, hc *http.Client, key string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, key, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode >= 500 {
		return fmt.Errorf("GET %s: %s", key, resp.Status)
	}
	return nil
}

// shards is the discovery the environment asks for.
func shards() (client.Discovery, error) {
	if urls := os.Getenv("RENDERQUEUE_SHARDS"); urls != "" {
		return discovery.Static(strings.Split(urls, ",")...)
	}
	if hp := os.Getenv("RENDERQUEUE_DNS"); hp != "" {
		host, port, err := net.SplitHostPort(hp)
		if err != nil {
			return nil, fmt.Errorf("RENDERQUEUE_DNS=%q: want host:port: %w", hp, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("RENDERQUEUE_DNS=%q: port: %w", hp, err)
		}
		if os.Getenv("RENDERQUEUE_CA_FILE") != "" {
			return discovery.DNSHTTPS(host, p, 0)
		}
		return discovery.DNS(host, p, 0)
	}
	return nil, errors.New("set RENDERQUEUE_SHARDS (shard base URLs) or RENDERQUEUE_DNS (the headless Service, host:port)")
}

func readToken(file string) (string, error) {
	if file == "" {
		return "", errors.New("set RENDERQUEUE_TOKEN_FILE: the Secret <name>-api-token, key token, mounted")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("reading the API token: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	log.Info("metrics", "addr", ln.Addr().String())
	return nil
}
