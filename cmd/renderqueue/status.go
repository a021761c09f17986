package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/statusview"
)

// pluginName is the name under which the binary is the kubectl plugin `kubectl renderqueue`.
const pluginName = "kubectl-renderqueue"

// pluginArgs turns the arguments of `kubectl renderqueue NAME [flags]` (the binary run as, or
// linked as, kubectl-renderqueue) into those of `renderqueue status NAME [flags]`, and those of
// `kubectl renderqueue explain NAME KEY [flags]` into `renderqueue explain NAME KEY [flags]`;
// other invocations' arguments pass unchanged. argv includes the program name.
func pluginArgs(argv []string) []string {
	if len(argv) == 0 || strings.TrimSuffix(filepath.Base(argv[0]), ".exe") != pluginName {
		return argv[1:]
	}
	args := argv[1:]
	if len(args) > 0 && args[0] == "explain" {
		return args
	}
	if len(args) > 0 && args[0] == "status" {
		args = args[1:]
	}
	return append([]string{"status"}, args...)
}

// runStatus is `renderqueue status`: a readable summary of keeper shards' /v1/status, either of
// each shard given by URL, or of a whole RenderQueue read through the Kubernetes API (kubectl's
// flags: --kubeconfig, --context, -n), its shards through the API server's Pod proxy — the
// command behind the `kubectl renderqueue` plugin (pkg/statusview).
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("status", pflag.ContinueOnError)
	fs.SortFlags = false
	urls := fs.String("url", os.Getenv("RENDERQUEUE_SHARDS"), "keeper shard base URL(s), comma-separated (default $RENDERQUEUE_SHARDS)")
	rqName := fs.String("renderqueue", "", "show this RenderQueue: its shards as a table, read through the API server's Pod proxy (or give NAME as the argument)")
	asJSON := fs.Bool("json", false, "print the raw status JSON instead")
	timeout := fs.Duration("timeout", 10*time.Second, "per-shard request timeout")
	kube := genericclioptions.NewConfigFlags(false)
	kube.AddFlags(fs)
	fs.Usage = func() {
		_, _ = fmt.Fprintln(fs.Output(), "usage: renderqueue status NAME [-n NAMESPACE] [--context CONTEXT] [--kubeconfig FILE] [--json]")
		_, _ = fmt.Fprintln(fs.Output(), "       renderqueue status --url URL[,URL...] [--json]")
		_, _ = fmt.Fprintln(fs.Output(), "       kubectl renderqueue NAME [-n NAMESPACE]   (this binary linked as kubectl-renderqueue on PATH)")
		_, _ = fmt.Fprintln(fs.Output(), "\nWith a RenderQueue NAME: its shards' state, exactness, due, edge, last walk and p99 lateness as a")
		_, _ = fmt.Fprintln(fs.Output(), "table, and what comes due by hour as a chart; the shards are read through the API server's Pod")
		_, _ = fmt.Fprintln(fs.Output(), "proxy (needs get on renderqueues and pods/proxy). With --url: each shard's /v1/status in full.")
		_, _ = fmt.Fprintln(fs.Output(), "\nflags:")
		fs.PrintDefaults()
	}
	if err := parsePFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 1:
		return fmt.Errorf("unexpected arguments %q: give one RenderQueue name", fs.Args()[1:])
	case fs.NArg() == 1 && *rqName != "" && fs.Arg(0) != *rqName:
		return fmt.Errorf("two RenderQueue names: %q and --renderqueue %q", fs.Arg(0), *rqName)
	case fs.NArg() == 1:
		*rqName = fs.Arg(0)
	}
	if *timeout <= 0 {
		return fmt.Errorf("--timeout %v is not positive", *timeout)
	}
	if *rqName != "" {
		if fs.Changed("url") {
			return errors.New("--url and a RenderQueue name exclude each other: give one")
		}
		return queueStatus(ctx, kube, *rqName, *asJSON, *timeout, stdout)
	}
	var list []string
	for _, u := range strings.Split(*urls, ",") {
		if u = strings.TrimSpace(u); u != "" {
			list = append(list, u)
		}
	}
	if len(list) == 0 {
		return errors.New("give a RenderQueue NAME, or --url (or RENDERQUEUE_SHARDS)")
	}
	hc := &http.Client{Timeout: *timeout}
	var errs []error
	for i, u := range list {
		st, err := client.GetStatus(ctx, hc, u)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if i > 0 {
			_, _ = fmt.Fprintln(stdout)
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			err = enc.Encode(st)
		} else {
			err = statusview.Write(stdout, *st)
		}
		if err != nil {
			return fmt.Errorf("printing the status of %s: %w", u, err)
		}
	}
	return errors.Join(errs...)
}

// queueStatus prints the RenderQueue name of the kubeconfig's namespace (-n) and its shards, as the
// queue view or its JSON (pkg/statusview).
func queueStatus(ctx context.Context, kube *genericclioptions.ConfigFlags, name string, asJSON bool, timeout time.Duration, stdout io.Writer) error {
	ns, _, err := kube.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return fmt.Errorf("the namespace: %w", err)
	}
	cfg, err := kube.ToRESTConfig()
	if err != nil {
		return fmt.Errorf("the Kubernetes client configuration: %w", err)
	}
	q, err := statusview.LoadQueue(ctx, cfg, ns, name, timeout)
	if err != nil {
		return err
	}
	if asJSON {
		return statusview.WriteQueueJSON(stdout, q)
	}
	return statusview.WriteQueue(stdout, q)
}

// parsePFlags parses args into fs as cli.ParseFlags does for the standard flag package: the usage
// that -h asks for goes to stdout (and flag.ErrHelp is returned), a parse error's to stderr.
func parsePFlags(fs *pflag.FlagSet, args []string, stdout, stderr io.Writer) error {
	var out strings.Builder
	fs.SetOutput(&out)
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	if errors.Is(err, pflag.ErrHelp) {
		_, _ = io.WriteString(stdout, out.String())
		return flag.ErrHelp
	}
	_, _ = io.WriteString(stderr, out.String())
	return err
}
