// Command localcluster runs renderqueue's local Kubernetes stack for `make demo` (and for poking
// around by hand): it builds the images (hack/images.sh: the renderqueue image of `make image`,
// the sandbox, CoreDNS), starts a throwaway PostgreSQL and a one-node cluster of real components
// (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd, the kubelet,
// kube-proxy, CoreDNS: package test/e2e/cluster), writes a shell environment file (KUBECONFIG,
// RENDERQUEUE_DSN, RENDERQUEUE_POD_DSN, ...) once everything is up, then runs until SIGINT or
// SIGTERM and stops everything it started, leaving the machine as it found it. A second
// localcluster on the same machine refuses to start while one runs.
//
//	localcluster --assets DIR --env-file /tmp/x/env [--dir DIR] [-v]
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
	"github.com/renderqueue/renderqueue/test/e2e/cluster/node"
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
	dir := fs.String("dir", "", "state directory (default: a new temporary directory, removed on exit)")
	envFile := fs.String("env-file", "", "write KUBECONFIG, RENDERQUEUE_DSN, ... here (shell syntax) once the stack is up")
	verbose := fs.Bool("v", false, "copy every component's output to stderr")
	noPostgres := fs.Bool("no-postgres", false, "leave out the throwaway PostgreSQL")
	waitNode := fs.Bool("wait", false, "wait for another local cluster on this machine to end instead of refusing to start")
	sweep := fs.Bool("sweep", false, "only remove what a killed run left on this machine (hack/node.sh sweep), then exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *sweep {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		return node.SweepMachine(ctx, node.HostOptions{Logf: func(format string, a ...any) {
			_, _ = fmt.Fprintf(stderr, "localcluster: %s\n", fmt.Sprintf(format, a...))
		}})
	}
	if *assets == "" {
		return fmt.Errorf("--assets (or KUBEBUILDER_ASSETS) is required; run hack/setup-envtest.sh")
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
	logf("building the images (hack/images.sh)")
	images, err := cluster.BuildImages(ctx, repoAbs, *assets, logf)
	if err != nil {
		return err
	}
	c, err := cluster.Start(ctx, cluster.Options{
		Repo: repoAbs, Assets: *assets, Dir: stateDir, Logf: logf, ComponentLog: componentLog, SkipPostgres: *noPostgres, WaitForNode: *waitNode,
		Images: images.Archives, SandboxImage: images.Sandbox, CoreDNSImage: images.CoreDNS,
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
			"export LOCALCLUSTER_POD_LOGS=" + shellQuote(node.StateDir+"/pod-logs"),
			"export LOCALCLUSTER_POD_CIDR=" + shellQuote(node.PodCIDR),
			"export LOCALCLUSTER_IMAGE=" + shellQuote(images.Renderqueue),
		}
		if c.Postgres != nil {
			lines = append(lines, "export RENDERQUEUE_DSN="+shellQuote(c.Postgres.DSN),
				"export RENDERQUEUE_POD_DSN="+shellQuote(c.Postgres.PodDSN))
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
