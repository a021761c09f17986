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

	"github.com/renderqueue/renderqueue/internal/cli"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
)

// runSchema is `renderqueue schema migrate --dsn ...`: apply the embedded schema migrations.
func runSchema(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const usage = "usage: renderqueue schema migrate --dsn DSN [--version N] [--partitions N] [--timeout 5m]"
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help") {
		_, _ = fmt.Fprintln(stdout, usage)
		return flag.ErrHelp
	}
	if len(args) == 0 || args[0] != "migrate" {
		_, _ = fmt.Fprintln(stderr, usage)
		return errors.New("unknown or missing schema subcommand (want: migrate)")
	}
	fs := flag.NewFlagSet("schema migrate", flag.ContinueOnError)
	fs.Usage = func() {
		_, _ = fmt.Fprintln(fs.Output(), usage)
		_, _ = fmt.Fprintf(fs.Output(), "\nApplies the embedded schema migrations the database lacks, up to the newest this binary knows\n"+
			"(version %d) or to --version, in one transaction; running it again applies nothing. Migrations\n"+
			"only go up: a --version below the database's fails and changes nothing.\n", postgres.SchemaVersion())
		fs.PrintDefaults()
	}
	dsn := fs.String("dsn", os.Getenv("RENDERQUEUE_DSN"), "PostgreSQL connection string (default $RENDERQUEUE_DSN)")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long")
	partitions := fs.Int("partitions", 0, "create render_schedule as N hash partitions of the key (2..1024; only when the schema is created; docs/scale.md)")
	version := fs.Int("version", 0, fmt.Sprintf("migrate up to this schema version (1..%d; not below the database's), 0: the newest", postgres.SchemaVersion()))
	if err := cli.ParseFlags(fs, args[1:], stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if strings.TrimSpace(*dsn) == "" {
		return errors.New("--dsn (or RENDERQUEUE_DSN) is required")
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	st, err := postgres.Open(ctx, *dsn, postgres.Options{})
	if err != nil {
		return err
	}
	defer func() { _ = st.Close() }()
	res, err := postgres.MigratePoolWith(ctx, st.Pool(), postgres.MigrateOptions{Partitions: *partitions, Version: *version})
	if err != nil {
		return err
	}
	if len(res.Applied) == 0 {
		_, err = fmt.Fprintf(stdout, "schema is up to date (version %d)\n", res.To)
		return err
	}
	_, err = fmt.Fprintf(stdout, "schema migrated from version %d to %d (%s)\n", res.From, res.To, strings.Join(res.Applied, ", "))
	return err
}
