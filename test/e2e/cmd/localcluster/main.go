// Command localcluster runs renderqueue's local Kubernetes stack for `make demo` (and for poking
// around by hand): a throwaway PostgreSQL, etcd, kube-apiserver with the aggregation layer,
// kube-controller-manager, and the runner that plays scheduler and kubelet for one Node and runs
// every Pod there — the operator's Deployment Pod and the shard Pods alike — with the renderqueue
// binary standing in for the renderqueue image (see package test/e2e/cluster). It writes a shell
// environment file (KUBECONFIG, RENDERQUEUE_DSN, RENDERQUEUE_POD_DSN, ...) once everything is up,
// then runs until SIGINT or SIGTERM and stops everything it started.
//
//	localcluster --assets DIR --binary bin/renderqueue --env-file /tmp/x/env [--dir DIR] [-v]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/renderqueue/renderqueue/test/e2e/cluster"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "localcluster: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("localcluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	repo := fs.String("repo", ".", "repository root (for hack/postgres.sh)")
	assets := fs.String("assets", os.Getenv("KUBEBUILDER_ASSETS"), "directory with etcd, kube-apiserver, kube-controller-manager, kubectl (default $KUBEBUILDER_ASSETS)")
	binary := fs.String("binary", "bin/renderqueue", "the renderqueue binary, run for every container whose image is .../renderqueue[:tag]")
	dir := fs.String("dir", "", "state directory (default: a new temporary directory, removed on exit)")
	envFile := fs.String("env-file", "", "write KUBECONFIG, RENDERQUEUE_DSN, ... here (shell syntax) once the stack is up")
	verbose := fs.Bool("v", false, "copy every component's output to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *assets == "" {
		return fmt.Errorf("--assets (or KUBEBUILDER_ASSETS) is required; run hack/setup-envtest.sh")
	}
	bin, err := filepath.Abs(*binary)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", *binary, err)
	}
	repoAbs, err := filepath.Abs(*repo)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", *repo, err)
	}
	stateDir := *dir
	if stateDir == "" {
		if stateDir, err = os.MkdirTemp("", "renderqueue-localcluster-"); err != nil {
			return fmt.Errorf("creating a state directory: %w", err)
		}
		defer func() { _ = os.RemoveAll(stateDir) }()
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, a ...any) {
		_, _ = fmt.Fprintf(stderr, "localcluster: [%s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, a...))
	}
	var componentLog io.Writer
	if *verbose {
		componentLog = stderr
	}
	c, err := cluster.Start(ctx, cluster.Options{
		Repo: repoAbs, Assets: *assets, Binary: bin, Dir: stateDir, Logf: logf, ComponentLog: componentLog,
	})
	if err != nil {
		return err
	}
	defer func() {
		logf("stopping everything")
		c.Stop()
		logf("stopped")
	}()
	if *envFile != "" {
		lines := []string{
			"export KUBECONFIG=" + shellQuote(c.Kubeconfig),
			"export LOCALCLUSTER_DIR=" + shellQuote(stateDir),
			"export LOCALCLUSTER_LOGS=" + shellQuote(c.LogDir()),
			"export LOCALCLUSTER_PID=" + strconv.Itoa(os.Getpid()),
			"export LOCALCLUSTER_PODS=" + shellQuote(filepath.Join(stateDir, "pods")),
			"export LOCALCLUSTER_POD_CIDR=" + shellQuote(c.Network.CIDR.String()),
		}
		if c.Postgres != nil {
			lines = append(lines, "export RENDERQUEUE_DSN="+shellQuote(c.Postgres.DSN),
				"export RENDERQUEUE_POD_DSN="+shellQuote(c.Postgres.TCPDSN))
		}
		tmp := *envFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", tmp, err)
		}
		if err := os.Rename(tmp, *envFile); err != nil {
			return fmt.Errorf("writing %s: %w", *envFile, err)
		}
	}
	logf("up; Ctrl-C (or SIGTERM to pid %d) stops it", os.Getpid())
	<-ctx.Done()
	return nil
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
