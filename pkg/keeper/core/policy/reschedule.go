package policy

import (
	"fmt"
	"time"
)

// Reschedule is how a completion picks a rendered row's next due time (unless the worker gives
// one). Rows are claimed only once due, so a render always happens at or after the row's due
// time; the policies differ in what a late render does to the next one.
type Reschedule uint8

const (
	// KeepPhase (the default): the next due time stays on the row's own schedule — its due time
	// plus a whole number k ≥ 1 of cadences — at the point of it nearest to one cadence after the
	// render (ties: the later one). A render at most half a cadence late is next due at due +
	// cadence; later renders skip the missed points. So a backlog drained faster than its rows'
	// cadence comes due again as spread out as it was before it fell behind, not as a second wave
	// at the rate the drain ran, and renders do not drift later cycle after cycle.
	//
	// The cost: a row rendered late comes due again sooner than one cadence after its render —
	// between half a cadence and one and a half cadences after it (a row rendered 0.4 cadence late
	// is due again 0.6 cadence later, one rendered 0.6 late 1.4 later).
	KeepPhase Reschedule = iota
	// AfterRender: the next due time is the completion time plus the cadence: every render is
	// followed by a full cadence, but the render times drift later by each render's lateness, and
	// a drained backlog comes due again one cadence later at the rate the drain ran — the drain
	// echo: a wave as steep as the drain, which a fleet running near capacity cannot absorb.
	AfterRender
	// Adaptive (the API's default): KeepPhase while the shard keeps up or drains a backlog with
	// capacity to spare, AfterRender while its rows need more renders than its claims hand out.
	// The core decides at every claim from what it has seen (package pace): the demand Σ rows /
	// cadence of its rows against the rows an hour its claims have handed out since the due rows
	// last ran out. So a drained backlog keeps its phases (no echo), and a sustained overload
	// stretches every interval instead of running rows half a cadence late until they skip one.
	Adaptive
)

var rescheduleNames = [...]string{KeepPhase: "KeepPhase", AfterRender: "AfterRender", Adaptive: "Adaptive"}

func (r Reschedule) String() string {
	if int(r) < len(rescheduleNames) {
		return rescheduleNames[r]
	}
	return fmt.Sprintf("Reschedule(%d)", uint8(r))
}

// ParseReschedule parses a policy name: "KeepPhase", "AfterRender" or "Adaptive", exactly.
func ParseReschedule(s string) (Reschedule, error) {
	for i, n := range rescheduleNames {
		if s == n {
			return Reschedule(i), nil
		}
	}
	return 0, fmt.Errorf("unknown reschedule policy %q (want KeepPhase, AfterRender or Adaptive)", s)
}

// NextDue is the next due time policy p gives a row due at due with the given cadence that is
// rendered (completed) at now. Times are used at millisecond precision. Adaptive is KeepPhase
// here: the core resolves it (Resolve) from the shard's load before it calls NextDue.
func NextDue(p Reschedule, now, due time.Time, cadence time.Duration) time.Time {
	return time.UnixMilli(nextDueMs(p, now.UnixMilli(), due.UnixMilli(), cadence.Milliseconds())).UTC()
}

// Resolve is the policy a completion follows: p itself, or for Adaptive AfterRender when stretch
// (the shard's demand exceeds its capacity, pace.Decide) and KeepPhase otherwise.
func (p Reschedule) Resolve(stretch bool) Reschedule {
	if p != Adaptive {
		return p
	}
	if stretch {
		return AfterRender
	}
	return KeepPhase
}

func nextDueMs(p Reschedule, nowMs, dueMs, cadenceMs int64) int64 {
	if p == AfterRender || cadenceMs <= 0 {
		return nowMs + cadenceMs
	}
	// k = 1 + round(late / cadence), halves rounded up, at least 1
	late := nowMs - dueMs
	k := int64(1)
	if late > 0 {
		k += (late + cadenceMs/2) / cadenceMs
	}
	return dueMs + k*cadenceMs
}
