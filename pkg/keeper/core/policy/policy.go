package policy

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// Config is the keeper core's policy.
type Config struct {
	// Window: hold rows due before now + Window; 0 holds every row.
	Window time.Duration
	// SubmittedBoost multiplies the score of rows from a sitemap (source submitted); 1 = no boost.
	SubmittedBoost float64
	// UrgentMaxShare caps urgent rows at floor(UrgentMaxShare × n) of a claim batch of n while
	// other rows are due. 0 lets urgent rows through only when nothing else is due.
	UrgentMaxShare float64
	// Floors reserve a minimum share of every claim for classes of rows while they have due rows
	// (see Floor); they must not sum past 1.
	Floors []Floor
	// Reschedule picks a completed row's next due time; the zero value is KeepPhase.
	Reschedule Reschedule
	// StarvationBound bounds how long a class of rows (the non-urgent rows of one cadence and
	// source) with due rows goes without a render, in its cadences: a class that has had due
	// rows and no row claimed for StarvationBound × its cadence gets its most overdue row claimed
	// ahead of floors and score order (after the urgent share). 0 turns the bound off; the keeper
	// runs with DefaultStarvationBound.
	StarvationBound float64
	// FirstLease is the first lease token handed out; the service starts it at a random value so
	// tokens from an earlier process are not accepted by a later one.
	FirstLease uint64
}

// DefaultStarvationBound is the keeper's StarvationBound: no class with due rows goes more than
// half its cadence (and one claim) without a render.
const DefaultStarvationBound = 0.5

// MaxFloors is the most floors a configuration may have.
const MaxFloors = 64

// floorSumSlack absorbs the rounding of decimal shares that sum to exactly 1 (0.1 + 0.2 + 0.7).
const floorSumSlack = 1e-9

// Floor reserves a minimum share of every claim for one class of rows: the non-urgent rows of
// one (cadence, source). While the class has due rows, a claim of n rows of which u are urgent
// gives it at least ⌊Share × (n − u)⌋ of them (fewer only when it has fewer due rows, or when
// other floors' fractions carried over fill the claim, see below), taken in score order within the
// class, before the rest of the claim is filled by score. A floor never takes rows the class does
// not have: what it leaves unused goes back to score order in the same claim.
//
// Fractions carry over: each claim adds Share × (n − u) to the class's credit, every row of the
// class the claim hands out (by its floor or by score) takes one off, the floor reserves
// ⌊credit⌋, the credit never goes below 0, and a class left without due rows keeps only the
// fraction. So small claims (n = 1) respect floors too: over consecutive claims during which it
// keeps due rows, a class gets at least Share of their non-urgent rows, less a bounded shortfall
// (below the number of floors plus one claim's share, reached only when carried-over floor credits
// compete for the last places of a claim).
type Floor struct {
	Cadence time.Duration
	Source  schedule.Source
	Share   float64
}

// String writes the floor as ParseFloor reads it: "96h/discovered=0.05".
func (f Floor) String() string {
	return shortDuration(f.Cadence) + "/" + f.Source.String() + "=" + strconv.FormatFloat(f.Share, 'g', -1, 64)
}

// ParseFloor parses a floor written "CADENCE/SOURCE=SHARE", e.g. "96h/discovered=0.05": a Go
// duration, submitted or discovered, and a decimal share within (0, 1].
func ParseFloor(s string) (Floor, error) {
	class, share, ok := strings.Cut(s, "=")
	cadence, source, ok2 := strings.Cut(class, "/")
	if !ok || !ok2 {
		return Floor{}, fmt.Errorf("floor %q: want CADENCE/SOURCE=SHARE, e.g. 96h/discovered=0.05", s)
	}
	var f Floor
	var err error
	if f.Cadence, err = time.ParseDuration(cadence); err != nil {
		return Floor{}, fmt.Errorf("floor %q: cadence: %w", s, err)
	}
	if f.Source, err = schedule.ParseSource(source); err != nil {
		return Floor{}, fmt.Errorf("floor %q: %w", s, err)
	}
	if f.Share, err = strconv.ParseFloat(share, 64); err != nil {
		return Floor{}, fmt.Errorf("floor %q: share: %w", s, err)
	}
	if errs := validateFloors([]Floor{f}); len(errs) > 0 {
		return Floor{}, errors.Join(errs...)
	}
	return f, nil
}

// shortDuration writes whole-second durations compactly ("96h", "90m", "1h30m"), others as
// time.Duration does.
func shortDuration(d time.Duration) string {
	if d <= 0 || d%time.Second != 0 {
		return d.String()
	}
	s := d.String() // e.g. "96h0m0s", "1h30m0s", "45s"
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Validate says what is wrong with a configuration.
func (c Config) Validate() error {
	var errs []error
	if c.Window < 0 {
		errs = append(errs, fmt.Errorf("window %v is negative", c.Window))
	}
	if math.IsNaN(c.SubmittedBoost) || math.IsInf(c.SubmittedBoost, 0) || c.SubmittedBoost <= 0 {
		errs = append(errs, fmt.Errorf("submittedBoost %v must be a finite number > 0", c.SubmittedBoost))
	}
	if math.IsNaN(c.UrgentMaxShare) || c.UrgentMaxShare < 0 || c.UrgentMaxShare > 1 {
		errs = append(errs, fmt.Errorf("urgentMaxShare %v must be within [0, 1]", c.UrgentMaxShare))
	}
	errs = append(errs, validateFloors(c.Floors)...)
	if c.Reschedule != KeepPhase && c.Reschedule != AfterRender && c.Reschedule != Adaptive {
		errs = append(errs, fmt.Errorf("reschedule %v is not a policy (want %v, %v or %v)", c.Reschedule, KeepPhase, AfterRender, Adaptive))
	}
	if math.IsNaN(c.StarvationBound) || math.IsInf(c.StarvationBound, 0) || c.StarvationBound < 0 {
		errs = append(errs, fmt.Errorf("starvationBound %v must be a finite number ≥ 0", c.StarvationBound))
	}
	return errors.Join(errs...)
}

func validateFloors(floors []Floor) []error {
	var errs []error
	if len(floors) > MaxFloors {
		errs = append(errs, fmt.Errorf("%d floors, at most %d allowed", len(floors), MaxFloors))
	}
	type class struct {
		cadence time.Duration
		source  schedule.Source
	}
	seen := map[class]bool{}
	sum := 0.0
	for i, f := range floors {
		switch {
		case f.Cadence < schedule.MinCadence || f.Cadence > schedule.MaxCadence:
			errs = append(errs, fmt.Errorf("floor %d (%v): cadence must be within [%v, %v]", i, f, schedule.MinCadence, schedule.MaxCadence))
		case f.Cadence%time.Millisecond != 0:
			errs = append(errs, fmt.Errorf("floor %d (%v): cadence must be whole milliseconds (rows' cadences are)", i, f))
		}
		if f.Source != schedule.SourceDiscovered && f.Source != schedule.SourceSubmitted {
			errs = append(errs, fmt.Errorf("floor %d (%v): unknown source", i, f))
		}
		if math.IsNaN(f.Share) || f.Share <= 0 || f.Share > 1 {
			errs = append(errs, fmt.Errorf("floor %d (%v): share must be within (0, 1]", i, f))
		} else {
			sum += f.Share
		}
		k := class{f.Cadence, f.Source}
		if seen[k] {
			errs = append(errs, fmt.Errorf("floor %d (%v): class %v/%v has more than one floor", i, f, f.Cadence, f.Source))
		}
		seen[k] = true
	}
	if sum > 1+floorSumSlack {
		errs = append(errs, fmt.Errorf("floors sum to %v; they must not sum past 1", sum))
	}
	return errs
}

// Score is the claim priority of a row due at due with the given cadence and source at now:
// relative lateness (now − due) / cadence, times the submitted boost for sitemap rows. Times are in
// milliseconds.
func Score(nowMs, dueMs, cadenceMs int64, submitted bool, boost float64) float64 {
	s := float64(nowMs-dueMs) / float64(cadenceMs)
	if submitted {
		s *= boost
	}
	return s
}
