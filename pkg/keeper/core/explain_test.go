package core

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// explainModel is a core's held rows as a test wrote them, with the leases it took.
type explainModel struct {
	rows   map[string]schedule.Row
	leased map[string]bool
}

// randomExplainCore fills a core with n random rows of three cadences (1h, 2h with submitted
// boost 2, so classes tie on score: 2 h late at 2 h ×2 equals 1 h late at 1 h ... and 4d), both
// sources, some urgent, many on the same due times (ties by key); slot testSlots[3] is incoming.
// It claims a few rows, so some rows are leased.
func randomExplainCore(t *testing.T, seed uint64, n int, cfg policy.Config) (*Core, *explainModel) {
	t.Helper()
	c := newCore(t, cfg)
	c.SetSlot(testSlots[3], SlotIncoming)
	rng := rand.New(rand.NewPCG(seed, seed+1))
	m := &explainModel{rows: map[string]schedule.Row{}, leased: map[string]bool{}}
	cadences := []time.Duration{time.Hour, 2 * time.Hour, 96 * time.Hour}
	for i := range n {
		cad := cadences[rng.IntN(len(cadences))]
		// due on a 15-minute grid from three cadences ago to one ahead: many equal due times
		steps := int(4 * cad / time.Hour)
		due := t0.Add(time.Duration(rng.IntN(4*steps)-3*steps) * 15 * time.Minute)
		r := row(fmt.Sprintf("k%05d", i), due, cad, int64(i+1))
		r.Source = schedule.Source(rng.IntN(2))
		r.Urgent = rng.IntN(10) == 0
		if c.Apply(t0, r).Result != Held {
			t.Fatalf("row %s not held", r.Key)
		}
		m.rows[r.Key] = r
	}
	for _, cl := range c.Claim(t0, n/10, time.Minute) {
		m.leased[cl.Key] = true
	}
	return c, m
}

// referenceOrder is the claimable due rows of the owned slots at now in the order Explain ranks
// them: urgent first, then by score, then due, then key — by sorting them all.
func (m *explainModel) referenceOrder(c *Core, now time.Time, boost float64) []schedule.Row {
	var due []schedule.Row
	for k, r := range m.rows {
		if c.SlotState(r.Slot()) == SlotOwned && !r.Due.After(now) && !m.leased[k] {
			due = append(due, r)
		}
	}
	score := func(r schedule.Row) float64 {
		return policy.Score(now.UnixMilli(), r.Due.UnixMilli(), r.Cadence.Milliseconds(), r.Source == schedule.SourceSubmitted, boost)
	}
	slices.SortFunc(due, func(a, b schedule.Row) int {
		if a.Urgent != b.Urgent {
			if a.Urgent {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(score(b), score(a)); c != 0 {
			return c
		}
		if c := a.Due.Compare(b.Due); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	return due
}

// TestExplainRanksAsASortWould: for every held row of a core with ties of score across classes
// and of due time within them, leased rows, urgent rows and an incoming slot, Explain's Ahead is
// the row's position among the claimable due rows of the owned slots sorted urgent first, then by
// score, due time and key; rows that are leased, not due or incoming are not ranked.
func TestExplainRanksAsASortWould(t *testing.T) {
	cfg := policy.Config{SubmittedBoost: 2, UrgentMaxShare: 0.2, StarvationBound: policy.DefaultStarvationBound}
	for seed := range uint64(4) {
		c, m := randomExplainCore(t, seed, 3000, cfg)
		order := m.referenceOrder(c, t0, cfg.SubmittedBoost)
		pos := map[string]int{}
		urgentDue := 0
		for i, r := range order {
			pos[r.Key] = i
			if r.Urgent {
				urgentDue++
			}
		}
		ranked := 0
		for k, r := range m.rows {
			x := c.Explain(t0, k)
			if !x.Held || x.Slot != r.Slot() || !x.Due.Equal(r.Due) || x.Cadence != r.Cadence || x.Urgent != r.Urgent || x.Rev != r.Rev {
				t.Fatalf("seed %d, %s: %+v does not describe %+v", seed, k, x, r)
			}
			want, waiting := pos[k]
			if x.Ranked != waiting {
				t.Fatalf("seed %d, %s: ranked %v, want %v (due %v, leased %v, slot state %v)", seed, k, x.Ranked, waiting, x.IsDue, x.Leased, x.SlotState)
			}
			if x.Leased != m.leased[k] {
				t.Fatalf("seed %d, %s: leased %v, want %v", seed, k, x.Leased, m.leased[k])
			}
			if !waiting {
				continue
			}
			ranked++
			if x.Ahead != want || x.DueClaimable != len(order) {
				t.Fatalf("seed %d, %s: %d ahead of %d, want %d of %d", seed, k, x.Ahead, x.DueClaimable, want, len(order))
			}
			if wantU := min(want, urgentDue); !r.Urgent && x.AheadUrgent != wantU || r.Urgent && x.AheadUrgent != 0 {
				t.Fatalf("seed %d, %s (urgent %v): %d urgent ahead, want %d", seed, k, r.Urgent, x.AheadUrgent, wantU)
			}
		}
		if ranked < 1000 {
			t.Fatalf("seed %d: only %d rows ranked: the test exercises too little", seed, ranked)
		}
	}
}

// TestExplainIsTheClaimOrder: with nothing taking rows out of score order (no urgent share cap,
// no starvation bound, no floors), claims one row at a time take the rows in the order Explain
// ranks them: the row ranked k-th is the (k+1)-th claimed.
func TestExplainIsTheClaimOrder(t *testing.T) {
	cfg := policy.Config{SubmittedBoost: 2, UrgentMaxShare: 1}
	c, m := randomExplainCore(t, 9, 2000, cfg)
	now := t0.Add(time.Second)
	rankOf := map[string]int{}
	for k := range m.rows {
		if x := c.Explain(now, k); x.Ranked {
			rankOf[k] = x.Ahead
		}
	}
	for i := range len(rankOf) {
		got := c.Claim(now, 1, time.Hour)
		if len(got) != 1 {
			t.Fatalf("claim %d got %d rows", i, len(got))
		}
		if r, ok := rankOf[got[0].Key]; !ok || r != i {
			t.Fatalf("claim %d took %s, which Explain ranked %d (ranked: %v)", i, got[0].Key, r, ok)
		}
	}
	if got := c.Claim(now, 1, time.Hour); len(got) != 0 {
		t.Fatalf("a row was claimed after every ranked one: %+v", got)
	}
}

// TestExplainStates: a leased row (its lease, since when, until when, a completion in flight), a
// fenced one, one not due yet, one of an incoming slot, an invalid key and a key not held; and
// the estimate from the claims of the last minute.
func TestExplainStates(t *testing.T) {
	c := newCore(t, policy.Config{SubmittedBoost: 1, UrgentMaxShare: 0.2})
	for i := range 300 { // k00000..k00299, in the test slots by number
		c.Apply(t0, row(fmt.Sprintf("k%05d", i), t0.Add(-time.Duration(300-i)*time.Minute), time.Hour, int64(i+1)))
	}
	// 10 rows a second for 30 s: 300 rows claimed (the most overdue), a rate of 10/s
	var claimed []Claimed
	for s := range 30 {
		claimed = append(claimed, c.Claim(t0.Add(time.Duration(s)*time.Second), 10, time.Hour)...)
	}
	now := t0.Add(30 * time.Second)
	if len(claimed) != 300 {
		t.Fatalf("claimed %d rows, want all 300", len(claimed))
	}
	// complete none; add fresh due rows to rank
	for i := 300; i < 320; i++ {
		c.Apply(now, row(fmt.Sprintf("k%05d", i), now.Add(-time.Duration(320-i)*time.Minute), time.Hour, int64(i+1)))
	}

	leased := c.Explain(now, claimed[3].Key)
	if !leased.Held || !leased.Leased || leased.Ranked || leased.LeaseToken != claimed[3].Lease ||
		!leased.LeaseExpires.Equal(claimed[3].LeaseExpires) || !leased.LeasedSince.Equal(claimed[3].LeaseExpires.Add(-time.Hour)) ||
		leased.Completing || leased.Estimate.OK {
		t.Errorf("leased row: %+v", leased)
	}
	if _, _, err := c.BeginCompleting(now, claimed[4].Key, claimed[4].Lease); err != nil {
		t.Fatal(err)
	}
	if x := c.Explain(now, claimed[4].Key); !x.Leased || !x.Completing {
		t.Errorf("row being completed: %+v", x)
	}

	// k00300 is the most overdue of the fresh rows: 19 others are due after it
	first := c.Explain(now, "k00300")
	if !first.Ranked || first.Ahead != 0 || first.DueClaimable != 20 || !first.IsDue || first.Lateness != 20*time.Minute {
		t.Errorf("first waiting row: %+v", first)
	}
	rate := 300.0 / 30 // rows a second over the 30 s since the first claim
	if first.ClaimRate != rate || first.ClaimRateOver != 30*time.Second {
		t.Errorf("claim rate %v over %v, want %v over 30s", first.ClaimRate, first.ClaimRateOver, rate)
	}
	if want := now.Add(100 * time.Millisecond); !first.Estimate.OK || !first.Estimate.At.Equal(want) {
		t.Errorf("estimate %+v, want %v (one row at 10/s)", first.Estimate, want)
	}
	last := c.Explain(now, "k00319")
	if last.Ahead != 19 || !last.Estimate.OK || !last.Estimate.At.Equal(now.Add(2*time.Second)) {
		t.Errorf("last waiting row: ahead %d, estimate %+v", last.Ahead, last.Estimate)
	}

	// fenced: its slot hands out nothing until the fence ends; the estimate waits for it
	slot := slotOfKey("k00319")
	c.Fence(now, []int{slot}, now.Add(time.Hour))
	if x := c.Explain(now, "k00319"); !x.Fenced || x.FenceOpen || !x.FenceUntil.Equal(now.Add(time.Hour)) || !x.OwnedFenced ||
		!x.Ranked || !x.Estimate.OK || !x.Estimate.At.Equal(now.Add(time.Hour)) {
		t.Errorf("fenced row: %+v", x)
	}
	c.HoldSlots(now, []int{slot})
	if x := c.Explain(now, "k00319"); !x.FenceOpen || x.Estimate.OK || x.Estimate.Why == "" {
		t.Errorf("row of a slot fenced until its leases are known: %+v", x)
	}
	c.Fence(now, []int{slot}, now)

	future := row("k00400", now.Add(10*time.Minute), time.Hour, 500)
	c.Apply(now, future)
	if x := c.Explain(now, "k00400"); !x.Held || x.IsDue || x.Ranked || x.Lateness != -10*time.Minute || x.Score >= 0 || x.Estimate.OK {
		t.Errorf("row not due yet: %+v", x)
	}
	c.SetSlot(slotOfKey("k00401"), SlotIncoming)
	c.Apply(now, row("k00401", now.Add(-time.Hour), time.Hour, 501))
	if x := c.Explain(now, "k00401"); !x.Held || x.SlotState != SlotIncoming || x.Ranked || x.Estimate.OK {
		t.Errorf("row of an incoming slot: %+v", x)
	}
	bad := row("k00402", now, 0, 502) // no cadence
	c.Apply(now, bad)
	if x := c.Explain(now, "k00402"); x.Held || !x.Invalid || x.KnownRev != 502 {
		t.Errorf("invalid row: %+v", x)
	}
	if x := c.Explain(now, "nope"); x.Held || x.Invalid || x.KnownRev != 0 || x.Estimate.OK || x.ClaimRate != rate {
		t.Errorf("unknown key: %+v", x)
	}
	// a minute without claims: no rate, no estimate
	if x := c.Explain(now.Add(2*time.Minute), "k00300"); x.ClaimRate != 0 || x.Estimate.OK || x.Estimate.Why == "" {
		t.Errorf("no claims for a minute: %+v", x)
	}
}
