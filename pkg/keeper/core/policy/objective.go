package policy

import (
	"errors"
	"fmt"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// MaxObjectives is the most freshness objectives a core counts.
const MaxObjectives = 16

// Objective is one freshness objective as the core counts it (the percentile is not the core's:
// it counts events, and whoever reads the counts judges them): the rows of a class, and the most
// their render may start after they came due.
//
// Each due time of a row of the class is one event, decided once: good when a render that
// started within MaxLateness of the due time completes, late when a render that started later
// completes, or when MaxLateness passes while the row is not being rendered, or when a render
// in progress at that moment ends without completing. core.Core.ObjectivesCatchUp documents the
// counting.
type Objective struct {
	// Name names it (unique among a core's objectives).
	Name string
	// MinCadence and MaxCadence bound the rows' cadence, inclusive; 0 leaves that side open.
	MinCadence, MaxCadence time.Duration
	// Source, when set, selects only the rows from that source.
	Source *schedule.Source
	// Urgent, when set, selects only the urgent (true) or the ordinary (false) rows.
	Urgent *bool
	// MaxLateness is the most a render may start after the due time and be good; > 0.
	MaxLateness time.Duration
}

// Matches reports whether rows of this class are the objective's.
func (o Objective) Matches(cadence time.Duration, source schedule.Source, urgent bool) bool {
	return (o.MinCadence == 0 || cadence >= o.MinCadence) &&
		(o.MaxCadence == 0 || cadence <= o.MaxCadence) &&
		(o.Source == nil || *o.Source == source) &&
		(o.Urgent == nil || *o.Urgent == urgent)
}

// SameAs reports whether two objectives count the same events (their definitions are equal).
func (o Objective) SameAs(p Objective) bool {
	return o.Name == p.Name && o.MinCadence == p.MinCadence && o.MaxCadence == p.MaxCadence &&
		eqPtr(o.Source, p.Source) && eqPtr(o.Urgent, p.Urgent) && o.MaxLateness == p.MaxLateness
}

func eqPtr[T comparable](a, b *T) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// overlaps reports whether some class of rows matches both objectives.
func (o Objective) overlaps(p Objective) bool {
	lo := max(o.MinCadence, p.MinCadence)
	hiO, hiP := o.MaxCadence, p.MaxCadence
	if hiO > 0 && lo > hiO || hiP > 0 && lo > hiP {
		return false
	}
	if o.Source != nil && p.Source != nil && *o.Source != *p.Source {
		return false
	}
	return o.Urgent == nil || p.Urgent == nil || *o.Urgent == *p.Urgent
}

// ValidateObjectives reports every problem of a list of objectives: more than MaxObjectives, a
// missing or repeated name, MaxLateness not positive, cadences reversed, and two objectives whose
// classes overlap (each row counts for at most one objective: its event is decided once).
func ValidateObjectives(objs []Objective) error {
	var errs []error
	if len(objs) > MaxObjectives {
		errs = append(errs, fmt.Errorf("%d objectives: at most %d", len(objs), MaxObjectives))
	}
	seen := map[string]bool{}
	for i, o := range objs {
		if o.Name == "" {
			errs = append(errs, fmt.Errorf("objective %d has no name", i))
		} else if seen[o.Name] {
			errs = append(errs, fmt.Errorf("objective %q is named twice", o.Name))
		}
		seen[o.Name] = true
		if o.MaxLateness <= 0 {
			errs = append(errs, fmt.Errorf("objective %q: maxLateness %v must be positive", o.Name, o.MaxLateness))
		}
		if o.MinCadence < 0 || o.MaxCadence < 0 || o.MaxCadence > 0 && o.MinCadence > o.MaxCadence {
			errs = append(errs, fmt.Errorf("objective %q: cadences %v–%v are not a range", o.Name, o.MinCadence, o.MaxCadence))
		}
		for _, p := range objs[:i] {
			if o.overlaps(p) {
				errs = append(errs, fmt.Errorf("objectives %q and %q select some rows in common: each row counts for one objective", p.Name, o.Name))
			}
		}
	}
	return errors.Join(errs...)
}
