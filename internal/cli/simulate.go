package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/objective"
	"github.com/renderqueue/renderqueue/pkg/simulate"
)

// Simulate is `renderqueue simulate`: the keeper core on virtual time for capacity planning
// (pkg/simulate).
func Simulate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.Usage = func() {
		_, _ = fmt.Fprintln(fs.Output(), "usage: renderqueue simulate (--load L | --capacity R | --workers W --render-time T) [flags]")
		_, _ = fmt.Fprintln(fs.Output(), "\nRuns the keeper core on virtual time (no database, no sleeping) for a fleet and a render")
		_, _ = fmt.Fprintln(fs.Output(), "capacity, and prints per class how late renders start, renders versus demand, the longest")
		_, _ = fmt.Fprintln(fs.Output(), "wait of a class with due rows, rows not rendered in the last cadence, and the due count")
		_, _ = fmt.Fprintln(fs.Output(), "over time. The fleet is the seed mix (--rows, --homepages, ...) or a YAML file (--fleet).")
		_, _ = fmt.Fprintln(fs.Output(), "With --objectives it reports how each run keeps freshness objectives and, with --render-time,")
		_, _ = fmt.Fprintln(fs.Output(), "searches the fewest workers that keep them all. See docs/priority.md.")
		fs.PrintDefaults()
	}
	fleetFile := fs.String("fleet", "", "YAML file describing the fleet's classes (see docs/priority.md); replaces the seed-mix flags")
	rows := fs.Int("rows", 200_000, "seed mix: rows")
	homepages := fs.Int("homepages", 300, "seed mix: 1 h homepages among the rows")
	categoryPermille := fs.Int("category-permille", 30, "seed mix: share (‰) of the other rows that render every 24 h; the rest every 96 h")
	backlog := fs.Float64("backlog", 0, "seed mix: share of every class overdue at the start (1: a whole-fleet backlog)")
	backlogCycles := fs.Float64("backlog-cycles", simulate.DefaultBacklogCycles, "seed mix: how many cadences back the backlog reaches")
	load := fs.Float64("load", 0, "demand ÷ capacity: sets the capacity to the fleet's demand / load (0.8: 80% load)")
	capacity := fs.Float64("capacity", 0, "renders per hour the workers complete")
	workers := fs.Int("workers", 0, "render workers (with --render-time: capacity = workers × 1h / render-time)")
	renderTime := fs.Duration("render-time", 0, "time one render takes (with --workers)")
	orders := fs.String("order", "keeper", "claim orders to run, comma-separated: keeper, oldest-due, class-priority, or all")
	def := simulate.DefaultKeeper()
	boost := fs.Float64("submitted-boost", def.SubmittedBoost, "keeper: score multiplier for rows from a sitemap")
	urgentShare := fs.Float64("urgent-max-share", def.UrgentMaxShare, "keeper: most of a claim urgent rows may take (the simulated fleet has no urgent rows)")
	var floors FloorFlags
	fs.Var(&floors, "floor", "keeper: a class's floor, CADENCE/SOURCE=SHARE (e.g. 96h/discovered=0.05); repeat or comma-separate")
	resched := RescheduleFlag{Policy: def.Reschedule}
	fs.Var(&resched, "reschedule", "next due time of a rendered row: Adaptive, KeepPhase or AfterRender (every order)")
	starvation := fs.Float64("starvation-bound", def.StarvationBound, "keeper: a class with due rows and no render for this many of its cadences gets its most overdue row next; 0: off (the keeper always runs with the default)")
	batch := fs.Int("batch", simulate.DefaultBatch, "rows per claim")
	tick := fs.Duration("tick", simulate.DefaultTick, "time step: claims at its start, completions at its end")
	duration := fs.Duration("duration", 240*time.Hour, "simulated time")
	measureFrom := fs.Duration("measure-from", 0, "start measuring this long after the start (e.g. 120h for days 6 to 10)")
	sample := fs.Duration("sample", 0, "interval of the due-count samples (default: duration / 20)")
	seedVal := fs.Uint64("seed", 1, "random seed of due times and key hashes")
	objectivesFile := fs.String("objectives", "", "YAML file of freshness objectives (a list under objectives, or a RenderQueue manifest's spec.objectives): prints how each run keeps them and, with --render-time, the fewest workers that keep them all (docs/priority.md)")
	maxWorkers := fs.Int("max-workers", 10000, "with --objectives and --render-time: the most workers the search tries")
	if err := ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var fleet simulate.Fleet
	if *fleetFile != "" {
		for _, name := range []string{"rows", "homepages", "category-permille", "backlog", "backlog-cycles"} {
			if set[name] {
				return fmt.Errorf("--%s describes the seed mix; with --fleet the file describes the fleet", name)
			}
		}
		data, err := os.ReadFile(*fleetFile)
		if err != nil {
			return fmt.Errorf("reading the fleet: %w", err)
		}
		if fleet, err = simulate.ParseFleet(data); err != nil {
			return fmt.Errorf("%s: %w", *fleetFile, err)
		}
	} else {
		if *rows <= 0 || *homepages < 0 || *homepages > *rows {
			return fmt.Errorf("--rows %d and --homepages %d: want rows > 0 and 0 ≤ homepages ≤ rows", *rows, *homepages)
		}
		if *categoryPermille < 0 || *categoryPermille > 1000 {
			return fmt.Errorf("--category-permille %d is not within [0, 1000]", *categoryPermille)
		}
		fleet = simulate.SeedFleet(*rows, *homepages, *categoryPermille, *backlog)
		for i := range fleet.Classes {
			fleet.Classes[i].BacklogCycles = *backlogCycles
		}
	}

	capacityGiven := 0
	for _, n := range []string{"load", "capacity", "workers"} {
		if set[n] {
			capacityGiven++
		}
	}
	if capacityGiven != 1 {
		return errors.New("give the render capacity one way: --load, --capacity, or --workers with --render-time")
	}
	if set["workers"] != set["render-time"] {
		return errors.New("--workers and --render-time go together")
	}
	if set["workers"] {
		if *workers <= 0 || *renderTime <= 0 {
			return fmt.Errorf("--workers %d and --render-time %v must be positive", *workers, *renderTime)
		}
		*capacity = float64(*workers) * float64(time.Hour) / float64(*renderTime)
	}
	if set["load"] && !(*load > 0) {
		return fmt.Errorf("--load %v must be > 0", *load)
	}
	if set["capacity"] && !(*capacity > 0) {
		return fmt.Errorf("--capacity %v must be > 0", *capacity)
	}
	var objs []objective.Objective
	if *objectivesFile != "" {
		data, err := os.ReadFile(*objectivesFile)
		if err != nil {
			return fmt.Errorf("reading the objectives: %w", err)
		}
		if objs, err = objective.Parse(data); err != nil {
			return fmt.Errorf("%s: %w", *objectivesFile, err)
		}
	} else if set["max-workers"] {
		return errors.New("--max-workers bounds the search of --objectives")
	}
	if *maxWorkers < 1 {
		return fmt.Errorf("--max-workers %d must be at least 1", *maxWorkers)
	}

	var runOrders []simulate.Order
	if *orders == "all" {
		runOrders = simulate.Orders
	} else {
		for _, o := range strings.Split(*orders, ",") {
			order, err := simulate.ParseOrder(strings.TrimSpace(o))
			if err != nil {
				return fmt.Errorf("--order: %w", err)
			}
			runOrders = append(runOrders, order)
		}
	}

	base := simulate.Config{
		Fleet: fleet, Capacity: *capacity, Batch: *batch, Tick: *tick, Duration: *duration,
		MeasureFrom: *measureFrom, Sample: *sample, Seed: *seedVal, Objectives: objs,
		Keeper: policy.Config{SubmittedBoost: *boost, UrgentMaxShare: *urgentShare, Floors: floors, Reschedule: resched.Policy,
			StarvationBound: *starvation},
	}
	if set["load"] {
		base.Load = *load
	}
	var results []*simulate.Result
	for i, o := range runOrders {
		if err := ctx.Err(); err != nil {
			return err
		}
		cfg := base
		cfg.Order = o
		res, err := simulate.Run(cfg)
		if err != nil {
			return err
		}
		if i > 0 {
			if _, err := fmt.Fprintln(stdout); err != nil {
				return err
			}
		}
		if err := simulate.Write(stdout, res); err != nil {
			return err
		}
		if len(objs) > 0 {
			if _, err := fmt.Fprintln(stdout, "\nobjectives:"); err != nil {
				return err
			}
			if err := simulate.WriteObjectives(stdout, res); err != nil {
				return err
			}
		}
		results = append(results, res)
	}
	if len(objs) > 0 && *renderTime > 0 {
		for _, o := range runOrders {
			cfg := base
			cfg.Order = o
			if _, err := fmt.Fprintf(stdout, "\nsearch (order %s): the fewest workers that keep every objective\n", o); err != nil {
				return err
			}
			s, err := simulate.NeededWorkers(cfg, *renderTime, *maxWorkers)
			if err != nil {
				return err
			}
			if err := simulate.WriteSearch(stdout, s, *renderTime, *maxWorkers); err != nil {
				return err
			}
		}
	} else if len(objs) > 0 {
		if _, err := fmt.Fprintln(stdout, "\n(give --workers and --render-time to search the workers needed)"); err != nil {
			return err
		}
	}
	if len(results) > 1 {
		if _, err := fmt.Fprintln(stdout, "\ncomparison:"); err != nil {
			return err
		}
		return simulate.WriteComparison(stdout, results)
	}
	return nil
}
