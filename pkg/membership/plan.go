package membership

import (
	"fmt"
	"sort"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// Plan is the sequence of phases taking an assignment to a target shard list.
type Plan struct {
	// FromEpoch is the epoch of the assignment the plan starts from.
	FromEpoch int64
	// Phases are applied in order with Apply. Empty when nothing moves. For a settled assignment
	// it is [Prepare at FromEpoch+1, Commit at FromEpoch+2]; for the empty assignment it is
	// [Commit at FromEpoch+1] (nothing is counted before the first assignment, so there is
	// nothing to prepare).
	Phases []Phase
}

// IsEmpty reports whether the plan moves nothing.
func (p Plan) IsEmpty() bool { return len(p.Phases) == 0 }

// Moves returns the slots changing owner (those of the final commit), nil for an empty plan.
func (p Plan) Moves() []Move {
	if p.IsEmpty() {
		return nil
	}
	return p.Phases[len(p.Phases)-1].Moves
}

// Moved returns the number of slots changing owner.
func (p Plan) Moved() int {
	n := 0
	for _, m := range p.Moves() {
		n += m.Slots.Len()
	}
	return n
}

// PlanRebalance returns the phases taking current to an assignment over the target shards
// (in the operator's order, e.g. shard-0, shard-1, ...). current must be settled (no handoff
// being prepared). target must be 1 to NumSlots distinct non-empty names.
//
// The result, with n = len(target), gives every target shard NumSlots/n or NumSlots/n+1 slots
// (NumSlots%n shards get the larger count), so loads are within one slot. It moves the fewest
// slots that allows: a shard that is removed gives all its slots, a kept shard gives only its
// excess over its target count, and the larger counts go to the shards that currently own the
// most (ties broken by target order), which is what minimises the excess. Slots move only from
// shards over their target to shards under it, so each slot moves at most once.
//
// Among the plans moving that few slots it prefers the one leaving each shard few contiguous
// runs (a shard's slots read as few hash ranges), by a greedy heuristic: a shard under its
// target first grows its existing runs into the ends of adjacent runs of shards over their
// target; only when no such neighbour is left does it take a new run, the largest piece it can
// take from the end of one giver's run, preferring a piece that consumes a giver's run whole,
// then one lying next to another giver it can grow into. Givers always give from run ends, so
// a giver never ends with more runs than it had.
//
// The empty assignment is planned as contiguous ranges in target order, the first NumSlots%n
// shards one slot larger. Planning a balanced assignment over the same shards moves nothing.
func PlanRebalance(current Assignment, target []string) (Plan, error) {
	if err := checkTarget(target); err != nil {
		return Plan{}, err
	}
	if !current.Settled() {
		return Plan{}, fmt.Errorf("plan from epoch %d: a handoff is being prepared; finish or roll it back first", current.Epoch)
	}
	if current.IsEmpty() {
		return initialPlan(current.Epoch, target), nil
	}
	counts := current.Counts()
	want := targetCounts(counts, target)

	owner := current.owner
	excess := map[string]int{}
	deficit := map[string]int{}
	for name, c := range counts {
		if d := c - want[name]; d > 0 {
			excess[name] = d // want is 0 for removed shards
		}
	}
	for _, name := range target {
		if d := want[name] - counts[name]; d > 0 {
			deficit[name] = d
		}
	}
	rank := map[string]int{}
	for i, name := range target {
		rank[name] = i
	}
	balance(&owner, excess, deficit, rank)

	moves := movesBetween(&current.owner, &owner)
	if len(moves) == 0 {
		return Plan{FromEpoch: current.Epoch}, nil
	}
	return Plan{
		FromEpoch: current.Epoch,
		Phases: []Phase{
			{Kind: PhasePrepare, Epoch: current.Epoch + 1, Moves: moves},
			{Kind: PhaseCommit, Epoch: current.Epoch + 2, Moves: moves},
		},
	}, nil
}

// checkTarget checks a target shard list: 1 to NumSlots distinct, non-empty names.
func checkTarget(target []string) error {
	if len(target) == 0 {
		return fmt.Errorf("target has no shards")
	}
	if len(target) > schedule.NumSlots {
		return fmt.Errorf("target has %d shards, more than the %d slots", len(target), schedule.NumSlots)
	}
	seen := map[string]bool{}
	for i, name := range target {
		if name == "" {
			return fmt.Errorf("target shard %d has an empty name", i)
		}
		if seen[name] {
			return fmt.Errorf("target shard %q listed twice", name)
		}
		seen[name] = true
	}
	return nil
}

// initialPlan assigns contiguous ranges in target order, the first NumSlots%n one slot larger.
func initialPlan(epoch int64, target []string) Plan {
	n := len(target)
	moves := make([]Move, 0, n)
	first := 0
	for i, name := range target {
		size := schedule.NumSlots / n
		if i < schedule.NumSlots%n {
			size++
		}
		moves = append(moves, Move{To: name, Slots: schedule.SlotRange(first, first+size-1)})
		first += size
	}
	return Plan{FromEpoch: epoch, Phases: []Phase{{Kind: PhaseCommit, Epoch: epoch + 1, Moves: moves}}}
}

// targetCounts returns each target shard's slot count: NumSlots/n, plus one for the NumSlots%n
// shards owning the most slots now (ties by target order). Shards not in target get none.
func targetCounts(counts map[string]int, target []string) map[string]int {
	n := len(target)
	order := append([]string(nil), target...)
	sort.SliceStable(order, func(i, j int) bool { return counts[order[i]] > counts[order[j]] })
	want := make(map[string]int, n)
	for i, name := range order {
		want[name] = schedule.NumSlots / n
		if i < schedule.NumSlots%n {
			want[name]++
		}
	}
	return want
}

// balance reassigns slots from shards with excess to shards with deficit until no deficit is
// left (the totals are equal), growing receivers' runs at boundaries first and seeding a new
// run only when no receiver borders a giver. It updates owner, excess and deficit in place.
func balance(owner *[schedule.NumSlots]string, excess, deficit map[string]int, rank map[string]int) {
	for {
		if growAtBoundary(owner, excess, deficit) {
			continue
		}
		recv := neediest(deficit, rank)
		if recv == "" {
			return
		}
		seed(owner, excess, deficit, recv)
	}
}

// growAtBoundary finds the first boundary between a giver with excess and a receiver with
// deficit and moves to the receiver as many slots as allowed from the giver's run end at that
// boundary. It reports whether it moved anything.
func growAtBoundary(owner *[schedule.NumSlots]string, excess, deficit map[string]int) bool {
	for i := 0; i+1 < schedule.NumSlots; i++ {
		l, r := owner[i], owner[i+1]
		if l == r {
			continue
		}
		if excess[l] > 0 && deficit[r] > 0 {
			first, _ := runAround(owner, i)
			transfer(owner, excess, deficit, l, r, max(first, i-min(excess[l], deficit[r])+1), i)
			return true
		}
		if excess[r] > 0 && deficit[l] > 0 {
			_, last := runAround(owner, i+1)
			transfer(owner, excess, deficit, r, l, i+1, min(last, i+min(excess[r], deficit[l])))
			return true
		}
	}
	return false
}

// neediest returns the receiver with the largest remaining deficit (ties by rank), "" if none.
func neediest(deficit map[string]int, rank map[string]int) string {
	best := ""
	for name, d := range deficit {
		if d <= 0 {
			continue
		}
		if best == "" || d > deficit[best] || (d == deficit[best] && rank[name] < rank[best]) {
			best = name
		}
	}
	return best
}

// seed gives recv a new run: the largest piece it can take from the end of one giver's run,
// preferring a piece that is a giver's whole run, then one next to another giver with excess
// (so recv can grow into it), then the lowest slot.
func seed(owner *[schedule.NumSlots]string, excess, deficit map[string]int, recv string) {
	type candidate struct {
		giver       string
		first, last int
		whole, grow bool
	}
	better := func(a, b candidate) bool {
		if la, lb := a.last-a.first, b.last-b.first; la != lb {
			return la > lb
		}
		if a.whole != b.whole {
			return a.whole
		}
		if a.grow != b.grow {
			return a.grow
		}
		return a.first < b.first
	}
	growsInto := func(slot int, giver string) bool {
		return slot >= 0 && slot < schedule.NumSlots && owner[slot] != giver && excess[owner[slot]] > 0
	}
	var best *candidate
	for slot := 0; slot < schedule.NumSlots; {
		g := owner[slot]
		first, last := runAround(owner, slot)
		slot = last + 1
		if excess[g] <= 0 {
			continue
		}
		k := min(excess[g], deficit[recv], last-first+1)
		whole := k == last-first+1
		for _, c := range []candidate{
			{giver: g, first: first, last: first + k - 1, whole: whole, grow: growsInto(first-1, g) || (whole && growsInto(last+1, g))},
			{giver: g, first: last - k + 1, last: last, whole: whole, grow: growsInto(last+1, g) || (whole && growsInto(first-1, g))},
		} {
			if best == nil || better(c, *best) {
				best = &c
			}
		}
	}
	// Total excess equals total deficit, so a giver with excess exists while recv has deficit.
	transfer(owner, excess, deficit, best.giver, recv, best.first, best.last)
}

// runAround returns the maximal run of slot's owner containing slot.
func runAround(owner *[schedule.NumSlots]string, slot int) (first, last int) {
	first, last = slot, slot
	for first > 0 && owner[first-1] == owner[slot] {
		first--
	}
	for last+1 < schedule.NumSlots && owner[last+1] == owner[slot] {
		last++
	}
	return first, last
}

// transfer gives slots first..last (owned by from) to to and updates excess and deficit.
func transfer(owner *[schedule.NumSlots]string, excess, deficit map[string]int, from, to string, first, last int) {
	for s := first; s <= last; s++ {
		owner[s] = to
	}
	k := last - first + 1
	excess[from] -= k
	deficit[to] -= k
}
