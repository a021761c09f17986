package membership

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// genSlotSet draws a slot set: either random runs (like real assignments) or random bits.
func genSlotSet(t *rapid.T, label string) schedule.SlotSet {
	var s schedule.SlotSet
	if rapid.Bool().Draw(t, label+"/bits") {
		for i := range s {
			s[i] = rapid.Uint64().Draw(t, label+"/word")
		}
		return s
	}
	for range rapid.IntRange(0, 8).Draw(t, label+"/runs") {
		first := rapid.IntRange(0, schedule.NumSlots-1).Draw(t, label+"/first")
		last := rapid.IntRange(first, min(schedule.NumSlots-1, first+300)).Draw(t, label+"/last")
		s = s.Union(schedule.SlotRange(first, last))
	}
	return s
}

func TestPropertyFormatParseRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := genSlotSet(t, "set")
		text := schedule.FormatSlots(s)
		back, err := schedule.ParseSlots(text)
		if err != nil {
			t.Fatalf("ParseSlots(FormatSlots(s) = %q): %v", text, err)
		}
		if back != s {
			t.Fatalf("round trip of %q changed the set", text)
		}
		wantRuns := 0
		if text != "" {
			wantRuns = strings.Count(text, ",") + 1
		}
		if len(s.Runs()) != wantRuns {
			t.Fatalf("%q has %d elements for %d runs", text, wantRuns, len(s.Runs()))
		}
	})
}

// TestPropertyParseNeverPartial feeds ParseSlots random strings over the characters of the text
// form plus a few strays: it either fails with an empty set, or succeeds on exactly the
// canonical form of what it returns, so no text is ever partly accepted.
func TestPropertyParseNeverPartial(t *testing.T) {
	alphabet := []rune("0123456789,-,- x+")
	rapid.Check(t, func(t *rapid.T) {
		var text string
		if rapid.Bool().Draw(t, "mutate") {
			// Mutate a valid text, so that near-valid inputs are common.
			text = schedule.FormatSlots(genSlotSet(t, "set"))
			r := []rune(text)
			pos := rapid.IntRange(0, len(r)).Draw(t, "pos")
			c := rapid.SampledFrom(alphabet).Draw(t, "char")
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0: // insert
				r = append(r[:pos], append([]rune{c}, r[pos:]...)...)
			case 1: // replace
				if pos < len(r) {
					r[pos] = c
				}
			case 2: // delete
				if pos < len(r) {
					r = append(r[:pos], r[pos+1:]...)
				}
			}
			text = string(r)
		} else {
			text = string(rapid.SliceOfN(rapid.SampledFrom(alphabet), 0, 24).Draw(t, "runes"))
		}
		got, err := schedule.ParseSlots(text)
		if err != nil {
			if !got.IsEmpty() {
				t.Fatalf("ParseSlots(%q) returned %s with error %v", text, got, err)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", text)) {
				t.Fatalf("error %v does not quote the input %q", err, text)
			}
			return
		}
		if canon := schedule.FormatSlots(got); canon != text {
			t.Fatalf("ParseSlots(%q) accepted non-canonical text (canonical %q)", text, canon)
		}
	})
}

// genAssignment draws a settled assignment over shard names from pool: empty, contiguous ranges
// with random cuts, or fragmented random ownership.
func genAssignment(t *rapid.T, pool []string) Assignment {
	switch rapid.IntRange(0, 2).Draw(t, "kind") {
	case 0:
		return Assignment{Epoch: rapid.Int64Range(0, 5).Draw(t, "epoch")}
	case 1:
		n := rapid.IntRange(1, len(pool)).Draw(t, "owners")
		cuts := rapid.SliceOfNDistinct(rapid.IntRange(1, schedule.NumSlots-1), n-1, n-1, rapid.ID[int]).Draw(t, "cuts")
		a := Assignment{Epoch: rapid.Int64Range(1, 100).Draw(t, "epoch")}
		isCut := map[int]bool{}
		for _, c := range cuts {
			isCut[c] = true
		}
		names := rapid.Permutation(pool).Draw(t, "order")
		idx := 0
		for slot := range a.owner {
			if isCut[slot] {
				idx++
			}
			a.owner[slot] = names[idx]
		}
		return a
	default:
		names := rapid.SliceOfNDistinct(rapid.SampledFrom(pool), 1, len(pool), rapid.ID[string]).Draw(t, "owners")
		a := Assignment{Epoch: rapid.Int64Range(1, 100).Draw(t, "epoch")}
		runLen := rapid.IntRange(1, 200).Draw(t, "runLen")
		cur := rapid.SampledFrom(names).Draw(t, "first")
		for slot := range a.owner {
			if slot%runLen == 0 && rapid.Bool().Draw(t, "switch") {
				cur = rapid.SampledFrom(names).Draw(t, "next")
			}
			a.owner[slot] = cur
		}
		return a
	}
}

// genTarget draws 1..10 distinct shard names: some from the current pool, some new.
func genTarget(t *rapid.T, pool []string) []string {
	all := append(append([]string(nil), pool...), "new-0", "new-1", "new-2", "new-3", "new-4")
	return rapid.SliceOfNDistinct(rapid.SampledFrom(all), 1, 10, rapid.ID[string]).Draw(t, "target")
}

// minMoves is the reference minimum number of moved slots: every slot of a shard not in the
// target moves, and a target shard with c slots and target count t gives max(0, c-t); the
// NumSlots%n larger counts are placed by trying every choice of shards.
func minMoves(counts map[string]int, target []string) int {
	n := len(target)
	inTarget := map[string]bool{}
	for _, name := range target {
		inTarget[name] = true
	}
	removed := 0
	for name, c := range counts {
		if !inTarget[name] {
			removed += c
		}
	}
	best := -1
	var choose func(i, left int, ceil map[string]bool)
	choose = func(i, left int, ceil map[string]bool) {
		if i == n {
			if left != 0 {
				return
			}
			m := removed
			for _, name := range target {
				tc := schedule.NumSlots / n
				if ceil[name] {
					tc++
				}
				m += max(0, counts[name]-tc)
			}
			if best < 0 || m < best {
				best = m
			}
			return
		}
		if left > 0 {
			ceil[target[i]] = true
			choose(i+1, left-1, ceil)
			delete(ceil, target[i])
		}
		choose(i+1, left, ceil)
	}
	choose(0, schedule.NumSlots%n, map[string]bool{})
	return best
}

// checkOwnership checks, through the serialised form, that every slot has exactly one owner
// and at most one receiver, never its owner.
func checkOwnership(t *rapid.T, a Assignment, what string) {
	var owned, incoming schedule.SlotSet
	for _, sh := range a.Spec().Shards {
		o, err := schedule.ParseSlots(sh.Owned)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		in, err := schedule.ParseSlots(sh.Incoming)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !owned.Intersect(o).IsEmpty() {
			t.Fatalf("%s: slots %s owned twice", what, owned.Intersect(o))
		}
		if !incoming.Intersect(in).IsEmpty() {
			t.Fatalf("%s: slots %s incoming twice", what, incoming.Intersect(in))
		}
		if !o.Intersect(in).IsEmpty() {
			t.Fatalf("%s: %s owns and receives %s", what, sh.Name, o.Intersect(in))
		}
		owned, incoming = owned.Union(o), incoming.Union(in)
	}
	if owned != schedule.AllSlots() {
		t.Fatalf("%s: slots %s have no owner", what, schedule.AllSlots().Minus(owned))
	}
}

func TestPropertyPlanner(t *testing.T) {
	pool := []string{"s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"}
	rapid.Check(t, func(t *rapid.T) {
		start := genAssignment(t, pool)
		target := genTarget(t, pool)
		plan, err := PlanRebalance(start, target)
		if err != nil {
			t.Fatal(err)
		}
		a := start
		for _, ph := range plan.Phases {
			prev := a
			if a, err = Apply(a, ph); err != nil {
				t.Fatalf("apply %s: %v", ph.Kind, err)
			}
			checkOwnership(t, a, string(ph.Kind))
			if ph.Kind == PhasePrepare {
				// Owners unchanged; exactly the moving slots are incoming.
				for slot := 0; slot < schedule.NumSlots; slot++ {
					if a.Owner(slot) != prev.Owner(slot) {
						t.Fatalf("prepare changed the owner of slot %d", slot)
					}
				}
			}
		}
		end := a

		// Moved slots, counted independently of the plan.
		moved := 0
		for slot := 0; slot < schedule.NumSlots; slot++ {
			if start.Owner(slot) != end.Owner(slot) {
				moved++
			}
		}
		want := schedule.NumSlots
		if !start.IsEmpty() {
			want = minMoves(start.Counts(), target)
		}
		if moved != want || plan.Moved() != want {
			t.Fatalf("moved %d (plan says %d), minimum %d", moved, plan.Moved(), want)
		}

		// Balanced within one slot, over exactly the target shards.
		counts := end.Counts()
		if len(counts) != len(target) {
			t.Fatalf("owners %v, target %v", counts, target)
		}
		lo, hi := schedule.NumSlots, 0
		for _, name := range target {
			lo, hi = min(lo, counts[name]), max(hi, counts[name])
		}
		if hi-lo > 1 {
			t.Fatalf("unbalanced: %v", counts)
		}

		// Each slot moved from a shard over its target to one under it: a shard never both
		// gives and receives, and a giver never ends with more runs than it had.
		for _, name := range target {
			gave := !start.Owned(name).Minus(end.Owned(name)).IsEmpty()
			got := !end.Owned(name).Minus(start.Owned(name)).IsEmpty()
			if gave && got {
				t.Fatalf("%s both gave and received", name)
			}
			if gave && len(end.Owned(name).Runs()) > len(start.Owned(name).Runs()) {
				t.Fatalf("giver %s went from %d to %d runs", name, len(start.Owned(name).Runs()), len(end.Owned(name).Runs()))
			}
		}

		// Epochs: one per phase, growing by one.
		for i, ph := range plan.Phases {
			if ph.Epoch != start.Epoch+int64(i)+1 {
				t.Fatalf("phase %d at epoch %d from epoch %d", i, ph.Epoch, start.Epoch)
			}
		}

		// Planning the result again, in any order of the same shards, moves nothing.
		again, err := PlanRebalance(end, rapid.Permutation(target).Draw(t, "again"))
		if err != nil {
			t.Fatal(err)
		}
		if !again.IsEmpty() {
			t.Fatalf("re-planning moves %d slots", again.Moved())
		}
	})
}

// TestPropertyHandoff drives a handoff with random reports and times against a reference: it
// commits at the first step where every receiver reports the prepare epoch or later, and rolls
// back at the first step at or after the deadline otherwise. Every assignment published on the
// way has every slot owned exactly once, and a rollback restores the previous owners.
func TestPropertyHandoff(t *testing.T) {
	pool := []string{"s0", "s1", "s2", "s3", "s4"}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rapid.Check(t, func(t *rapid.T) {
		start := genAssignment(t, pool)
		if start.IsEmpty() {
			start, _ = NewAssignment(3, map[string]schedule.SlotSet{"s0": schedule.AllSlots()})
		}
		plan, err := PlanRebalance(start, genTarget(t, pool))
		if err != nil {
			t.Fatal(err)
		}
		if plan.IsEmpty() {
			return
		}
		timeout := time.Duration(rapid.IntRange(1, 100).Draw(t, "timeout")) * time.Second
		h, act, err := StartHandoff(start, plan, t0, timeout)
		if err != nil {
			t.Fatal(err)
		}
		a, err := Apply(start, act.Phase)
		if err != nil {
			t.Fatal(err)
		}
		checkOwnership(t, a, "prepare")
		receivers := h.Receivers()
		now := t0
		for step := 0; !h.Done(); step++ {
			if step > 200 {
				t.Fatalf("handoff not done after %d steps", step)
			}
			now = now.Add(time.Duration(rapid.IntRange(0, 30).Draw(t, "advance")) * time.Second)
			reports := map[string]int64{}
			allPrepared := true
			for _, r := range append(receivers, "s0") {
				switch rapid.IntRange(0, 3).Draw(t, "report") {
				case 0: // no report
				case 1:
					reports[r] = h.PrepareEpoch - 1 // an old epoch
				case 2:
					reports[r] = h.PrepareEpoch
				case 3:
					reports[r] = h.PrepareEpoch + 1
				}
			}
			for _, r := range receivers {
				if reports[r] < h.PrepareEpoch {
					allPrepared = false
				}
			}
			wantKind := ActionWait
			switch {
			case allPrepared:
				wantKind = ActionCommit
			case !now.Before(t0.Add(timeout)):
				wantKind = ActionRollback
			}
			next, act, err := h.Step(now, reports)
			if err != nil {
				t.Fatal(err)
			}
			if act.Kind != wantKind {
				t.Fatalf("step %d at +%v: action %s, want %s", step, now.Sub(t0), act.Kind, wantKind)
			}
			if act.Phase.Kind != "" {
				if a, err = Apply(a, act.Phase); err != nil {
					t.Fatal(err)
				}
				checkOwnership(t, a, string(act.Phase.Kind))
			}
			h = next
		}
		if a.Epoch != start.Epoch+2 || !a.Settled() {
			t.Fatalf("end at epoch %d (settled %v), want %d settled", a.Epoch, a.Settled(), start.Epoch+2)
		}
		for slot := 0; slot < schedule.NumSlots; slot++ {
			want := start.Owner(slot)
			if h.State == HandoffCommitted {
				if to := plan.Phases[0]; to.Kind == PhasePrepare {
					for _, m := range to.Moves {
						if m.Slots.Has(slot) {
							want = m.To
						}
					}
				}
			}
			if a.Owner(slot) != want {
				t.Fatalf("%s: slot %d owned by %s, want %s", h.State, slot, a.Owner(slot), want)
			}
		}
	})
}
