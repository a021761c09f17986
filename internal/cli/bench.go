package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/renderqueue/renderqueue/pkg/bench"
)

// Bench is `renderqueue bench`: the end-to-end throughput of a standalone keeper against a
// SKIP LOCKED queue on the same PostgreSQL (pkg/bench).
func Bench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.Usage = func() {
		_, _ = fmt.Fprintln(fs.Output(), "usage: renderqueue bench --dsn DSN [flags]")
		_, _ = fmt.Fprintln(fs.Output(), "\nCreates a scratch database on the server of DSN (the role needs CREATEDB; it is dropped")
		_, _ = fmt.Fprintln(fs.Output(), "after), writes the same due rows into the renderqueue schema and into a plain table, and")
		_, _ = fmt.Fprintln(fs.Output(), "measures a keeper it starts (this binary, standalone, window 0) driven over HTTP against")
		_, _ = fmt.Fprintln(fs.Output(), "SELECT … ORDER BY due_at FOR UPDATE SKIP LOCKED plus UPDATE on the plain table. No render")
		_, _ = fmt.Fprintln(fs.Output(), "time: workers complete what they claim at once. See docs/benchmarks.md.")
		fs.PrintDefaults()
	}
	dsn := fs.String("dsn", os.Getenv("RENDERQUEUE_DSN"), "PostgreSQL connection string of the server (default $RENDERQUEUE_DSN)")
	rows := fs.Int("rows", 1_000_000, "due rows in each queue")
	duration := fs.Duration("duration", 10*time.Second, "length of each run")
	workers := fs.Int("workers", 32, "keeper run: workers")
	batch := fs.Int("batch", 1000, "keeper run: rows per claim")
	skip := fs.String("skip-locked", "1x1000,1x5000,1x10000,1x20000,2x1000,2x5000,4x1000", "SKIP LOCKED runs: WORKERSxBATCH, comma-separated (the best counts; a batch up to 100000)")
	triggerRounds := fs.Int("trigger-rounds", 40, "batches of the trigger measurement (0: skip it)")
	keep := fs.Bool("keep-database", false, "keep the scratch database")
	postgresCPUs := fs.String("postgres-cpus", "", "CPU list (e.g. 0): run PostgreSQL's processes there and the keeper and the workers on the other CPUs, as if the database had a machine of its own (the server must run here; needs root or the server's user)")
	rounds := fs.Int("rounds", 1, "run the whole benchmark this many times, each on a scratch database of its own and the SKIP LOCKED queue first in every second round, and report the median ratio and its range (one run's ratio is not a verdict: docs/benchmarks.md)")
	verbose := fs.Bool("v", false, "show progress and the keeper's log on stderr")
	if err := ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if strings.TrimSpace(*dsn) == "" {
		return errors.New("--dsn (or RENDERQUEUE_DSN) is required")
	}
	if *rounds < 1 || *rounds > 100 {
		return fmt.Errorf("--rounds %d: must be within 1..100", *rounds)
	}
	shapes, err := parseShapes(*skip)
	if err != nil {
		return fmt.Errorf("--skip-locked: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this binary to start the keeper: %w", err)
	}
	cfg := bench.Config{
		ServerDSN: *dsn, Rows: *rows, Duration: *duration, Keeper: bench.Shape{Workers: *workers, Batch: *batch},
		SkipLocked: shapes, TriggerRounds: *triggerRounds, KeepDatabase: *keep, PostgresCPUs: *postgresCPUs,
		StartKeeper: func(ctx context.Context, dsn, token string) (*bench.Keeper, error) {
			return startKeeperProcess(ctx, self, dsn, token, *verbose, stderr)
		},
	}
	if *triggerRounds == 0 {
		cfg.TriggerRounds = -1
	}
	if *verbose {
		cfg.Log = func(format string, args ...any) {
			_, _ = fmt.Fprintf(stderr, "bench: "+format+"\n", args...)
		}
	}
	// one round prints its report alone; several print each with a header, then the medians
	var writeErr error
	rs, err := bench.RunRounds(ctx, cfg, *rounds, func(i int, rep bench.Report) {
		if *rounds == 1 {
			writeErr = rep.Write(stdout)
			return
		}
		first := "the keeper first"
		if rep.SkipLockedFirst {
			first = "the SKIP LOCKED queue first"
		}
		_, e := fmt.Fprintf(stdout, "=== round %d of %d (%s)\n", i+1, *rounds, first)
		writeErr = errors.Join(writeErr, e, rep.Write(stdout))
		_, e = fmt.Fprintln(stdout)
		writeErr = errors.Join(writeErr, e)
	})
	if *rounds > 1 && len(rs) > 0 {
		_, e := fmt.Fprintln(stdout, "=== all rounds")
		writeErr = errors.Join(writeErr, e, rs.Write(stdout))
	}
	if err != nil {
		return err
	}
	if writeErr != nil {
		return writeErr
	}
	if u := rs.Unverified(); u > 0 {
		return fmt.Errorf("%d acknowledged completions are not in the database", u)
	}
	return nil
}

// parseShapes parses "8x100,16x100".
func parseShapes(s string) ([]bench.Shape, error) {
	var out []bench.Shape
	for _, f := range strings.Split(s, ",") {
		w, b, ok := strings.Cut(strings.TrimSpace(f), "x")
		wn, err1 := strconv.Atoi(w)
		bn, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%q is not WORKERSxBATCH (e.g. 8x100)", f)
		}
		out = append(out, bench.Shape{Workers: wn, Batch: bn})
	}
	return out, nil
}

// startKeeperProcess starts `renderqueue keeper` (standalone, window 0) on a free loopback port.
func startKeeperProcess(ctx context.Context, self, dsn, token string, verbose bool, stderr io.Writer) (*bench.Keeper, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "keeper", "--dsn", dsn, "--listen", addr, "--window", "0", "--name", "bench")
	cmd.Env = append(os.Environ(), "RENDERQUEUE_TOKEN="+token)
	if verbose {
		cmd.Stdout, cmd.Stderr = stderr, stderr
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s keeper: %w", self, err)
	}
	exited := make(chan error, 1)
	done := make(chan struct{})
	var exitErr error
	go func() { exitErr = cmd.Wait(); close(done); exited <- exitErr }()
	var once sync.Once
	var stopErr error
	stop := func() error {
		once.Do(func() {
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
				stopErr = err
				return
			}
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-done
				stopErr = errors.New("the keeper did not stop within 30s of SIGTERM; killed")
			}
		})
		return stopErr
	}
	go func() {
		select {
		case <-ctx.Done():
			_ = stop()
		case <-done:
		}
	}()
	return &bench.Keeper{URL: "http://" + addr, PID: cmd.Process.Pid, Stop: stop, Exited: exited}, nil
}
