package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/renderqueue/renderqueue/pkg/workersim"
)

// runWorkerSim is `renderqueue worker-sim`: simulated render workers against keeper shards
// (pkg/workersim).
func runWorkerSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("worker-sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		_, _ = fmt.Fprintln(stderr, "usage: renderqueue worker-sim --shard URL[,URL...] [flags]")
		_, _ = fmt.Fprintln(stderr, "\nClaims due rows from keeper shards, sleeps a simulated render time, completes them.")
		fs.PrintDefaults()
	}
	shards := fs.String("shard", os.Getenv("RENDERQUEUE_SHARDS"), "keeper shard base URL(s), comma-separated, taken round robin (default $RENDERQUEUE_SHARDS)")
	tokenFile := fs.String("token-file", "", "file holding the API bearer token (default: $RENDERQUEUE_TOKEN)")
	concurrency := fs.Int("concurrency", 8, "simulated workers")
	batch := fs.Int("batch", 10, "rows per claim")
	renderTime := fs.Duration("render-time", 50*time.Millisecond, "mean simulated render time per row")
	jitter := fs.Float64("jitter", 0.5, "render time spread: uniform within render-time·[1−jitter, 1+jitter]")
	lease := fs.Duration("lease", 0, "lease to ask for (0: the shard's default)")
	duration := fs.Duration("duration", 0, "stop after this long (0: run until interrupted)")
	backoff := fs.Duration("backoff", 100*time.Millisecond, "first wait after a 503 or an empty claim (doubles up to 2s)")
	seedVal := fs.Uint64("seed", 1, "random seed of the render time jitter")
	progressEvery := fs.Duration("progress", 5*time.Second, "progress line interval on stderr (0: none)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var urls []string
	for _, u := range strings.Split(*shards, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	if len(urls) == 0 {
		return errors.New("--shard (or RENDERQUEUE_SHARDS) is required")
	}
	token := os.Getenv("RENDERQUEUE_TOKEN")
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("reading the token file: %w", err)
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return fmt.Errorf("token file %s is empty", *tokenFile)
		}
	}
	if *duration < 0 {
		return fmt.Errorf("--duration %v is negative", *duration)
	}
	sim, err := workersim.New(workersim.Config{
		Shards: urls, Token: token, Concurrency: *concurrency, Batch: *batch,
		RenderTime: *renderTime, Jitter: *jitter, LeaseSeconds: lease.Seconds(),
		Backoff: *backoff, Seed: *seedVal,
	})
	if err != nil {
		return err
	}
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	start := time.Now()
	line := func(st workersim.Stats) string {
		el := time.Since(start).Seconds()
		s := fmt.Sprintf("%.1fs: claimed %d in %d claims, completed %d (%.1f/s), rejected %d, released %d, empty claims %d, 503s %d, errors %d",
			el, st.Claimed, st.Claims, st.Completed, float64(st.Completed)/max(el, 1e-9), st.Rejected, st.Released, st.Empty, st.Unavailable, st.Errors)
		if st.LastError != "" {
			s += " (last: " + st.LastError + ")"
		}
		return s
	}
	_, _ = fmt.Fprintf(stderr, "worker-sim: %d workers, batch %d, render %v ±%.0f%%, shards %s\n", *concurrency, *batch, *renderTime, *jitter*100, strings.Join(urls, ", "))
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
			_, _ = fmt.Fprintln(stderr, "worker-sim:", line(sim.Stats()))
		case err := <-runErr:
			if _, werr := fmt.Fprintln(stdout, "worker-sim done:", line(sim.Stats())); werr != nil && err == nil {
				err = werr
			}
			return err
		}
	}
}
