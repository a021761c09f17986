package membership

import (
	"sort"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// ShardDue is what one shard reported about its due rows (from its /v1/status).
type ShardDue struct {
	// Owned is the slots the shard reported owning (membership.owned).
	Owned schedule.SlotSet
	// DuePerSlot is the shard's due count per owned slot; a slot it owns but omits counts 0.
	DuePerSlot map[int]int
	// Prepared is the incoming slots the shard has fully walked for the epoch it reports
	// (membership.incoming when preparedEpoch >= epoch, else empty): it holds their rows exactly
	// and follows their events, but neither serves nor counts them.
	Prepared schedule.SlotSet
	// DuePerPreparedSlot is the shard's due count per prepared slot; omitted slots count 0.
	DuePerPreparedSlot map[int]int
}

// SumDue sums due over every slot of the committed assignment a, taking each slot's count from
// exactly one report by the rule of the package documentation ("When a moving slot's count
// counts": owner, else a shard still owning it, else a shard that prepared it).
//
// exact is false, and due only a lower bound, when a is empty or some slot has no such report.
// Whether each shard's own counts are exact is for the caller to combine.
func SumDue(a Assignment, reports map[string]ShardDue) (due int, exact bool) {
	if a.IsEmpty() {
		return 0, false
	}
	names := make([]string, 0, len(reports))
	for n := range reports {
		names = append(names, n)
	}
	sort.Strings(names)
	exact = true
slots:
	for slot := 0; slot < schedule.NumSlots; slot++ {
		if r, ok := reports[a.Owner(slot)]; ok && r.Owned.Has(slot) {
			due += r.DuePerSlot[slot]
			continue
		}
		for _, n := range names {
			if r := reports[n]; r.Owned.Has(slot) {
				due += r.DuePerSlot[slot]
				continue slots
			}
		}
		for _, n := range names {
			if r := reports[n]; r.Prepared.Has(slot) {
				due += r.DuePerPreparedSlot[slot]
				continue slots
			}
		}
		exact = false
	}
	return due, exact
}
