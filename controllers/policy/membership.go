package policy

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/specs"
	"github.com/renderqueue/renderqueue/pkg/membership"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// AssignmentFromStatus parses the assignment published in status.membership.
func AssignmentFromStatus(ms rqv1.MembershipStatus) (membership.Assignment, error) {
	byName := map[string]*membership.ShardSlots{}
	var names []string
	get := func(name string) *membership.ShardSlots {
		if s, ok := byName[name]; ok {
			return s
		}
		s := &membership.ShardSlots{Name: name}
		byName[name] = s
		names = append(names, name)
		return s
	}
	for _, s := range ms.Assignment {
		get(s.Shard).Owned = s.Slots
	}
	for _, s := range ms.Incoming {
		get(s.Shard).Incoming = s.Slots
	}
	spec := membership.AssignmentSpec{Epoch: ms.Epoch}
	for _, n := range names {
		spec.Shards = append(spec.Shards, *byName[n])
	}
	a, err := membership.ParseAssignment(spec)
	if err != nil {
		return membership.Assignment{}, fmt.Errorf("status.membership: %w", err)
	}
	return a, nil
}

// SetAssignment publishes a in status.membership (assignment, incoming, epoch, slotsMoving).
func SetAssignment(rq *rqv1.RenderQueue, ms *rqv1.MembershipStatus, a membership.Assignment) {
	ms.Epoch = a.Epoch
	ms.Assignment, ms.Incoming = nil, nil
	moving := 0
	names := a.Shards()
	specs.SortShards(rq, names)
	for _, n := range names {
		if owned := a.Owned(n); !owned.IsEmpty() {
			ms.Assignment = append(ms.Assignment, rqv1.ShardSlots{Shard: n, Slots: schedule.FormatSlots(owned)})
		}
		if in := a.Incoming(n); !in.IsEmpty() {
			ms.Incoming = append(ms.Incoming, rqv1.ShardSlots{Shard: n, Slots: schedule.FormatSlots(in)})
			moving += in.Len()
		}
	}
	ms.SlotsMoving = int32(moving)
}

// HandoffToStatus converts the coordinator's state for status.
func HandoffToStatus(h membership.Handoff) *rqv1.HandoffStatus {
	out := &rqv1.HandoffStatus{
		State:        rqv1.HandoffState(h.State),
		FromEpoch:    h.FromEpoch,
		PrepareEpoch: h.PrepareEpoch,
		FinalEpoch:   h.FinalEpoch,
		StartedAt:    metav1.NewTime(h.StartedAt),
		Deadline:     metav1.NewTime(h.Deadline),
		Waiting:      slices.Clone(h.Waiting),
	}
	for _, m := range h.Moves {
		out.Moves = append(out.Moves, rqv1.SlotMove{From: m.From, To: m.To, Slots: m.Slots})
	}
	return out
}

// HandoffFromStatus converts status.membership.handoff back for the coordinator.
func HandoffFromStatus(s *rqv1.HandoffStatus) membership.Handoff {
	h := membership.Handoff{
		State:        membership.HandoffState(s.State),
		FromEpoch:    s.FromEpoch,
		PrepareEpoch: s.PrepareEpoch,
		FinalEpoch:   s.FinalEpoch,
		StartedAt:    s.StartedAt.Time,
		Deadline:     s.Deadline.Time,
		Waiting:      slices.Clone(s.Waiting),
	}
	for _, m := range s.Moves {
		h.Moves = append(h.Moves, membership.MoveText{From: m.From, To: m.To, Slots: m.Slots})
	}
	return h
}

// DescribeMoves summarises moves per receiver: "web-shard-3 receives 256".
func DescribeMoves(moves []membership.MoveText) string {
	per := map[string]int{}
	var order []string
	for _, m := range moves {
		s, err := schedule.ParseSlots(m.Slots)
		if err != nil {
			continue
		}
		if _, ok := per[m.To]; !ok {
			order = append(order, m.To)
		}
		per[m.To] += s.Len()
	}
	sort.Strings(order)
	parts := make([]string, 0, len(order))
	for _, to := range order {
		parts = append(parts, fmt.Sprintf("%s receives %d", to, per[to]))
	}
	return strings.Join(parts, ", ")
}

// MovedSlots counts the slots of moves.
func MovedSlots(moves []membership.MoveText) int {
	n := 0
	for _, m := range moves {
		if s, err := schedule.ParseSlots(m.Slots); err == nil {
			n += s.Len()
		}
	}
	return n
}
