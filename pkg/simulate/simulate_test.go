package simulate

import (
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// The tests run the seed mix at a tenth of the size docs/priority.md uses (20,000 rows, 30
// homepages: the same proportions), so each simulation takes well under a second.
func testFleet(backlog float64) Fleet { return SeedFleet(20_000, 30, 30, backlog) }

func run(t *testing.T, cfg Config) *Result {
	t.Helper()
	res, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func class(t *testing.T, r *Result, name string) ClassResult {
	t.Helper()
	for _, c := range r.Classes {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no class %s in %v", name, r.Classes)
	return ClassResult{}
}

// largest is the class with the most rows.
func largest(r *Result) ClassResult {
	best := r.Classes[0]
	for _, c := range r.Classes {
		if c.Rows > best.Rows {
			best = c
		}
	}
	return best
}

var keeperPolicy = policy.Config{SubmittedBoost: 2, UrgentMaxShare: 0.2}

// TestEveryClassKeepsRenderingAtFiveTimesCapacity: with the submitted boost at five times
// capacity, floors keep every class rendering — no class with due rows goes a full cadence
// without a render. Without floors the boosted rows hold the frontier and the discovered 96 h
// rows get no render at all.
func TestEveryClassKeepsRenderingAtFiveTimesCapacity(t *testing.T) {
	cfg := Config{Fleet: testFleet(0), Load: 5, Keeper: keeperPolicy, Duration: 240 * time.Hour}
	starved := run(t, cfg)
	if c := class(t, starved, "96h/discovered"); c.Renders != 0 || c.LongestWait != cfg.Duration {
		t.Errorf("without floors: 96h/discovered rendered %d rows, longest wait %v; the boost should starve it",
			c.Renders, c.LongestWait)
	}

	for _, c := range cfg.Fleet.Classes {
		cfg.Keeper.Floors = append(cfg.Keeper.Floors, policy.Floor{Cadence: c.Cadence, Source: c.Source, Share: 0.03})
	}
	res := run(t, cfg)
	for _, c := range res.Classes {
		if c.Renders == 0 || c.LongestWait >= c.Cadence {
			t.Errorf("%s: %d renders, longest wait with due rows %v (cadence %v)", c.Name, c.Renders, c.LongestWait, c.Cadence)
		}
		if c.DueAtEnd == 0 {
			t.Errorf("%s: nothing due at the end of a 500%% load run; the check would prove nothing", c.Name)
		}
	}
	if t.Failed() {
		t.Log(report(t, res))
	}
}

// TestNoDrainEcho: after a whole-fleet backlog at 95% load, the largest class's p99 lateness in
// days 6 to 10 stays within 1.5 times that of strict class priority, which drains each class at
// the rate it can sustain. With AfterRender the keeper's drain comes back one cadence later as a
// wave (the echo), far beyond it.
func TestNoDrainEcho(t *testing.T) {
	cfg := Config{Fleet: testFleet(1), Load: 0.95, Keeper: keeperPolicy, Duration: 240 * time.Hour, MeasureFrom: 120 * time.Hour}
	byOrder := func(o Order, p policy.Reschedule) ClassResult {
		c := cfg
		c.Order, c.Keeper.Reschedule = o, p
		return largest(run(t, c))
	}
	keep := byOrder(OrderKeeper, policy.KeepPhase)
	for _, p := range []policy.Reschedule{policy.AfterRender, policy.KeepPhase} {
		strict := byOrder(OrderClassPriority, p)
		if keep.Lateness.P99 > strict.Lateness.P99*3/2 {
			t.Errorf("%s p99 lateness in days 6-10: keeper (KeepPhase) %v, strict class priority (%v) %v", keep.Name, keep.Lateness.P99, p, strict.Lateness.P99)
		}
		t.Logf("%s p99 in days 6-10: strict class priority (%v) %v", keep.Name, p, strict.Lateness.P99)
	}
	echo := byOrder(OrderKeeper, policy.AfterRender)
	strict := byOrder(OrderClassPriority, policy.AfterRender)
	if echo.Lateness.P99 <= strict.Lateness.P99*3/2 {
		t.Errorf("keeper with AfterRender: %s p99 %v, strict class priority %v; the echo should show", echo.Name, echo.Lateness.P99, strict.Lateness.P99)
	}
	t.Logf("%s p99 in days 6-10: keeper KeepPhase %v, keeper AfterRender %v, strict class priority AfterRender %v",
		keep.Name, keep.Lateness.P99, echo.Lateness.P99, strict.Lateness.P99)
}

// TestHourlyClassAtEightyPercent: at 80% load (steady state, no backlog) the 1 h class's p99
// relative lateness stays at or below 0.1; an oldest-due-first queue does worse.
func TestHourlyClassAtEightyPercent(t *testing.T) {
	for _, seed := range []uint64{1, 2} {
		cfg := Config{Fleet: testFleet(0), Load: 0.8, Keeper: keeperPolicy, Duration: 48 * time.Hour, Seed: seed}
		res := run(t, cfg)
		for _, c := range res.Classes {
			if c.Cadence == time.Hour && (c.Renders == 0 || c.Lateness.P99Relative > 0.1) {
				t.Errorf("seed %d: %s p99 relative lateness %.3f over %d renders", seed, c.Name, c.Lateness.P99Relative, c.Renders)
			}
		}
		cfg.Order = OrderOldestDue
		base := run(t, cfg)
		if b, k := class(t, base, "1h/submitted"), class(t, res, "1h/submitted"); b.Lateness.P99Relative <= k.Lateness.P99Relative {
			t.Errorf("seed %d: oldest-due 1h p99 %.3f is not worse than the keeper's %.3f", seed, b.Lateness.P99Relative, k.Lateness.P99Relative)
		}
	}
}

// TestDueCountMatchesCore: the simulator's own due accounting (the due-over-time samples, the
// longest waits) agrees with the keeper core's exact summary at every sample.
func TestDueCountMatchesCore(t *testing.T) {
	cfg := Config{Fleet: testFleet(0.3), Load: 1.1, Keeper: keeperPolicy, Duration: 100 * time.Hour, Sample: 5 * time.Hour}.withDefaults()
	cfg.Keeper.Reschedule = policy.AfterRender
	s, err := newSim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	core := s.sched.(*keeperSched).core
	checks := 0
	s.check = func(nowMs int64) {
		sum := core.Summary(time.UnixMilli(nowMs))
		if sum.Due != totalDue(s.due) || sum.Leased != 0 {
			t.Fatalf("at %v: simulator counts %d due, the core %d (leased %d)", time.Duration(nowMs-s.startMs)*time.Millisecond, totalDue(s.due), sum.Due, sum.Leased)
		}
		for _, cl := range sum.Classes {
			for ci, c := range cfg.Fleet.Classes {
				if c.Cadence == cl.Cadence && c.Source == cl.Source && s.due[ci] != cl.Due {
					t.Fatalf("at %v: %s: simulator %d due, core %d", time.Duration(nowMs-s.startMs)*time.Millisecond, c.Name, s.due[ci], cl.Due)
				}
			}
		}
		checks++
	}
	s.run()
	if checks != 21 {
		t.Fatalf("%d checks, want 21", checks)
	}
}

func totalDue(v []int) int {
	n := 0
	for _, x := range v {
		n += x
	}
	return n
}

// TestRendersAndLateness checks the accounting on a fleet small enough to reason about: one class
// of 60 hourly rows.
func TestRendersAndLateness(t *testing.T) {
	f := Fleet{Classes: []Class{{Rows: 60, Cadence: time.Hour, Source: schedule.SourceSubmitted}}}
	// ample capacity: every row renders at the first tick at or after its due time (under a
	// minute late) and comes due again one cadence after its due time (KeepPhase): 10 or 11 renders
	// of each row in 10 hours
	res := run(t, Config{Fleet: f, Capacity: 6000, Keeper: keeperPolicy, Duration: 10 * time.Hour, Seed: 7})
	c := res.Classes[0]
	if c.Demand != 600 || c.Renders < 600 || c.Renders > 660 {
		t.Fatalf("renders %d of %v needed", c.Renders, c.Demand)
	}
	if c.Lateness.Max >= time.Minute || c.NotRendered != 0 || c.LongestWait != 0 {
		t.Fatalf("lateness %+v, not rendered %d, longest wait %v", c.Lateness, c.NotRendered, c.LongestWait)
	}
	// half the capacity, one render every other minute: everything falls behind, the capacity is
	// used to the last render, and the class waits one tick (a minute) in every other
	res = run(t, Config{Fleet: f, Capacity: 30, Keeper: keeperPolicy, Duration: 10 * time.Hour, Seed: 7})
	c = res.Classes[0]
	if c.Renders != 300 || c.Lateness.Max < time.Hour || c.LongestWait != time.Minute || c.DueAtEnd == 0 {
		t.Fatalf("half capacity: renders %d, lateness %+v, longest wait %v, due at end %d", c.Renders, c.Lateness, c.LongestWait, c.DueAtEnd)
	}
}

func TestConfigErrors(t *testing.T) {
	ok := Config{Fleet: testFleet(0), Load: 1, Keeper: keeperPolicy, Duration: time.Hour}
	cases := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no capacity", func(c *Config) { c.Load = 0 }, "give a capacity or a load"},
		{"negative load", func(c *Config) { c.Load = -1 }, "load -1"},
		{"no duration", func(c *Config) { c.Duration = 0 }, "duration 0s must be at least one tick"},
		{"measure past the end", func(c *Config) { c.MeasureFrom = 2 * time.Hour }, "measureFrom 2h0m0s"},
		{"order", func(c *Config) { c.Order = "fifo" }, `unknown order "fifo"`},
		{"batch", func(c *Config) { c.Batch = -1 }, "batch -1"},
		{"floors", func(c *Config) {
			c.Keeper.Floors = []policy.Floor{{Cadence: time.Hour, Share: 0.7}, {Cadence: 24 * time.Hour, Share: 0.7}}
		}, "must not sum past 1"},
		{"no classes", func(c *Config) { c.Fleet = Fleet{} }, "no classes"},
		{"same class twice", func(c *Config) {
			c.Fleet.Classes = append(c.Fleet.Classes, Class{Name: "x", Rows: 1, Cadence: time.Hour, Source: schedule.SourceSubmitted})
		}, "same cadence and source as 1h/submitted"},
		{"backlog", func(c *Config) { c.Fleet.Classes[0].Backlog = 1.5 }, "backlog 1.5"},
		{"ticks", func(c *Config) { c.Tick = time.Millisecond; c.Duration = 24 * time.Hour }, "use a longer tick"},
	}
	for _, tc := range cases {
		cfg := ok
		cfg.Fleet.Classes = append([]Class(nil), ok.Fleet.Classes...)
		tc.edit(&cfg)
		_, err := Run(cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

func TestSeedFleet(t *testing.T) {
	f := SeedFleet(200_000, 300, 30, 0.5)
	want := []struct {
		rows    int
		cadence time.Duration
		source  schedule.Source
	}{
		{150, time.Hour, schedule.SourceSubmitted}, {150, time.Hour, schedule.SourceDiscovered},
		{2995, 24 * time.Hour, schedule.SourceSubmitted}, {2996, 24 * time.Hour, schedule.SourceDiscovered},
		{96854, 96 * time.Hour, schedule.SourceSubmitted}, {96855, 96 * time.Hour, schedule.SourceDiscovered},
	}
	if len(f.Classes) != len(want) || f.Rows() != 200_000 {
		t.Fatalf("classes %+v", f.Classes)
	}
	for i, w := range want {
		if c := f.Classes[i]; c.Rows != w.rows || c.Cadence != w.cadence || c.Source != w.source || c.Backlog != 0.5 {
			t.Errorf("class %d: %+v, want %+v", i, c, w)
		}
	}
}

func TestParseFleet(t *testing.T) {
	f, err := ParseFleet([]byte(`
dueShare: 0.05
classes:
  - name: homepages
    rows: 150
    cadence: 1h
    source: submitted
  - rows: 9000
    cadence: 96h
    source: discovered
    backlog: 1
    backlogCycles: 3
`))
	if err != nil {
		t.Fatal(err)
	}
	d := f.withDefaults()
	if d.DueShare != 0.05 || len(d.Classes) != 2 || d.Classes[0].Name != "homepages" || d.Classes[1].Name != "96h/discovered" ||
		d.Classes[1].BacklogCycles != 3 || d.Classes[0].BacklogCycles != DefaultBacklogCycles || d.Classes[1].Backlog != 1 {
		t.Fatalf("parsed %+v", d)
	}
	bad := []struct{ yaml, want string }{
		{``, "empty"},
		{`classes: [{rows: 1, cadence: 1h, source: sitemap}]`, `unknown source "sitemap"`},
		{`classes: [{rows: 1, cadence: hourly, source: submitted}]`, "cadence"},
		{`classes: [{rows: 1, cadence: 1h, source: submitted, colour: red}]`, "colour"},
		{`classes: [{rows: -1, cadence: 1h, source: submitted}]`, "rows -1"},
		{`classes: [{rows: 1, cadence: 1h, source: submitted, backlogCycles: 0}]`, "backlogCycles must be > 0"},
		{`classes: []`, "no classes"},
	}
	for _, b := range bad {
		if _, err := ParseFleet([]byte(b.yaml)); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("ParseFleet(%q) = %v, want an error containing %q", b.yaml, err, b.want)
		}
	}
}

func TestFormat(t *testing.T) {
	for d, want := range map[time.Duration]string{time.Hour: "1h", 96 * time.Hour: "96h", 90 * time.Minute: "1h30m", 45 * time.Second: "45s", 0: "0s", 1500 * time.Millisecond: "1.5s"} {
		if got := FormatCadence(d); got != want {
			t.Errorf("FormatCadence(%v) = %q, want %q", d, got, want)
		}
	}
	for d, want := range map[time.Duration]string{0: "0s", 59 * time.Second: "59s", 5 * time.Minute: "5m", 150 * time.Minute: "2.5h", 72 * time.Hour: "3.0d"} {
		if got := FormatLate(d); got != want {
			t.Errorf("FormatLate(%v) = %q, want %q", d, got, want)
		}
	}
	if got := thousands(1234567); got != "1,234,567" {
		t.Errorf("thousands = %q", got)
	}
}

func report(t *testing.T, r *Result) string {
	t.Helper()
	var b strings.Builder
	if err := Write(&b, r); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
