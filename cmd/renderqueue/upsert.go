package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/renderqueue/renderqueue/internal/cli"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
)

// badLinesShown caps the bad lines printed one by one (all are counted).
const badLinesShown = 100

// runUpsert is `renderqueue upsert`: write schedule rows given as NDJSON (store.UpsertNDJSON).
func runUpsert(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("upsert", flag.ContinueOnError)
	fs.Usage = func() {
		_, _ = fmt.Fprintln(fs.Output(), "usage: renderqueue upsert --dsn DSN [--file F] [--batch N] < rows.ndjson")
		_, _ = fmt.Fprintln(fs.Output(), "\nAdds or changes schedule rows, one JSON object per line:")
		_, _ = fmt.Fprintln(fs.Output(), `  {"key":"https://shop.example.com/p/1","cadence":"96h","route":"product","source":"submitted","due":"2026-12-01T10:00:00Z"}`)
		_, _ = fmt.Fprintln(fs.Output(), `  {"key":"https://shop.example.com/p/2","cadence":"24h","unscheduled":true}`)
		_, _ = fmt.Fprintln(fs.Output(), "key and cadence are required, and one of due (RFC 3339) and \"unscheduled\": true; route (\"\"),")
		_, _ = fmt.Fprintln(fs.Output(), "source (discovered) and urgent (false) are optional. Each line is checked on its own: a bad line")
		_, _ = fmt.Fprintln(fs.Output(), "is reported with its number on stderr and writes nothing; good lines are written in batches, each")
		_, _ = fmt.Fprintln(fs.Output(), "one transaction. Exits 1 when any line was bad or a batch could not be written.")
		fs.PrintDefaults()
	}
	dsn := fs.String("dsn", os.Getenv("RENDERQUEUE_DSN"), "PostgreSQL connection string (default $RENDERQUEUE_DSN)")
	file := fs.String("file", "-", "read the rows from this file (-: standard input)")
	batch := fs.Int("batch", 1000, "rows per transaction")
	if err := cli.ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if strings.TrimSpace(*dsn) == "" {
		return errors.New("--dsn (or RENDERQUEUE_DSN) is required")
	}
	if *batch < 1 {
		return fmt.Errorf("--batch %d is below 1", *batch)
	}
	in := io.Reader(os.Stdin)
	if *file != "-" {
		f, err := os.Open(*file)
		if err != nil {
			return fmt.Errorf("opening the rows: %w", err)
		}
		defer func() { _ = f.Close() }()
		in = f
	}
	st, err := postgres.Open(ctx, *dsn, postgres.Options{MaxConns: 2})
	if err != nil {
		return err
	}
	defer func() { _ = st.Close() }()
	shown := 0
	res, err := store.UpsertNDJSON(ctx, st, in, store.NDJSONOptions{Batch: *batch, BadLine: func(line int, err error) {
		// shown as they are found, up to a cap; all are counted
		if shown++; shown <= badLinesShown {
			_, _ = fmt.Fprintf(stderr, "line %d: %v\n", line, err)
		}
	}})
	if shown > badLinesShown {
		_, _ = fmt.Fprintf(stderr, "... and %d more bad lines\n", shown-badLinesShown)
	}
	if _, perr := fmt.Fprintf(stdout, "upsert: read %d lines: wrote %d rows in %d transactions, %d bad lines (not written), %d blank\n",
		res.Lines, res.Written, res.Batches, res.Bad, res.Blank); perr != nil && err == nil {
		err = perr
	}
	if err != nil {
		return err
	}
	if res.Bad > 0 {
		return fmt.Errorf("%d bad lines were not written (see above)", res.Bad)
	}
	return nil
}
