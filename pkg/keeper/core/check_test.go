package core

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/duetree"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/rowstore"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// checkCore verifies the core's internal invariants against its records: every held row is in
// exactly the tree of its group and slot state, with its leased bit; every tree is ordered, its
// inner counts and separators are exact and its cached head is its first claimable entry; the
// due counts equal a count of the records at the cursor; the per-slot held and walk-seen counts
// equal a count of the records.
func checkCore(c *Core) error {
	type where struct {
		g        int
		incoming bool
	}
	want := map[where]map[uint32]bool{}
	var slotDue [schedule.NumSlots]int32
	var slotHeld [schedule.NumSlots]int32
	var seen [schedule.NumSlots]int32
	routeDue := make([]int32, len(c.routes))
	routeIncoming := make([]int32, len(c.routes))
	var slotDemand [schedule.NumSlots]float64
	departed, departedOwned, departedDemand := 0, 0, 0.0
	var errs []string
	c.rows.Each(func(id uint32, r *rowstore.Rec) {
		st := c.slots[r.Slot]
		slotDemand[r.Slot] += c.groups[r.Group].perMs
		if st == SlotNone {
			// a departed row (drain.go): in the tree and counts of the state its slot left from,
			// without a lease
			st = c.departedFrom[r.Slot]
			if st == SlotNone {
				errs = append(errs, fmt.Sprintf("record %d held in slot %d, which is not the shard's and has no departed rows", id, r.Slot))
				return
			}
			departed++
			if st == SlotOwned {
				departedOwned++
				departedDemand += c.groups[r.Group].perMs
			}
			if c.leases.Leased(id) {
				errs = append(errs, fmt.Sprintf("departed record %d of slot %d has a lease", id, r.Slot))
			}
		} else {
			if ok := c.leases.Leased(id); ok != r.Has(flagLeased) {
				errs = append(errs, fmt.Sprintf("record %d: leased flag %v, lease entry %v", id, r.Has(flagLeased), ok))
			}
			if c.walk == nil && !c.isSeen(r) {
				errs = append(errs, fmt.Sprintf("record %d of slot %d unseen between walks", id, r.Slot))
			}
		}
		w := where{int(r.Group), st == SlotIncoming}
		if want[w] == nil {
			want[w] = map[uint32]bool{}
		}
		want[w][id] = r.Has(flagLeased)
		slotHeld[r.Slot]++
		if r.Due() <= c.due.cursor {
			slotDue[r.Slot]++
			if st == SlotOwned {
				routeDue[r.Route]++
			} else {
				routeIncoming[r.Route]++
			}
		}
		if c.walk != nil && c.walk.slots[r.Slot] && c.isSeen(r) {
			seen[r.Slot]++
		}
	})
	if departed != c.departed {
		errs = append(errs, fmt.Sprintf("departed rows: counted %d, records %d", c.departed, departed))
	}
	if departedOwned != c.departedOwned {
		errs = append(errs, fmt.Sprintf("departed rows in owned trees: counted %d, records %d", c.departedOwned, departedOwned))
	}
	if departed == 0 && (c.departedFrom != [schedule.NumSlots]SlotState{} || c.departedDemand != 0) {
		errs = append(errs, "no departed rows, but their bookkeeping is left")
	}
	if math.Abs(departedDemand-c.departedDemand) > 1e-12 {
		errs = append(errs, fmt.Sprintf("departed demand: counted %v, records %v", c.departedDemand, departedDemand))
	}
	for s := range slotDemand {
		if math.Abs(slotDemand[s]-c.slotDemand[s]) > 1e-12 {
			errs = append(errs, fmt.Sprintf("demand of slot %d: counted %v, records %v", s, c.slotDemand[s], slotDemand[s]))
		}
	}
	if !slices.Equal(routeIncoming, c.due.routeIncoming) {
		errs = append(errs, fmt.Sprintf("due per route of incoming slots: counted %v, records %v", c.due.routeIncoming, routeIncoming))
	}
	inPending := map[uint32]bool{}
	for gi, g := range c.groups {
		for _, inc := range []bool{false, true} {
			t := &g.owned
			if inc {
				t = &g.incoming
			}
			got, err := c.trees.Check(t)
			if err != nil {
				errs = append(errs, fmt.Sprintf("group %d incoming=%v: %v", gi, inc, err))
				continue
			}
			// bulk mode: the valid pending entries count as the tree's, once each
			for _, e := range c.trees.Pending(t) {
				if !inPending[e.ID()] {
					inPending[e.ID()] = true
					got = append(got, e)
				}
			}
			w := want[where{gi, inc}]
			if len(got) != len(w) {
				errs = append(errs, fmt.Sprintf("group %d incoming=%v: tree holds %d entries, %d records", gi, inc, len(got), len(w)))
			}
			for i, e := range got {
				leased, ok := w[e.ID()]
				if !ok || leased != e.Leased() {
					errs = append(errs, fmt.Sprintf("group %d incoming=%v: entry %d (id %d, leased %v) is no such record (held %v, leased %v)",
						gi, inc, i, e.ID(), e.Leased(), ok, leased))
				}
				if r := c.rows.At(e.ID()); duetree.NewEntry(e.ID(), r.Due(), e.Leased()) != e {
					errs = append(errs, fmt.Sprintf("entry %x of record %d: its due step is not the record's due %d", uint64(e), e.ID(), r.Due()))
				}
			}
		}
	}
	c.rows.Each(func(id uint32, r *rowstore.Rec) {
		if r.Has(flagPending) && !inPending[id] {
			errs = append(errs, fmt.Sprintf("record %d marked pending without a pending entry", id))
		}
	})
	if err := c.rows.Check(); err != nil {
		errs = append(errs, err.Error())
	}
	if slotDue != c.due.slot {
		errs = append(errs, fmt.Sprintf("due per slot: counted %v, records %v", nonZero(c.due.slot[:]), nonZero(slotDue[:])))
	}
	if !slices.Equal(routeDue, c.due.route) {
		errs = append(errs, fmt.Sprintf("due per route: counted %v, records %v", c.due.route, routeDue))
	}
	if slotHeld != c.slotHeld {
		errs = append(errs, fmt.Sprintf("held per slot: counted %v, records %v", nonZero(c.slotHeld[:]), nonZero(slotHeld[:])))
	}
	if c.walk != nil && seen != c.walk.seen {
		errs = append(errs, fmt.Sprintf("seen per slot: counted %v, records %v", nonZero(c.walk.seen[:]), nonZero(seen[:])))
	}
	if len(errs) > 0 {
		if len(errs) > 5 {
			errs = append(errs[:5], fmt.Sprintf("and %d more", len(errs)-5))
		}
		return fmt.Errorf("core invariants: %v", errs)
	}
	return nil
}

func nonZero(v []int32) map[int]int32 {
	m := map[int]int32{}
	for i, n := range v {
		if n != 0 {
			m[i] = n
		}
	}
	return m
}

// TestBulkLoad loads rows in bulk mode with everything that can happen meanwhile: rows updated to
// another due time and back (a stale entry and a second one of the same step), deleted and added
// again (a record id reused with the same due), moved between owned and incoming, and a lease
// ended by a completion; then the trees are built and checked, and their summary matches a scan.
func TestBulkLoad(t *testing.T) {
	c := newCore(t, policy.Config{})
	now := t0
	// a claimed row before bulk mode starts
	c.Apply(now, row("k0", now.Add(-time.Hour), time.Hour, 1))
	claimed := c.Claim(now, 1, time.Minute)
	if len(claimed) != 1 {
		t.Fatal("no claim")
	}
	c.BeginBulk()
	rev := int64(10)
	for i := 1; i < 3000; i++ {
		rev++
		c.Apply(now, row(fmt.Sprintf("k%d", i), now.Add(time.Duration(i%600-300)*time.Second), time.Hour, rev))
	}
	for i := 1; i < 3000; i += 7 { // away and back to the same due
		k := fmt.Sprintf("k%d", i)
		due := now.Add(time.Duration(i%600-300) * time.Second)
		rev++
		c.Apply(now, row(k, due.Add(time.Hour), time.Hour, rev))
		rev++
		c.Apply(now, row(k, due, time.Hour, rev))
	}
	for i := 2; i < 3000; i += 11 { // deleted, and added again with the same due
		k := fmt.Sprintf("k%d", i)
		rev++
		c.Delete(now, k, slotOfKey(k), rev)
		rev++
		c.Apply(now, row(k, now.Add(time.Duration(i%600-300)*time.Second), time.Hour, rev))
	}
	c.SetSlot(testSlots[1], SlotIncoming) // a quarter of the rows change trees
	// the claimed row is completed while its entry waits (after its change event)
	cp, _, err := c.Completing(now, "k0", claimed[0].Lease)
	if err != nil {
		t.Fatal(err)
	}
	done := row("k0", cp.NextDue, time.Hour, rev+1)
	c.Apply(now, done)
	c.ApplyCompleted(now, done, claimed[0].Lease, cp.Hint)
	if err := checkCore(c); err != nil {
		t.Fatalf("in bulk mode: %v", err)
	}
	c.EndBulk()
	if err := checkCore(c); err != nil {
		t.Fatalf("after the build: %v", err)
	}
	for _, g := range c.groups {
		if g.owned.PendingLen()+g.incoming.PendingLen() > 0 {
			t.Fatal("pending entries left after EndBulk")
		}
	}
	want := summaryScan(c, now.UnixMilli())
	want.AsOf = now
	if got := c.Summary(now); summaryString(got) != summaryString(want) {
		t.Fatalf("summary\n got %s\nwant %s", summaryString(got), summaryString(want))
	}
	if c.leases.Len() != 0 {
		t.Fatalf("%d leases left", c.leases.Len())
	}
}
