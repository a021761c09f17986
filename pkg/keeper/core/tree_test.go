package core

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

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
	var errs []string
	c.forEachHeld(func(id uint32, r *rec) {
		st := c.slots[r.slot]
		if st == SlotNone {
			errs = append(errs, fmt.Sprintf("record %d held in slot %d, which is not the shard's", id, r.slot))
			return
		}
		w := where{int(r.group), st == SlotIncoming}
		if want[w] == nil {
			want[w] = map[uint32]bool{}
		}
		want[w][id] = r.has(flagLeased)
		slotHeld[r.slot]++
		if _, ok := c.leases[id]; ok != r.has(flagLeased) {
			errs = append(errs, fmt.Sprintf("record %d: leased flag %v, lease entry %v", id, r.has(flagLeased), ok))
		}
		if r.due() <= c.due.cursor {
			slotDue[r.slot]++
			if st == SlotOwned {
				routeDue[r.route]++
			}
		}
		if c.walk != nil && c.walk.slots[r.slot] && c.isSeen(r) {
			seen[r.slot]++
		}
		if c.walk == nil && !c.isSeen(r) {
			errs = append(errs, fmt.Sprintf("record %d of slot %d unseen between walks", id, r.slot))
		}
	})
	inPending := map[uint32]bool{}
	for gi, g := range c.groups {
		for _, inc := range []bool{false, true} {
			t := &g.owned
			if inc {
				t = &g.incoming
			}
			got, err := c.checkTree(t)
			if err != nil {
				errs = append(errs, fmt.Sprintf("group %d incoming=%v: %v", gi, inc, err))
				continue
			}
			// bulk mode: the valid pending entries count as the tree's, once each
			for _, e := range t.pending {
				if c.pendingValid(t, e) && !inPending[entryID(e)] {
					inPending[entryID(e)] = true
					got = append(got, makeEntry(entryID(e), c.rows.at(entryID(e))))
				}
			}
			w := want[where{gi, inc}]
			if len(got) != len(w) {
				errs = append(errs, fmt.Sprintf("group %d incoming=%v: tree holds %d entries, %d records", gi, inc, len(got), len(w)))
			}
			for i, e := range got {
				leased, ok := w[entryID(e)]
				if !ok || leased != (e&leasedBit != 0) {
					errs = append(errs, fmt.Sprintf("group %d incoming=%v: entry %d (id %d, leased %v) is no such record (held %v, leased %v)",
						gi, inc, i, entryID(e), e&leasedBit != 0, ok, leased))
				}
				if r := c.rows.at(entryID(e)); uint64(r.due()>>dueStepBits) != e>>dueShift {
					errs = append(errs, fmt.Sprintf("entry of record %d: due step %d, record due %d", entryID(e), e>>dueShift, r.due()))
				}
			}
		}
	}
	c.forEachHeld(func(id uint32, r *rec) {
		if r.has(flagPending) && !inPending[id] {
			errs = append(errs, fmt.Sprintf("record %d marked pending without a pending entry", id))
		}
	})
	inIndex := map[uint32]bool{}
	for _, e := range c.index.slots {
		if e == 0 {
			continue
		}
		id := e&idMask - 1
		if inIndex[id] || c.rows.at(id).msFlags&flagHeld == 0 {
			errs = append(errs, fmt.Sprintf("index entry for record %d: twice %v, held %v", id, inIndex[id], c.rows.at(id).msFlags&flagHeld != 0))
		}
		inIndex[id] = true
	}
	if len(inIndex) != c.rows.n || c.index.n != c.rows.n {
		errs = append(errs, fmt.Sprintf("index holds %d records (counts %d), %d held", len(inIndex), c.index.n, c.rows.n))
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

// checkTree verifies t's structure and returns its entries in order.
func (c *Core) checkTree(t *tree) ([]uint64, error) {
	if t.n == 0 {
		if t.clm != 0 {
			return nil, fmt.Errorf("empty tree with %d claimable", t.clm)
		}
		return nil, nil
	}
	var out []uint64
	var walk func(node uint32, h int) (cnt, clm uint32, first uint64, err error)
	walk = func(node uint32, h int) (uint32, uint32, uint64, error) {
		if h == 0 {
			l := c.pool.leaf(node)
			if l.n == 0 {
				return 0, 0, 0, fmt.Errorf("empty leaf %d", node)
			}
			var clm uint32
			for _, e := range l.e[:l.n] {
				out = append(out, e)
				clm += claimable(e)
			}
			return uint32(l.n), clm, l.e[0], nil
		}
		in := c.pool.inner(node)
		if in.n == 0 {
			return 0, 0, 0, fmt.Errorf("empty inner node %d", node)
		}
		var cnt, clm uint32
		for i := range int(in.n) {
			n, m, first, err := walk(in.child[i], h-1)
			if err != nil {
				return 0, 0, 0, err
			}
			if n != in.cnt[i] || m != in.clm[i] {
				return 0, 0, 0, fmt.Errorf("inner %d child %d: counts %d/%d, subtree %d/%d", node, i, in.cnt[i], in.clm[i], n, m)
			}
			if entryID(first) != entryID(in.sep[i]) {
				return 0, 0, 0, fmt.Errorf("inner %d child %d: separator names record %d, first entry %d", node, i, entryID(in.sep[i]), entryID(first))
			}
			cnt += n
			clm += m
		}
		return cnt, clm, in.sep[0], nil
	}
	cnt, clm, _, err := walk(t.root, t.height)
	if err != nil {
		return nil, err
	}
	if int(cnt) != t.n || int(clm) != t.clm {
		return nil, fmt.Errorf("tree counts %d/%d, nodes %d/%d", t.n, t.clm, cnt, clm)
	}
	for i := 1; i < len(out); i++ {
		if c.cmpEntry(out[i-1], out[i]) >= 0 {
			return nil, fmt.Errorf("entries %d and %d out of order", i-1, i)
		}
	}
	if t.headOK {
		var first uint64
		for _, e := range out {
			if e&leasedBit == 0 {
				first = e
				break
			}
		}
		if t.head != first {
			return nil, fmt.Errorf("cached head %x, first claimable %x", t.head, first)
		}
	}
	return out, nil
}

// TestTreeOrderStatistics drives one group's tree through random inserts, deletions and lease
// changes large enough to split and merge nodes at several levels, and checks its structure, rank,
// select and head against a sorted slice after every batch.
func TestTreeOrderStatistics(t *testing.T) {
	c := newCore(t, Config{})
	rng := rand.New(rand.NewPCG(7, 8))
	now := t0
	live := map[string]bool{}
	rev := int64(0)
	maxHeight := 0
	for round := range 40 {
		for range 2000 {
			k := fmt.Sprintf("k%d", rng.IntN(30000))
			rev++
			if live[k] && rng.IntN(3) == 0 {
				c.Delete(now, k, slotOfKey(k), rev)
				delete(live, k)
				continue
			}
			// due within ±10 minutes on a 250 ms grid: many ties within one second
			due := now.Add(time.Duration(rng.IntN(4800)-2400) * 250 * time.Millisecond)
			c.Apply(now, row(k, due, time.Hour, rev))
			live[k] = true
		}
		if round%3 == 0 {
			got := c.Claim(now, 500, time.Minute)
			for i, g := range got {
				if i%2 == 0 {
					if err := c.Release(now, g.Key, g.Lease); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		if err := checkCore(c); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		g := c.groups[0]
		entries, _ := c.checkTree(&g.owned)
		for _, q := range []int64{-1, 0, 1, 999, 1000, 1250, 300_000, -300_000} {
			tMs := now.UnixMilli() + q
			want := 0
			for _, e := range entries {
				if c.rows.at(entryID(e)).due() <= tMs {
					want++
				}
			}
			if got := c.tRank(&g.owned, tMs); got != want {
				t.Fatalf("round %d: rank(now%+dms) = %d, want %d", round, q, got, want)
			}
		}
		points := []int64{-300_000, -1, 0, 0, 1, 999, 1000, 1250, 300_000, 600_000}
		for i := range points {
			points[i] += now.UnixMilli()
		}
		ranks := make([]int, len(points))
		c.tRanks(&g.owned, points, ranks)
		for i, tMs := range points {
			if want := c.tRank(&g.owned, tMs); ranks[i] != want {
				t.Fatalf("round %d: tRanks at now%+dms = %d, tRank %d", round, tMs-now.UnixMilli(), ranks[i], want)
			}
		}
		for _, k := range []int{0, len(entries) / 3, len(entries) - 1} {
			if got := c.tSelect(&g.owned, k); entryID(got) != entryID(entries[k]) {
				t.Fatalf("round %d: select(%d) = record %d, want %d", round, k, entryID(got), entryID(entries[k]))
			}
		}
		maxHeight = max(maxHeight, g.owned.height)
	}
	if maxHeight < 2 {
		t.Fatalf("the tree reached height %d: the test does not exercise inner-node splits and merges", maxHeight)
	}
}

// TestReserveSizesIndex checks that Reserve sizes the index for a load of that many rows (no
// rebuild on the way) and that rebuilding it as it grows keeps every key findable.
func TestReserveSizesIndex(t *testing.T) {
	c := newCore(t, Config{})
	c.Reserve(5000)
	size := len(c.index.slots)
	if size*3 < 5000*4 {
		t.Fatalf("reserved %d slots for 5000 keys", size)
	}
	for i := range 5000 {
		c.Apply(t0, row(fmt.Sprintf("k%d", i), t0, time.Hour, 1))
	}
	if len(c.index.slots) != size {
		t.Fatalf("the index grew from %d to %d slots within its reservation", size, len(c.index.slots))
	}
	for i := 5000; i < 20000; i++ { // past the reservation: rebuilt from the records as it grows
		c.Apply(t0, row(fmt.Sprintf("k%d", i), t0, time.Hour, 1))
	}
	if c.index.n != 20000 || len(c.index.slots) == size {
		t.Fatalf("index holds %d keys in %d slots", c.index.n, len(c.index.slots))
	}
	for i := range 20000 {
		if _, ok := c.index.find(&c.rows, &c.keys, fmt.Sprintf("k%d", i)); !ok {
			t.Fatalf("k%d not found after the index grew", i)
		}
	}
	c.Reserve(10) // never shrinks
	if c.index.n != 20000 {
		t.Fatal("Reserve changed the index")
	}
}

// TestBulkLoad loads rows in bulk mode with everything that can happen meanwhile: rows updated to
// another due time and back (a stale entry and a second one of the same step), deleted and added
// again (a record id reused with the same due), moved between owned and incoming, and a lease
// ended by a completion; then the trees are built and checked, and their summary matches a scan.
func TestBulkLoad(t *testing.T) {
	c := newCore(t, Config{})
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
	c.ApplyCompleted(now, done, claimed[0].Lease)
	if err := checkCore(c); err != nil {
		t.Fatalf("in bulk mode: %v", err)
	}
	c.EndBulk()
	if err := checkCore(c); err != nil {
		t.Fatalf("after the build: %v", err)
	}
	for _, g := range c.groups {
		if len(g.owned.pending)+len(g.incoming.pending) > 0 {
			t.Fatal("pending entries left after EndBulk")
		}
	}
	want := summaryScan(c, now.UnixMilli())
	want.AsOf = now
	if got := c.Summary(now); summaryString(got) != summaryString(want) {
		t.Fatalf("summary\n got %s\nwant %s", summaryString(got), summaryString(want))
	}
	if len(c.leases) != 0 {
		t.Fatalf("%d leases left", len(c.leases))
	}
}
