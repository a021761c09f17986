// Package objective is freshness objectives: a promise that a share of one class's renders start
// within a lateness of their due time ("99% of the hourly rows rendered within 10 minutes of
// due"), and the arithmetic of keeping it — attainment, error budget, burn rate — as the SRE
// workbook defines them for request-based objectives, with a row coming due as the request.
//
// An event is one due time of one row. It is decided good when its render starts within
// MaxLateness of the due time, late when the render starts later, or when MaxLateness passes with
// no render at all: a fleet whose workers stopped burns its budget although nothing completes.
// Due times still within MaxLateness and not rendered are not decided yet and count nowhere.
//
// The package is pure: no clock, no I/O. `renderqueue simulate --objectives` evaluates
// objectives on the simulated fleet (pkg/simulate) and searches the worker count that meets them.
package objective

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// Selector picks the rows an objective is about. Its zero value selects every row.
type Selector struct {
	// MinCadence and MaxCadence bound the rows' cadence, inclusive; 0 leaves that side open.
	MinCadence, MaxCadence time.Duration
	// Source, when set, selects only the rows from that source.
	Source *schedule.Source
	// Urgent, when set, selects only the urgent (true) or the ordinary (false) rows.
	Urgent *bool
}

// Matches reports whether a row with these values is one of the selector's.
func (s Selector) Matches(cadence time.Duration, source schedule.Source, urgent bool) bool {
	return (s.MinCadence == 0 || cadence >= s.MinCadence) &&
		(s.MaxCadence == 0 || cadence <= s.MaxCadence) &&
		(s.Source == nil || *s.Source == source) &&
		(s.Urgent == nil || *s.Urgent == urgent)
}

// String describes the selector: "cadence 1h–1h, submitted", "every row".
func (s Selector) String() string {
	var parts []string
	switch {
	case s.MinCadence > 0 && s.MaxCadence > 0 && s.MinCadence == s.MaxCadence:
		parts = append(parts, "cadence "+Short(s.MinCadence))
	case s.MinCadence > 0 && s.MaxCadence > 0:
		parts = append(parts, "cadence "+Short(s.MinCadence)+"–"+Short(s.MaxCadence))
	case s.MinCadence > 0:
		parts = append(parts, "cadence ≥ "+Short(s.MinCadence))
	case s.MaxCadence > 0:
		parts = append(parts, "cadence ≤ "+Short(s.MaxCadence))
	}
	if s.Source != nil {
		parts = append(parts, s.Source.String())
	}
	if s.Urgent != nil {
		parts = append(parts, map[bool]string{true: "urgent", false: "not urgent"}[*s.Urgent])
	}
	if len(parts) == 0 {
		return "every row"
	}
	return strings.Join(parts, ", ")
}

// Short writes a duration without its zero minutes and seconds: "1h", "1h30m", "10m", "90s".
func Short(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Objective is one freshness promise.
type Objective struct {
	// Name names it in output, status and metrics: lower-case letters, digits and '-'.
	Name string
	// Class is the rows it is about.
	Class Selector
	// Percentile is the share of the class's events, in percent, that must be good: within
	// (0, 100), e.g. 99 or 99.9.
	Percentile float64
	// MaxLateness is the most an event's render may start after its due time and be good.
	MaxLateness time.Duration
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// Validate reports every problem of the objective.
func (o Objective) Validate() error {
	var errs []error
	if !nameRE.MatchString(o.Name) {
		errs = append(errs, fmt.Errorf("name %q: want 1–63 lower-case letters, digits and '-', starting and ending with a letter or digit", o.Name))
	}
	if !(o.Percentile > 0 && o.Percentile < 100) {
		errs = append(errs, fmt.Errorf("percentile %v: want a number within (0, 100), such as 99 or 99.9", o.Percentile))
	}
	if o.MaxLateness <= 0 {
		errs = append(errs, fmt.Errorf("maxLateness %v: want a positive duration", o.MaxLateness))
	}
	if o.Class.MinCadence < 0 || o.Class.MaxCadence < 0 {
		errs = append(errs, errors.New("class: cadences must not be negative"))
	} else if o.Class.MaxCadence > 0 && o.Class.MinCadence > o.Class.MaxCadence {
		errs = append(errs, fmt.Errorf("class: minCadence %v is above maxCadence %v", o.Class.MinCadence, o.Class.MaxCadence))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("objective %q: %w", o.Name, err)
	}
	return nil
}

// ValidateAll validates each objective and that their names differ.
func ValidateAll(objs []Objective) error {
	var errs []error
	seen := map[string]bool{}
	for _, o := range objs {
		if err := o.Validate(); err != nil {
			errs = append(errs, err)
		}
		if seen[o.Name] {
			errs = append(errs, fmt.Errorf("objective %q is named twice", o.Name))
		}
		seen[o.Name] = true
	}
	return errors.Join(errs...)
}

// String describes the objective: `hourly: 99% of cadence 1h within 10m of due`.
func (o Objective) String() string {
	return fmt.Sprintf("%s: %s%% of %s within %s of due", o.Name, strconv.FormatFloat(o.Percentile, 'f', -1, 64), o.Class, Short(o.MaxLateness))
}

// Budget is the share of events allowed to be late: 1 − Percentile/100.
func (o Objective) Budget() float64 { return 1 - o.Percentile/100 }

// Good reports whether an event whose render started lateness after its due time is good.
func (o Objective) Good(lateness time.Duration) bool { return lateness <= o.MaxLateness }

// Tally counts an objective's decided events.
type Tally struct {
	Good, Late int64
}

// Add returns the sum of t and u.
func (t Tally) Add(u Tally) Tally { return Tally{t.Good + u.Good, t.Late + u.Late} }

// Total is the number of decided events.
func (t Tally) Total() int64 { return t.Good + t.Late }

// Attainment is the share of good events, and false when there were none.
func (t Tally) Attainment() (float64, bool) {
	if t.Total() == 0 {
		return 0, false
	}
	return float64(t.Good) / float64(t.Total()), true
}

// BurnRate is how fast the events of t spend o's error budget: the late share divided by the
// budget. 1 spends exactly the budget over any window; 14.4 spends a 30-day budget in 2 days. 0
// without events.
func (o Objective) BurnRate(t Tally) float64 {
	if t.Total() == 0 {
		return 0
	}
	return float64(t.Late) / float64(t.Total()) / o.Budget()
}

// BudgetRemaining is the share of the error budget the events of t left unspent: 1 − burn rate;
// negative when overspent.
func (o Objective) BudgetRemaining(t Tally) float64 { return 1 - o.BurnRate(t) }

// Met reports whether the events of t keep the objective (true without events). The comparison
// is of counts, not floating-point shares: good × 100 ≥ total × percentile, to within a part in
// 10^12.
func (o Objective) Met(t Tally) bool {
	if t.Total() == 0 {
		return true
	}
	return float64(t.Good)*100 >= float64(t.Total())*o.Percentile*(1-1e-12)
}

// Percent formats a share (0.9912) as a percentage with enough digits for the objective's
// percentile: "99.12%".
func Percent(share float64) string {
	if math.IsNaN(share) || math.IsInf(share, 0) {
		return "n/a"
	}
	return strconv.FormatFloat(math.Round(share*10000)/100, 'f', -1, 64) + "%"
}

type entry struct {
	Name  string `json:"name"`
	Class struct {
		MinCadence string `json:"minCadence"`
		MaxCadence string `json:"maxCadence"`
		Source     string `json:"source"`
		Urgent     *bool  `json:"urgent"`
	} `json:"class"`
	Percentile  json.RawMessage `json:"percentile"` // "99.9" or 99.9
	MaxLateness string          `json:"maxLateness"`
	// Window is spec.objectives[].window: how far back the operator judges the objective. A
	// simulation judges it over its measurement window; the field is accepted (a RenderQueue's
	// objectives are read as they are) and checked, not used.
	Window string `json:"window"`
}

// Parse reads objectives from YAML or JSON: a list under "objectives", or a RenderQueue manifest
// whose spec.objectives it takes (other fields of the manifest are ignored):
//
//	objectives:
//	  - name: hourly
//	    class: {minCadence: 1h, maxCadence: 1h, source: submitted}  # any of them; {} is every row
//	    percentile: "99"     # a string or a number within (0, 100)
//	    maxLateness: 10m
//
// Durations are Go durations. Unknown fields of an objective are errors.
func Parse(data []byte) ([]Objective, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("parsing objectives: the file is empty")
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("parsing objectives: %w", err)
	}
	var top struct {
		Objectives json.RawMessage `json:"objectives"`
		Spec       struct {
			Objectives json.RawMessage `json:"objectives"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(js, &top); err != nil {
		return nil, fmt.Errorf("parsing objectives: want a mapping with objectives or spec.objectives: %w", err)
	}
	list := top.Objectives
	if len(top.Spec.Objectives) > 0 {
		if len(list) > 0 {
			return nil, errors.New("parsing objectives: both objectives and spec.objectives are set")
		}
		list = top.Spec.Objectives
	}
	var entries []entry
	if len(list) > 0 {
		// strict for the objectives themselves; the rest of a manifest is not ours to check
		dec := json.NewDecoder(bytes.NewReader(list))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&entries); err != nil {
			return nil, fmt.Errorf("parsing objectives: %w", err)
		}
	}
	if len(entries) == 0 {
		return nil, errors.New("parsing objectives: no objectives (want a list under objectives or spec.objectives)")
	}
	objs := make([]Objective, 0, len(entries))
	var errs []error
	for i, e := range entries {
		o := Objective{Name: e.Name}
		fail := func(format string, a ...any) {
			errs = append(errs, fmt.Errorf("objective %d (%q): %s", i, e.Name, fmt.Sprintf(format, a...)))
		}
		dur := func(field, s string) time.Duration {
			if s == "" {
				return 0
			}
			d, err := time.ParseDuration(s)
			if err != nil {
				fail("%s: %v", field, err)
			}
			return d
		}
		o.Class.MinCadence = dur("class.minCadence", e.Class.MinCadence)
		o.Class.MaxCadence = dur("class.maxCadence", e.Class.MaxCadence)
		o.MaxLateness = dur("maxLateness", e.MaxLateness)
		if w := dur("window", e.Window); e.Window != "" && w <= 0 {
			fail("window %s: want a positive duration", e.Window)
		}
		if e.MaxLateness == "" {
			fail("maxLateness is required")
		}
		if e.Class.Source != "" {
			src, err := schedule.ParseSource(e.Class.Source)
			if err != nil {
				fail("class.source: %v", err)
			}
			o.Class.Source = &src
		}
		o.Class.Urgent = e.Class.Urgent
		p := strings.Trim(strings.TrimSpace(string(e.Percentile)), `"`)
		if p == "" {
			fail("percentile is required")
		} else if v, err := strconv.ParseFloat(p, 64); err != nil {
			fail("percentile %s: not a number", p)
		} else {
			o.Percentile = v
		}
		objs = append(objs, o)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := ValidateAll(objs); err != nil {
		return nil, err
	}
	return objs, nil
}
