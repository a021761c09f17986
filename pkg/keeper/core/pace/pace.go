// Package pace is what the keeper core sees of its shard's load, for the Adaptive reschedule
// policy (policy.Adaptive): how many rows the claims hand out an hour while every claim finds due
// rows (the render capacity at work on the shard), against the renders an hour its rows need
// (the demand, Σ rows / cadence). From these Decide says whether a completion keeps the row's
// phase (the shard keeps up, or drains a backlog with capacity to spare) or stretches its interval
// like AfterRender (demand exceeds the capacity).
//
// The package is pure: the time is a parameter, in milliseconds (TestCoreIsPure in package core).
package pace

import (
	"fmt"
	"math"
	"time"
)

// Window is the time constant of the measured claim rate: claims an hour ago weigh 1/e of the
// latest.
const Window = time.Hour

// MinSaturated is how long every claim must have found due rows before the claim rate measures
// the capacity: until then a completion keeps the row's phase.
const MinSaturated = 15 * time.Minute

// Meter measures the claim rate over the current stretch of saturated claims: claims that each
// found as many due rows as they asked for. A claim that finds fewer (the due rows ran out: the
// shard keeps up) ends the stretch. The zero Meter has seen no claim.
type Meter struct {
	// saturated: the last claim found as many due rows as it asked for.
	saturated bool
	// sinceMs is when the current saturated stretch began (its first claim).
	sinceMs int64
	// lastMs is the time of the last claim counted in acc.
	lastMs int64
	// acc is the rows claimed in the stretch, each weighted exp(−age / Window) as of lastMs.
	acc float64
}

// Claimed records a claim at nowMs that asked for asked rows and got got of them. Claims must come
// in time order (an earlier nowMs counts as lastMs).
func (m *Meter) Claimed(nowMs int64, asked, got int) {
	if got < asked {
		*m = Meter{}
		return
	}
	if got == 0 {
		return
	}
	if !m.saturated {
		*m = Meter{saturated: true, sinceMs: nowMs, lastMs: nowMs}
	}
	if nowMs > m.lastMs {
		m.acc *= math.Exp(-float64(nowMs-m.lastMs) / float64(Window.Milliseconds()))
		m.lastMs = nowMs
	}
	m.acc += float64(got)
}

// Reading is what a Meter measured at nowMs, with the demand it is compared with.
func (m *Meter) Reading(nowMs int64, demand float64) Reading {
	r := Reading{Demand: demand}
	if !m.saturated || nowMs < m.sinceMs {
		return r
	}
	r.Saturated = time.Duration(nowMs-m.sinceMs) * time.Millisecond
	w := float64(Window.Milliseconds())
	span := float64(nowMs - m.sinceMs)
	if span <= 0 {
		return r
	}
	// the rows claimed, weighted as of now, over the weight a constant rate of one row per
	// millisecond would have accumulated over the stretch: the stretch's rate, recent claims
	// weighing most (an exponentially weighted average without the bias of its empty start)
	acc := m.acc * math.Exp(-float64(nowMs-m.lastMs)/w)
	r.ClaimRate = acc / (w * -math.Expm1(-span/w)) * float64(time.Hour.Milliseconds())
	return r
}

// Reading is the load the core has seen.
type Reading struct {
	// Demand is the renders an hour the shard's rows need: Σ rows / cadence over the owned rows.
	Demand float64
	// ClaimRate is the rows an hour claims handed out during the current saturated stretch
	// (recent claims weighing most, Window); 0 when not saturated.
	ClaimRate float64
	// Saturated is how long every claim has found due rows; 0 when the last claim found fewer
	// than it asked for, or none was made.
	Saturated time.Duration
}

// Reasons Decide gives.
const (
	// ReasonKeepingUp: the last claim found fewer due rows than it asked for.
	ReasonKeepingUp = "KeepingUp"
	// ReasonMeasuring: the claims have found due rows for less than MinSaturated.
	ReasonMeasuring = "Measuring"
	// ReasonDraining: the claims hand out at least the demand: the due rows are a backlog the
	// shard drains.
	ReasonDraining = "Draining"
	// ReasonOverloaded: the demand exceeds what the claims hand out.
	ReasonOverloaded = "Overloaded"
)

// Decision is what Decide decided, and from what.
type Decision struct {
	// Stretch: completions under the Adaptive policy follow AfterRender; otherwise KeepPhase.
	Stretch bool
	// Reason is one of the Reason constants.
	Reason string
	// Reading is what was decided from.
	Reading Reading
}

// Decide says whether a completion under the Adaptive policy stretches the row's interval like
// AfterRender (the demand exceeds the rows the claims hand out, so keeping phases would ask for
// more renders than the capacity has) or keeps its phase like KeepPhase (the shard keeps up, or
// drains a backlog with capacity to spare: stretching would bring the drained rows back due as a
// wave), and why. It does not allocate (the core decides at every claim); Message says it for
// people.
func Decide(r Reading) Decision {
	d := Decision{Reading: r}
	switch {
	case r.Saturated == 0:
		d.Reason = ReasonKeepingUp
	case r.Saturated < MinSaturated:
		d.Reason = ReasonMeasuring
	case r.Demand <= r.ClaimRate:
		d.Reason = ReasonDraining
	default:
		d.Stretch, d.Reason = true, ReasonOverloaded
	}
	return d
}

// Message says the decision for people.
func (d Decision) Message() string {
	r := d.Reading
	switch d.Reason {
	case ReasonKeepingUp:
		return "the last claim found fewer due rows than it asked for: rows keep their phase"
	case ReasonMeasuring:
		return fmt.Sprintf("claims have found due rows for %v, less than the %v that measure the capacity: rows keep their phase",
			r.Saturated.Round(time.Second), MinSaturated)
	case ReasonDraining:
		return fmt.Sprintf("claims hand out %.0f rows/h, at least the demand of %.0f renders/h: draining a backlog, rows keep their phase",
			r.ClaimRate, r.Demand)
	case ReasonOverloaded:
		return fmt.Sprintf("the demand of %.0f renders/h exceeds the %.0f rows/h claims hand out (load %.0f%%): intervals stretch like AfterRender",
			r.Demand, r.ClaimRate, 100*r.Demand/r.ClaimRate)
	}
	return d.Reason
}
