package schedule

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// What a valid row is, in one place. The store refuses to write a row that is not storable (its
// Upsert, `renderqueue upsert` and the producers' NDJSON path all check Problems), and the keeper
// holds a row only when it is holdable (HoldProblem): storable and scheduled (a due time). So
// every row written through renderqueue that has a due time is held when it is due; a row written
// by plain SQL past these limits (the table's own constraints are looser) is counted invalid by
// the keeper and never held, never coerced.
const (
	// MaxKeyBytes is the longest key (canonical URL) a row may have.
	MaxKeyBytes = 2048
	// MaxRouteBytes is the longest route a row may have.
	MaxRouteBytes = 256
	// MinCadence and MaxCadence bound a row's cadence (whole milliseconds).
	MinCadence = time.Millisecond
	MaxCadence = 10 * 365 * 24 * time.Hour
	// MinDueMs and MaxDueMs bound a row's due time in Unix milliseconds, [MinDueMs, MaxDueMs):
	// from 1970 to 2106-02-07, because the keeper holds due times as 32-bit seconds.
	MinDueMs int64 = 0
	MaxDueMs int64 = math.MaxUint32 * 1000
)

// KeyProblem says why key cannot be a row's key, or "" when it can: it must be 1 to MaxKeyBytes
// bytes without a NUL byte.
func KeyProblem(key string) string {
	switch {
	case key == "":
		return "empty key"
	case len(key) > MaxKeyBytes:
		return fmt.Sprintf("key is %d bytes, longer than %d", len(key), MaxKeyBytes)
	case strings.IndexByte(key, 0) >= 0:
		return "key contains a NUL byte"
	}
	return ""
}

// CadenceProblem says why d cannot be a row's cadence, or "" when it can.
func CadenceProblem(d time.Duration) string {
	switch {
	case d <= 0:
		return fmt.Sprintf("cadence %v is not positive", d)
	case d%time.Millisecond != 0:
		return fmt.Sprintf("cadence %v is not a whole number of milliseconds", d)
	case d > MaxCadence:
		return fmt.Sprintf("cadence %v is over %v", d, MaxCadence)
	}
	return ""
}

// RouteProblem says why route cannot be a row's route, or "" when it can.
func RouteProblem(route string) string {
	switch {
	case len(route) > MaxRouteBytes:
		return fmt.Sprintf("route is %d bytes, longer than %d", len(route), MaxRouteBytes)
	case strings.IndexByte(route, 0) >= 0:
		return "route contains a NUL byte"
	}
	return ""
}

// SourceProblem says why s is not a known source, or "".
func SourceProblem(s Source) string {
	if s != SourceDiscovered && s != SourceSubmitted {
		return fmt.Sprintf("unknown source %v", s)
	}
	return ""
}

// DueProblem says why t cannot be a row's due time (a completion's next due time included), or
// "" when it can: it must lie within [1970, 2106) (MinDueMs, MaxDueMs).
func DueProblem(t time.Time) string {
	if ms := t.UnixMilli(); ms < MinDueMs || ms >= MaxDueMs {
		return fmt.Sprintf("due time %s is outside [1970, 2106)", t.UTC().Format(time.RFC3339Nano))
	}
	return ""
}

// Problems lists why r cannot be stored, nil when it can: its key, cadence, route, source and,
// when it has one, its due time. An unscheduled row (no due time) is storable.
func (r *Row) Problems() []string {
	var out []string
	for _, p := range [...]string{KeyProblem(r.Key), CadenceProblem(r.Cadence), RouteProblem(r.Route), SourceProblem(r.Source)} {
		if p != "" {
			out = append(out, p)
		}
	}
	if r.HasDue {
		if p := DueProblem(r.Due); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// HoldProblem says why the keeper cannot hold r, or "" when it can: the first of r's Problems, or
// an absent due time. It allocates nothing for a holdable row.
func (r *Row) HoldProblem() string {
	if p := KeyProblem(r.Key); p != "" {
		return p
	}
	if !r.HasDue {
		return "due time is absent"
	}
	if p := CadenceProblem(r.Cadence); p != "" {
		return p
	}
	if p := RouteProblem(r.Route); p != "" {
		return p
	}
	if p := SourceProblem(r.Source); p != "" {
		return p
	}
	return DueProblem(r.Due)
}
