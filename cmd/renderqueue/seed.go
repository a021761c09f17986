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
	"github.com/renderqueue/renderqueue/pkg/seed"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
)

// runSeed is `renderqueue seed`: write synthetic schedule rows (pkg/seed) into PostgreSQL.
func runSeed(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("seed", flag.ContinueOnError)
	fs.Usage = func() {
		_, _ = fmt.Fprintln(fs.Output(), "usage: renderqueue seed --dsn DSN [--rows N] [flags]")
		_, _ = fmt.Fprintln(fs.Output(), "\nWrites N synthetic schedule rows: ~97% 96 h product pages, ~3% 24 h categories, a few")
		_, _ = fmt.Fprintln(fs.Output(), "hundred 1 h homepages, half submitted, due times spread over each cadence around now.")
		fs.PrintDefaults()
	}
	dsn := fs.String("dsn", os.Getenv("RENDERQUEUE_DSN"), "PostgreSQL connection string (default $RENDERQUEUE_DSN)")
	rows := fs.Int("rows", 200000, "rows to write")
	homepages := fs.Int("homepages", 300, "how many of the rows are 1 h homepages")
	categoryShare := fs.Float64("category-share", float64(seed.DefaultCategoryPermille)/1000, "share of the non-homepage rows rendering every 24 h (the rest: 96 h)")
	dueShare := fs.Float64("due-share", seed.DefaultDueShare, "share of each ordinary row's cadence lying before now (≈ share already due)")
	overdue := fs.Int("overdue", 0, "backlog: how many of the rows are due between now − cadence·overdue-cycles and now")
	overdueCycles := fs.Float64("overdue-cycles", seed.DefaultOverdueCycles, "how many cadences back the backlog reaches")
	urgent := fs.Int("urgent", 0, "how many of the rows are urgent and due now")
	keyPrefix := fs.String("key-prefix", seed.DefaultKeyPrefix, "start of every key (keys are PREFIX/<route>/<n>); change it to add distinct rows")
	seedVal := fs.Uint64("seed", 1, "random seed (same seed and flags, same rows)")
	batch := fs.Int("batch", 5000, "rows per Upsert")
	parallel := fs.Int("parallel", 2, "Upserts in flight at once")
	migrate := fs.Bool("migrate", false, "migrate the schema first")
	progressEvery := fs.Duration("progress", time.Second, "progress line interval on stderr (0: none)")
	if err := cli.ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if strings.TrimSpace(*dsn) == "" {
		return errors.New("--dsn (or RENDERQUEUE_DSN) is required")
	}
	if *categoryShare < 0 || *categoryShare > 1 {
		return fmt.Errorf("--category-share %v is not within [0, 1]", *categoryShare)
	}
	plan := seed.Plan{
		Rows:             *rows,
		Homepages:        min(*homepages, max(*rows, 0)),
		CategoryPermille: int(*categoryShare*1000 + 0.5),
		Overdue:          *overdue,
		OverdueCycles:    *overdueCycles,
		Urgent:           *urgent,
		DueShare:         *dueShare,
		KeyPrefix:        *keyPrefix,
		Seed:             *seedVal,
	}.Defaults()
	if *categoryShare == 0 {
		plan.CategoryPermille = 0
	}
	if *dueShare == 0 {
		plan.DueShare = 0
	}
	if err := plan.Validate(); err != nil {
		return err
	}

	st, err := postgres.Open(ctx, *dsn, postgres.Options{MaxConns: int32(max(*parallel, 1)) + 1})
	if err != nil {
		return err
	}
	defer func() { _ = st.Close() }()
	if *migrate {
		if err := st.Migrate(ctx); err != nil {
			return fmt.Errorf("migrating the schema: %w", err)
		}
	}

	var last time.Time
	progress := func(p seed.Progress) {
		if *progressEvery <= 0 || (p.Written < p.Total && time.Since(last) < *progressEvery) {
			return
		}
		last = time.Now()
		_, _ = fmt.Fprintf(stderr, "seed: %d/%d rows (%.0f%%), %.0f rows/s\n", p.Written, p.Total,
			100*float64(p.Written)/float64(max(p.Total, 1)), p.RowsPerSecond())
	}
	now := time.Now()
	sum, err := seed.Write(ctx, st, plan, seed.WriteOptions{Batch: *batch, Parallel: *parallel, Now: now, Progress: progress})
	if err != nil {
		return fmt.Errorf("seeding (%d rows written): %w", sum.Written, err)
	}
	_, err = fmt.Fprintf(stdout, "seeded %d rows in %.1fs (%.0f rows/s): product %d, category %d, home %d; submitted %d, urgent %d, due now %d; keys %s/<route>/<n>\n",
		sum.Written, sum.Elapsed.Seconds(), sum.RowsPerSecond(), sum.ByRoute[seed.RouteProduct], sum.ByRoute[seed.RouteCategory],
		sum.ByRoute[seed.RouteHome], sum.Submitted, sum.Urgent, sum.DueNow, plan.KeyPrefix)
	return err
}
