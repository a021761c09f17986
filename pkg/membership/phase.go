package membership

import (
	"fmt"
	"sort"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// PhaseKind names a step of a handoff.
type PhaseKind string

const (
	// PhasePrepare marks each move's slots incoming to its receiver; owners are unchanged.
	PhasePrepare PhaseKind = "Prepare"
	// PhaseCommit moves ownership of the prepared slots to their receivers in one write and
	// clears incoming. Without a preceding prepare it is only allowed on the empty assignment
	// (the first assignment, when nothing is counted yet).
	PhaseCommit PhaseKind = "Commit"
	// PhaseRollback abandons a prepare: incoming is cleared and owners stay as they were.
	PhaseRollback PhaseKind = "Rollback"
)

// Move hands a set of slots from one shard to another.
type Move struct {
	// From is the shard giving the slots; "" when they have no owner (the first assignment).
	From string
	// To is the shard receiving the slots.
	To string
	// Slots is the slots moving.
	Slots schedule.SlotSet
}

// Phase is one published version of the assignment during a handoff.
type Phase struct {
	// Kind says what the phase does.
	Kind PhaseKind
	// Epoch is the epoch of the assignment after the phase; it must be above the current one.
	Epoch int64
	// Moves lists the slots concerned, one entry per (From, To) pair, sorted by From then To.
	Moves []Move
}

// Apply returns the assignment after phase p. It fails, leaving nothing half-applied, when the
// phase does not fit a:
//   - p.Epoch must be above a.Epoch;
//   - Prepare needs a settled, non-empty a, each move's slots owned by its From, no slot in two
//     moves, and To differing from From;
//   - Commit needs the moves to be exactly the slots incoming in a (each to its To, owned by its
//     From), or, on the empty assignment, moves from "" covering every slot once;
//   - Rollback needs the moves to be exactly the slots incoming in a.
func Apply(a Assignment, p Phase) (Assignment, error) {
	if p.Epoch <= a.Epoch {
		return Assignment{}, fmt.Errorf("%s phase at epoch %d: not above the current epoch %d", p.Kind, p.Epoch, a.Epoch)
	}
	next := a
	next.Epoch = p.Epoch
	var err error
	switch p.Kind {
	case PhasePrepare:
		err = applyPrepare(&next, p.Moves)
	case PhaseCommit:
		err = applyCommit(&next, p.Moves)
	case PhaseRollback:
		if err = checkIncoming(&next, p.Moves); err == nil {
			next.incoming = [schedule.NumSlots]string{}
		}
	default:
		err = fmt.Errorf("unknown phase kind %q", p.Kind)
	}
	if err == nil {
		err = next.Validate()
	}
	if err != nil {
		return Assignment{}, fmt.Errorf("%s phase at epoch %d on epoch %d: %w", p.Kind, p.Epoch, a.Epoch, err)
	}
	return next, nil
}

func applyPrepare(a *Assignment, moves []Move) error {
	if a.IsEmpty() {
		return fmt.Errorf("the empty assignment has nothing to hand off; commit the first assignment directly")
	}
	if !a.Settled() {
		return fmt.Errorf("a handoff is already being prepared")
	}
	for _, m := range moves {
		if m.To == "" || m.To == m.From {
			return fmt.Errorf("move %s from %q to %q: receiver must be a different, named shard", m.Slots, m.From, m.To)
		}
		for _, slot := range m.Slots.Slots() {
			if a.owner[slot] != m.From {
				return fmt.Errorf("move from %q to %q: slot %d is owned by %q", m.From, m.To, slot, a.owner[slot])
			}
			if a.incoming[slot] != "" {
				return fmt.Errorf("slot %d is in two moves (to %q and %q)", slot, a.incoming[slot], m.To)
			}
			a.incoming[slot] = m.To
		}
	}
	return nil
}

func applyCommit(a *Assignment, moves []Move) error {
	if a.IsEmpty() {
		// The first assignment: nothing is counted yet, so ownership is set directly.
		for _, m := range moves {
			if m.From != "" {
				return fmt.Errorf("first assignment: move from %q, but no slot has an owner", m.From)
			}
			if err := a.claim(m.To, m.Slots); err != nil {
				return fmt.Errorf("first assignment: %w", err)
			}
		}
		if a.IsEmpty() {
			return fmt.Errorf("first assignment: no slot is assigned")
		}
		return nil
	}
	if err := checkIncoming(a, moves); err != nil {
		return err
	}
	for slot, to := range a.incoming {
		if to != "" {
			a.owner[slot] = to
		}
	}
	a.incoming = [schedule.NumSlots]string{}
	return nil
}

// checkIncoming checks that moves are exactly the slots incoming in a, each from its owner.
func checkIncoming(a *Assignment, moves []Move) error {
	if a.Settled() {
		return fmt.Errorf("no handoff is being prepared")
	}
	var covered schedule.SlotSet
	for _, m := range moves {
		for _, slot := range m.Slots.Slots() {
			if covered.Has(slot) {
				return fmt.Errorf("slot %d is in two moves", slot)
			}
			covered.Add(slot)
			if a.incoming[slot] != m.To || a.owner[slot] != m.From {
				return fmt.Errorf("move from %q to %q: slot %d is owned by %q and incoming to %q", m.From, m.To, slot, a.owner[slot], a.incoming[slot])
			}
		}
	}
	var incoming schedule.SlotSet
	for slot, to := range a.incoming {
		if to != "" {
			incoming.Add(slot)
		}
	}
	if missing := incoming.Minus(covered); !missing.IsEmpty() {
		return fmt.Errorf("incoming slots %s are not in the phase's moves", missing)
	}
	return nil
}

// movesBetween returns the slots whose owner differs between from and to, grouped by (old
// owner, new owner) and sorted.
func movesBetween(from, to *[schedule.NumSlots]string) []Move {
	type pair struct{ from, to string }
	sets := map[pair]schedule.SlotSet{}
	for slot := range from {
		if from[slot] != to[slot] {
			k := pair{from[slot], to[slot]}
			s := sets[k]
			s.Add(slot)
			sets[k] = s
		}
	}
	moves := make([]Move, 0, len(sets))
	for k, s := range sets {
		moves = append(moves, Move{From: k.from, To: k.to, Slots: s})
	}
	sort.Slice(moves, func(i, j int) bool {
		if moves[i].From != moves[j].From {
			return moves[i].From < moves[j].From
		}
		return moves[i].To < moves[j].To
	})
	return moves
}
