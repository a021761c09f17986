package bench

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestPostgresBusy(t *testing.T) {
	run := func(pg, wall time.Duration, pgOK bool, cpus string) RunResult {
		return RunResult{CPU: cpuUse{Postgres: pg, Wall: wall, PostgresOK: pgOK}, CPUs: Placement{Postgres: cpus}}
	}
	for _, tc := range []struct {
		name  string
		run   RunResult
		share float64 // want, when ok
		cpus  int     // want, when ok
		ok    bool
	}{
		{"one CPU, nearly all of it", run(7600*time.Millisecond, 8*time.Second, true, "0"), 0.95, 1, true},
		{"two CPUs: the share is of both", run(8*time.Second, 8*time.Second, true, "0-1"), 0.5, 2, true},
		{"a list of CPUs", run(3*time.Second, time.Second, true, "0,2-3"), 1, 3, true},
		{"the server elsewhere: its CPU is not measured", run(0, 8*time.Second, false, "0"), 0, 0, false},
		{"processes on different CPUs: no one share", run(time.Second, time.Second, true, "0 / 0-1"), 0, 0, false},
		{"no placement read", run(time.Second, time.Second, true, ""), 0, 0, false},
		{"no time between the samples", run(time.Second, 0, true, "0"), 0, 0, false},
		{"a list that does not parse", run(time.Second, time.Second, true, "x"), 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			share, cpus, ok := tc.run.PostgresBusy()
			if ok != tc.ok || (ok && (math.Abs(share-tc.share) > 1e-9 || cpus != tc.cpus)) {
				t.Errorf("PostgresBusy() = %v, %d, %v; want %v, %d, %v", share, cpus, ok, tc.share, tc.cpus, tc.ok)
			}
		})
	}
}

func TestReportSaysHowBusyTheDatabaseWas(t *testing.T) {
	// round (rounds_test.go): one second on CPU 0, PostgreSQL 1 µs per row in both runs, so the
	// rows are the shares of its CPU in millionths
	report := func(r Report) string {
		var b strings.Builder
		if err := r.Write(&b); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	const line = "PostgreSQL's CPU use of the 1 CPU(s) it may run on (0): keeper run 95%, best SKIP LOCKED shape 94%"
	if got := report(round(950_000, 1, 940_000)); !strings.Contains(got, line+" (both at the database's limit") {
		t.Errorf("both runs at the limit; the report:\n%s", got)
	}
	got := report(round(950_000, 1, 500_000))
	if !strings.Contains(got, "keeper run 95%, best SKIP LOCKED shape 50%\n") {
		t.Errorf("the SKIP LOCKED run at half its CPU; the report:\n%s", got)
	}
	if strings.Contains(got, "limit") {
		t.Errorf("a run below the limit reported at it:\n%s", got)
	}
}

func TestReportSaysHowEachRunWasSettled(t *testing.T) {
	const all = "tables vacuumed and analyzed, PostgreSQL checkpointed, this machine's dirty pages written out (sync)"
	for _, tc := range []struct {
		name    string
		keeper  string   // the keeper run's Settled
		skip    []string // each SKIP LOCKED run's Settled
		want    []string // lines the report has
		notWant []string // lines it has not
	}{
		{"every run alike: one line", all, []string{all, all},
			[]string{"before each run: " + all + "\n"}, []string{"before the SKIP LOCKED run"}},
		{"a run settled otherwise is named", all, []string{all, "not checkpointed"},
			[]string{"before each run: " + all + "\n", "before the SKIP LOCKED run 1 × 20: not checkpointed\n"}, nil},
		{"a run not settled says so", all, []string{""},
			[]string{"before the SKIP LOCKED run 1 × 10: not settled\n"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Report{Keeper: RunResult{Settled: tc.keeper}}
			for i, s := range tc.skip {
				r.SkipLocked = append(r.SkipLocked, RunResult{Shape: Shape{Workers: 1, Batch: 10 * (i + 1)}, Settled: s})
			}
			var b strings.Builder
			if err := r.Write(&b); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("no %q in the report:\n%s", w, b.String())
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(b.String(), w) {
					t.Errorf("%q in the report:\n%s", w, b.String())
				}
			}
		})
	}
}
