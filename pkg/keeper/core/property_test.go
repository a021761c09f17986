package core

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/duetree"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/summary"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"pgregory.net/rapid"
)

// Test keys are "k<i>" (padded or not); key i lives in slot testSlots[i % len(testSlots)].
var testSlots = [...]int{0, 1, 511, 1023}

func testHash(key string) int64 {
	i, err := strconv.Atoi(strings.TrimLeft(strings.TrimPrefix(key, "k"), "0"))
	if err != nil {
		i = 0
	}
	lo, _ := schedule.SlotHashRange(testSlots[i%len(testSlots)])
	return lo + int64(i)
}

func slotOfKey(key string) int { return schedule.SlotOf(testHash(key)) }

var base = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func genRow(t *rapid.T, nowMs int64) schedule.Row {
	i := rapid.IntRange(0, 24).Draw(t, "key")
	key := fmt.Sprintf("k%d", i)
	if rapid.IntRange(0, 3).Draw(t, "pad") == 0 {
		key = fmt.Sprintf("k%03d", i) // different key, same hash: exercises index collisions
	}
	cadences := []time.Duration{time.Hour, 24 * time.Hour, 96 * time.Hour, 90 * time.Minute}
	r := schedule.Row{
		Key:     key,
		KeyHash: testHash(key),
		HasDue:  true,
		// due on a minute grid within ±48 h so equal scores and equal dues happen
		Due:     time.UnixMilli(nowMs + int64(rapid.IntRange(-48*60, 48*60).Draw(t, "dueMin"))*60_000).UTC(),
		Cadence: cadences[rapid.IntRange(0, len(cadences)-1).Draw(t, "cadence")],
		Route:   []string{"home", "product", "category"}[rapid.IntRange(0, 2).Draw(t, "route")],
		Source:  schedule.Source(rapid.IntRange(0, 1).Draw(t, "source")),
		Urgent:  rapid.IntRange(0, 5).Draw(t, "urgent") == 0,
		Rev:     int64(rapid.IntRange(1, 40).Draw(t, "rev")),
	}
	switch rapid.IntRange(0, 19).Draw(t, "invalid") {
	case 0:
		r.HasDue = false
	case 1:
		r.Cadence = 0
	case 2:
		r.Due = time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return r
}

// TestCoreMatchesReference drives the core and the naive reference with the same random
// operations and compares every claim, lease operation, walk count and summary.
func TestCoreMatchesReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := policy.Config{
			Window:          []time.Duration{0, 2 * time.Hour, 24 * time.Hour}[rapid.IntRange(0, 2).Draw(t, "window")],
			SubmittedBoost:  []float64{1, 2, 1.5}[rapid.IntRange(0, 2).Draw(t, "boost")],
			UrgentMaxShare:  []float64{0, 0.2, 0.5, 1}[rapid.IntRange(0, 3).Draw(t, "share")],
			Floors:          genFloors(t),
			Reschedule:      policy.Reschedule(rapid.IntRange(0, 2).Draw(t, "reschedule")),
			StarvationBound: []float64{0, policy.DefaultStarvationBound, 0.1, 2}[rapid.IntRange(0, 3).Draw(t, "starvationBound")],
			FirstLease:      1000,
		}
		core, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ref := newRef(cfg)
		for _, s := range testSlots {
			core.SetSlot(s, SlotOwned)
			ref.setSlot(s, SlotOwned)
		}
		nowMs := base.UnixMilli()
		var tokens []uint64
		var tokenKeys []string // the key each token was handed out with
		var tokenRevs []int64  // and the rev
		var edge Edge
		nextRev := int64(1000) // completions write revs above genRow's
		steps := rapid.IntRange(1, 120).Draw(t, "steps")
		for step := 0; step < steps; step++ {
			nowMs += int64(rapid.IntRange(0, 90).Draw(t, "advanceMin")) * 60_000
			now := time.UnixMilli(nowMs)
			switch op := rapid.IntRange(0, 15).Draw(t, "op"); op {
			case 15:
				// the service removes departed rows (of slots that left) in steps; every other
				// operation must already act as if they were gone
				core.Drain(rapid.IntRange(0, 3).Draw(t, "drainRows"))
			case 12:
				// fence some slots: until lifted, until a time (maybe past: lifting), or lifted now
				var slots []int
				for _, s := range testSlots {
					if rapid.Bool().Draw(t, "fenceSlot") {
						slots = append(slots, s)
					}
				}
				if rapid.IntRange(0, 2).Draw(t, "fenceKind") == 0 {
					core.HoldSlots(now, slots)
					ref.setFence(nowMs, slots, math.MaxInt64)
					break
				}
				until := nowMs + int64(rapid.IntRange(-30, 180).Draw(t, "fenceMin"))*60_000
				core.Fence(now, slots, time.UnixMilli(until))
				ref.setFence(nowMs, slots, until)
			case 13:
				// leases handed over from another shard: a fresh token, or one handed out here
				// (the same lease handed over twice)
				var ls []Lease
				for i := rapid.IntRange(1, 4).Draw(t, "imports"); i > 0; i-- {
					l := Lease{Key: fmt.Sprintf("k%d", rapid.IntRange(0, 24).Draw(t, "importKey")),
						Token:   uint64(rapid.IntRange(1_000_000, 1_000_050).Draw(t, "importToken")),
						Expires: time.UnixMilli(nowMs + int64(rapid.IntRange(-10, 120).Draw(t, "importMin"))*60_000),
						Rev:     int64(rapid.IntRange(1, 40).Draw(t, "importRev"))}
					if len(tokens) > 0 && rapid.Bool().Draw(t, "importOwn") {
						ti := rapid.IntRange(0, len(tokens)-1).Draw(t, "importTokenIdx")
						l.Key, l.Token, l.Rev = tokenKeys[ti], tokens[ti], tokenRevs[ti]
					}
					l.Slot = slotOfKey(l.Key)
					ls = append(ls, l)
				}
				want := 0
				for _, l := range ls {
					if ref.importLease(nowMs, l) {
						want++
						tokens, tokenKeys, tokenRevs = append(tokens, l.Token), append(tokenKeys, l.Key), append(tokenRevs, l.Rev)
					}
				}
				if got := core.ImportLeases(now, ls); got != want {
					t.Fatalf("step %d: ImportLeases(%+v) took %d, reference %d", step, ls, got, want)
				}
			case 14:
				var slots []int
				for _, s := range testSlots {
					if rapid.Bool().Draw(t, "exportSlot") {
						slots = append(slots, s)
					}
				}
				got := core.ExportLeases(now, slots, time.Minute)
				slices.SortFunc(got, func(a, b Lease) int { return strings.Compare(a.Key, b.Key) })
				if want := ref.exportLeases(nowMs, slots); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("step %d: ExportLeases(%v)\n got %v\nwant %v", step, slots, got, want)
				}
			case 11:
				// bulk mode on or off (a load places rows into pending lists)
				if rapid.Bool().Draw(t, "bulk") {
					core.BeginBulk()
				} else {
					core.EndBulk()
				}
			case 0, 1, 2:
				r := genRow(t, nowMs)
				var got Outcome
				if core.Walking() && rapid.Bool().Draw(t, "walked") {
					got = core.WalkRow(now, r)
					ref.walkRow(nowMs, r)
				} else {
					got = core.Apply(now, r)
					if want := ref.apply(nowMs, r); got.Result != want {
						t.Fatalf("step %d: Apply(%+v) = %v, reference %v", step, r, got.Result, want)
					}
				}
			case 3:
				r := genRow(t, nowMs)
				got := core.Delete(now, r.Key, r.Slot(), r.Rev)
				if want := ref.del(r.Key, r.Slot(), r.Rev); got.Result != want {
					t.Fatalf("step %d: Delete(%s, %d) = %v, reference %v", step, r.Key, r.Rev, got.Result, want)
				}
			case 4, 5:
				n := rapid.IntRange(0, 8).Draw(t, "n")
				leaseFor := time.Duration(rapid.IntRange(1, 120).Draw(t, "leaseMin")) * time.Minute
				got := core.Claim(now, n, leaseFor)
				want := ref.claim(nowMs, n, leaseFor)
				if len(got) != len(want) {
					t.Fatalf("step %d: Claim(%d) got %d rows %v, reference %v", step, n, len(got), claimedKeys(got), want)
				}
				for i := range got {
					if got[i].Key != want[i] {
						t.Fatalf("step %d: Claim(%d) order %v, reference %v", step, n, claimedKeys(got), want)
					}
					if got[i].Lease != ref.held[want[i]].token {
						t.Fatalf("step %d: lease token %d, reference %d", step, got[i].Lease, ref.held[want[i]].token)
					}
					tokens = append(tokens, got[i].Lease)
					tokenKeys = append(tokenKeys, got[i].Key)
					tokenRevs = append(tokenRevs, got[i].Rev)
				}
			case 6:
				if len(tokens) == 0 {
					continue
				}
				key := fmt.Sprintf("k%d", rapid.IntRange(0, 24).Draw(t, "releaseKey"))
				tok := tokens[rapid.IntRange(0, len(tokens)-1).Draw(t, "token")]
				got := core.Release(now, key, tok)
				if want := ref.release(nowMs, key, tok); got != want {
					t.Fatalf("step %d: Release(%s, %d) = %v, reference %v", step, key, tok, got, want)
				}
			case 7:
				s := testSlots[rapid.IntRange(0, len(testSlots)-1).Draw(t, "slot")]
				st := SlotState(rapid.IntRange(0, 2).Draw(t, "state"))
				if core.Walking() {
					continue // the service never changes slots mid-walk
				}
				if rapid.Bool().Draw(t, "manySlots") {
					// several slots at once, as a new membership does
					states := core.slots
					for _, s := range testSlots {
						if rapid.Bool().Draw(t, "changeSlot") {
							states[s] = SlotState(rapid.IntRange(0, 2).Draw(t, "slotState"))
							ref.setSlot(s, states[s])
						}
					}
					core.SetSlots(&states)
					break
				}
				core.SetSlot(s, st)
				ref.setSlot(s, st)
			case 8:
				if core.Walking() {
					unread := []int{}
					if rapid.Bool().Draw(t, "partial") {
						unread = append(unread, testSlots[rapid.IntRange(0, len(testSlots)-1).Draw(t, "unread")])
					}
					got := core.EndWalk(unread)
					want := ref.endWalk(unread)
					if got != want {
						t.Fatalf("step %d: EndWalk counts\n got %+v\nwant %+v", step, got, want)
					}
					edge = Edge{Known: true, Unbounded: cfg.Window == 0, At: time.UnixMilli(ref.startMs + cfg.Window.Milliseconds())}
				} else {
					var slots []int
					for _, s := range testSlots {
						if core.SlotState(s) != SlotNone {
							slots = append(slots, s)
						}
					}
					if err := core.BeginWalk(now, edge, slots); err != nil {
						t.Fatal(err)
					}
					ref.beginWalk(nowMs, edge, slots)
				}
			case 9:
				// a summary at now, after catching up in small steps, or at an earlier time (the
				// due counts' cursor moves back, and forward again at the next one)
				at := nowMs
				switch rapid.IntRange(0, 2).Draw(t, "summaryAt") {
				case 1:
					at -= int64(rapid.IntRange(0, 48*60).Draw(t, "backMin")) * 60_000
				case 2:
					for !core.CatchUp(now, rapid.IntRange(1, 3).Draw(t, "catchUpRows")) {
						if err := checkCore(core); err != nil {
							t.Fatalf("step %d: catching up: %v", step, err)
						}
					}
				}
				compareSummary(t, step, core.Summary(time.UnixMilli(at)), ref.summary(at))
			case 10:
				// complete a row as the shard does: the next due time from the core, the written
				// version applied, the lease ended
				if len(tokens) == 0 {
					continue
				}
				key := fmt.Sprintf("k%d", rapid.IntRange(0, 24).Draw(t, "completeKey"))
				ti := rapid.IntRange(0, len(tokens)-1).Draw(t, "completeToken")
				tok := tokens[ti]
				if rapid.Bool().Draw(t, "ownKey") {
					key = tokenKeys[ti] // the key it was claimed with: usually a live lease
				}
				cp, held, err := core.Completing(now, key, tok)
				wantNext, wantHeld, wantErr := ref.completing(nowMs, key, tok)
				if held != wantHeld || err != wantErr || (held && cp.NextDue.UnixMilli() != wantNext) {
					t.Fatalf("step %d: Completing(%s, %d) = %v %v %v, reference %v %v %v", step, key, tok,
						cp.NextDue.UnixMilli(), held, err, wantNext, wantHeld, wantErr)
				}
				if err != nil {
					continue
				}
				r := ref.held[key].row
				if cp.ClaimedRev != tokenRevs[ti] {
					t.Fatalf("step %d: Completing(%s) claimed rev %d, the claim handed out %d", step, key, cp.ClaimedRev, tokenRevs[ti])
				}
				if !cp.Due.Equal(r.Due) || cp.Cadence != r.Cadence || cp.Source != r.Source {
					t.Fatalf("step %d: Completing(%s) = %+v, held row %+v", step, key, cp, r)
				}
				nextRev++
				r.Due, r.Rev, r.Urgent = cp.NextDue, nextRev, false
				if !core.Walking() && rapid.IntRange(0, 5).Draw(t, "slotLeavesMeanwhile") == 0 {
					// a commit gives the row's slot away while the completion is written: the row
					// departs, and the write's outcome finds nothing
					core.SetSlot(r.Slot(), SlotNone)
					ref.setSlot(r.Slot(), SlotNone)
				}
				if rapid.Bool().Draw(t, "applyCompleted") {
					// as the shard does it: one call, maybe after the write's change event
					if rapid.Bool().Draw(t, "eventFirst") {
						if got, want := core.Apply(now, r).Result, ref.apply(nowMs, r); got != want {
							t.Fatalf("step %d: change event of completing %s: %v, reference %v", step, key, got, want)
						}
					}
					// Completing's hint, none, or any record id: a hint only spares a lookup
					hint := []Hint{cp.Hint, {}, {rec: rapid.Uint32Range(0, 40).Draw(t, "hintRec")}}[rapid.IntRange(0, 2).Draw(t, "hint")]
					got := core.ApplyCompleted(now, r, tok, hint).Result
					want := ref.apply(nowMs, r)
					_ = ref.release(nowMs, key, tok)
					if got != want {
						t.Fatalf("step %d: ApplyCompleted(%s): %v, reference %v", step, key, got, want)
					}
					if rev, held := core.HeldRev(key); want == Held && (!held || rev != r.Rev) {
						t.Fatalf("step %d: after ApplyCompleted(%s) the core holds rev %d (%v), want %d", step, key, rev, held, r.Rev)
					}
					break
				}
				if got, want := core.Apply(now, r).Result, ref.apply(nowMs, r); got != want {
					t.Fatalf("step %d: completed version of %s: %v, reference %v", step, key, got, want)
				}
				if got, want := core.Release(now, key, tok), ref.release(nowMs, key, tok); got != want {
					t.Fatalf("step %d: release after completing %s: %v, reference %v", step, key, got, want)
				}
			}
			if core.Held() != len(ref.held) {
				t.Fatalf("step %d: held %d, reference %d", step, core.Held(), len(ref.held))
			}
			// the demand the Adaptive policy weighs the claims against (Pace): departed rows
			// still in the owned trees are not counted
			if got, want := core.demand(), ref.demand(); math.Abs(got-want) > 1e-9*max(1, want) {
				t.Fatalf("step %d: demand %v renders/h, reference %v", step, got, want)
			}
			if err := checkCore(core); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
		compareSummary(t, steps, core.Summary(time.UnixMilli(nowMs)), ref.summary(nowMs))
	})
}

// genFloors draws a valid set of floors over genRow's classes (possibly none).
func genFloors(t *rapid.T) []policy.Floor {
	var floors []policy.Floor
	sum := 0.0
	for _, cad := range []time.Duration{time.Hour, 24 * time.Hour, 96 * time.Hour, 90 * time.Minute} {
		for _, src := range []schedule.Source{schedule.SourceDiscovered, schedule.SourceSubmitted} {
			share := []float64{0, 0, 0.1, 0.25, 0.3, 0.5, 0.05}[rapid.IntRange(0, 6).Draw(t, "floor")]
			if share == 0 || sum+share > 1 {
				continue
			}
			sum += share
			floors = append(floors, policy.Floor{Cadence: cad, Source: src, Share: share})
		}
	}
	return floors
}

func claimedKeys(c []Claimed) []string {
	out := make([]string, len(c))
	for i := range c {
		out[i] = c[i].Key
	}
	return out
}

func compareSummary(t *rapid.T, step int, got, want summary.Summary) {
	t.Helper()
	if g, w := summaryString(got), summaryString(want); g != w {
		t.Fatalf("step %d: summary\n got %s\nwant %s", step, g, w)
	}
}

func summaryString(s summary.Summary) string {
	o := "nil"
	if s.Oldest != nil {
		o = fmt.Sprintf("%s@%s", s.Oldest.Key, s.Oldest.Due.Format(time.RFC3339))
	}
	return fmt.Sprintf("held=%d incoming=%d invalid=%d due=%d leased=%d heldBack=%d perSlot=%v perIncomingSlot=%v lateness=%+v oldest=%s byRoute=%v classes=%+v coming=%+v",
		s.Held, s.HeldIncoming, s.Invalid, s.Due, s.Leased, s.HeldBack, s.DuePerSlot, s.DuePerIncomingSlot, s.Lateness, o, s.ByRoute, s.Classes, s.Coming)
}

// TestFloorsTakeNoMoreThanTheirShare checks the floors' bound against score order: for random
// due rows, floors and claim sizes, a claim gives each floored class no more rows than the larger
// of what its floor reserves (⌊credit⌋) and what score order alone gives it (a core without
// floors holding the same rows), and, when the reservations fit in the claim, at least the
// smaller of its reservation and its due rows. Other work is always due in these claims.
func TestFloorsTakeNoMoreThanTheirShare(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		floors := genFloors(t)
		boost := []float64{1, 2, 5}[rapid.IntRange(0, 2).Draw(t, "boost")]
		withFloors, err := New(policy.Config{SubmittedBoost: boost, Floors: floors})
		if err != nil {
			t.Fatal(err)
		}
		scoreOnly, err := New(policy.Config{SubmittedBoost: boost})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range testSlots {
			withFloors.SetSlot(s, SlotOwned)
			scoreOnly.SetSlot(s, SlotOwned)
		}
		nowMs := base.UnixMilli()
		for i := range rapid.IntRange(1, 60).Draw(t, "rows") {
			r := genRow(t, nowMs)
			r.Key = fmt.Sprintf("k%d", i) // distinct keys
			r.KeyHash = testHash(r.Key)
			r.HasDue, r.Urgent = true, false
			r.Cadence = max(r.Cadence, time.Hour)
			r.Due = time.UnixMilli(min(r.Due.UnixMilli(), nowMs)).UTC()
			withFloors.Apply(time.UnixMilli(nowMs), r)
			scoreOnly.Apply(time.UnixMilli(nowMs), r)
		}
		for round := range rapid.IntRange(1, 10).Draw(t, "rounds") {
			now := time.UnixMilli(nowMs)
			n := rapid.IntRange(1, 20).Draw(t, "n")
			quota := make([]int, len(floors))
			reserved := 0
			for i, f := range floors {
				quota[i] = int(min(math.Floor(withFloors.floors[i].credit+f.Share*float64(n)), float64(n)))
				reserved += quota[i]
			}
			dueOf := classCounts(withFloors, floors, nowMs)
			got := withFloors.Claim(now, n, time.Hour)
			want := scoreOnly.Claim(now, n, time.Hour)
			if len(got) != len(want) {
				t.Fatalf("round %d: %d rows with floors, %d without", round, len(got), len(want))
			}
			gotBy, wantBy := claimedBy(got, floors), claimedBy(want, floors)
			for i, f := range floors {
				if gotBy[i] > max(quota[i], wantBy[i]) {
					t.Fatalf("round %d: floor %v took %d of %d rows; its reservation is %d and score order gives it %d",
						round, f, gotBy[i], n, quota[i], wantBy[i])
				}
				if reserved <= n && gotBy[i] < min(quota[i], dueOf[i]) {
					t.Fatalf("round %d: floor %v got %d of %d rows; its reservation is %d and it has %d due",
						round, f, gotBy[i], n, quota[i], dueOf[i])
				}
			}
			for _, c := range got {
				if err := withFloors.Release(now, c.Key, c.Lease); err != nil {
					t.Fatal(err)
				}
			}
			for _, c := range want {
				if err := scoreOnly.Release(now, c.Key, c.Lease); err != nil {
					t.Fatal(err)
				}
			}
			nowMs += int64(rapid.IntRange(0, 120).Draw(t, "advanceMin")) * 60_000
		}
	})
}

// claimedBy counts claimed rows by the floor of their class (non-urgent only).
func claimedBy(rows []Claimed, floors []policy.Floor) []int {
	out := make([]int, len(floors))
	for _, r := range rows {
		for i, f := range floors {
			if !r.Urgent && f.Cadence == r.Cadence && f.Source == r.Source {
				out[i]++
			}
		}
	}
	return out
}

// classCounts counts the claimable due rows of each floor's class.
func classCounts(c *Core, floors []policy.Floor, nowMs int64) []int {
	out := make([]int, len(floors))
	for _, g := range c.groups {
		if g.floor < 0 {
			continue
		}
		c.trees.Visit(&g.owned, 0, c.trees.Rank(&g.owned, nowMs), func(e duetree.Entry) {
			if !e.Leased() {
				out[g.floor]++
			}
		})
	}
	return out
}
