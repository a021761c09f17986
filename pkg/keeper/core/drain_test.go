package core

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
)

// TestDepartedRows: the rows of a slot that leaves are gone at the commit for every lookup — a
// completion being written when it came (its write fails: AbortCompleting), a lease handed over
// or exported, an explanation — while Drain removes them in steps, and the rows of the slots kept
// stay.
func TestDepartedRows(t *testing.T) {
	c := newCore(t, policy.Config{})
	now := t0
	for i := range 40 { // k0, k4, … in slot testSlots[0]; the others elsewhere
		c.Apply(now, row(fmt.Sprintf("k%d", i), now.Add(-time.Duration(i)*time.Minute), time.Hour, 1))
	}
	claimed := c.Claim(now, 40, time.Hour)
	var k4 Claimed
	for _, cl := range claimed {
		if cl.Key == "k4" {
			k4 = cl
		}
	}
	cp, _, err := c.BeginCompleting(now, "k4", k4.Lease)
	if err != nil {
		t.Fatal(err)
	}
	c.SetSlot(testSlots[0], SlotNone)
	if !c.Draining() || c.Held() != 30 {
		t.Fatalf("after the commit: draining %v, held %d, want true and 30", c.Draining(), c.Held())
	}
	if err := c.AbortCompleting(now, "k4", k4.Lease, cp.Hint); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("AbortCompleting of a departed row: %v, want ErrNotHeld", err)
	}
	if _, ok := c.SlotOfHeld("k0"); ok {
		t.Fatal("SlotOfHeld finds a departed row")
	}
	if n := c.ImportLeases(now, []Lease{{Key: "k0", Slot: testSlots[0], Token: 7, Expires: now.Add(time.Hour)}}); n != 0 {
		t.Fatalf("ImportLeases took %d leases of a slot that left", n)
	}
	for _, l := range c.ExportLeases(now, testSlots[:], time.Minute) {
		if slotOfKey(l.Key) == testSlots[0] {
			t.Fatalf("a lease of a slot that left is exported: %+v", l)
		}
	}
	steps := 0
	for !c.Drain(3) {
		steps++
		if err := checkCore(c); err != nil {
			t.Fatalf("drain step %d: %v", steps, err)
		}
	}
	// 10 departed rows, 3 a step: the trees' walk meets them all (looking at the records after it,
	// a record at a time, would take a hundred steps more)
	if steps < 2 || steps > 6 || c.Held() != 30 || c.rows.Len() != 30 {
		t.Fatalf("drained in %d steps, held %d, %d records", steps, c.Held(), c.rows.Len())
	}
	if err := checkCore(c); err != nil {
		t.Fatal(err)
	}
	if x := c.Explain(now, "k8"); x.Held {
		t.Fatal("Explain finds a row of a slot that left")
	}
}

// TestDrainEndsWhenCountIsOff: should the count of departed rows be off (more than the trees
// hold), Drain still ends: it looks at every record after the trees' walk, removes what it finds
// there, and stops.
func TestDrainEndsWhenCountIsOff(t *testing.T) {
	c := newCore(t, policy.Config{})
	for i := range 20 {
		c.Apply(t0, row(fmt.Sprintf("k%d", i), t0, time.Hour, 1))
	}
	c.SetSlot(testSlots[0], SlotNone)
	c.departed++ // one more than there is
	for steps := 0; !c.Drain(2); steps++ {
		if steps > 1000 {
			t.Fatal("Drain does not end")
		}
	}
	if c.Draining() || c.Held() != 15 || c.rows.Len() != 15 {
		t.Fatalf("after the drain: draining %v, held %d, %d records", c.Draining(), c.Held(), c.rows.Len())
	}
	if err := checkCore(c); err != nil {
		t.Fatal(err)
	}
}

// TestDrainWalkMeetsEveryDepartedRow: the trees' walk alone (no look at the records after it)
// removes every departed row, a few entries at a time, while rows of the slots kept are added,
// moved, deleted and claimed between its windows — before and after where it got to.
func TestDrainWalkMeetsEveryDepartedRow(t *testing.T) {
	c := newCore(t, policy.Config{})
	now := t0
	rev := int64(1)
	for i := range 400 {
		c.Apply(now, row(fmt.Sprintf("k%d", i), now.Add(time.Duration(i%97-48)*time.Minute), time.Duration(1+i%3)*time.Hour, rev))
	}
	c.Claim(now, 50, time.Hour)
	states := c.slots
	states[testSlots[0]], states[testSlots[2]] = SlotNone, SlotIncoming // one leaves, one moves
	c.SetSlots(&states)
	if c.departed != 100 {
		t.Fatalf("%d departed rows, want 100", c.departed)
	}
	windows := 0
	for c.departed > 0 && c.drainTree < 2*len(c.groups) {
		if _, visited := c.drainWindow(3); visited == 0 {
			c.drainTree++
			c.drainAt = false
		}
		windows++
		// the slots kept change meanwhile: a row added, one moved, one deleted, a claim
		rev++
		i := 1 + windows%99*4 // slot testSlots[1]
		switch windows % 4 {
		case 0:
			c.Apply(now, row(fmt.Sprintf("n%d", windows), now.Add(time.Duration(windows%90-45)*time.Minute), time.Hour, rev))
		case 1:
			c.Apply(now, row(fmt.Sprintf("k%d", i), now.Add(time.Duration(windows%50-25)*time.Minute), time.Hour, rev))
		case 2:
			c.Delete(now, fmt.Sprintf("k%d", i+2), slotOfKey(fmt.Sprintf("k%d", i+2)), rev)
		case 3:
			c.Claim(now, 2, time.Hour)
		}
		if err := checkCore(c); err != nil {
			t.Fatalf("window %d: %v", windows, err)
		}
	}
	if c.departed != 0 {
		t.Fatalf("the walk left %d departed rows (%d windows)", c.departed, windows)
	}
}
