package simulate

import (
	"fmt"
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

// keeperPolicy is the keeper's policy when nothing is set; oldDefaults what it was before
// Adaptive and the starvation bound (reschedule KeepPhase, the zero value; no bound).
var (
	keeperPolicy = DefaultKeeper()
	oldDefaults  = policy.Config{SubmittedBoost: 2, UrgentMaxShare: 0.2}
)

// The mixes the targets of docs/priority.md are checked on, at a tenth of its size: the seed mix
// (`renderqueue simulate`), and one with ten times the homepages and 20% daily rows
// (`--homepages 3000 --category-permille 200 --seed 7`).
var mixes = []struct {
	name             string
	homepages, daily int // rows every hour; ‰ of the others every day
	seed             uint64
}{
	{"seed mix", 30, 30, 1},
	{"other mix", 300, 200, 7},
}

// target is one of the promises docs/priority.md makes for the defaults, as a simulation and a
// check of its result.
type target struct {
	name    string
	load    float64
	backlog float64       // share of every class overdue at the start, within one cadence
	from    time.Duration // measured from
	// check says what breaks the promise in a class's figures ("" when kept)
	check func(c ClassResult) string
}

var targets = []target{
	{"500% load: every class with due rows rendered within its cadence", 5, 0, 0, func(c ClassResult) string {
		if c.Renders == 0 || c.LongestWait >= c.Cadence {
			return fmt.Sprintf("%d renders, longest wait with due rows %v (cadence %v)", c.Renders, c.LongestWait, c.Cadence)
		}
		return ""
	}},
	{"120% load, days 6-10: p99 ≤ 0.18 (submitted), 0.34 (discovered)", 1.2, 0, 120 * time.Hour, func(c ClassResult) string {
		bound := 0.34
		if c.Source == schedule.SourceSubmitted {
			bound = 0.18
		}
		if c.Renders == 0 || c.Lateness.P99Relative > bound {
			return fmt.Sprintf("p99 relative lateness %.3f over %d renders, want ≤ %v", c.Lateness.P99Relative, c.Renders, bound)
		}
		return ""
	}},
	{"whole-fleet backlog, 95% load, days 6-10: p99 ≤ 0.03", 0.95, 1, 120 * time.Hour, p99AtMost(0.03)},
	{"80% load, days 6-10: p99 ≤ 0.02", 0.8, 0, 120 * time.Hour, p99AtMost(0.02)},
}

func p99AtMost(bound float64) func(ClassResult) string {
	return func(c ClassResult) string {
		if c.Renders == 0 || c.Lateness.P99Relative > bound {
			return fmt.Sprintf("p99 relative lateness %.3f over %d renders, want ≤ %v", c.Lateness.P99Relative, c.Renders, bound)
		}
		return ""
	}
}

// runTarget simulates a target on a mix for ten days with the keeper's policy p.
func runTarget(t *testing.T, tg target, homepages, daily int, seed uint64, p policy.Config) *Result {
	t.Helper()
	f := SeedFleet(20_000, homepages, daily, tg.backlog)
	for i := range f.Classes {
		f.Classes[i].BacklogCycles = 1
	}
	return run(t, Config{Fleet: f, Load: tg.load, Keeper: p, Duration: 240 * time.Hour, MeasureFrom: tg.from, Seed: seed})
}

// broken lists the classes whose figures break the target's promise.
func broken(tg target, r *Result) []string {
	var out []string
	for _, c := range r.Classes {
		if why := tg.check(c); why != "" {
			out = append(out, c.Name+": "+why)
		}
	}
	return out
}

// TestDefaultsKeepThePromises: with nothing set but the load, the keeper keeps every promise of
// docs/priority.md on both mixes: at five times capacity every class with due rows is rendered
// within its cadence, at 120% renders run no later than AfterRender's, after a whole-fleet
// backlog at 95% there is no drain echo, and at 80% nothing is later than before.
func TestDefaultsKeepThePromises(t *testing.T) {
	for _, m := range mixes {
		for _, tg := range targets {
			res := runTarget(t, tg, m.homepages, m.daily, m.seed, keeperPolicy)
			for _, b := range broken(tg, res) {
				t.Errorf("%s, %s: %s", m.name, tg.name, b)
			}
			if t.Failed() {
				t.Log(report(t, res))
			}
		}
	}
}

// TestOldDefaultsBreakThePromises: what the defaults were before (KeepPhase, no starvation bound)
// breaks the first two promises on both mixes — the boost starves the 96 h discovered class at
// five times capacity, and KeepPhase runs renders twice as late at 120% — so the test above
// checks what the new defaults changed. And each half of the new defaults is needed: without the
// starvation bound (Adaptive alone) a class starves at five times capacity; with AfterRender
// instead of Adaptive a drained backlog comes back as an echo.
func TestOldDefaultsBreakThePromises(t *testing.T) {
	noBound := keeperPolicy
	noBound.StarvationBound = 0
	afterRender := keeperPolicy
	afterRender.Reschedule = policy.AfterRender
	cases := []struct {
		name   string
		policy policy.Config // the keeper's policy
		target int           // the index of the target it breaks
	}{
		{"old defaults", oldDefaults, 0},
		{"old defaults", oldDefaults, 1},
		{"Adaptive without the starvation bound", noBound, 0},
		{"AfterRender with the starvation bound", afterRender, 2},
	}
	for _, m := range mixes {
		for _, tc := range cases {
			tg := targets[tc.target]
			if b := broken(tg, runTarget(t, tg, m.homepages, m.daily, m.seed, tc.policy)); len(b) == 0 {
				t.Errorf("%s, %s: %s keeps the promise; the test of the defaults would not notice it gone", m.name, tg.name, tc.name)
			} else {
				t.Logf("%s, %s: %s breaks it: %v", m.name, tg.name, tc.name, b)
			}
		}
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
	for _, keeper := range []policy.Reschedule{policy.Adaptive, policy.KeepPhase} {
		keep := byOrder(OrderKeeper, keeper)
		for _, p := range []policy.Reschedule{policy.AfterRender, policy.KeepPhase} {
			strict := byOrder(OrderClassPriority, p)
			if keep.Lateness.P99 > strict.Lateness.P99*3/2 {
				t.Errorf("%s p99 lateness in days 6-10: keeper (%v) %v, strict class priority (%v) %v", keep.Name, keeper, keep.Lateness.P99, p, strict.Lateness.P99)
			}
			t.Logf("%s p99 in days 6-10: keeper (%v) %v, strict class priority (%v) %v", keep.Name, keeper, keep.Lateness.P99, p, strict.Lateness.P99)
		}
	}
	echo := byOrder(OrderKeeper, policy.AfterRender)
	strict := byOrder(OrderClassPriority, policy.AfterRender)
	if echo.Lateness.P99 <= strict.Lateness.P99*3/2 {
		t.Errorf("keeper with AfterRender: %s p99 %v, strict class priority %v; the echo should show", echo.Name, echo.Lateness.P99, strict.Lateness.P99)
	}
	t.Logf("%s p99 in days 6-10: keeper AfterRender %v, strict class priority AfterRender %v", echo.Name, echo.Lateness.P99, strict.Lateness.P99)
}

// TestFloorsOnTopOfTheDefaults: explicit floors work as before on top of the defaults: at five
// times capacity a floor of 0.03 on every class gives each at least 3% of the renders (the
// starvation bound alone gives the 96 h discovered class a render every half cadence).
func TestFloorsOnTopOfTheDefaults(t *testing.T) {
	cfg := Config{Fleet: testFleet(0), Load: 5, Keeper: keeperPolicy, Duration: 240 * time.Hour}
	if c := class(t, run(t, cfg), "96h/discovered"); c.Renders > 10 {
		t.Errorf("no floors: 96h/discovered rendered %d rows; the boost should leave it the starvation bound's", c.Renders)
	}
	for _, c := range cfg.Fleet.Classes {
		cfg.Keeper.Floors = append(cfg.Keeper.Floors, policy.Floor{Cadence: c.Cadence, Source: c.Source, Share: 0.03})
	}
	res := run(t, cfg)
	for _, c := range res.Classes {
		if float64(c.Renders) < 0.03*float64(res.All.Renders)-float64(len(res.Classes)) || c.LongestWait >= c.Cadence {
			t.Errorf("%s: %d of %d renders, longest wait with due rows %v", c.Name, c.Renders, res.All.Renders, c.LongestWait)
		}
		if c.DueAtEnd == 0 {
			t.Errorf("%s: nothing due at the end of a 500%% load run; the check would prove nothing", c.Name)
		}
	}
	if t.Failed() {
		t.Log(report(t, res))
	}
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
