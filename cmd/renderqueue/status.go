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
	"strings"
	"time"

	"github.com/renderqueue/renderqueue/pkg/statusview"
)

// runStatus is `renderqueue status --url URL`: print a keeper shard's /v1/status for people
// (pkg/statusview).
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		_, _ = fmt.Fprintln(stderr, "usage: renderqueue status --url URL[,URL...] [--json]")
		_, _ = fmt.Fprintln(stderr, "\nPrints a readable summary of each keeper shard's GET /v1/status.")
		fs.PrintDefaults()
	}
	urls := fs.String("url", os.Getenv("RENDERQUEUE_SHARDS"), "keeper shard base URL(s), comma-separated (default $RENDERQUEUE_SHARDS)")
	asJSON := fs.Bool("json", false, "print the raw status JSON instead")
	timeout := fs.Duration("timeout", 10*time.Second, "per-shard request timeout")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var list []string
	for _, u := range strings.Split(*urls, ",") {
		if u = strings.TrimSpace(u); u != "" {
			list = append(list, u)
		}
	}
	if len(list) == 0 {
		return errors.New("--url (or RENDERQUEUE_SHARDS) is required")
	}
	client := &http.Client{Timeout: *timeout}
	var errs []error
	for i, u := range list {
		st, err := statusview.Fetch(ctx, client, u)
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
			err = statusview.Write(stdout, st)
		}
		if err != nil {
			return fmt.Errorf("printing the status of %s: %w", u, err)
		}
	}
	return errors.Join(errs...)
}
