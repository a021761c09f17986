package membership

import (
	"reflect"
	"strings"
	"testing"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// twoShards returns a settled assignment at epoch 4: a owns 0-511, b owns 512-1023.
func twoShards(t *testing.T) Assignment {
	t.Helper()
	a, err := NewAssignment(4, map[string]schedule.SlotSet{"a": schedule.SlotRange(0, 511), "b": schedule.SlotRange(512, 1023)})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestApply(t *testing.T) {
	settled := twoShards(t)
	toC := []Move{{From: "a", To: "c", Slots: schedule.SlotRange(0, 99)}, {From: "b", To: "c", Slots: schedule.SlotRange(1000, 1023)}}
	preparing, err := Apply(settled, Phase{Kind: PhasePrepare, Epoch: 5, Moves: toC})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		// name describes the case.
		name string
		// from is the assignment the phase is applied to.
		from Assignment
		// phase is the phase to apply.
		phase Phase
		// wantErr, when set, is a fragment of the expected error.
		wantErr string
		// wantOwned is each shard's owned slots afterwards (when no error).
		wantOwned map[string]string
		// wantIncoming is each shard's incoming slots afterwards (when no error).
		wantIncoming map[string]string
	}{
		{
			name: "prepare marks incoming, owners unchanged",
			from: settled, phase: Phase{Kind: PhasePrepare, Epoch: 5, Moves: toC},
			wantOwned:    map[string]string{"a": "0-511", "b": "512-1023", "c": ""},
			wantIncoming: map[string]string{"a": "", "b": "", "c": "0-99,1000-1023"},
		},
		{
			name: "commit moves ownership and clears incoming",
			from: preparing, phase: Phase{Kind: PhaseCommit, Epoch: 6, Moves: toC},
			wantOwned:    map[string]string{"a": "100-511", "b": "512-999", "c": "0-99,1000-1023"},
			wantIncoming: map[string]string{"a": "", "b": "", "c": ""},
		},
		{
			name: "rollback restores the previous ownership",
			from: preparing, phase: Phase{Kind: PhaseRollback, Epoch: 6, Moves: toC},
			wantOwned:    map[string]string{"a": "0-511", "b": "512-1023", "c": ""},
			wantIncoming: map[string]string{"a": "", "b": "", "c": ""},
		},
		{
			name: "epoch must grow", from: settled,
			phase:   Phase{Kind: PhasePrepare, Epoch: 4, Moves: toC},
			wantErr: "not above the current epoch",
		},
		{
			name: "prepare needs the giver to own the slots", from: settled,
			phase:   Phase{Kind: PhasePrepare, Epoch: 5, Moves: []Move{{From: "b", To: "c", Slots: schedule.SlotRange(0, 0)}}},
			wantErr: `slot 0 is owned by "a"`,
		},
		{
			name: "prepare to the owner itself", from: settled,
			phase:   Phase{Kind: PhasePrepare, Epoch: 5, Moves: []Move{{From: "a", To: "a", Slots: schedule.SlotRange(0, 0)}}},
			wantErr: "different, named shard",
		},
		{
			name: "prepare on top of a prepare", from: preparing,
			phase:   Phase{Kind: PhasePrepare, Epoch: 6, Moves: nil},
			wantErr: "already being prepared",
		},
		{
			name: "slot in two moves", from: settled,
			phase:   Phase{Kind: PhasePrepare, Epoch: 5, Moves: []Move{{From: "a", To: "c", Slots: schedule.SlotRange(0, 1)}, {From: "a", To: "d", Slots: schedule.SlotRange(1, 2)}}},
			wantErr: "two moves",
		},
		{
			name: "commit without prepare", from: settled,
			phase:   Phase{Kind: PhaseCommit, Epoch: 5, Moves: toC},
			wantErr: "no handoff is being prepared",
		},
		{
			name: "commit of part of the prepared slots", from: preparing,
			phase:   Phase{Kind: PhaseCommit, Epoch: 6, Moves: toC[:1]},
			wantErr: "not in the phase's moves",
		},
		{
			name: "commit to another receiver than prepared", from: preparing,
			phase:   Phase{Kind: PhaseCommit, Epoch: 6, Moves: []Move{{From: "a", To: "d", Slots: schedule.SlotRange(0, 99)}, toC[1]}},
			wantErr: `incoming to "c"`,
		},
		{
			name: "rollback with nothing prepared", from: settled,
			phase:   Phase{Kind: PhaseRollback, Epoch: 5},
			wantErr: "no handoff is being prepared",
		},
		{
			name: "first commit must cover every slot", from: Assignment{},
			phase:   Phase{Kind: PhaseCommit, Epoch: 1, Moves: []Move{{To: "a", Slots: schedule.SlotRange(0, 1022)}}},
			wantErr: "slots 1023 have no owner",
		},
		{
			name: "first commit of nothing", from: Assignment{},
			phase:   Phase{Kind: PhaseCommit, Epoch: 1},
			wantErr: "no slot is assigned",
		},
		{
			name: "prepare on the empty assignment", from: Assignment{},
			phase:   Phase{Kind: PhasePrepare, Epoch: 1},
			wantErr: "commit the first assignment directly",
		},
		{
			name: "unknown kind", from: settled,
			phase:   Phase{Kind: "Shuffle", Epoch: 5},
			wantErr: "unknown phase kind",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Apply(tt.from, tt.phase)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one mentioning %q", err, tt.wantErr)
				}
				if got != (Assignment{}) {
					t.Errorf("returned a partial assignment with the error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Epoch != tt.phase.Epoch {
				t.Errorf("epoch %d, want %d", got.Epoch, tt.phase.Epoch)
			}
			for name, want := range tt.wantOwned {
				if s := schedule.FormatSlots(got.Owned(name)); s != want {
					t.Errorf("%s owns %q, want %q", name, s, want)
				}
			}
			for name, want := range tt.wantIncoming {
				if s := schedule.FormatSlots(got.Incoming(name)); s != want {
					t.Errorf("%s incoming %q, want %q", name, s, want)
				}
			}
		})
	}
}

func TestAssignmentSpecRoundTrip(t *testing.T) {
	settled := twoShards(t)
	preparing, err := Apply(settled, Phase{Kind: PhasePrepare, Epoch: 5, Moves: []Move{{From: "b", To: "c", Slots: schedule.SlotRange(700, 800)}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []Assignment{{}, settled, preparing} {
		back, err := ParseAssignment(a.Spec())
		if err != nil {
			t.Fatalf("ParseAssignment(%+v): %v", a.Spec(), err)
		}
		if back != a {
			t.Errorf("round trip of %+v changed the assignment", a.Spec())
		}
	}
	want := AssignmentSpec{Epoch: 5, Shards: []ShardSlots{{Name: "a", Owned: "0-511"}, {Name: "b", Owned: "512-1023"}, {Name: "c", Owned: "", Incoming: "700-800"}}}
	if got := preparing.Spec(); !reflect.DeepEqual(got, want) {
		t.Errorf("spec\n got %+v\nwant %+v", got, want)
	}
	partial := AssignmentSpec{Epoch: 4, Shards: []ShardSlots{{Name: "a", Owned: "0-511"}}}
	if _, err := ParseAssignment(partial); err == nil || !strings.Contains(err.Error(), "no owner") {
		t.Errorf("ParseAssignment of a partial assignment: error %v", err)
	}
}

func TestParseAssignmentRejects(t *testing.T) {
	tests := []struct {
		// name describes the case.
		name string
		// spec is the malformed assignment.
		spec AssignmentSpec
		// wantErr is a fragment of the expected error.
		wantErr string
	}{
		{
			name:    "bad slot text",
			spec:    AssignmentSpec{Epoch: 3, Shards: []ShardSlots{{Name: "a", Owned: "0-1023,"}}},
			wantErr: `shard "a" owned: slot set "0-1023,"`,
		},
		{
			name:    "slot owned twice",
			spec:    AssignmentSpec{Epoch: 3, Shards: []ShardSlots{{Name: "a", Owned: "0-600"}, {Name: "b", Owned: "600-1023"}}},
			wantErr: `slot 600 owned by both "a" and "b"`,
		},
		{
			name:    "slot without owner",
			spec:    AssignmentSpec{Epoch: 3, Shards: []ShardSlots{{Name: "a", Owned: "0-600"}, {Name: "b", Owned: "602-1023"}}},
			wantErr: "slots 601 have no owner",
		},
		{
			name:    "slot incoming twice",
			spec:    AssignmentSpec{Epoch: 3, Shards: []ShardSlots{{Name: "a", Owned: "0-1023"}, {Name: "b", Incoming: "5"}, {Name: "c", Incoming: "5"}}},
			wantErr: `slot 5 incoming to both`,
		},
		{
			name:    "slot incoming to its owner",
			spec:    AssignmentSpec{Epoch: 3, Shards: []ShardSlots{{Name: "a", Owned: "0-1023", Incoming: "5"}}},
			wantErr: "incoming to its own owner",
		},
		{
			name:    "incoming without owners",
			spec:    AssignmentSpec{Epoch: 3, Shards: []ShardSlots{{Name: "a", Incoming: "5"}}},
			wantErr: "no slot has an owner",
		},
		{
			name:    "shard listed twice",
			spec:    AssignmentSpec{Epoch: 3, Shards: []ShardSlots{{Name: "a", Owned: "0-1023"}, {Name: "a"}}},
			wantErr: "listed twice",
		},
		{
			name:    "empty name",
			spec:    AssignmentSpec{Epoch: 3, Shards: []ShardSlots{{Owned: "0-1023"}}},
			wantErr: "empty name",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseAssignment(tt.spec)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one mentioning %q", err, tt.wantErr)
			}
			if got != (Assignment{}) {
				t.Errorf("returned a partial assignment with the error")
			}
		})
	}
}

func TestNewAssignmentRejects(t *testing.T) {
	if _, err := NewAssignment(1, map[string]schedule.SlotSet{"a": schedule.SlotRange(0, 10)}); err == nil {
		t.Error("partial cover accepted")
	}
	if _, err := NewAssignment(1, map[string]schedule.SlotSet{"": schedule.AllSlots()}); err == nil {
		t.Error("empty name accepted")
	}
	if _, err := NewAssignment(1, map[string]schedule.SlotSet{"a": schedule.AllSlots(), "b": schedule.SlotRange(3, 3)}); err == nil {
		t.Error("overlap accepted")
	}
	if a, err := NewAssignment(0, nil); err != nil || !a.IsEmpty() {
		t.Errorf("empty assignment: %v", err)
	}
}

func TestSumDue(t *testing.T) {
	settled := twoShards(t)
	moves := []Move{{From: "a", To: "c", Slots: schedule.SlotRange(0, 9)}}
	preparing, _ := Apply(settled, Phase{Kind: PhasePrepare, Epoch: 5, Moves: moves})
	committed, _ := Apply(preparing, Phase{Kind: PhaseCommit, Epoch: 6, Moves: moves})
	due := func(slots ...int) map[int]int {
		m := map[int]int{}
		for _, s := range slots {
			m[s] = 1
		}
		return m
	}
	tests := []struct {
		// name describes the case.
		name string
		// a is the committed assignment the operator sums by.
		a Assignment
		// reports is each shard's reported owned slots and due per slot.
		reports map[string]ShardDue
		// wantDue is the expected sum.
		wantDue int
		// wantExact is whether the sum is exact.
		wantExact bool
	}{
		{
			name: "settled",
			a:    settled,
			reports: map[string]ShardDue{
				"a": {Owned: schedule.SlotRange(0, 511), DuePerSlot: due(0, 5, 511)},
				"b": {Owned: schedule.SlotRange(512, 1023), DuePerSlot: due(512)},
			},
			wantDue: 4, wantExact: true,
		},
		{
			name: "preparing: the receiver's incoming counts are ignored",
			a:    preparing,
			reports: map[string]ShardDue{
				"a": {Owned: schedule.SlotRange(0, 511), DuePerSlot: due(0, 5)},
				"b": {Owned: schedule.SlotRange(512, 1023), DuePerSlot: due(512)},
				"c": {DuePerSlot: due(0, 5)},
			},
			wantDue: 3, wantExact: true,
		},
		{
			name: "committed, giver not yet adopted: its stale counts are ignored",
			a:    committed,
			reports: map[string]ShardDue{
				"a": {Owned: schedule.SlotRange(0, 511), DuePerSlot: due(0, 5, 100)},
				"b": {Owned: schedule.SlotRange(512, 1023)},
				"c": {Owned: schedule.SlotRange(0, 9), DuePerSlot: due(0, 5)},
			},
			wantDue: 3, wantExact: true,
		},
		{
			name: "committed, receiver not yet adopted but prepared: its prepared counts stand in",
			a:    committed,
			reports: map[string]ShardDue{
				"a": {Owned: schedule.SlotRange(10, 511), DuePerSlot: due(100)},
				"b": {Owned: schedule.SlotRange(512, 1023)},
				"c": {Prepared: schedule.SlotRange(0, 9), DuePerPreparedSlot: due(0, 5)},
			},
			wantDue: 3, wantExact: true,
		},
		{
			name: "committed, neither adopted: the giver still owns and counts",
			a:    committed,
			reports: map[string]ShardDue{
				"a": {Owned: schedule.SlotRange(0, 511), DuePerSlot: due(0, 5, 100)},
				"b": {Owned: schedule.SlotRange(512, 1023)},
				"c": {Prepared: schedule.SlotRange(0, 9), DuePerPreparedSlot: due(0, 5)},
			},
			wantDue: 3, wantExact: true,
		},
		{
			name: "committed, receiver not yet adopted and not prepared: inexact lower bound",
			a:    committed,
			reports: map[string]ShardDue{
				"a": {Owned: schedule.SlotRange(10, 511), DuePerSlot: due(100)},
				"b": {Owned: schedule.SlotRange(512, 1023)},
				"c": {},
			},
			wantDue: 1, wantExact: false,
		},
		{
			name: "a shard did not report",
			a:    settled,
			reports: map[string]ShardDue{
				"a": {Owned: schedule.SlotRange(0, 511), DuePerSlot: due(3)},
			},
			wantDue: 1, wantExact: false,
		},
		{
			name: "empty assignment", a: Assignment{}, wantDue: 0, wantExact: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gotDue, gotExact := SumDue(tt.a, tt.reports)
			if gotDue != tt.wantDue || gotExact != tt.wantExact {
				t.Errorf("SumDue = %d, %v; want %d, %v", gotDue, gotExact, tt.wantDue, tt.wantExact)
			}
		})
	}
}
