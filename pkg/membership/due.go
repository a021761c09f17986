package membership

// ShardDue is what one shard reported about its due rows (from its /v1/status).
type ShardDue struct {
	// Owned is the slots the shard reported owning (membership.owned).
	Owned SlotSet
	// DuePerSlot is the shard's due count per owned slot; a slot it owns but omits counts 0.
	DuePerSlot map[int]int
}

// SumDue sums due over every slot, taking each slot's count from its owner in the committed
// assignment a (incoming slots are ignored), so that no slot is counted twice or missed. exact is
// false, and due only a lower bound, when a is empty or the owner of some slot did not report or
// did not report owning it (e.g. a receiver that has not yet adopted a commit). Whether each
// shard's own counts are exact is for the caller to combine.
func SumDue(a Assignment, reports map[string]ShardDue) (due int, exact bool) {
	if a.IsEmpty() {
		return 0, false
	}
	exact = true
	for slot := 0; slot < NumSlots; slot++ {
		r, ok := reports[a.Owner(slot)]
		if !ok || !r.Owned.Has(slot) {
			exact = false
			continue
		}
		due += r.DuePerSlot[slot]
	}
	return due, exact
}
