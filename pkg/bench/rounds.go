package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// Rounds is the reports of a benchmark run several times, in order.
//
// One run's ratio is not a verdict: on the 2-core development machine the best SKIP LOCKED shape
// alone varied 32,000–58,000 rows/s between runs minutes apart, and the keeper's rate 75,000–
// 112,000 (docs/benchmarks.md). The median of several rounds, each a keeper run and its SKIP
// LOCKED runs close together in time and compared with each other, is.
type Rounds []Report

// RunRounds runs the benchmark n times, each round on a scratch database of its own, the SKIP
// LOCKED queue first in every second round (Config.SkipLockedFirst), so that neither queue always
// runs after the other. done, when set, is called with each round's report as it ends. On an
// error the rounds that ended are returned with it.
func RunRounds(ctx context.Context, cfg Config, n int, done func(i int, r Report)) (Rounds, error) {
	if n < 1 {
		return nil, fmt.Errorf("bench: %d rounds: at least 1", n)
	}
	var out Rounds
	for i := range n {
		c := cfg
		c.SkipLockedFirst = i%2 == 1
		r, err := Run(ctx, c)
		if err != nil {
			return out, fmt.Errorf("round %d of %d: %w", i+1, n, err)
		}
		out = append(out, r)
		if done != nil {
			done(i, r)
		}
	}
	return out, nil
}

// FloorTarget is the most PostgreSQL CPU per completion through the keeper may be over the floor's
// (issue 42): the keeper's completion path costing at most 10% more than a bare UPDATE by key.
const FloorTarget = 1.10

// Spread is the median and the range of one figure over rounds.
type Spread struct {
	// N is how many rounds had the figure.
	N                int
	Median, Min, Max float64
}

// spreadOf is the spread of v (the median of an even count is the mean of the middle two).
func spreadOf(v []float64) Spread {
	if len(v) == 0 {
		return Spread{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Spread{N: len(s), Median: m, Min: s[0], Max: s[len(s)-1]}
}

// RoundsSummary is what the rounds measured, each figure as its median and range.
type RoundsSummary struct {
	// Keeper and SkipLocked are the keeper's rate and the best SKIP LOCKED shape's, rows/s.
	Keeper, SkipLocked Spread
	// Ratio is each round's keeper rate over its own best SKIP LOCKED rate.
	Ratio Spread
	// PostgresKeeper and PostgresSkipLocked are PostgreSQL's CPU per completed row (µs) of the
	// keeper run and of the best SKIP LOCKED run, over the rounds that measured it.
	PostgresKeeper, PostgresSkipLocked Spread
	// BusyKeeper and BusySkipLocked are the shares (0..1) of the CPUs PostgreSQL may run on that
	// it used in the keeper run and in the best SKIP LOCKED run (RunResult.PostgresBusy), over the
	// rounds that measured both; AtLimit is how many of those rounds had both at the database's
	// limit (limitBusy), where the ratio is about that of PostgreSQL's CPU per row.
	BusyKeeper, BusySkipLocked Spread
	AtLimit                    int
	// PostgresFloor is PostgreSQL's CPU per row of the floor run (µs), and FloorRatio each round's
	// keeper figure over its own floor's (Report.FloorRatio).
	PostgresFloor, FloorRatio Spread
}

// Summary is the rounds' figures as medians and ranges.
func (rs Rounds) Summary() RoundsSummary {
	var keeper, skip, ratio, pgK, pgS, busyK, busyS, pgF, floor []float64
	atLimit := 0
	for _, r := range rs {
		best := r.BestSkipLocked()
		keeper = append(keeper, r.Keeper.RowsPerSecond())
		skip = append(skip, best.RowsPerSecond())
		if q := r.Ratio(); q > 0 {
			ratio = append(ratio, q)
		}
		if d, ok := r.Keeper.PostgresPerRow(); ok {
			pgK = append(pgK, us(d))
		}
		if d, ok := best.PostgresPerRow(); ok {
			pgS = append(pgS, us(d))
		}
		if d, ok := r.Floor.PostgresPerRow(); ok {
			pgF = append(pgF, us(d))
		}
		if q, ok := r.FloorRatio(); ok {
			floor = append(floor, q)
		}
		k, _, okK := r.Keeper.PostgresBusy()
		b, _, okS := best.PostgresBusy()
		if okK && okS {
			busyK, busyS = append(busyK, k), append(busyS, b)
			if k >= limitBusy && b >= limitBusy {
				atLimit++
			}
		}
	}
	return RoundsSummary{Keeper: spreadOf(keeper), SkipLocked: spreadOf(skip), Ratio: spreadOf(ratio),
		PostgresKeeper: spreadOf(pgK), PostgresSkipLocked: spreadOf(pgS),
		BusyKeeper: spreadOf(busyK), BusySkipLocked: spreadOf(busyS), AtLimit: atLimit,
		PostgresFloor: spreadOf(pgF), FloorRatio: spreadOf(floor)}
}

// Unverified is how many acknowledged keeper completions of all rounds the database did not show.
func (rs Rounds) Unverified() int {
	n := 0
	for _, r := range rs {
		n += r.Keeper.Unverified()
	}
	return n
}

// Write prints one line per round and the medians over them.
func (rs Rounds) Write(w io.Writer) error {
	if len(rs) == 0 {
		return errors.New("bench: no rounds to report")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d rounds, each on a scratch database of its own\n\n", len(rs))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	row := func(format string, a ...any) { _, _ = fmt.Fprintf(tw, format, a...) }
	row("%s\n", "round\tfirst\tkeeper rows/s\tbest SKIP LOCKED rows/s\tkeeper / SKIP LOCKED\tPostgreSQL µs/row (keeper, SKIP LOCKED)\tload before\t")
	for i, r := range rs {
		first := "keeper"
		if r.SkipLockedFirst {
			first = "SKIP LOCKED"
		}
		best := r.BestSkipLocked()
		var notes []string
		if r.Keeper.Drained {
			notes = append(notes, "the keeper ran out of due rows")
		}
		if len(r.Keeper.Maintenance) > 0 {
			notes = append(notes, "vacuumed or analyzed in the keeper run: "+maintenanceList(r.Keeper.Maintenance))
		}
		if len(best.Maintenance) > 0 {
			notes = append(notes, "vacuumed or analyzed in the SKIP LOCKED run: "+maintenanceList(best.Maintenance))
		}
		if u := r.Keeper.Unverified(); u > 0 {
			notes = append(notes, fmt.Sprintf("%d keeper completions not in the database", u))
		}
		note := ""
		if len(notes) > 0 {
			note = " (" + strings.Join(notes, "; ") + ")"
		}
		row("%d\t%s\t%.0f\t%.0f (%v)\t%.2f×\t%s, %s\t%.2f\t%s\n", i+1, first, r.Keeper.RowsPerSecond(),
			best.RowsPerSecond(), best.Shape, r.Ratio(), pgPerRow(r.Keeper), pgPerRow(best), r.LoadBefore, note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	s := rs.Summary()
	fmt.Fprintf(&b, "\nmedian of %d rounds (range): keeper %.0f rows/s (%.0f–%.0f), best SKIP LOCKED %.0f rows/s (%.0f–%.0f)\n",
		len(rs), s.Keeper.Median, s.Keeper.Min, s.Keeper.Max, s.SkipLocked.Median, s.SkipLocked.Min, s.SkipLocked.Max)
	fmt.Fprintf(&b, "keeper / best SKIP LOCKED, each round against its own: median %.2f× (%.2f–%.2f×)\n",
		s.Ratio.Median, s.Ratio.Min, s.Ratio.Max)
	if s.PostgresKeeper.N > 0 && s.PostgresSkipLocked.N > 0 {
		fmt.Fprintf(&b, "PostgreSQL CPU per completed row: keeper median %.1f µs (%.1f–%.1f), best SKIP LOCKED median %.1f µs (%.1f–%.1f)\n",
			s.PostgresKeeper.Median, s.PostgresKeeper.Min, s.PostgresKeeper.Max,
			s.PostgresSkipLocked.Median, s.PostgresSkipLocked.Min, s.PostgresSkipLocked.Max)
	}
	if s.FloorRatio.N > 0 {
		fmt.Fprintf(&b, "floor (bare UPDATE by key, no triggers): PostgreSQL CPU per row median %.1f µs (%.1f–%.1f); keeper / floor, each round against its own: median %.2f× (%.2f–%.2f×; target ≤ %.2f×)\n",
			s.PostgresFloor.Median, s.PostgresFloor.Min, s.PostgresFloor.Max, s.FloorRatio.Median, s.FloorRatio.Min, s.FloorRatio.Max, FloorTarget)
	}
	if s.BusyKeeper.N > 0 {
		fmt.Fprintf(&b, "PostgreSQL's CPU use of the CPUs it may run on: keeper run median %.0f%% (%.0f–%.0f%%), best SKIP LOCKED median %.0f%% (%.0f–%.0f%%); both at the database's limit (%.0f%% and above) in %d of %d rounds\n",
			100*s.BusyKeeper.Median, 100*s.BusyKeeper.Min, 100*s.BusyKeeper.Max,
			100*s.BusySkipLocked.Median, 100*s.BusySkipLocked.Min, 100*s.BusySkipLocked.Max, 100*limitBusy, s.AtLimit, s.BusyKeeper.N)
	}
	if d := rs.Drained(); d > 0 {
		fmt.Fprintf(&b, "NOTE: the keeper ran out of due rows in %d of %d rounds: those rates include the drain (workers finding nothing, the last writes alone) and understate it; a shorter --duration or more --rows measures it at full pace\n", d, len(rs))
	}
	if u := rs.Unverified(); u > 0 {
		fmt.Fprintf(&b, "WARNING: %d acknowledged keeper completions are not in the database as completed\n", u)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Drained is how many rounds' keeper runs ran out of due rows before their duration.
func (rs Rounds) Drained() int {
	n := 0
	for _, r := range rs {
		if r.Keeper.Drained {
			n++
		}
	}
	return n
}

// pgPerRow is a run's PostgreSQL CPU per completed row in µs, or n/a.
func pgPerRow(r RunResult) string {
	if d, ok := r.PostgresPerRow(); ok {
		return fmt.Sprintf("%.1f", us(d))
	}
	return "n/a"
}
