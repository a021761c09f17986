package bench

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Write prints the report for people.
func (r Report) Write(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "renderqueue bench: %d due rows with 64-byte keys in each queue, %v per run\n", r.Rows, r.Duration)
	fmt.Fprintf(&b, "PostgreSQL: %s\n", firstWords(r.Server, 2))
	if r.SharedMemory != "" {
		fmt.Fprintf(&b, "PostgreSQL's shared memory: %s\n", r.SharedMemory)
	}
	fmt.Fprintf(&b, "load average (1 min): %.2f before, %.2f after\n", r.LoadBefore, r.LoadAfter)
	fmt.Fprintf(&b, "keeper loaded %d rows in %v\n", r.Rows, r.KeeperLoad.Round(time.Millisecond))
	fmt.Fprintf(&b, "CPUs allowed: %s\n", r.Keeper.CPUs)
	if r.SkipLockedFirst {
		b.WriteString("the SKIP LOCKED runs came before the keeper's\n")
	}
	for _, s := range r.SkipLocked {
		if s.CPUs.Postgres != r.Keeper.CPUs.Postgres || s.CPUs.Clients != r.Keeper.CPUs.Clients {
			fmt.Fprintf(&b, "CPUs allowed in the SKIP LOCKED run %v: %s\n", s.Shape, s.CPUs)
		}
	}
	if r.Keeper.Settled != "" {
		fmt.Fprintf(&b, "before each run: %s\n", r.Keeper.Settled)
	}
	for _, s := range r.SkipLocked {
		if s.Settled != r.Keeper.Settled {
			fmt.Fprintf(&b, "before the SKIP LOCKED run %v: %s\n", s.Shape, cmp.Or(s.Settled, "not settled"))
		}
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	row := func(format string, a ...any) { _, _ = fmt.Fprintf(tw, format, a...) }
	row("%s\n", "queue\tshape\trows/s\tclaim p50\tclaim p99\tcomplete p50\tcomplete p99\tverified\tCPU µs/row (keeper, clients, PostgreSQL)\tmachine busy, stolen\t")
	line := func(name string, res RunResult) {
		verified := fmt.Sprintf("%d/%d", res.Verified, res.Completed)
		note := ""
		if res.Drained {
			note = " (ran out of due rows)"
		}
		if res.Errors > 0 {
			note += fmt.Sprintf(" (%d errors, the last: %s)", res.Errors, res.LastError)
		}
		if len(res.Maintenance) > 0 {
			note += fmt.Sprintf(" (vacuumed or analyzed during the run: %s; PostgreSQL's core was not the run's alone)", maintenanceList(res.Maintenance))
		}
		row("%s\t%v\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, res.Shape, res.RowsPerSecond(),
			ms(res.Claim.P50), ms(res.Claim.P99), ms(res.Complete.P50), ms(res.Complete.P99), verified,
			cpuPerRow(res), busy(res.CPU), note)
	}
	line("keeper (HTTP)", r.Keeper)
	for _, s := range r.SkipLocked {
		line("SKIP LOCKED", s)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	best := r.BestSkipLocked()
	fmt.Fprintf(&b, "\nbest SKIP LOCKED shape: %v at %.0f rows/s\n", best.Shape, best.RowsPerSecond())
	fmt.Fprintf(&b, "keeper / best SKIP LOCKED: %.2f×\n", r.Ratio())
	// how much less of the database a completion through the keeper takes
	if k, okK := r.Keeper.PostgresPerRow(); okK && k > 0 {
		if s, okS := best.PostgresPerRow(); okS {
			fmt.Fprintf(&b, "PostgreSQL CPU per completed row: keeper %.1f µs, best SKIP LOCKED shape %.1f µs (%.2f× less through the keeper)\n",
				us(k), us(s), float64(s)/float64(k))
		}
	}
	if f, ok := r.Floor.PostgresPerRow(); ok {
		q, _ := r.FloorRatio()
		fmt.Fprintf(&b, "floor (bare UPDATE by key in batches of %d, no triggers, %.0f rows/s): PostgreSQL CPU per row %.1f µs; keeper / floor %.2f× (target ≤ %.2f×)\n",
			floorBatch, r.Floor.RowsPerSecond(), us(f), q, FloorTarget)
	}
	if line := postgresBusyLine(r.Keeper, best); line != "" {
		b.WriteString(line)
	}
	if r.TriggerWith > 0 {
		fmt.Fprintf(&b, "change events of a completion, when sent (another keeper holds the row's slot; the keeper run above sends none): %.1f µs (the group commit's UPDATE: %.1f µs/row with them, %.1f µs/row without)\n",
			us(r.TriggerWith-r.TriggerWithout), us(r.TriggerWith), us(r.TriggerWithout))
	}
	if wal := r.Keeper.WALPerCompletion(); wal > 0 {
		fmt.Fprintf(&b, "WAL written during the keeper run per completed row: %.0f bytes (this server: wal_level %s)\n", wal, r.WALSettings)
	}
	if r.TableBytesPerRow > 0 {
		fmt.Fprintf(&b, "render_schedule with its indexes: %.0f bytes per row\n", r.TableBytesPerRow)
	}
	if u := r.Keeper.Unverified(); u != 0 {
		fmt.Fprintf(&b, "WARNING: %d acknowledged keeper completions are not in the database as completed\n", u)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// postgresBusyLine says how busy PostgreSQL kept the CPUs it may run on in the keeper run and
// in the best SKIP LOCKED run ("" when not measured): when both were near their limit, the
// ratio of the rates is about that of PostgreSQL's CPU per row, whatever the clients do.
func postgresBusyLine(keeper, best RunResult) string {
	k, n, okK := keeper.PostgresBusy()
	s, _, okS := best.PostgresBusy()
	if !okK || !okS || keeper.CPUs.Postgres != best.CPUs.Postgres {
		return ""
	}
	line := fmt.Sprintf("PostgreSQL's CPU use of the %d CPU(s) it may run on (%s): keeper run %.0f%%, best SKIP LOCKED shape %.0f%%",
		n, keeper.CPUs.Postgres, 100*k, 100*s)
	if k >= limitBusy && s >= limitBusy {
		line += " (both at the database's limit: the ratio is about that of PostgreSQL's CPU per row)"
	}
	return line + "\n"
}

// limitBusy is the share of its CPUs above which a run counts as limited by the database: the
// rest goes to the kernel's work on its behalf and the scheduler.
const limitBusy = 0.9

func firstWords(s string, n int) string {
	f := strings.Fields(s)
	return strings.Join(f[:min(n, len(f))], " ")
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

func cpuPerRow(r RunResult) string {
	if r.Completed == 0 {
		return "-"
	}
	per := func(d time.Duration, ok bool) string {
		if !ok {
			return "n/a"
		}
		return fmt.Sprintf("%.1f", us(d)/float64(r.Completed))
	}
	return fmt.Sprintf("%s, %s, %s", per(r.CPU.Keeper, r.CPU.KeeperOK), per(r.CPU.Clients, true), per(r.CPU.Postgres, r.CPU.PostgresOK))
}

// busy is the machine's busy share over the run and the share the hypervisor stole (time the
// CPUs were ready to run and the host ran something else: a run's latencies include it).
func busy(c cpuUse) string {
	m := c.Machine
	if !c.MachineOK || m.Total <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f%%, stolen %.0f%%", 100*float64(m.Busy)/float64(m.Total), 100*m.StealShare())
}

// maintenanceList is "bench_queue 1×, render_schedule 2×", by table name.
func maintenanceList(m map[string]int) string {
	names := slices.Sorted(maps.Keys(m))
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s %d×", n, m[n])
	}
	return strings.Join(parts, ", ")
}
