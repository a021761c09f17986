package core

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/summary"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// row builds a valid row in slot 0 (test keys map to testSlots via testHash).
func row(key string, due time.Time, cadence time.Duration, rev int64) schedule.Row {
	return schedule.Row{Key: key, KeyHash: testHash(key), Due: due, HasDue: true, Cadence: cadence, Route: "product", Rev: rev}
}

func newCore(t *testing.T, cfg policy.Config) *Core {
	t.Helper()
	if cfg.SubmittedBoost == 0 {
		cfg.SubmittedBoost = 1
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range testSlots {
		c.SetSlot(s, SlotOwned)
	}
	return c
}

func keysOf(c []Claimed) string { return strings.Join(claimedKeys(c), ",") }

func TestApplyRevOrder(t *testing.T) {
	c := newCore(t, policy.Config{})
	c.Apply(t0, row("k1", t0.Add(-time.Hour), time.Hour, 5))
	cases := []struct {
		name string
		row  schedule.Row
		want Result
	}{
		// an older rev never overwrites a newer one
		{"older rev", row("k1", t0.Add(-2*time.Hour), time.Hour, 4), Ignored},
		// an equal rev is not newer
		{"same rev", row("k1", t0.Add(-2*time.Hour), time.Hour, 5), Ignored},
		// a newer rev replaces it
		{"newer rev", row("k1", t0.Add(-3*time.Hour), time.Hour, 6), Held},
	}
	for _, tc := range cases {
		if got := c.Apply(t0, tc.row).Result; got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if s := c.Summary(t0); s.Oldest == nil || !s.Oldest.Due.Equal(t0.Add(-3*time.Hour)) {
		t.Fatalf("oldest = %+v, want due 3h ago", s.Oldest)
	}
	// a delete with an older rev is ignored, a newer one removes
	if got := c.Delete(t0, "k1", slotOfKey("k1"), 6).Result; got != Ignored {
		t.Fatalf("delete rev 6 = %v", got)
	}
	if got := c.Delete(t0, "k1", slotOfKey("k1"), 7).Result; got != Removed || c.Held() != 0 {
		t.Fatalf("delete rev 7 = %v, held %d", got, c.Held())
	}
}

func TestTombstoneOnlyWhileWalking(t *testing.T) {
	c := newCore(t, policy.Config{})
	c.Apply(t0, row("k1", t0, time.Hour, 5))
	if err := c.BeginWalk(t0, Edge{}, testSlots[:]); err != nil {
		t.Fatal(err)
	}
	c.Delete(t0, "k1", slotOfKey("k1"), 8)
	// the walk read the row before the delete committed: its older copy must not come back
	if got := c.WalkRow(t0, row("k1", t0, time.Hour, 5)).Result; got != Ignored {
		t.Fatalf("older walked copy after delete = %v, want ignored", got)
	}
	c.EndWalk(nil)
	if c.Held() != 0 {
		t.Fatalf("held %d after walk", c.Held())
	}
	// outside a walk no tombstone is kept: a newer insert is held as usual
	if got := c.Apply(t0, row("k1", t0, time.Hour, 9)).Result; got != Held {
		t.Fatalf("re-insert = %v", got)
	}
}

func TestAdmissionWindow(t *testing.T) {
	c := newCore(t, policy.Config{Window: 2 * time.Hour})
	cases := []struct {
		name string
		row  schedule.Row
		want Result
	}{
		// due before now + window: held
		{"inside", row("k1", t0.Add(time.Hour), 96*time.Hour, 1), Held},
		// due exactly at now + window: not held (strict <)
		{"at edge", row("k2", t0.Add(2*time.Hour), 96*time.Hour, 1), NotHeld},
		// an event moving a held row beyond the window drops it
		{"moved out", row("k1", t0.Add(3*time.Hour), 96*time.Hour, 2), Dropped},
		// long overdue rows are always inside
		{"overdue", row("k3", t0.Add(-72*time.Hour), 96*time.Hour, 1), Held},
	}
	for _, tc := range cases {
		if got := c.Apply(t0, tc.row).Result; got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if c.Held() != 1 {
		t.Fatalf("held %d, want 1", c.Held())
	}
	// window 0 holds everything, however far ahead
	c0 := newCore(t, policy.Config{})
	if got := c0.Apply(t0, row("k1", t0.Add(1000*time.Hour), 96*time.Hour, 1)).Result; got != Held {
		t.Fatalf("window 0: %v", got)
	}
}

func TestInvalidRowsAreCountedNotCoerced(t *testing.T) {
	c := newCore(t, policy.Config{})
	absent := row("k1", time.Time{}, time.Hour, 1)
	absent.HasDue = false
	zeroCad := row("k2", t0, 0, 1)
	negCad := row("k3", t0, -time.Hour, 1)
	ancient := row("k4", time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC), time.Hour, 1)
	long := row(strings.Repeat("x", schedule.MaxKeyBytes+1), t0, time.Hour, 1)
	badSource := row("k5", t0, time.Hour, 1)
	badSource.Source = 7
	for _, r := range []schedule.Row{absent, zeroCad, negCad, ancient, long, badSource} {
		if o := c.Apply(t0, r); o.Result != Invalid || o.Reason == "" {
			t.Errorf("%.10s: %+v, want invalid with a reason", r.Key, o)
		}
	}
	s := c.Summary(t0)
	if s.Held != 0 || s.Due != 0 || s.Invalid != 6 || s.Oldest != nil {
		t.Fatalf("summary %s", summaryString(s))
	}
	if got := c.Claim(t0, 10, time.Minute); len(got) != 0 {
		t.Fatalf("claimed invalid rows: %v", keysOf(got))
	}
	// a valid newer version replaces the invalid one and the count drops
	if got := c.Apply(t0, row("k1", t0, time.Hour, 2)).Result; got != Held || c.InvalidCount() != 5 {
		t.Fatalf("valid after invalid: %v, invalid %d", got, c.InvalidCount())
	}
	// an older version of an invalid key cannot undo it
	if got := c.Apply(t0, row("k2", t0, time.Hour, 0)).Result; got != Ignored {
		t.Fatalf("older valid copy of an invalid key: %v", got)
	}
}

func TestClaimOrder(t *testing.T) {
	cases := []struct {
		name  string
		cfg   policy.Config
		rows  []schedule.Row
		n     int
		want  string // claimed keys in order
		setup func(r []schedule.Row)
	}{
		{
			// relative lateness, not oldest-due: a 1 h homepage 2 h late (2.0) beats a 96 h
			// product page 2 days late (0.5)
			name: "relative lateness",
			rows: []schedule.Row{row("k1", t0.Add(-48*time.Hour), 96*time.Hour, 1), row("k2", t0.Add(-2*time.Hour), time.Hour, 1)},
			n:    2, want: "k2,k1",
		},
		{
			// the submitted boost: 0.5 × 3 beats 1.0
			name: "submitted boost",
			cfg:  policy.Config{SubmittedBoost: 3},
			rows: []schedule.Row{row("k1", t0.Add(-time.Hour), time.Hour, 1), {Key: "k2", KeyHash: testHash("k2"), Due: t0.Add(-30 * time.Minute), HasDue: true, Cadence: time.Hour, Source: schedule.SourceSubmitted, Rev: 1}},
			n:    2, want: "k2,k1",
		},
		{
			// equal scores: earlier due first (2 h late on 2 h cadence vs 1 h late on 1 h cadence)
			name: "tie by due",
			rows: []schedule.Row{row("k1", t0.Add(-time.Hour), time.Hour, 1), row("k2", t0.Add(-2*time.Hour), 2*time.Hour, 1)},
			n:    2, want: "k2,k1",
		},
		{
			// equal scores and due: smaller key first
			name: "tie by key",
			rows: []schedule.Row{row("k3", t0.Add(-time.Hour), time.Hour, 1), row("k2", t0.Add(-time.Hour), time.Hour, 1)},
			n:    2, want: "k2,k3",
		},
		{
			// rows not yet due are never claimed
			name: "only due",
			rows: []schedule.Row{row("k1", t0.Add(time.Minute), time.Hour, 1), row("k2", t0, time.Hour, 1)},
			n:    5, want: "k2",
		},
	}
	for _, tc := range cases {
		c := newCore(t, tc.cfg)
		for _, r := range tc.rows {
			c.Apply(t0, r)
		}
		if got := keysOf(c.Claim(t0, tc.n, time.Minute)); got != tc.want {
			t.Errorf("%s: claimed %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestUrgentShare(t *testing.T) {
	mk := func() *Core {
		c := newCore(t, policy.Config{UrgentMaxShare: 0.25})
		for i, k := range []string{"k1", "k2", "k3", "k4", "k5", "k6"} {
			r := row(k, t0.Add(-time.Duration(i+1)*time.Minute), time.Hour, 1)
			r.Urgent = i < 3 // k1..k3 urgent, k4..k6 not
			c.Apply(t0, r)
		}
		return c
	}
	// batch of 4: at most floor(0.25 × 4) = 1 urgent row while other rows are due, first
	if got := keysOf(mk().Claim(t0, 4, time.Minute)); got != "k3,k6,k5,k4" {
		t.Fatalf("batch 4: %s", got)
	}
	// batch of 8: 2 urgent first, 3 others, then the last urgent row since nothing else is due
	if got := keysOf(mk().Claim(t0, 8, time.Minute)); got != "k3,k2,k6,k5,k4,k1" {
		t.Fatalf("batch 8: %s", got)
	}
}

func TestFloors(t *testing.T) {
	sub := func(key string, due time.Time, cadence time.Duration) schedule.Row {
		r := row(key, due, cadence, 1)
		r.Source = schedule.SourceSubmitted
		return r
	}
	// the 96 h discovered class always loses by score to the boosted 1 h submitted rows
	mk := func(floors ...policy.Floor) *Core {
		c := newCore(t, policy.Config{SubmittedBoost: 2, Floors: floors})
		for i := range 8 {
			c.Apply(t0, sub(fmt.Sprintf("h%d", i), t0.Add(-time.Duration(2+i)*time.Hour), time.Hour))
			c.Apply(t0, row(fmt.Sprintf("p%d", i), t0.Add(-time.Duration(10+i)*time.Hour), 96*time.Hour, 1))
		}
		return c
	}
	// no floor: score order only
	if got := keysOf(mk().Claim(t0, 4, time.Minute)); got != "h7,h6,h5,h4" {
		t.Fatalf("no floor: %s", got)
	}
	// a floor of 0.5: ⌊0.5 × 4⌋ = 2 rows of the class first (its best), then score order
	floor := policy.Floor{Cadence: 96 * time.Hour, Source: schedule.SourceDiscovered, Share: 0.5}
	if got := keysOf(mk(floor).Claim(t0, 4, time.Minute)); got != "p7,p6,h7,h6" {
		t.Fatalf("floor 0.5, batch 4: %s", got)
	}
	// fractions carry over: with a floor of 0.25 and claims of 1, every fourth claim is the class's
	c := mk(policy.Floor{Cadence: 96 * time.Hour, Source: schedule.SourceDiscovered, Share: 0.25})
	var got []string
	for range 8 {
		got = append(got, keysOf(c.Claim(t0, 1, time.Hour)))
	}
	if s := strings.Join(got, ","); s != "h7,h6,h5,p7,h4,h3,h2,p6" {
		t.Fatalf("floor 0.25, claims of 1: %s", s)
	}
	// an unused floor goes back to score order in the same claim, and is not saved up: the class
	// has no due rows, so the claim is all score order, and once its rows come due it gets its
	// floor, not what it missed
	c = newCore(t, policy.Config{SubmittedBoost: 1, Floors: []policy.Floor{floor}})
	for i := range 8 {
		c.Apply(t0, row(fmt.Sprintf("h%d", i), t0.Add(-time.Duration(2+i)*time.Hour), time.Hour, 1))
		c.Apply(t0, row(fmt.Sprintf("p%d", i), t0.Add(time.Duration(1+i)*time.Minute), 96*time.Hour, 1))
	}
	if got := keysOf(c.Claim(t0, 2, 24*time.Hour)); got != "h7,h6" {
		t.Fatalf("floor without due rows: %s", got)
	}
	for range 5 {
		c.Claim(t0, 1, 24*time.Hour) // h5..h1
	}
	// credit 0.5 + 0.5 × 4: two rows, then score order (h0 is 3 cadences late)
	if got := keysOf(c.Claim(t0.Add(time.Hour), 4, time.Hour)); got != "p0,p1,h0,p2" {
		t.Fatalf("floor once due: %s", got)
	}
	// a class the score order already serves takes nothing extra: the floor counts its rows
	c = newCore(t, policy.Config{SubmittedBoost: 1, Floors: []policy.Floor{{Cadence: time.Hour, Source: schedule.SourceDiscovered, Share: 0.5}}})
	for i := range 8 {
		c.Apply(t0, row(fmt.Sprintf("h%d", i), t0.Add(-time.Duration(2+i)*time.Hour), time.Hour, 1))
		c.Apply(t0, row(fmt.Sprintf("p%d", i), t0.Add(-time.Duration(1+i)*time.Hour), 96*time.Hour, 1))
	}
	if got := keysOf(c.Claim(t0, 4, time.Hour)); got != "h7,h6,h5,h4" {
		t.Fatalf("floor of a class served by score: %s", got)
	}
}

func TestLeases(t *testing.T) {
	c := newCore(t, policy.Config{})
	c.Apply(t0, row("k1", t0.Add(-time.Hour), time.Hour, 1))
	got := c.Claim(t0, 1, 5*time.Minute)
	if len(got) != 1 {
		t.Fatal("nothing claimed")
	}
	tok := got[0].Lease
	if again := c.Claim(t0, 1, time.Minute); len(again) != 0 {
		t.Fatalf("leased row claimed again: %s", keysOf(again))
	}
	if s := c.Summary(t0); s.Leased != 1 || s.Due != 1 {
		t.Fatalf("leased %d due %d", s.Leased, s.Due)
	}
	if err := c.Release(t0, "k1", tok+1); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("wrong token: %v", err)
	}
	if err := c.Release(t0, "nope", tok); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("unknown key: %v", err)
	}
	// the lease expires: claimable again, the old token is dead
	later := t0.Add(5 * time.Minute)
	if err := c.CheckLease(later, "k1", tok); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("expired lease: %v", err)
	}
	again := c.Claim(later, 1, time.Minute)
	if len(again) != 1 || again[0].Lease == tok {
		t.Fatalf("after expiry: %+v", again)
	}
	if err := c.Release(later, "k1", again[0].Lease); err != nil {
		t.Fatal(err)
	}
	if n := len(c.Claim(later, 1, time.Minute)); n != 1 {
		t.Fatalf("after release claimed %d", n)
	}
	// an event moving a leased row keeps the lease; completion = apply the new version, release
	c2 := newCore(t, policy.Config{})
	c2.Apply(t0, row("k1", t0.Add(-time.Hour), time.Hour, 1))
	tok = c2.Claim(t0, 1, time.Minute)[0].Lease
	c2.Apply(t0, row("k1", t0.Add(time.Hour), time.Hour, 2)) // the completion's write
	if err := c2.Release(t0, "k1", tok); err != nil {
		t.Fatal(err)
	}
	if s := c2.Summary(t0); s.Due != 0 || s.Coming.Next60m != 1 || s.Leased != 0 {
		t.Fatalf("after completion: %s", summaryString(s))
	}
}

func TestSlotsIncomingAndDrop(t *testing.T) {
	c := newCore(t, policy.Config{})
	// k1 → slot testSlots[1]
	c.SetSlot(testSlots[1], SlotIncoming)
	c.Apply(t0, row("k1", t0.Add(-time.Hour), time.Hour, 1))
	c.Apply(t0, row("k4", t0.Add(-time.Hour), time.Hour, 1)) // slot testSlots[0]
	s := c.Summary(t0)
	if s.Held != 2 || s.HeldIncoming != 1 || s.Due != 1 {
		t.Fatalf("incoming counted: %s", summaryString(s))
	}
	if got := keysOf(c.Claim(t0, 5, time.Minute)); got != "k4" {
		t.Fatalf("claimed %s, want only the owned row", got)
	}
	c.SetSlot(testSlots[1], SlotOwned)
	if got := keysOf(c.Claim(t0, 5, time.Minute)); got != "k1" {
		t.Fatalf("after commit claimed %s", got)
	}
	c.SetSlot(testSlots[1], SlotNone)
	if c.Held() != 1 {
		t.Fatalf("held %d after slot left", c.Held())
	}
	if got := c.Apply(t0, row("k1", t0, time.Hour, 5)).Result; got != NotOwned {
		t.Fatalf("row of a foreign slot: %v", got)
	}
}

func TestWalkAccounting(t *testing.T) {
	c := newCore(t, policy.Config{Window: 2 * time.Hour})
	slots := testSlots[:]
	// load: everything is an admission
	if err := c.BeginWalk(t0, Edge{}, slots); err != nil {
		t.Fatal(err)
	}
	c.WalkRow(t0, row("k1", t0.Add(-time.Hour), time.Hour, 1))
	c.WalkRow(t0, row("k2", t0.Add(time.Hour), time.Hour, 1))
	c.WalkRow(t0, row("k3", t0.Add(5*time.Hour), time.Hour, 1)) // beyond the window
	bad := row("k5", t0, time.Hour, 1)
	bad.HasDue = false
	c.WalkRow(t0, bad)
	got := c.EndWalk(nil)
	want := WalkCounts{Scanned: 4, Admitted: 2, Invalid: 1, OwnedNotHeld: 1}
	want.OwnedNotHeldByHour[5] = 1
	if got != want {
		t.Fatalf("load counts %+v, want %+v", got, want)
	}
	edge := Edge{Known: true, At: t0.Add(2 * time.Hour)}

	// the next walk, an hour later: k3 (due t0+5h) is still out; k6, due t0+2h30m, is now
	// inside the window and after the previous edge: an admission, not a repair. k7 due before
	// the previous edge and not held: a true miss. k2 held and unseen: proven deleted. k1 stale.
	t1 := t0.Add(time.Hour)
	if err := c.BeginWalk(t1, edge, slots); err != nil {
		t.Fatal(err)
	}
	c.WalkRow(t1, row("k1", t0.Add(-time.Hour), time.Hour, 2))
	c.WalkRow(t1, row("k3", t0.Add(5*time.Hour), time.Hour, 1))
	c.WalkRow(t1, row("k6", t0.Add(150*time.Minute), time.Hour, 1))
	c.WalkRow(t1, row("k7", t0.Add(30*time.Minute), time.Hour, 1))
	got = c.EndWalk(nil)
	want = WalkCounts{Scanned: 4, Admitted: 1, Repaired: 3, Deleted: 1, OwnedNotHeld: 1}
	want.OwnedNotHeldByHour[4] = 1
	if got != want {
		t.Fatalf("verify counts %+v, want %+v", got, want)
	}

	// a partial walk proves nothing deleted in its unread slot, and events during a walk mark
	// rows as seen
	if err := c.BeginWalk(t1, edge, slots); err != nil {
		t.Fatal(err)
	}
	c.Apply(t1, row("k8", t1, time.Hour, 1)) // an event during the walk
	got = c.EndWalk([]int{slotOfKey("k1"), slotOfKey("k6"), slotOfKey("k7")})
	if got.Deleted != 0 || c.Held() != 4 {
		t.Fatalf("partial walk: %+v, held %d", got, c.Held())
	}
}

func TestSummaryFigures(t *testing.T) {
	c := newCore(t, policy.Config{})
	rows := []schedule.Row{
		row("k1", t0.Add(-2*time.Hour), time.Hour, 1),      // late 7200 s, rel 2
		row("k2", t0.Add(-30*time.Minute), time.Hour, 1),   // late 1800 s, rel 0.5
		row("k3", t0.Add(-48*time.Hour), 96*time.Hour, 1),  // late 172800 s, rel 0.5
		row("k4", t0.Add(10*time.Minute), time.Hour, 1),    // coming in 15 m
		row("k5", t0.Add(90*time.Minute), 24*time.Hour, 1), // coming in hour bin 1
		row("k6", t0.Add(30*time.Hour), 96*time.Hour, 1),   // beyond 24 h
	}
	rows[1].Route = "home"
	for _, r := range rows {
		c.Apply(t0, r)
	}
	s := c.Summary(t0)
	if s.Due != 3 || s.Held != 6 {
		t.Fatalf("due %d held %d", s.Due, s.Held)
	}
	wantLate := summary.Lateness{MaxSeconds: 172800, P50Seconds: 7200, P99Seconds: 172800, MaxRelative: 2, P50Relative: 0.5, P99Relative: 2}
	if s.Lateness != wantLate {
		t.Fatalf("lateness %+v, want %+v", s.Lateness, wantLate)
	}
	if s.Oldest == nil || s.Oldest.Key != "k3" {
		t.Fatalf("oldest %+v", s.Oldest)
	}
	if s.ByRoute["product"] != 2 || s.ByRoute["home"] != 1 {
		t.Fatalf("byRoute %v", s.ByRoute)
	}
	if s.Coming.Next15m != 1 || s.Coming.Next60m != 1 || s.Coming.Next24h != 2 || s.Coming.ByHour[0] != 1 || s.Coming.ByHour[1] != 1 {
		t.Fatalf("coming %+v", s.Coming)
	}
	if len(s.Classes) != 3 || s.Classes[0].Cadence != time.Hour || s.Classes[0].Due != 2 || s.Classes[0].Held != 3 {
		t.Fatalf("classes %+v", s.Classes)
	}
	var perSlot int
	for _, n := range s.DuePerSlot {
		perSlot += n
	}
	if perSlot != s.Due {
		t.Fatalf("due per slot sums to %d, due %d", perSlot, s.Due)
	}
}

// TestSlotLeavingMidWalk: a slot that leaves while a walk runs (a paced walk adopts settings) and
// comes back before it ends is not vouched for by the walk — it needs a walk of its own — and
// its rows are all alike (seen) when the walk ends, so the next walk proves deletions in it.
func TestSlotLeavingMidWalk(t *testing.T) {
	c := newCore(t, policy.Config{})
	slots := testSlots[:]
	if err := c.BeginWalk(t0, Edge{}, slots); err != nil {
		t.Fatal(err)
	}
	for i := range 16 { // four rows in each slot
		c.WalkRow(t0, row(fmt.Sprintf("k%d", i), t0.Add(-time.Hour), time.Hour, 1))
	}
	c.EndWalk(nil)
	left := slotOfKey("k1")
	if !c.WalkedBefore(left) {
		t.Fatalf("slot %d not walked by the load", left)
	}

	if err := c.BeginWalk(t0, Edge{Known: true, Unbounded: true}, slots); err != nil {
		t.Fatal(err)
	}
	c.WalkRow(t0, row("k0", t0.Add(-time.Hour), time.Hour, 1)) // slot 0 read before the change
	c.SetSlot(left, SlotNone)
	if c.Held() != 12 {
		t.Fatalf("held %d after slot %d left, want 12", c.Held(), left)
	}
	c.SetSlot(left, SlotOwned)
	c.Apply(t0, row("k5", t0.Add(-time.Hour), time.Hour, 2)) // an event in the slot that came back
	for i := 1; i < 16; i++ {
		if slotOfKey(fmt.Sprintf("k%d", i)) != left {
			c.WalkRow(t0, row(fmt.Sprintf("k%d", i), t0.Add(-time.Hour), time.Hour, 1))
		}
	}
	counts := c.EndWalk(nil)
	if c.WalkedBefore(left) {
		t.Errorf("slot %d counts as walked by a walk it left in the middle of", left)
	}
	for _, s := range slots {
		if s != left && !c.WalkedBefore(s) {
			t.Errorf("slot %d not walked", s)
		}
	}
	if counts.Deleted != 0 || c.Held() != 13 {
		t.Errorf("counts %+v, held %d; want nothing deleted, 13 held", counts, c.Held())
	}
	if err := checkCore(c); err != nil {
		t.Fatal(err)
	}
	// the next walk reads the slot: k1, k9, k13 come back, k5 is proven deleted
	if err := c.BeginWalk(t0, Edge{Known: true, Unbounded: true}, slots); err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		if i != 5 {
			c.WalkRow(t0, row(fmt.Sprintf("k%d", i), t0.Add(-time.Hour), time.Hour, 1))
		}
	}
	if counts := c.EndWalk(nil); counts.Deleted != 1 || c.Held() != 15 || !c.WalkedBefore(left) {
		t.Errorf("next walk: counts %+v, held %d, walked %v; want 1 deleted, 15 held, walked", counts, c.Held(), c.WalkedBefore(left))
	}
	if err := checkCore(c); err != nil {
		t.Fatal(err)
	}
}

// sameKey is a keyString that allocates nothing.
func sameKey([]byte) string { return "k" }

// TestClaimInto: ClaimInto claims what Claim claims, and with room enough and a keyString that
// does not allocate, it allocates nothing (the shard calls it under its lock).
func TestClaimInto(t *testing.T) {
	mk := func() *Core {
		c := newCore(t, policy.Config{})
		for i := range 300 {
			key := fmt.Sprintf("k%0*d", 1+i%40, i) // keys of 2 to 41 bytes
			c.Apply(t0, row(key, t0.Add(-time.Duration(i)*time.Second), time.Hour, 1))
		}
		return c
	}
	want := mk().Claim(t0, 100, time.Minute)
	got := mk().ClaimInto(t0, 100, time.Minute, []Claimed{{Key: "before"}}, func(k []byte) string { return string(k) })
	if got[0].Key != "before" {
		t.Fatalf("ClaimInto changed what out held: %q", got[0].Key)
	}
	if g, w := keysOf(got[1:]), keysOf(want); g != w {
		t.Fatalf("ClaimInto claimed\n%s\nwant\n%s", g, w)
	}
	c := mk()
	c.Claim(t0, 300, time.Minute) // the lease table at its size; the leases expire below
	now := t0.Add(2 * time.Minute)
	var mallocs uint64
	for i := range 3 {
		out := make([]Claimed, 0, 50)
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		out = c.ClaimInto(now, 50, time.Minute, out, sameKey)
		runtime.ReadMemStats(&m1)
		if len(out) != 50 {
			t.Fatalf("claimed %d rows, want 50", len(out))
		}
		if i > 0 { // the first also expires the 300 leases, whose rows go back to their trees
			mallocs = max(mallocs, m1.Mallocs-m0.Mallocs)
		}
	}
	// a string per key would be 50
	if mallocs != 0 {
		t.Errorf("ClaimInto of 50 rows with room enough allocated %d times, want none", mallocs)
	}
}

// TestCompletingClaimedRev: Completing reports the rev a lease was granted for, not the row's
// rev now: a producer's change applied while the row is leased keeps the lease, and the
// completion must be written against the claimed version (so the store refuses it and the change
// stands).
func TestCompletingClaimedRev(t *testing.T) {
	c := newCore(t, policy.Config{})
	c.Apply(t0, row("k1", t0.Add(-time.Hour), time.Hour, 5))
	claimed := c.Claim(t0, 1, time.Minute)
	if len(claimed) != 1 || claimed[0].Rev != 5 {
		t.Fatalf("claimed %+v", claimed)
	}
	if cp, _, err := c.Completing(t0, "k1", claimed[0].Lease); err != nil || !cp.AsClaimed || cp.Route != "product" {
		t.Fatalf("Completing before any change: %+v, %v; want the row held as claimed, route product", cp, err)
	}
	changed := row("k1", t0.Add(-time.Hour), time.Hour, 9)
	changed.Urgent = true
	if got := c.Apply(t0, changed).Result; got != Held {
		t.Fatalf("the producer's change: %v, want held", got)
	}
	cp, held, err := c.Completing(t0, "k1", claimed[0].Lease)
	if !held || err != nil || cp.ClaimedRev != 5 || cp.AsClaimed {
		t.Fatalf("Completing: claimed rev %d, held %v, as claimed %v, %v; want rev 5 under the current lease, no longer held as claimed", cp.ClaimedRev, held, cp.AsClaimed, err)
	}
	if _, _, err := c.Completing(t0, "k1", claimed[0].Lease+1); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Completing with another token: %v, want ErrLeaseLost", err)
	}
}
