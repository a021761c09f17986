package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/renderqueue/renderqueue/internal/cli"
	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/statusview"
)

// runExplain is `renderqueue explain` (and `kubectl renderqueue explain`): what the shards know
// of one row — its slot and owner, held or why not, lateness, score, lease, rank and a rough
// estimate of its claim — from the shard that owns its slot (GET /v1/rows/{key}). With a
// RenderQueue NAME the shards are asked through the API server's Pod proxy with the token of
// the queue's Secret; with --url, at their addresses with --token-file.
func runExplain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("explain", pflag.ContinueOnError)
	fs.SortFlags = false
	urls := fs.String("url", "", "ask the keeper shard(s) at these base URLs, comma-separated, instead of a RenderQueue's")
	tokenFile := fs.String("token-file", "", "file holding the shards' API token (default: with NAME the RenderQueue's Secret <NAME>-api-token; with --url $RENDERQUEUE_TOKEN)")
	caFile := fs.String("shard-ca-file", "", "with --url: PEM CA bundle the shards' https:// URLs are verified with (the ConfigMap <NAME>-shard-ca)")
	serverName := fs.String("shard-server-name", "", "with --url: the name the shards' certificate is verified for (<NAME>-shards.<NAMESPACE>.svc for the operator's)")
	asJSON := fs.Bool("json", false, "print the shard's answer as JSON (GET /v1/rows/{key})")
	timeout := fs.Duration("timeout", 10*time.Second, "per-shard request timeout")
	kube := genericclioptions.NewConfigFlags(false)
	kube.AddFlags(fs)
	fs.Usage = func() {
		_, _ = fmt.Fprintln(fs.Output(), "usage: renderqueue explain NAME KEY [-n NAMESPACE] [--context CONTEXT] [--kubeconfig FILE] [--json]")
		_, _ = fmt.Fprintln(fs.Output(), "       renderqueue explain --url URL[,URL...] KEY [--token-file FILE] [--shard-ca-file FILE --shard-server-name NAME] [--json]")
		_, _ = fmt.Fprintln(fs.Output(), "       kubectl renderqueue explain NAME KEY [-n NAMESPACE]   (this binary linked as kubectl-renderqueue on PATH)")
		_, _ = fmt.Fprintln(fs.Output(), "\nWhat the shard that owns KEY's slot knows of the row: held or why not (beyond the window, another")
		_, _ = fmt.Fprintln(fs.Output(), "shard's slot, invalid, not seen yet), its lateness and score, its lease (never the token), its rank")
		_, _ = fmt.Fprintln(fs.Output(), "among the shard's due rows in claim order and a rough estimate of when a claim takes it. A key no")
		_, _ = fmt.Fprintln(fs.Output(), "row has, or an invalid one, is an error that says so. With NAME the shards are asked through the")
		_, _ = fmt.Fprintln(fs.Output(), "API server's Pod proxy (needs get on renderqueues, on pods/proxy and on the Secret NAME-api-token).")
		_, _ = fmt.Fprintln(fs.Output(), "\nflags:")
		fs.PrintDefaults()
	}
	if err := parsePFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if *timeout <= 0 {
		return fmt.Errorf("--timeout %v is not positive", *timeout)
	}
	var ex statusview.Explained
	switch {
	case fs.Changed("url"):
		if fs.NArg() != 1 {
			return fmt.Errorf("with --url give one KEY, got %d arguments", fs.NArg())
		}
		var list []string
		for _, u := range strings.Split(*urls, ",") {
			if u = strings.TrimSpace(u); u != "" {
				list = append(list, u)
			}
		}
		if len(list) == 0 {
			return errors.New("--url is empty")
		}
		token, err := cli.ReadToken(*tokenFile)
		if err != nil {
			return err
		}
		hc := &http.Client{}
		if *caFile != "" || *serverName != "" {
			if hc, err = client.NewHTTPClient(client.TLSOptions{CAFile: *caFile, ServerName: *serverName}); err != nil {
				return fmt.Errorf("--shard-ca-file: %w", err)
			}
		}
		hc.Timeout = *timeout
		ex, err = statusview.ExplainAt(ctx, hc, list, fs.Arg(0), token)
		if err != nil {
			return err
		}
	default:
		if fs.NArg() != 2 {
			return fmt.Errorf("give a RenderQueue NAME and a KEY (or --url URL KEY), got %d arguments", fs.NArg())
		}
		name, key := fs.Arg(0), fs.Arg(1)
		ns, _, err := kube.ToRawKubeConfigLoader().Namespace()
		if err != nil {
			return fmt.Errorf("the namespace: %w", err)
		}
		cfg, err := kube.ToRESTConfig()
		if err != nil {
			return fmt.Errorf("the Kubernetes client configuration: %w", err)
		}
		token := ""
		if *tokenFile != "" {
			if token, err = cli.ReadToken(*tokenFile); err != nil {
				return err
			}
		} else if token, err = statusview.ReadQueueToken(ctx, cfg, ns, name); err != nil {
			return err
		}
		if ex, err = statusview.ExplainInQueue(ctx, cfg, ns, name, key, token, *timeout); err != nil {
			return err
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(ex.Row)
	}
	return statusview.WriteExplained(stdout, ex)
}
