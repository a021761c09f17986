package membership

import (
	"fmt"
	"sort"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// HandoffState is the state of a Handoff.
type HandoffState string

const (
	// HandoffPreparing: the prepare assignment (PrepareEpoch) is published; the coordinator waits
	// until every receiver reports PrepareEpoch as walked, or the deadline passes.
	HandoffPreparing HandoffState = "Preparing"
	// HandoffCommitted (final): the commit assignment (FinalEpoch) is published; the moves'
	// slots belong to their receivers.
	HandoffCommitted HandoffState = "Committed"
	// HandoffRolledBack (final): a receiver did not report in time; the previous ownership is
	// published again at FinalEpoch, with nothing incoming.
	HandoffRolledBack HandoffState = "RolledBack"
)

// MoveText is a Move in text form (as RenderQueue status carries it).
type MoveText struct {
	// From is the giving shard, "" for slots without owner (the first assignment).
	From string
	// To is the receiving shard.
	To string
	// Slots is the moving slots in the compact text form.
	Slots string
}

// Handoff is the coordinator of one rebalance: a pure state machine the operator steps with the
// time and the shards' reports, and persists (e.g. in RenderQueue status) between steps. All
// fields are plain values; slot sets are text.
//
// States, and what the shards report in each (Status.Membership of the shard API):
//
//	(before)    assignment at FromEpoch, settled. Every shard reports epoch FromEpoch, its owned
//	            slots, incoming "", and preparedEpoch <= FromEpoch.
//	Preparing   assignment at PrepareEpoch = FromEpoch+1: owners unchanged, moving slots incoming
//	            to their receivers. A shard that adopted it reports epoch PrepareEpoch. A giver
//	            still owns, serves and counts the moving slots. A receiver walks and holds its
//	            incoming slots without serving or counting them, and reports preparedEpoch =
//	            PrepareEpoch once a walk of all of them has finished without unread segments
//	            (until then it reports its older preparedEpoch). A shard with nothing incoming
//	            may report preparedEpoch = PrepareEpoch at once; only receivers are waited for.
//	Committed   assignment at FinalEpoch = FromEpoch+2: the moving slots are owned by their
//	            receivers. On adopting it, a giver drops them and a receiver serves and counts
//	            them; both report epoch FinalEpoch and the new owned slots.
//	RolledBack  assignment at FinalEpoch: owners as at FromEpoch, nothing incoming. Receivers
//	            drop the slots they were walking; everyone reports epoch FinalEpoch.
//
// Epochs only grow, so a shard ignores an assignment older than the one it has, and a report of
// preparedEpoch below PrepareEpoch (from an earlier handoff) never counts as prepared.
type Handoff struct {
	// State is the handoff's state.
	State HandoffState
	// FromEpoch is the epoch of the settled assignment the handoff started from.
	FromEpoch int64
	// PrepareEpoch is the epoch of the prepare assignment; 0 when there was no prepare (the
	// first assignment, committed directly).
	PrepareEpoch int64
	// FinalEpoch is the epoch of the commit or rollback assignment.
	FinalEpoch int64
	// Moves lists the slots being handed over.
	Moves []MoveText
	// StartedAt is when the handoff started.
	StartedAt time.Time
	// Deadline is when a handoff still Preparing is rolled back.
	Deadline time.Time
	// Waiting lists the receivers that had not reported PrepareEpoch as prepared at the last
	// step, sorted (for status and events).
	Waiting []string
}

// ActionKind says what the operator must do after a step.
type ActionKind string

const (
	// ActionNone: nothing to do; the handoff is finished.
	ActionNone ActionKind = "None"
	// ActionWait: nothing to publish yet; step again when reports change or after RequeueAfter.
	ActionWait ActionKind = "Wait"
	// ActionPrepare: publish the prepare phase.
	ActionPrepare ActionKind = "Prepare"
	// ActionCommit: publish the commit phase.
	ActionCommit ActionKind = "Commit"
	// ActionRollback: publish the rollback phase.
	ActionRollback ActionKind = "Rollback"
)

// Action is what the operator must do after a step. For Prepare, Commit and Rollback it applies
// Phase to its current assignment with Apply and persists the resulting assignment together with
// the returned Handoff in one write; that write is the moment the phase takes effect.
type Action struct {
	// Kind says what to do.
	Kind ActionKind
	// Phase is the phase to publish; zero for None and Wait.
	Phase Phase
	// Waiting lists the receivers not yet prepared (for Wait and Rollback), sorted.
	Waiting []string
	// RequeueAfter is the time left until the deadline (for Wait).
	RequeueAfter time.Duration
}

// StartHandoff starts carrying out plan from current at time now. A receiver that has not
// reported its slots prepared within timeout makes the handoff roll back. It returns the
// Handoff to persist and the first action: Prepare (state Preparing) or, for the first
// assignment of an empty one, Commit (state Committed). It fails for an empty plan, a plan made
// from another epoch, a non-positive timeout, or a first phase that does not apply to current.
func StartHandoff(current Assignment, plan Plan, now time.Time, timeout time.Duration) (Handoff, Action, error) {
	if plan.IsEmpty() {
		return Handoff{}, Action{}, fmt.Errorf("start handoff at epoch %d: the plan moves nothing", current.Epoch)
	}
	if plan.FromEpoch != current.Epoch {
		return Handoff{}, Action{}, fmt.Errorf("start handoff at epoch %d: the plan was made from epoch %d", current.Epoch, plan.FromEpoch)
	}
	if timeout <= 0 {
		return Handoff{}, Action{}, fmt.Errorf("start handoff at epoch %d: timeout %v is not positive", current.Epoch, timeout)
	}
	first := plan.Phases[0]
	if _, err := Apply(current, first); err != nil {
		return Handoff{}, Action{}, fmt.Errorf("start handoff: %w", err)
	}
	h := Handoff{
		FromEpoch:  current.Epoch,
		FinalEpoch: plan.Phases[len(plan.Phases)-1].Epoch,
		Moves:      movesText(plan.Moves()),
		StartedAt:  now,
		Deadline:   now.Add(timeout),
	}
	switch {
	case first.Kind == PhaseCommit && len(plan.Phases) == 1:
		h.State = HandoffCommitted
		return h, Action{Kind: ActionCommit, Phase: first}, nil
	case first.Kind == PhasePrepare && len(plan.Phases) == 2 && plan.Phases[1].Kind == PhaseCommit:
		h.State = HandoffPreparing
		h.PrepareEpoch = first.Epoch
		h.Waiting = h.Receivers()
		return h, Action{Kind: ActionPrepare, Phase: first, Waiting: h.Waiting, RequeueAfter: timeout}, nil
	default:
		return Handoff{}, Action{}, fmt.Errorf("start handoff at epoch %d: plan is not [Prepare, Commit] or [Commit]", current.Epoch)
	}
}

// Receivers returns the shards receiving slots, sorted.
func (h Handoff) Receivers() []string {
	seen := map[string]bool{}
	for _, m := range h.Moves {
		seen[m.To] = true
	}
	return sortedKeys(seen)
}

// Done reports whether the handoff is finished (committed or rolled back).
func (h Handoff) Done() bool {
	return h.State == HandoffCommitted || h.State == HandoffRolledBack
}

// Step advances the handoff at time now, given each shard's reported preparedEpoch (shards that
// did not report are absent). While Preparing it commits once every receiver has reported
// preparedEpoch >= PrepareEpoch (checked before the deadline, so reports arriving with the
// deadline still commit), rolls back once now reaches Deadline with a receiver still missing, and
// waits otherwise. A finished handoff stays as it is with ActionNone. It fails only when the
// persisted handoff is malformed (unknown state, bad slot text, inconsistent epochs).
func (h Handoff) Step(now time.Time, preparedEpochs map[string]int64) (Handoff, Action, error) {
	switch h.State {
	case HandoffCommitted, HandoffRolledBack:
		return h, Action{Kind: ActionNone}, nil
	case HandoffPreparing:
	default:
		return h, Action{}, fmt.Errorf("handoff from epoch %d: unknown state %q", h.FromEpoch, h.State)
	}
	if h.PrepareEpoch <= h.FromEpoch || h.FinalEpoch <= h.PrepareEpoch {
		return h, Action{}, fmt.Errorf("handoff from epoch %d: inconsistent epochs prepare %d, final %d", h.FromEpoch, h.PrepareEpoch, h.FinalEpoch)
	}
	moves, err := parseMoves(h.Moves)
	if err != nil {
		return h, Action{}, fmt.Errorf("handoff from epoch %d: %w", h.FromEpoch, err)
	}
	var waiting []string
	for _, r := range h.Receivers() {
		if e, ok := preparedEpochs[r]; !ok || e < h.PrepareEpoch {
			waiting = append(waiting, r)
		}
	}
	sort.Strings(waiting)
	next := h
	next.Waiting = waiting
	switch {
	case len(waiting) == 0:
		next.State = HandoffCommitted
		return next, Action{Kind: ActionCommit, Phase: Phase{Kind: PhaseCommit, Epoch: h.FinalEpoch, Moves: moves}}, nil
	case !now.Before(h.Deadline):
		next.State = HandoffRolledBack
		return next, Action{Kind: ActionRollback, Phase: Phase{Kind: PhaseRollback, Epoch: h.FinalEpoch, Moves: moves}, Waiting: waiting}, nil
	default:
		return next, Action{Kind: ActionWait, Waiting: waiting, RequeueAfter: h.Deadline.Sub(now)}, nil
	}
}

func movesText(moves []Move) []MoveText {
	out := make([]MoveText, 0, len(moves))
	for _, m := range moves {
		out = append(out, MoveText{From: m.From, To: m.To, Slots: schedule.FormatSlots(m.Slots)})
	}
	return out
}

func parseMoves(moves []MoveText) ([]Move, error) {
	out := make([]Move, 0, len(moves))
	for _, m := range moves {
		s, err := schedule.ParseSlots(m.Slots)
		if err != nil {
			return nil, fmt.Errorf("move from %q to %q: %w", m.From, m.To, err)
		}
		out = append(out, Move{From: m.From, To: m.To, Slots: s})
	}
	return out, nil
}
