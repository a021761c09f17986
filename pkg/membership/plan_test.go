package membership

import (
	"fmt"
	"strings"
	"testing"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// mustPlanApply plans from a to target and applies every phase, failing the test on error.
func mustPlanApply(t *testing.T, a Assignment, target []string) (Plan, Assignment) {
	t.Helper()
	p, err := PlanRebalance(a, target)
	if err != nil {
		t.Fatalf("PlanRebalance(%v): %v", target, err)
	}
	for _, ph := range p.Phases {
		if a, err = Apply(a, ph); err != nil {
			t.Fatalf("Apply %s: %v", ph.Kind, err)
		}
	}
	return p, a
}

// shardNames returns shard-0 .. shard-(n-1).
func shardNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("shard-%d", i)
	}
	return out
}

// layout describes an assignment as "name=slots name=slots ...", sorted by name, with run counts.
func layout(a Assignment) string {
	var parts []string
	for _, s := range a.Spec().Shards {
		parts = append(parts, s.Name+"="+s.Owned)
	}
	return strings.Join(parts, " ")
}

func TestPlanRebalance(t *testing.T) {
	tests := []struct {
		// name describes the case.
		name string
		// from is the shard count of the contiguous starting assignment, 0 for the empty one.
		from int
		// target is the target shard list.
		target []string
		// wantMoved is the number of slots that must change owner.
		wantMoved int
		// wantPhases is the kinds of the plan's phases.
		wantPhases []PhaseKind
		// wantRuns is the number of runs each target shard must end with.
		wantRuns map[string]int
		// wantTotalRuns, when set, is the total number of runs over all shards.
		wantTotalRuns int
		// wantLayout, when set, is the exact resulting layout.
		wantLayout string
	}{
		{
			name: "first assignment is contiguous ranges, first shards larger",
			from: 0, target: shardNames(3), wantMoved: schedule.NumSlots,
			wantPhases: []PhaseKind{PhaseCommit},
			wantLayout: "shard-0=0-341 shard-1=342-682 shard-2=683-1023",
		},
		{
			name: "same shards move nothing",
			from: 3, target: shardNames(3), wantMoved: 0,
		},
		{
			name: "same shards in another order move nothing",
			from: 3, target: []string{"shard-2", "shard-0", "shard-1"}, wantMoved: 0,
		},
		{
			name: "1 to 2 hands over one half in one run",
			from: 1, target: shardNames(2), wantMoved: 512,
			wantPhases: []PhaseKind{PhasePrepare, PhaseCommit},
			wantRuns:   map[string]int{"shard-0": 1, "shard-1": 1},
		},
		{
			name: "3 to 4: givers stay contiguous, the new shard gets two runs",
			from: 3, target: shardNames(4), wantMoved: 256,
			wantPhases: []PhaseKind{PhasePrepare, PhaseCommit},
			wantRuns:   map[string]int{"shard-0": 1, "shard-1": 1, "shard-2": 1, "shard-3": 2},
			wantLayout: "shard-0=0-255 shard-1=427-682 shard-2=768-1023 shard-3=256-426,683-767",
		},
		{
			name: "4 to 3 by removing the middle shard",
			from: 4, target: []string{"shard-0", "shard-2", "shard-3"}, wantMoved: 256,
			wantPhases: []PhaseKind{PhasePrepare, PhaseCommit},
			wantRuns:   map[string]int{"shard-0": 1, "shard-2": 1, "shard-3": 2},
		},
		{
			name: "2 to 4 doubles: each new shard one run",
			from: 2, target: shardNames(4), wantMoved: 512,
			wantPhases: []PhaseKind{PhasePrepare, PhaseCommit},
			wantRuns:   map[string]int{"shard-0": 1, "shard-1": 1, "shard-2": 1, "shard-3": 1},
		},
		{
			name: "4 to 2 halves: the kept shards absorb their neighbours",
			from: 4, target: shardNames(2), wantMoved: 512,
			wantPhases:    []PhaseKind{PhasePrepare, PhaseCommit},
			wantTotalRuns: 3,
		},
		{
			name: "replace every shard",
			from: 2, target: []string{"a", "b"}, wantMoved: schedule.NumSlots,
			wantPhases: []PhaseKind{PhasePrepare, PhaseCommit},
			wantRuns:   map[string]int{"a": 1, "b": 1},
		},
		{
			name: "6 to 2",
			from: 6, target: shardNames(2), wantMoved: 1024 - 171 - 171,
			wantPhases:    []PhaseKind{PhasePrepare, PhaseCommit},
			wantTotalRuns: 3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var start Assignment
			if tt.from > 0 {
				_, start = mustPlanApply(t, Assignment{}, shardNames(tt.from))
			}
			p, end := mustPlanApply(t, start, tt.target)
			if got := p.Moved(); got != tt.wantMoved {
				t.Errorf("moved %d slots, want %d", got, tt.wantMoved)
			}
			var kinds []PhaseKind
			for i, ph := range p.Phases {
				kinds = append(kinds, ph.Kind)
				if want := start.Epoch + int64(i) + 1; ph.Epoch != want {
					t.Errorf("phase %d epoch %d, want %d", i, ph.Epoch, want)
				}
			}
			if fmt.Sprint(kinds) != fmt.Sprint(tt.wantPhases) {
				t.Errorf("phases %v, want %v", kinds, tt.wantPhases)
			}
			if p.IsEmpty() && end != start {
				t.Errorf("empty plan changed the assignment")
			}
			checkBalanced(t, end, tt.target)
			for name, want := range tt.wantRuns {
				if got := len(end.Owned(name).Runs()); got != want {
					t.Errorf("%s has %d runs, want %d (%s)", name, got, want, layout(end))
				}
			}
			if tt.wantTotalRuns != 0 {
				total := 0
				for _, name := range tt.target {
					total += len(end.Owned(name).Runs())
				}
				if total != tt.wantTotalRuns {
					t.Errorf("%d runs in all, want %d (%s)", total, tt.wantTotalRuns, layout(end))
				}
			}
			if tt.wantLayout != "" && layout(end) != tt.wantLayout {
				t.Errorf("layout\n got %s\nwant %s", layout(end), tt.wantLayout)
			}
		})
	}
}

// checkBalanced fails unless end is owned by exactly the target shards, each within one slot.
func checkBalanced(t *testing.T, end Assignment, target []string) {
	t.Helper()
	if err := end.Validate(); err != nil {
		t.Fatal(err)
	}
	counts := end.Counts()
	if len(counts) != len(target) {
		t.Errorf("owners %v, want exactly %v", counts, target)
	}
	lo, hi := schedule.NumSlots/len(target), (schedule.NumSlots+len(target)-1)/len(target)
	for _, name := range target {
		if c := counts[name]; c < lo || c > hi {
			t.Errorf("%s owns %d slots, want %d..%d", name, c, lo, hi)
		}
	}
}

func TestPlanRebalanceErrors(t *testing.T) {
	_, settled := mustPlanApply(t, Assignment{}, shardNames(2))
	p, _ := PlanRebalance(settled, shardNames(3))
	preparing, err := Apply(settled, p.Phases[0])
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		// name describes the case.
		name string
		// current is the assignment to plan from.
		current Assignment
		// target is the target shard list.
		target []string
		// wantErr is a fragment the error must contain.
		wantErr string
	}{
		{name: "no shards", current: settled, target: nil, wantErr: "no shards"},
		{name: "empty name", current: settled, target: []string{"a", ""}, wantErr: "empty name"},
		{name: "duplicate", current: settled, target: []string{"a", "a"}, wantErr: "listed twice"},
		{name: "too many", current: settled, target: shardNames(schedule.NumSlots + 1), wantErr: "more than"},
		{name: "handoff in progress", current: preparing, target: shardNames(3), wantErr: "being prepared"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := PlanRebalance(tt.current, tt.target)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %v, want one mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func TestPlanRebalanceOneSlotEach(t *testing.T) {
	_, end := mustPlanApply(t, Assignment{}, shardNames(schedule.NumSlots))
	checkBalanced(t, end, shardNames(schedule.NumSlots))
	_, end = mustPlanApply(t, end, shardNames(3))
	checkBalanced(t, end, shardNames(3))
}
