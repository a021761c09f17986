// Package simulate runs the keeper core on virtual time for capacity planning
// (`renderqueue simulate`): a fleet of schedule rows (classes with row counts, cadences, sources
// and an initial backlog), a render capacity, and the claim policy; no database, no sleeping.
//
// The simulation is the real core.Core, driven as a shard drives it: rows are applied, render
// workers claim batches (Claim), and each render completes one tick later the way the shard
// completes it — the next due time from Completing (the Reschedule policy), the written version
// applied with a new rev, the lease released. Time advances in ticks: at the start of every tick
// the workers claim as many rows as the capacity renders in one tick, in batches, and those
// renders complete at the end of the tick. Lateness is measured when a row is claimed (the render
// starts): now − due, and relative lateness (now − due) / cadence.
//
// For comparison it also runs two baselines that are not the keeper: an oldest-due-first queue
// (one queue ordered by due time, what a plain "ORDER BY due_at" queue does) and strict class
// priority (shorter cadences first, submitted before discovered, oldest due within a class).
// They complete rows with the same Reschedule policy as the keeper run.
package simulate

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/objective"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// Order is the claim order a simulation runs.
type Order string

// The claim orders.
const (
	// OrderKeeper is the keeper core: relative lateness × boost, floors, urgent share.
	OrderKeeper Order = "keeper"
	// OrderOldestDue is the baseline queue: oldest due first, regardless of cadence or source.
	OrderOldestDue Order = "oldest-due"
	// OrderClassPriority is strict class priority: shorter cadences first, submitted before
	// discovered at equal cadence, oldest due first within a class.
	OrderClassPriority Order = "class-priority"
)

// Orders lists the claim orders.
var Orders = []Order{OrderKeeper, OrderOldestDue, OrderClassPriority}

// ParseOrder parses an order name.
func ParseOrder(s string) (Order, error) {
	for _, o := range Orders {
		if string(o) == s {
			return o, nil
		}
	}
	return "", fmt.Errorf("unknown order %q (want keeper, oldest-due or class-priority)", s)
}

// Config is one simulation.
type Config struct {
	Fleet Fleet
	// Capacity is the renders per hour the workers complete. Either Capacity or Load.
	Capacity float64
	// Load sets Capacity to the fleet's demand / Load (0.8: capacity is 125% of the demand).
	Load float64
	// Order is the claim order; default OrderKeeper.
	Order Order
	// Keeper is the core's policy (SubmittedBoost, UrgentMaxShare, Floors, Reschedule); its
	// Window is ignored (every row is held). The baselines use only its Reschedule.
	Keeper policy.Config
	// Batch is the rows one claim asks for. Default 10.
	Batch int
	// Tick is the time step: claims at its start, completions at its end. Default 1m.
	Tick time.Duration
	// Duration is the simulated time. Required.
	Duration time.Duration
	// MeasureFrom starts the measurement (lateness, renders, longest wait) this long after the
	// start; 0 measures the whole run.
	MeasureFrom time.Duration
	// Sample is the interval of the due-count samples. Default Duration / 20, at least Tick.
	Sample time.Duration
	// Seed makes due times and key hashes reproducible.
	Seed uint64
	// Objectives are evaluated over the measurement window (Result.Objectives). The simulated
	// rows are never urgent.
	Objectives []objective.Objective
}

// Defaults.
const (
	DefaultBatch = 10
	DefaultTick  = time.Minute
)

// DefaultKeeper is the policy a keeper runs with when none of it is set: the RenderQueue API's
// defaults (submittedBoost 2, urgentMaxShare 0.2, no floors, reschedule Adaptive; the standalone
// keeper's flags default to them) and the starvation bound every keeper runs with.
func DefaultKeeper() policy.Config {
	return policy.Config{SubmittedBoost: 2, UrgentMaxShare: 0.2, Reschedule: policy.Adaptive, StarvationBound: policy.DefaultStarvationBound}
}

// withDefaults returns c with its optional fields defaulted.
func (c Config) withDefaults() Config {
	c.Fleet = c.Fleet.withDefaults()
	if c.Order == "" {
		c.Order = OrderKeeper
	}
	if c.Batch == 0 {
		c.Batch = DefaultBatch
	}
	if c.Tick == 0 {
		c.Tick = DefaultTick
	}
	if c.Sample == 0 && c.Duration > 0 {
		c.Sample = max(c.Tick, (c.Duration / 20).Truncate(c.Tick))
	}
	if c.Load > 0 && c.Capacity == 0 {
		c.Capacity = c.Fleet.Demand() / c.Load
	}
	c.Keeper.Window = 0
	return c
}

// Validate reports every problem of a (defaulted) configuration.
func (c Config) Validate() error {
	var errs []error
	if err := c.Fleet.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Load < 0 || math.IsNaN(c.Load) || math.IsInf(c.Load, 0) {
		errs = append(errs, fmt.Errorf("load %v must be a finite number > 0", c.Load))
	}
	if !(c.Capacity > 0) || math.IsInf(c.Capacity, 0) {
		errs = append(errs, fmt.Errorf("capacity %v renders/h must be a finite number > 0 (give a capacity or a load)", c.Capacity))
	}
	if _, err := ParseOrder(string(c.Order)); err != nil {
		errs = append(errs, err)
	}
	if err := c.Keeper.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Batch < 1 {
		errs = append(errs, fmt.Errorf("batch %d must be at least 1", c.Batch))
	}
	if c.Tick < time.Millisecond || c.Tick%time.Millisecond != 0 {
		errs = append(errs, fmt.Errorf("tick %v must be whole milliseconds, at least 1ms", c.Tick))
	}
	if c.Duration < c.Tick {
		errs = append(errs, fmt.Errorf("duration %v must be at least one tick (%v)", c.Duration, c.Tick))
	} else if c.Tick > 0 && c.Duration/c.Tick > maxTicks {
		errs = append(errs, fmt.Errorf("duration %v is %d ticks of %v, more than %d; use a longer tick", c.Duration, c.Duration/c.Tick, c.Tick, maxTicks))
	}
	if c.MeasureFrom < 0 || c.MeasureFrom >= c.Duration {
		errs = append(errs, fmt.Errorf("measureFrom %v must be within [0, duration %v)", c.MeasureFrom, c.Duration))
	}
	if c.Sample < c.Tick {
		errs = append(errs, fmt.Errorf("sample interval %v must be at least one tick (%v)", c.Sample, c.Tick))
	}
	if err := objective.ValidateAll(c.Objectives); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// maxTicks bounds a run's ticks (the due calendar has one entry per tick and class).
const maxTicks = 10_000_000

// Result is what a simulation measured.
type Result struct {
	// Config is the configuration run, defaulted (Capacity set).
	Config Config
	// Demand is the fleet's renders per hour.
	Demand float64
	// Classes are the per-class figures, in the fleet's order.
	Classes []ClassResult
	// All sums the classes (relative lateness percentiles over every render).
	All ClassResult
	// Samples is the due count over time, every Config.Sample from the start (before the
	// claims of that instant), and at the end.
	Samples []Sample
	// Elapsed is the wall-clock time the simulation took.
	Elapsed time.Duration
	// Objectives are Config.Objectives' outcomes, in their order.
	Objectives []ObjectiveResult
}

// ObjectiveResult is how a run kept one objective over the measurement window. Its events are
// the renders that started in the window (good when they started within MaxLateness of due)
// and the rows still not rendered at the end whose lateness passed MaxLateness within the window
// (late: they can no longer be good).
type ObjectiveResult struct {
	Objective objective.Objective
	Tally     objective.Tally
	// Met: Tally keeps the objective.
	Met bool
}

// Met reports whether the run kept every objective.
func (r *Result) Met() bool {
	for _, o := range r.Objectives {
		if !o.Met {
			return false
		}
	}
	return true
}

// ClassResult is one class's figures over the measurement window (NotRendered and DueAtEnd look
// at the end of the run).
type ClassResult struct {
	Name    string
	Rows    int
	Cadence time.Duration
	Source  schedule.Source
	// Renders started in the measurement window; Demand is the renders the class needs in it
	// (rows × window / cadence).
	Renders int
	Demand  float64
	// Lateness of the renders started in the measurement window (zero when none).
	Lateness Lateness
	// LongestWait is the longest time within the measurement window that the class had due
	// rows and got no render, in whole ticks (a wait that began before the window counts from
	// the window's start). A class that renders at least once a tick has 0.
	LongestWait time.Duration
	// NotRendered is the number of rows not rendered in the last cadence of the run; -1 when
	// the run is shorter than the cadence.
	NotRendered int
	// DueAtEnd is the class's due rows at the end of the run.
	DueAtEnd int
}

// Lateness is nearest-rank percentiles of lateness at render start: absolute and relative
// (÷ cadence).
type Lateness struct {
	P50, P99, Max                         time.Duration
	P50Relative, P99Relative, MaxRelative float64
}

// Sample is the due count at one instant.
type Sample struct {
	// At is the time since the start.
	At time.Duration
	// Due is every due row (due ≤ the instant, not yet claimed); ByClass per class.
	Due     int
	ByClass []int
}

// start is the simulated clock's origin; any instant between 1970 and 2106 would do.
var start = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// Run simulates cfg.
func Run(cfg Config) (*Result, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("simulation: %w", err)
	}
	began := time.Now()
	s, err := newSim(cfg)
	if err != nil {
		return nil, err
	}
	s.run()
	res := s.result()
	res.Elapsed = time.Since(began)
	return res, nil
}

// sim is one running simulation.
type sim struct {
	cfg   Config
	sched scheduler

	tickMs, startMs int64
	ticks           int

	// per row
	class      []uint16
	lastRender []int64 // ms; math.MinInt64 when never rendered
	dueAt      []int64 // ms; the row's due time (of its current version)

	// per class
	cadenceMs []int64
	firstRow  []int // rows of class k are [firstRow[k], firstRow[k+1])
	due       []int // due and unclaimed now
	calendar  []int32
	late      [][]int64 // ms, renders in the measurement window
	waitFrom  []int64   // the class has waited since (no render, rows due); -1 when not waiting
	longest   []int64

	samples []Sample
	// check, when set (tests), runs at every sample instant before the claims.
	check func(nowMs int64)
}

// scheduler is a claim order: the keeper core or a baseline.
type scheduler interface {
	// add holds row i, due at dueMs, at the start.
	add(i int, dueMs int64)
	// claim appends up to n due rows claimed at nowMs.
	claim(nowMs int64, n int, out []claimed) []claimed
	// complete finishes a claimed row's render at nowMs and returns its next due time.
	complete(nowMs int64, c claimed) (int64, error)
}

type claimed struct {
	row   int
	dueMs int64
	lease uint64
}

func newSim(cfg Config) (*sim, error) {
	f := cfg.Fleet
	n := f.Rows()
	s := &sim{
		cfg:        cfg,
		tickMs:     cfg.Tick.Milliseconds(),
		startMs:    start.UnixMilli(),
		ticks:      int(cfg.Duration / cfg.Tick),
		class:      make([]uint16, n),
		lastRender: make([]int64, n),
		dueAt:      make([]int64, n),
	}
	k := len(f.Classes)
	s.cadenceMs = make([]int64, k)
	s.firstRow = make([]int, k+1)
	s.due = make([]int, k)
	s.calendar = make([]int32, (s.ticks+1)*k)
	s.late = make([][]int64, k)
	s.waitFrom = make([]int64, k)
	s.longest = make([]int64, k)
	for ci, c := range f.Classes {
		s.cadenceMs[ci] = c.Cadence.Milliseconds()
		s.firstRow[ci+1] = s.firstRow[ci] + c.Rows
		s.waitFrom[ci] = -1
	}
	var err error
	switch cfg.Order {
	case OrderKeeper:
		s.sched, err = newKeeperSched(s, cfg)
	case OrderOldestDue:
		s.sched = newQueueSched(s, cfg.Keeper.Reschedule, false)
	case OrderClassPriority:
		s.sched = newQueueSched(s, cfg.Keeper.Reschedule, true)
	}
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5eed))
	for ci, c := range f.Classes {
		backlog := round(c.Backlog * float64(c.Rows))
		cad := float64(s.cadenceMs[ci])
		for j := range c.Rows {
			i := s.firstRow[ci] + j
			s.class[i] = uint16(ci)
			s.lastRender[i] = math.MinInt64
			var off float64 // ms from the start
			if j < backlog {
				off = -rng.Float64() * c.BacklogCycles * cad
			} else {
				off = (rng.Float64() - f.DueShare) * cad
			}
			dueMs := s.startMs + int64(math.Floor(off))
			s.sched.add(i, dueMs)
			s.dueAt[i] = dueMs
			s.schedule(ci, dueMs, 0)
		}
	}
	return s, nil
}

// schedule enters a row of class ci coming due at dueMs into the due calendar: it counts as due
// from the first tick at or after dueMs (and not before tick from).
func (s *sim) schedule(ci int, dueMs int64, from int) {
	t := from
	if d := dueMs - s.startMs; d > 0 {
		t = max(from, int((d+s.tickMs-1)/s.tickMs))
	}
	if t <= s.ticks {
		s.calendar[t*len(s.due)+ci]++
	}
}

func (s *sim) run() {
	k := len(s.due)
	measureMs := s.cfg.MeasureFrom.Milliseconds()
	sampleEvery := int(s.cfg.Sample / s.cfg.Tick)
	perTick := s.cfg.Capacity * s.cfg.Tick.Hours()
	credit := 0.0
	var batch, inFlight []claimed
	rendered := make([]bool, k)
	for t := 0; t <= s.ticks; t++ {
		nowMs := s.startMs + int64(t)*s.tickMs
		offMs := nowMs - s.startMs
		// the renders of the last tick complete
		for _, c := range inFlight {
			next, err := s.sched.complete(nowMs, c)
			if err != nil {
				panic(fmt.Sprintf("simulation: completing row %d: %v", c.row, err)) // a bug of the simulator or the core
			}
			s.schedule(int(s.class[c.row]), next, t)
			s.dueAt[c.row] = next
		}
		inFlight = inFlight[:0]
		for ci := range k {
			s.due[ci] += int(s.calendar[t*k+ci])
		}
		if t%sampleEvery == 0 || t == s.ticks {
			s.samples = append(s.samples, Sample{At: time.Duration(offMs) * time.Millisecond, Due: sum(s.due), ByClass: slices.Clone(s.due)})
			if s.check != nil {
				s.check(nowMs)
			}
		}
		if t == s.ticks {
			break
		}
		// this tick's renders start
		credit += perTick
		want := int(credit)
		credit -= float64(want)
		clear(rendered)
		for want > 0 {
			batch = s.sched.claim(nowMs, min(want, s.cfg.Batch), batch[:0])
			for _, c := range batch {
				ci := int(s.class[c.row])
				s.due[ci]--
				s.lastRender[c.row] = nowMs
				rendered[ci] = true
				if offMs >= measureMs {
					s.late[ci] = append(s.late[ci], nowMs-c.dueMs)
				}
			}
			inFlight = append(inFlight, batch...)
			if len(batch) < min(want, s.cfg.Batch) {
				break // nothing more is due: the rest of the capacity idles
			}
			want -= len(batch)
		}
		for ci := range k {
			switch {
			case rendered[ci] || s.due[ci] == 0:
				s.waitFrom[ci] = -1
			case s.waitFrom[ci] < 0:
				s.waitFrom[ci] = nowMs
			}
			// a wait is measured at the end of the tick: it lasted at least until then
			if s.waitFrom[ci] >= 0 && offMs+s.tickMs > measureMs {
				s.longest[ci] = max(s.longest[ci], nowMs+s.tickMs-max(s.waitFrom[ci], s.startMs+measureMs))
			}
		}
	}
}

func (s *sim) result() *Result {
	cfg := s.cfg
	res := &Result{Config: cfg, Demand: cfg.Fleet.Demand(), Samples: s.samples}
	endMs := s.startMs + int64(s.ticks)*s.tickMs
	window := float64(endMs - s.startMs - cfg.MeasureFrom.Milliseconds())
	var allRel []float64
	res.All = ClassResult{Name: "all", NotRendered: 0}
	for ci, c := range cfg.Fleet.Classes {
		cr := ClassResult{
			Name: c.Name, Rows: c.Rows, Cadence: c.Cadence, Source: c.Source,
			Renders:     len(s.late[ci]),
			Demand:      float64(c.Rows) * window / float64(s.cadenceMs[ci]),
			LongestWait: time.Duration(s.longest[ci]) * time.Millisecond,
			DueAtEnd:    s.due[ci],
			NotRendered: -1,
		}
		cad := float64(s.cadenceMs[ci])
		if l := s.late[ci]; len(l) > 0 {
			for _, v := range l {
				allRel = append(allRel, float64(v)/cad)
			}
			slices.Sort(l)
			cr.Lateness = Lateness{
				P50: ms(nearestRank(l, 0.50)), P99: ms(nearestRank(l, 0.99)), Max: ms(l[len(l)-1]),
				P50Relative: float64(nearestRank(l, 0.50)) / cad,
				P99Relative: float64(nearestRank(l, 0.99)) / cad,
				MaxRelative: float64(l[len(l)-1]) / cad,
			}
		}
		if endMs-s.startMs >= s.cadenceMs[ci] {
			cr.NotRendered = 0
			for i := s.firstRow[ci]; i < s.firstRow[ci+1]; i++ {
				if s.lastRender[i] < endMs-s.cadenceMs[ci] {
					cr.NotRendered++
				}
			}
		}
		res.Classes = append(res.Classes, cr)
		res.All.Rows += cr.Rows
		res.All.Renders += cr.Renders
		res.All.Demand += cr.Demand
		res.All.DueAtEnd += cr.DueAtEnd
		if cr.NotRendered >= 0 && res.All.NotRendered >= 0 {
			res.All.NotRendered += cr.NotRendered
		} else {
			res.All.NotRendered = -1
		}
		res.All.LongestWait = max(res.All.LongestWait, cr.LongestWait)
	}
	res.Objectives = s.objectives(endMs)
	if len(allRel) > 0 {
		slices.Sort(allRel)
		res.All.Lateness = Lateness{
			P50Relative: nearestRank(allRel, 0.50), P99Relative: nearestRank(allRel, 0.99), MaxRelative: allRel[len(allRel)-1],
		}
	}
	return res
}

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }

func sum(v []int) int {
	n := 0
	for _, x := range v {
		n += x
	}
	return n
}

// nearestRank returns the q-quantile of sorted v: the smallest value with at least q of v at or
// below it.
func nearestRank[T int64 | float64](v []T, q float64) T {
	k := int(math.Ceil(q*float64(len(v)))) - 1
	return v[max(0, min(k, len(v)-1))]
}

// keeperSched drives the real keeper core as a shard does.
type keeperSched struct {
	s     *sim
	core  *core.Core
	hash  []int64
	keys  []string
	rev   int64
	lease time.Duration
}

func newKeeperSched(s *sim, cfg Config) (*keeperSched, error) {
	c, err := core.New(cfg.Keeper)
	if err != nil {
		return nil, fmt.Errorf("simulation: %w", err)
	}
	for sl := range schedule.NumSlots {
		c.SetSlot(sl, core.SlotOwned)
	}
	n := len(s.class)
	ks := &keeperSched{s: s, core: c, hash: make([]int64, n), keys: make([]string, n), lease: 2 * cfg.Tick}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x4a54))
	for i := range n {
		ks.hash[i] = int64(rng.Uint64())
	}
	return ks, nil
}

func (k *keeperSched) row(i int, dueMs int64) schedule.Row {
	ci := k.s.class[i]
	c := &k.s.cfg.Fleet.Classes[ci]
	k.rev++
	return schedule.Row{
		Key: k.keys[i], KeyHash: k.hash[i], Due: time.UnixMilli(dueMs), HasDue: true,
		Cadence: c.Cadence, Route: c.Name, Source: c.Source, Rev: k.rev,
	}
}

func (k *keeperSched) add(i int, dueMs int64) {
	k.keys[i] = "https://sim.example/" + strconv.Itoa(i)
	if o := k.core.Apply(start, k.row(i, dueMs)); o.Result != core.Held {
		panic(fmt.Sprintf("simulation: row %d not held: %v %s", i, o.Result, o.Reason))
	}
}

func (k *keeperSched) claim(nowMs int64, n int, out []claimed) []claimed {
	for _, c := range k.core.Claim(time.UnixMilli(nowMs), n, k.lease) {
		i, err := strconv.Atoi(c.Key[len("https://sim.example/"):])
		if err != nil {
			panic(fmt.Sprintf("simulation: claimed key %q: %v", c.Key, err))
		}
		out = append(out, claimed{row: i, dueMs: c.Due.UnixMilli(), lease: c.Lease})
	}
	return out
}

func (k *keeperSched) complete(nowMs int64, c claimed) (int64, error) {
	now := time.UnixMilli(nowMs)
	cp, _, err := k.core.Completing(now, k.keys[c.row], c.lease)
	if err != nil {
		return 0, err
	}
	next := cp.NextDue.UnixMilli()
	if o := k.core.Apply(now, k.row(c.row, next)); o.Result != core.Held {
		return 0, fmt.Errorf("completed version not held: %v %s", o.Result, o.Reason)
	}
	if err := k.core.Release(now, k.keys[c.row], c.lease); err != nil {
		return 0, err
	}
	return next, nil
}

func ms2time(v int64) time.Time { return time.UnixMilli(v) }

// objectives evaluates Config.Objectives at the end of the run (endMs); see ObjectiveResult.
func (s *sim) objectives(endMs int64) []ObjectiveResult {
	fromMs := s.startMs + s.cfg.MeasureFrom.Milliseconds()
	out := make([]ObjectiveResult, 0, len(s.cfg.Objectives))
	for _, o := range s.cfg.Objectives {
		maxMs := o.MaxLateness.Milliseconds()
		var t objective.Tally
		for ci, c := range s.cfg.Fleet.Classes {
			if !o.Class.Matches(c.Cadence, c.Source, false) {
				continue
			}
			for _, l := range s.late[ci] {
				if o.Good(time.Duration(l) * time.Millisecond) {
					t.Good++
				} else {
					t.Late++
				}
			}
			for i := s.firstRow[ci]; i < s.firstRow[ci+1]; i++ {
				// not rendered since it came due, and decided late within the window
				if d := s.dueAt[i]; s.lastRender[i] < d && endMs-d > maxMs && d+maxMs >= fromMs {
					t.Late++
				}
			}
		}
		out = append(out, ObjectiveResult{Objective: o, Tally: t, Met: o.Met(t)})
	}
	return out
}
