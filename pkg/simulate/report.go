package simulate

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/renderqueue/renderqueue/internal/textfmt"
	"github.com/renderqueue/renderqueue/pkg/objective"
)

// Describe says in one line what a configuration runs: the order and the policy it uses.
func Describe(cfg Config) string {
	k := cfg.Keeper
	if cfg.Order != OrderKeeper && cfg.Order != "" {
		return fmt.Sprintf("order %s (baseline, not the keeper); reschedule %v", cfg.Order, k.Reschedule)
	}
	floors := "none"
	if len(k.Floors) > 0 {
		parts := make([]string, len(k.Floors))
		for i, f := range k.Floors {
			parts[i] = f.String()
		}
		floors = strings.Join(parts, ",")
	}
	bound := "off"
	if k.StarvationBound > 0 {
		bound = strconv.FormatFloat(k.StarvationBound, 'g', -1, 64) + " cadence"
	}
	return fmt.Sprintf("order keeper; submittedBoost %v, urgentMaxShare %v, reschedule %v, floors %s, starvation bound %s",
		k.SubmittedBoost, k.UrgentMaxShare, k.Reschedule, floors, bound)
}

// Write prints a result for people: the setting, a table of the classes, and the due count over
// time.
func Write(w io.Writer, r *Result) error {
	cfg := r.Config
	ew := &errWriter{w: w}
	ew.printf("%s\n", Describe(cfg))
	ew.printf("fleet: %s rows in %d classes, demand %s renders/h; capacity %s renders/h (load %.0f%%); claims of %d every %v\n",
		thousands(r.All.Rows), len(r.Classes), thousands(round(r.Demand)), thousands(round(cfg.Capacity)),
		100*r.Demand/cfg.Capacity, cfg.Batch, FormatCadence(cfg.Tick))
	ew.printf("simulated %s, measured from %s to the end; %s of wall time\n\n",
		FormatCadence(cfg.Duration), FormatCadence(cfg.MeasureFrom), r.Elapsed.Round(10*time.Millisecond))

	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	cells(tw, "class", "rows", "renders", "needed", "ratio", "p50 rel", "p99 rel", "max rel", "p50 late", "p99 late",
		"max late", "longest wait", "not rendered in last cadence", "due at end")
	for _, c := range append(r.Classes, r.All) {
		abs := func(d time.Duration) string {
			if c.Name == "all" {
				return "—"
			}
			return FormatLate(d)
		}
		ratio := "—"
		if c.Demand > 0 {
			ratio = fmt.Sprintf("%.2f", float64(c.Renders)/c.Demand)
		}
		cells(tw, c.Name, thousands(c.Rows), thousands(c.Renders), thousands(round(c.Demand)), ratio,
			rel(c.Lateness.P50Relative), rel(c.Lateness.P99Relative), rel(c.Lateness.MaxRelative),
			abs(c.Lateness.P50), abs(c.Lateness.P99), abs(c.Lateness.Max), FormatLate(c.LongestWait),
			notRendered(c), thousands(c.DueAtEnd))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	ew.printf("\ndue over time (rows due and not yet claimed):\n")
	tw = tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := []string{"at", "all"}
	for _, c := range r.Classes {
		head = append(head, c.Name)
	}
	cells(tw, head...)
	for _, s := range r.Samples {
		row := []string{FormatCadence(s.At), thousands(s.Due)}
		for _, n := range s.ByClass {
			row = append(row, thousands(n))
		}
		cells(tw, row...)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return ew.err
}

// WriteComparison prints one line per class and run: the relative and absolute lateness, the
// longest wait and the render ratio side by side (results of the same fleet).
func WriteComparison(w io.Writer, results []*Result) error {
	ew := &errWriter{w: w}
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	cells(tw, "class", "order", "ratio", "p50 rel", "p99 rel", "max rel", "p99 late", "longest wait", "not rendered in last cadence")
	if len(results) > 0 {
		for ci := range results[0].Classes {
			for _, r := range results {
				c := r.Classes[ci]
				cells(tw, c.Name, string(r.Config.Order), fmt.Sprintf("%.2f", float64(c.Renders)/max(c.Demand, 1e-9)),
					rel(c.Lateness.P50Relative), rel(c.Lateness.P99Relative), rel(c.Lateness.MaxRelative),
					FormatLate(c.Lateness.P99), FormatLate(c.LongestWait), notRendered(c))
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return ew.err
}

// cells writes one tab-separated row; a write error is kept by the errWriter beneath.
func cells(tw *tabwriter.Writer, c ...string) {
	_, _ = io.WriteString(tw, strings.Join(c, "\t")+"\t\n")
}

func notRendered(c ClassResult) string {
	if c.NotRendered < 0 {
		return "—"
	}
	return thousands(c.NotRendered)
}

// FormatLate writes a lateness compactly: "0s", "42s", "12m", "3.4h", "2.1d".
func FormatLate(d time.Duration) string {
	switch {
	case d < 2*time.Minute:
		return strconv.Itoa(int(d.Round(time.Second)/time.Second)) + "s"
	case d < 2*time.Hour:
		return strconv.Itoa(int(d.Round(time.Minute)/time.Minute)) + "m"
	case d < 48*time.Hour:
		return strconv.FormatFloat(d.Hours(), 'f', 1, 64) + "h"
	default:
		return strconv.FormatFloat(d.Hours()/24, 'f', 1, 64) + "d"
	}
}

func rel(v float64) string {
	if v >= 10 {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 3, 64)
}

// thousands formats an integer with thousands separators.
func thousands(n int) string { return textfmt.Thousands(int64(n)) }

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, a ...any) { _, _ = fmt.Fprintf(e, format, a...) }

// WriteObjectives prints how a run kept its objectives: one line each.
func WriteObjectives(w io.Writer, r *Result) error {
	ew := &errWriter{w: w}
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	cells(tw, "objective", "rows", "target", "within", "attainment", "good", "late", "budget left", "kept")
	for _, o := range r.Objectives {
		att := "—"
		if a, ok := o.Tally.Attainment(); ok {
			att = objective.Percent(a)
		}
		kept := "yes"
		if !o.Met {
			kept = "NO"
		}
		cells(tw, o.Objective.Name, o.Objective.Class.String(), strconv.FormatFloat(o.Objective.Percentile, 'f', -1, 64)+"%",
			FormatCadence(o.Objective.MaxLateness), att, thousands(int(o.Tally.Good)), thousands(int(o.Tally.Late)),
			objective.Percent(o.Objective.BudgetRemaining(o.Tally)), kept)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return ew.err
}

// WriteSearch prints a NeededWorkers outcome: the count, and the objectives at it and one below.
func WriteSearch(w io.Writer, s *Search, renderTime time.Duration, maxWorkers int) error {
	ew := &errWriter{w: w}
	if s.Workers == 0 {
		ew.printf("no worker count up to %d keeps every objective (%d runs); at %d:\n", maxWorkers, s.Runs, maxWorkers)
		if ew.err == nil {
			ew.err = WriteObjectives(ew, s.At)
		}
		return ew.err
	}
	ew.printf("workers needed: %d (%s renders/h at %v a render; %d runs of the simulation)\n", s.Workers,
		thousands(round(s.At.Config.Capacity)), renderTime, s.Runs)
	ew.printf("\nat %d workers:\n", s.Workers)
	if ew.err == nil {
		ew.err = WriteObjectives(ew, s.At)
	}
	if s.Below != nil {
		ew.printf("\nat %d workers:\n", s.Workers-1)
		if ew.err == nil {
			ew.err = WriteObjectives(ew, s.Below)
		}
	}
	return ew.err
}
