package bench

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestSpreadOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    []float64
		want Spread
	}{
		{"none", nil, Spread{}},
		{"one", []float64{3}, Spread{N: 1, Median: 3, Min: 3, Max: 3}},
		// an odd count: the middle value, whatever the order given
		{"odd", []float64{9, 1, 4}, Spread{N: 3, Median: 4, Min: 1, Max: 9}},
		// an even count: the mean of the middle two
		{"even", []float64{4, 1, 9, 2}, Spread{N: 4, Median: 3, Min: 1, Max: 9}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]float64(nil), tc.v...)
			if got := spreadOf(tc.v); got != tc.want {
				t.Errorf("spreadOf(%v) = %+v, want %+v", tc.v, got, tc.want)
			}
			for i := range in { // the caller's slice is left in its order
				if tc.v[i] != in[i] {
					t.Fatalf("spreadOf reordered its input: %v", tc.v)
				}
			}
		})
	}
}

// round is a report whose keeper completed keeper rows and whose SKIP LOCKED shapes completed
// skip rows each, in one second, PostgreSQL on CPU 0 taking pg µs per row in each run (0: not
// measured).
func round(keeper int, pg float64, skip ...int) Report {
	run := func(shape Shape, n int) RunResult {
		r := RunResult{Shape: shape, Completed: n, Verified: n, Elapsed: time.Second}
		if pg > 0 {
			r.CPU = cpuUse{Postgres: time.Duration(pg * float64(n) * float64(time.Microsecond)), PostgresOK: true, Wall: time.Second}
			r.CPUs = Placement{Postgres: "0"}
		}
		return r
	}
	rep := Report{Keeper: run(Shape{32, 1000}, keeper)}
	for i, n := range skip {
		rep.SkipLocked = append(rep.SkipLocked, run(Shape{i + 1, 1000}, n))
	}
	return rep
}

// TestRoundsSummary: each round's keeper is compared with that round's best SKIP LOCKED shape,
// and the summary is the median and range of those ratios, not the ratio of the medians.
func TestRoundsSummary(t *testing.T) {
	rs := Rounds{
		round(100_000, 8, 40_000, 50_000), // best 50,000: 2.0×
		round(90_000, 10, 30_000, 20_000), // best 30,000: 3.0×
		round(120_000, 9, 48_000),         // 2.5×
	}
	rs[1].SkipLockedFirst = true
	s := rs.Summary()
	near := func(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 }
	for _, c := range []struct {
		name      string
		got, want Spread
	}{
		{"keeper", s.Keeper, Spread{N: 3, Median: 100_000, Min: 90_000, Max: 120_000}},
		{"SKIP LOCKED", s.SkipLocked, Spread{N: 3, Median: 48_000, Min: 30_000, Max: 50_000}},
		{"ratio", s.Ratio, Spread{N: 3, Median: 2.5, Min: 2, Max: 3}},
		{"PostgreSQL, keeper", s.PostgresKeeper, Spread{N: 3, Median: 9, Min: 8, Max: 10}},
		// PostgreSQL's share of its CPU: 0.8, 0.9 and 1.08 in the keeper runs; 0.4, 0.3 and 0.432
		// in the best SKIP LOCKED runs
		{"PostgreSQL busy, keeper", s.BusyKeeper, Spread{N: 3, Median: 0.9, Min: 0.8, Max: 1.08}},
		{"PostgreSQL busy, SKIP LOCKED", s.BusySkipLocked, Spread{N: 3, Median: 0.4, Min: 0.3, Max: 0.432}},
	} {
		if c.got.N != c.want.N || !near(c.got.Median, c.want.Median) || !near(c.got.Min, c.want.Min) || !near(c.got.Max, c.want.Max) {
			t.Errorf("%s: %+v, want %+v", c.name, c.got, c.want)
		}
	}
	var out bytes.Buffer
	if err := rs.Write(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"3 rounds",
		"median 2.50× (2.00–3.00×)",
		"keeper median 9.0 µs (8.0–10.0)",
		"keeper run median 90% (80–108%), best SKIP LOCKED median 40% (30–43%); both at the database's limit (90% and above) in 0 of 3 rounds",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if !regexp.MustCompile(`(?m)^1 +keeper .*\n2 +SKIP LOCKED .*\n3 +keeper `).MatchString(out.String()) {
		t.Errorf("report does not say which queue ran first in each round:\n%s", out.String())
	}
	if strings.Contains(out.String(), "WARNING") || strings.Contains(out.String(), "ran out of due rows") {
		t.Errorf("a warning or note with every completion verified and no run drained:\n%s", out.String())
	}

	// a round with PostgreSQL's CPU unmeasured is left out of that figure only, a round with
	// unverified completions is flagged, and one whose keeper ran out of due rows is counted
	rs = append(rs, round(110_000, 0, 50_000))
	rs[3].Keeper.Verified -= 7
	rs[3].Keeper.Drained = true
	if got := rs.Summary().PostgresKeeper.N; got != 3 {
		t.Errorf("PostgreSQL figure over %d rounds, want the 3 that measured it", got)
	}
	// at the limit: both runs with PostgreSQL at 90% of its CPU or more (95% and 90.25%); not
	// when the SKIP LOCKED run is below (85.5%)
	if got := (Rounds{round(100_000, 9.5, 95_000)}).Summary().AtLimit; got != 1 {
		t.Errorf("AtLimit = %d for a round with both runs at the limit, want 1", got)
	}
	if got := (Rounds{round(100_000, 9.5, 90_000)}).Summary().AtLimit; got != 0 {
		t.Errorf("AtLimit = %d for a round whose SKIP LOCKED run was below the limit, want 0", got)
	}
	if got := rs.Summary().BusyKeeper.N; got != 3 {
		t.Errorf("PostgreSQL's share of its CPUs over %d rounds, want the 3 that measured it", got)
	}
	if got := rs.Unverified(); got != 7 {
		t.Errorf("Unverified() = %d, want 7", got)
	}
	out.Reset()
	if err := rs.Write(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"n/a, n/a", "7 keeper completions not in the database", "WARNING: 7 acknowledged",
		"the keeper ran out of due rows; 7 keeper", "NOTE: the keeper ran out of due rows in 1 of 4 rounds"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if err := (Rounds{}).Write(&out); err == nil {
		t.Error("Write of no rounds: no error")
	}
}
