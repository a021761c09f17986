package simulate

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// Class is one class of rows of a simulated fleet: rows sharing a cadence and a source.
type Class struct {
	// Name labels the class in the output; default "<cadence>/<source>", e.g. "96h/discovered".
	Name string
	// Rows is how many rows the class has.
	Rows int
	// Cadence is the rows' render interval.
	Cadence time.Duration
	// Source is where the rows came from (a sitemap: submitted; the crawler: discovered).
	Source schedule.Source
	// Backlog is the share of the class's rows overdue at the start (0 to 1): they are due
	// uniformly within the BacklogCycles cadences before the start.
	Backlog float64
	// BacklogCycles is how many cadences back the backlog reaches. Default 2.
	BacklogCycles float64
}

// Fleet is a simulated fleet. Rows not in the backlog start in steady state: each is due
// uniformly within [start − DueShare·cadence, start + (1 − DueShare)·cadence), as
// `renderqueue seed` writes them.
type Fleet struct {
	Classes []Class
	// DueShare is the share of each ordinary row's cadence that lies before the start. Default
	// 0.02; must be within [0, 1).
	DueShare float64
}

// Defaults of the fleet's optional fields.
const (
	DefaultBacklogCycles = 2
	DefaultDueShare      = 0.02
)

// withDefaults returns f with its optional fields defaulted and class names filled in.
func (f Fleet) withDefaults() Fleet {
	out := Fleet{DueShare: f.DueShare, Classes: make([]Class, len(f.Classes))}
	if out.DueShare == 0 {
		out.DueShare = DefaultDueShare
	}
	for i, c := range f.Classes {
		if c.BacklogCycles == 0 {
			c.BacklogCycles = DefaultBacklogCycles
		}
		if c.Name == "" {
			c.Name = FormatCadence(c.Cadence) + "/" + c.Source.String()
		}
		out.Classes[i] = c
	}
	return out
}

// Validate reports every problem of a (defaulted) fleet.
func (f Fleet) Validate() error {
	var errs []error
	if len(f.Classes) == 0 {
		errs = append(errs, errors.New("the fleet has no classes"))
	}
	if !(f.DueShare >= 0 && f.DueShare < 1) {
		errs = append(errs, fmt.Errorf("dueShare %v is not within [0, 1)", f.DueShare))
	}
	names := map[string]bool{}
	type key struct {
		cadence time.Duration
		source  schedule.Source
	}
	classes := map[key]string{}
	total := 0
	for i, c := range f.Classes {
		where := fmt.Sprintf("class %d (%s)", i, c.Name)
		if c.Rows < 0 {
			errs = append(errs, fmt.Errorf("%s: rows %d is negative", where, c.Rows))
		}
		total += max(c.Rows, 0)
		if c.Cadence < time.Second || c.Cadence > schedule.MaxCadence || c.Cadence%time.Millisecond != 0 {
			errs = append(errs, fmt.Errorf("%s: cadence %v must be whole milliseconds within [1s, %v]", where, c.Cadence, schedule.MaxCadence))
		}
		if c.Source != schedule.SourceDiscovered && c.Source != schedule.SourceSubmitted {
			errs = append(errs, fmt.Errorf("%s: unknown source %d", where, c.Source))
		}
		if !(c.Backlog >= 0 && c.Backlog <= 1) {
			errs = append(errs, fmt.Errorf("%s: backlog %v is not within [0, 1]", where, c.Backlog))
		}
		if !(c.BacklogCycles > 0 && c.BacklogCycles <= 1000) {
			errs = append(errs, fmt.Errorf("%s: backlogCycles %v is not within (0, 1000]", where, c.BacklogCycles))
		}
		if names[c.Name] {
			errs = append(errs, fmt.Errorf("%s: name used twice", where))
		}
		names[c.Name] = true
		k := key{c.Cadence, c.Source}
		if other, ok := classes[k]; ok {
			errs = append(errs, fmt.Errorf("%s: same cadence and source as %s (the keeper sees them as one class; merge them)", where, other))
		}
		classes[k] = c.Name
	}
	if total == 0 && len(f.Classes) > 0 {
		errs = append(errs, errors.New("the fleet has no rows"))
	}
	if total > maxRows {
		errs = append(errs, fmt.Errorf("the fleet has %d rows, more than the %d one simulation holds", total, maxRows))
	}
	return errors.Join(errs...)
}

// maxRows bounds a simulated fleet (one keeper core holds it).
const maxRows = 20_000_000

// Demand is the renders per hour the fleet needs: Σ rows / cadence.
func (f Fleet) Demand() float64 {
	d := 0.0
	for _, c := range f.Classes {
		d += float64(c.Rows) / c.Cadence.Hours()
	}
	return d
}

// Rows is the fleet's row count.
func (f Fleet) Rows() int {
	n := 0
	for _, c := range f.Classes {
		n += c.Rows
	}
	return n
}

// SeedFleet is the mix `renderqueue seed` writes, split exactly: homepages render hourly, of the
// other rows categoryPermille ‰ daily and the rest every 96 hours, each class half submitted
// (the odd row discovered); backlog is the share of every class overdue at the start.
func SeedFleet(rows, homepages, categoryPermille int, backlog float64) Fleet {
	rest := rows - homepages
	category := int(int64(rest) * int64(categoryPermille) / 1000)
	var f Fleet
	for _, c := range []struct {
		rows    int
		cadence time.Duration
	}{{homepages, time.Hour}, {category, 24 * time.Hour}, {rest - category, 96 * time.Hour}} {
		f.Classes = append(f.Classes,
			Class{Rows: c.rows / 2, Cadence: c.cadence, Source: schedule.SourceSubmitted, Backlog: backlog},
			Class{Rows: c.rows - c.rows/2, Cadence: c.cadence, Source: schedule.SourceDiscovered, Backlog: backlog})
	}
	return f
}

// fleetFile is the YAML (or JSON) form of a fleet.
type fleetFile struct {
	DueShare *float64    `json:"dueShare,omitempty"`
	Classes  []classFile `json:"classes"`
}

type classFile struct {
	Name          string   `json:"name,omitempty"`
	Rows          int      `json:"rows"`
	Cadence       string   `json:"cadence"`
	Source        string   `json:"source"`
	Backlog       float64  `json:"backlog,omitempty"`
	BacklogCycles *float64 `json:"backlogCycles,omitempty"`
}

// ParseFleet reads a fleet from YAML or JSON:
//
//	dueShare: 0.02            # optional
//	classes:
//	  - name: homepages       # optional
//	    rows: 150
//	    cadence: 1h           # a Go duration
//	    source: submitted     # or discovered
//	    backlog: 0.5          # optional: share overdue at the start
//	    backlogCycles: 2      # optional
//
// Unknown fields are errors.
func ParseFleet(data []byte) (Fleet, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return Fleet{}, errors.New("parsing the fleet: the file is empty")
	}
	var ff fleetFile
	if err := yaml.UnmarshalStrict(data, &ff); err != nil {
		return Fleet{}, fmt.Errorf("parsing the fleet: %w", err)
	}
	var f Fleet
	var errs []error
	if ff.DueShare != nil {
		if *ff.DueShare == 0 {
			errs = append(errs, errors.New("dueShare 0 is not supported (leave it out for the default)"))
		}
		f.DueShare = *ff.DueShare
	}
	for i, cf := range ff.Classes {
		c := Class{Name: cf.Name, Rows: cf.Rows, Backlog: cf.Backlog}
		d, err := time.ParseDuration(cf.Cadence)
		if err != nil {
			errs = append(errs, fmt.Errorf("class %d: cadence: %w", i, err))
		}
		c.Cadence = d
		if c.Source, err = schedule.ParseSource(cf.Source); err != nil {
			errs = append(errs, fmt.Errorf("class %d: %w", i, err))
		}
		if cf.BacklogCycles != nil {
			if *cf.BacklogCycles == 0 {
				errs = append(errs, fmt.Errorf("class %d: backlogCycles must be > 0", i))
			}
			c.BacklogCycles = *cf.BacklogCycles
		}
		f.Classes = append(f.Classes, c)
	}
	if err := errors.Join(errs...); err != nil {
		return Fleet{}, err
	}
	if err := f.withDefaults().Validate(); err != nil {
		return Fleet{}, err
	}
	return f, nil
}

// FormatCadence writes a duration compactly: "1h", "96h", "90m", "1h30m", "45s", "1.5s".
func FormatCadence(d time.Duration) string {
	if d <= 0 || d%time.Second != 0 {
		return d.String()
	}
	h, m, s := d/time.Hour, (d%time.Hour)/time.Minute, (d%time.Minute)/time.Second
	var b strings.Builder
	if h > 0 {
		b.WriteString(strconv.FormatInt(int64(h), 10) + "h")
	}
	if m > 0 {
		b.WriteString(strconv.FormatInt(int64(m), 10) + "m")
	}
	if s > 0 {
		b.WriteString(strconv.FormatInt(int64(s), 10) + "s")
	}
	return b.String()
}

// round rounds half away from zero to an int.
func round(x float64) int { return int(math.Round(x)) }
