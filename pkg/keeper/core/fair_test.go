package core

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/pace"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// TestStarvationBound: a class that has had due rows and no claim for StarvationBound of its
// cadence gets its most overdue row ahead of floors and score order, longest waiting (in
// cadences) first; the boosted hourly rows would otherwise take every claim.
func TestStarvationBound(t *testing.T) {
	floor := policy.Floor{Cadence: 96 * time.Hour, Source: schedule.SourceDiscovered, Share: 0.5}
	mk := func(bound float64, floors ...policy.Floor) *Core {
		c := newCore(t, policy.Config{SubmittedBoost: 2, StarvationBound: bound, Floors: floors})
		for i := range 8 {
			h := row(fmt.Sprintf("h%d", i), t0.Add(-time.Duration(2+i)*time.Hour), time.Hour, 1) // 2–9 cadences late
			h.Source = schedule.SourceSubmitted
			c.Apply(t0, h)
			c.Apply(t0, row(fmt.Sprintf("p%d", i), t0.Add(-time.Duration(50+i)*time.Hour), 96*time.Hour, 1)) // 0.52–0.59
		}
		c.Apply(t0, row("d0", t0.Add(-20*time.Hour), 24*time.Hour, 1)) // 0.83
		return c
	}
	type claim struct {
		at   time.Duration // after t0
		n    int           // rows asked for
		want string        // rows claimed, in order
	}
	cases := []struct {
		name   string
		bound  float64        // Config.StarvationBound
		floors []policy.Floor // Config.Floors
		claims []claim        // made one after the other, leases of a minute
	}{
		{"no bound: the boost starves the discovered rows", 0, nil, []claim{
			{0, 4, "h7,h6,h5,h4"},
			{48 * time.Hour, 4, "h7,h6,h5,h4"},
		}},
		{"every class past its bound, longest waiting first, then score order", 0.5, nil, []claim{
			{0, 5, "h7,d0,p7,h6,h5"}, // the hourly class waited 9 cadences, d0 0.83, p7 0.59
			{0, 4, "h4,h3,h2,h1"},    // each class just had a row: score order
			// nothing was completed: the hourly class waited 47 cadences, d0 1.96, p7 0.49
			{47 * time.Hour, 4, "h7,d0,h6,h5"},
			{47*time.Hour + 30*time.Minute, 4, "h7,h6,h5,h4"}, // the hourly class at its bound
			// both at their bound (0.5): the earlier due first
			{48 * time.Hour, 4, "p7,h7,h6,h5"},
		}},
		{"a row the bound hands out is one of the floor's reserved rows", 0.5, []policy.Floor{floor}, []claim{
			{0, 4, "h7,d0,p7,p6"}, // floor ⌊0.5 × 4⌋ = 2: p7 by the bound, p6 by the floor
		}},
		{"a small claim serves the longest waiting class", 0.5, nil, []claim{
			{0, 1, "h7"}, {0, 1, "d0"}, {0, 1, "p7"}, {0, 1, "h6"},
		}},
	}
	for _, tc := range cases {
		c := mk(tc.bound, tc.floors...)
		for i, cl := range tc.claims {
			if got := keysOf(c.Claim(t0.Add(cl.at), cl.n, time.Minute)); got != cl.want {
				t.Errorf("%s: claim %d (%v, %d rows) = %s, want %s", tc.name, i, cl.at, cl.n, got, cl.want)
			}
		}
	}
}

// TestAdaptiveReschedule: under the Adaptive policy a completion keeps the row's phase until
// the claims have found due rows for pace.MinSaturated and while they hand out at least the
// demand; it stretches like AfterRender while the demand exceeds them, and keeps phase again
// once a claim finds the due rows exhausted.
func TestAdaptiveReschedule(t *testing.T) {
	// 120 hourly rows (a demand of 120 renders an hour), due over the last 2 hours: a backlog
	mk := func() *Core {
		c := newCore(t, policy.Config{Reschedule: policy.Adaptive})
		for i := range 120 {
			c.Apply(t0, row(fmt.Sprintf("k%d", i), t0.Add(-time.Duration(i)*time.Minute), time.Hour, 1))
		}
		return c
	}
	type step struct {
		minutes int               // claims of perMinute rows at every minute up to this one
		reason  string            // the decision after them
		follows policy.Reschedule // the policy a completion of the last row claimed follows
	}
	cases := []struct {
		name      string
		perMinute int    // rows a claim asks for each minute
		steps     []step // one after the other
	}{
		{"one render a minute: 60 an hour, half the demand", 1, []step{
			{10, pace.ReasonMeasuring, policy.KeepPhase},
			{15, pace.ReasonOverloaded, policy.AfterRender},
			{24 * 60, pace.ReasonOverloaded, policy.AfterRender},
		}},
		{"three a minute: 180 an hour drain the backlog", 3, []step{
			{20, pace.ReasonDraining, policy.KeepPhase},
		}},
	}
	for _, tc := range cases {
		c := mk()
		minute := 0
		var last Claimed
		for _, st := range tc.steps {
			for ; minute <= st.minutes; minute++ {
				got := c.Claim(t0.Add(time.Duration(minute)*time.Minute), tc.perMinute, time.Minute)
				if len(got) != tc.perMinute {
					t.Fatalf("%s: minute %d: %d rows claimed", tc.name, minute, len(got))
				}
				last = got[len(got)-1]
			}
			now := t0.Add(time.Duration(minute-1) * time.Minute)
			d := c.Pace()
			if d.Reason != st.reason {
				t.Errorf("%s: after %d minutes: %s (%s), want %s", tc.name, st.minutes, d.Reason, d.Message(), st.reason)
			}
			cp, _, err := c.Completing(now, last.Key, last.Lease)
			if err != nil {
				t.Fatal(err)
			}
			if want := policy.NextDue(st.follows, now, last.Due, time.Hour); !cp.NextDue.Equal(want) {
				t.Errorf("%s: after %d minutes: completing %s (due %v) at %v: next due %v, want %v (%v)", tc.name, st.minutes, last.Key, last.Due, now, cp.NextDue, want, st.follows)
			}
		}
	}
	// a claim that finds fewer due rows than it asks for: keeping up, phases kept
	c := mk()
	for m := range 30 {
		c.Claim(t0.Add(time.Duration(m)*time.Minute), 1, time.Hour)
	}
	if d := c.Pace(); !d.Stretch {
		t.Fatalf("after 30 minutes of one render a minute: %s, want overloaded", d.Message())
	}
	if got := c.Claim(t0.Add(30*time.Minute), 1000, time.Hour); len(got) == 1000 {
		t.Fatal("claimed 1000 of 120 rows")
	}
	if d := c.Pace(); d.Stretch || d.Reason != pace.ReasonKeepingUp {
		t.Errorf("after a claim that emptied the due rows: %s, want %s", d.Message(), pace.ReasonKeepingUp)
	}
	// an explicit policy is never overridden
	for _, p := range []policy.Reschedule{policy.KeepPhase, policy.AfterRender} {
		c := newCore(t, policy.Config{Reschedule: p})
		for i := range 120 {
			c.Apply(t0, row(fmt.Sprintf("k%d", i), t0.Add(-time.Duration(i)*time.Minute), time.Hour, 1))
		}
		var last Claimed
		for m := range 60 {
			last = c.Claim(t0.Add(time.Duration(m)*time.Minute), 1, time.Hour)[0]
		}
		now := t0.Add(59 * time.Minute)
		cp, _, _ := c.Completing(now, last.Key, last.Lease)
		if want := policy.NextDue(p, now, last.Due, time.Hour); !cp.NextDue.Equal(want) {
			t.Errorf("%v, overloaded: next due %v, want %v", p, cp.NextDue, want)
		}
	}
}

// TestDemandBeyondTheWindow: with a window, the Adaptive policy's demand counts the rows beyond
// it as the last walk found them, rows dropped beyond it since, and only the owned slots' rows.
func TestDemandBeyondTheWindow(t *testing.T) {
	c := newCore(t, policy.Config{Window: 24 * time.Hour, Reschedule: policy.Adaptive})
	demand := func(at time.Time) float64 {
		c.Claim(at, 1, time.Minute)
		return c.Pace().Reading.Demand
	}
	walk := func(at time.Time, rows []schedule.Row) {
		if err := c.BeginWalk(at, Edge{}, testSlots[:]); err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			c.WalkRow(at, r)
		}
		c.EndWalk(nil)
	}
	var rows []schedule.Row
	for i := range 10 {
		rows = append(rows, row(fmt.Sprintf("k%d", i), t0.Add(time.Duration(i)*time.Minute), time.Hour, 1)) // held
	}
	for i := 10; i < 106; i++ {
		rows = append(rows, row(fmt.Sprintf("k%d", i), t0.Add(48*time.Hour+time.Duration(i)*time.Hour), 96*time.Hour, 1)) // beyond
	}
	steps := []struct {
		name string
		do   func()
		want float64 // renders an hour
	}{
		{"applied, not walked: the held rows only", func() {
			for _, r := range rows {
				c.Apply(t0, r)
			}
		}, 10},
		{"walked: 96 rows every 96 h beyond the window", func() { walk(t0, rows) }, 11},
		{"a held hourly row completed beyond the window: counted beyond it", func() {
			r := row("k3", t0.Add(30*time.Hour), time.Hour, 2)
			if o := c.Apply(t0, r); o.Result != Dropped {
				t.Fatalf("%v", o.Result)
			}
		}, 11},
		// 3 hourly rows (k1, k5, k9) and 24 of 96 h
		{"slot 1 leaves: its rows, held and beyond, leave the demand", func() { c.SetSlot(testSlots[1], SlotNone) }, 11 - 3 - 24.0/96},
		{"walked again, k3 deleted meanwhile: what the walk finds replaces the counts", func() {
			var owned []schedule.Row
			for _, r := range rows {
				if r.Slot() != testSlots[1] && r.Key != "k3" {
					owned = append(owned, r)
				}
			}
			walk(t0.Add(time.Minute), owned)
		}, 11 - 3 - 24.0/96 - 1},
	}
	for _, st := range steps {
		st.do()
		if got := demand(t0.Add(time.Minute)); math.Abs(got-st.want) > 1e-9 {
			t.Errorf("%s: demand %v renders/h, want %v", st.name, got, st.want)
		}
	}
}

// TestClassWaiting: a summary says, per class, since when it has had due rows and no render —
// what shows a class starving (a wait of a cadence or more) when the claims cannot keep the
// starvation bound, e.g. when none are made.
func TestClassWaiting(t *testing.T) {
	c := newCore(t, policy.Config{SubmittedBoost: 2})
	h := row("h0", t0.Add(-2*time.Hour), time.Hour, 1)
	h.Source = schedule.SourceSubmitted
	c.Apply(t0, h)
	c.Apply(t0, row("p0", t0.Add(-100*time.Hour), 96*time.Hour, 1))
	c.Apply(t0, row("p1", t0.Add(-90*time.Hour), 96*time.Hour, 1))
	c.Apply(t0, row("d0", t0.Add(time.Hour), 24*time.Hour, 1)) // not due
	waits := func(at time.Time) string {
		var out []string
		for _, cl := range c.Summary(at).Classes {
			out = append(out, fmt.Sprintf("%v/%v:%v", cl.Cadence, cl.Source, cl.Waiting(at)))
		}
		return fmt.Sprint(out)
	}
	steps := []struct {
		name string
		do   func()
		at   time.Duration // the summary's time after t0
		want string        // each class's wait
	}{
		{"nothing claimed: since each class's most overdue row came due", func() {}, 0,
			"[1h0m0s/submitted:2h0m0s 24h0m0s/discovered:0s 96h0m0s/discovered:100h0m0s]"},
		{"the boosted row claimed: its class waits no more", func() { c.Claim(t0, 1, 2*time.Hour) }, time.Minute,
			"[1h0m0s/submitted:0s 24h0m0s/discovered:0s 96h0m0s/discovered:100h1m0s]"},
		{"p0 claimed: the 96 h class waits from the claim, p1 due long before", func() { c.Claim(t0.Add(time.Minute), 1, time.Hour) }, time.Hour,
			"[1h0m0s/submitted:0s 24h0m0s/discovered:0s 96h0m0s/discovered:59m0s]"},
	}
	for _, st := range steps {
		st.do()
		if got := waits(t0.Add(st.at)); got != st.want {
			t.Errorf("%s: %s, want %s", st.name, got, st.want)
		}
	}
}
