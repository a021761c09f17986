package keeper

import (
	"strconv"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/shardmetrics"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// StatusMaxAge is how old a status /v1/status and /metrics may serve. A status costs time in the
// rows that came due since the last one plus the number of groups, slots and routes, not in the
// rows held (Core.Summary); sharing one for a short while only bounds the work a burst of readers
// can cause. The status says when it was computed (asOf).
const StatusMaxAge = 100 * time.Millisecond

// statusStepRows bounds the rows that came due a status counts per hold of the shard's lock.
const statusStepRows = 4096

// NewStatusCollector returns the collector of s's state gauges (package shardmetrics), computed
// at each scrape from a status at most StatusMaxAge old.
func NewStatusCollector(s *Shard) *shardmetrics.StatusCollector {
	return shardmetrics.NewStatusCollector(func() shardapi.Status { return s.RecentStatus(StatusMaxAge) })
}

// RecentStatus returns a status computed at most maxAge ago, computing a new one when the last
// is older.
func (s *Shard) RecentStatus(maxAge time.Duration) shardapi.Status {
	s.statusMu.Lock()
	defer s.statusMu.Unlock()
	now := s.clock()
	if s.lastStatus != nil && now.Sub(s.lastStatus.AsOf) < maxAge && !now.Before(s.lastStatus.AsOf) {
		return *s.lastStatus
	}
	st := s.Status(now)
	s.lastStatus = &st
	return st
}

// Status returns the shard's whole state at now, in the /v1/status contract. The rows of slots
// that left are removed (drain) and the rows that came due since the last status are counted
// first, in bounded steps, releasing the lock between them; then the figures are counted and the
// shard's state copied under the lock, and the reply is built after releasing it.
func (s *Shard) Status(now time.Time) shardapi.Status {
	s.drain() // the figures are counted without the rows of slots that left: they go first
	for {
		s.mu.Lock()
		done := s.core.CatchUp(now, statusStepRows)
		s.unlockStep()
		if done {
			break
		}
	}
	s.catchUpObjectives(now, statusStepRows)
	s.mu.Lock()
	sc := s.core.CountSummary(now)
	objectives := s.core.ObjectiveCounts()
	cov := *s.cov // a copy: the ledger holds values only
	exact := cov.Exact(now, s.ownedWalked())
	settings, lastErr := s.settings, s.lastErr
	ownedNotHeld, ownedAsOf := s.ownedNotHeld, s.ownedAsOf
	lastWalk, walkingSince := s.lastWalk, s.walkingSince
	fences := s.fencesStatus(now)
	s.mu.Unlock()

	sum := sc.Build()
	st := shardapi.Status{
		Shard:          s.name,
		AsOf:           now.UTC(),
		Complete:       cov.Complete(now),
		Exact:          exact,
		Window:         settings.Window.Seconds(),
		VerifyInterval: settings.VerifyInterval.Seconds(),
		VerifyWalkRate: &settings.VerifyWalkRate,
		Membership: shardapi.Membership{
			Epoch:         settings.Epoch,
			Owned:         schedule.FormatSlots(settings.Owned),
			Incoming:      schedule.FormatSlots(settings.Incoming),
			PreparedEpoch: cov.Prepared(),
		},
		Rows: shardapi.Rows{
			Held:    sum.Held,
			Invalid: sum.Invalid,
		},
		Due:        sum.Due,
		Leased:     sum.Leased,
		DuePerSlot: make(map[string]int, len(sum.DuePerSlot)),
		Lateness:   shardapi.Lateness(sum.Lateness),
		ByRoute:    sum.ByRoute,
		Classes:    make([]shardapi.Class, 0, len(sum.Classes)),
		Coming: shardapi.Coming{
			Next15m: sum.Coming.Next15m, Next60m: sum.Coming.Next60m, Next24h: sum.Coming.Next24h,
			ByHour:      sum.Coming.ByHour[:],
			CutAtWindow: settings.Window > 0 && settings.Window < 24*time.Hour,
		},
		Error:    lastErr,
		HeldBack: sum.HeldBack,
		Fences:   fences,
	}
	for _, o := range objectives {
		oc := shardapi.ObjectiveCount{Name: o.Name, Good: o.Good, Late: o.Late, Since: o.Since}
		for _, so := range settings.Objectives {
			if so.Name == o.Name {
				oc.Percentile = so.Percentile
			}
		}
		st.Objectives = append(st.Objectives, oc)
	}
	st.Status = cov.State(sum.Due, now)
	if edge := cov.Edge(); edge.Known && !edge.Unbounded {
		at := edge.At.UTC()
		ahead := at.Sub(now).Seconds()
		st.Edge, st.EdgeAheadSeconds = &at, &ahead
	}
	if gap, open := cov.OpenGap(); open {
		g := &shardapi.Gap{Since: gap.Since.UTC(), Reason: gap.Reason}
		if !gap.Resumed.IsZero() {
			r := gap.Resumed.UTC()
			g.Resumed = &r
		}
		st.Gap = g
	}
	if !ownedAsOf.IsZero() {
		asOf := ownedAsOf.UTC()
		st.Rows.OwnedNotHeld = ownedNotHeld.OwnedNotHeld
		st.Rows.OwnedNotHeldAsOf = &asOf
		st.Rows.OwnedNotHeldByHour = ownedNotHeld.OwnedNotHeldByHour[:]
		st.Rows.OwnedNotHeldApproximate = true
	}
	for slot, n := range sum.DuePerSlot {
		st.DuePerSlot[strconv.Itoa(slot)] = n
	}
	// incoming slots are reported once walked, not counted in Due: the operator decides when
	// their counts count (pkg/membership's doc, "When a moving slot's count counts")
	for slot, n := range sum.DuePerIncomingSlot {
		if sc.Walked(slot) {
			if st.DuePerIncomingSlot == nil {
				st.DuePerIncomingSlot = map[string]int{}
			}
			st.DuePerIncomingSlot[strconv.Itoa(slot)] = n
		}
	}
	for _, c := range sum.Classes {
		cl := shardapi.Class{Cadence: c.Cadence.Seconds(), Source: c.Source.String(), Due: c.Due, Held: c.Held,
			MaxLateSeconds: c.MaxLateSeconds, LateBy: c.LateBy[:]}
		if !c.WaitingSince.IsZero() {
			w := c.WaitingSince.UTC()
			cl.WaitingSince = &w
		}
		st.Classes = append(st.Classes, cl)
	}
	if sum.Oldest != nil {
		st.Oldest = &shardapi.Oldest{Due: sum.Oldest.Due} // no key: the status is unauthenticated
	}
	if w := lastWalk; w != nil {
		st.LastWalk = &shardapi.Walk{
			StartedAt: w.StartedAt.UTC(), Partial: w.Partial, Failed: w.Failed,
			Scanned: w.Counts.Scanned, Admitted: w.Counts.Admitted, Repaired: w.Counts.Repaired,
			Invalid: w.Counts.Invalid, UnreadSegments: w.UnreadSegments, Error: w.Err,
		}
		if !w.FinishedAt.IsZero() {
			f := w.FinishedAt.UTC()
			st.LastWalk.FinishedAt = &f
		}
	}
	if !walkingSince.IsZero() {
		w := walkingSince.UTC()
		st.WalkingSince = &w
	}
	return st
}
