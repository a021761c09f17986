package core

import (
	"errors"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
)

// TestLeasesTravelWithTheirSlot hands slot 0 from a giver core to a receiver core as the shards
// do at a commit: the receiver holds the slot until the giver's leases arrive, takes them over
// with their tokens and expiries, hands none of the leased rows out until they end, and accepts
// their completions, releases and extensions; the rows nobody had leased are claimable at once.
func TestLeasesTravelWithTheirSlot(t *testing.T) {
	giver := newCore(t, policy.Config{FirstLease: 100})
	receiver := newCore(t, policy.Config{FirstLease: 5000})
	receiver.SetSlot(0, SlotIncoming)
	slot := slotOfKey("k0") // keys k0, k4, k8 live in slot 0
	for _, k := range []string{"k0", "k4", "k8"} {
		r := row(k, t0.Add(-time.Hour), time.Hour, 7)
		giver.Apply(t0, r)
		receiver.Apply(t0, r)
	}
	leased := giver.Claim(t0, 2, 10*time.Minute) // k0, k4 (ties by key)
	if keysOf(leased) != "k0,k4" {
		t.Fatalf("giver claimed %s", keysOf(leased))
	}
	// k4's completion is being written when the slot leaves: its lease goes with at least a
	// minute, whatever its expiry
	if _, _, err := giver.BeginCompleting(t0.Add(9*time.Minute+30*time.Second), "k4", leased[1].Lease); err != nil {
		t.Fatal(err)
	}

	// the commit: the receiver owns the slot, held until the giver's leases arrive
	at := t0.Add(9*time.Minute + 40*time.Second)
	receiver.HoldSlots(at, []int{slot})
	receiver.SetSlot(slot, SlotOwned)
	if got := receiver.Claim(at, 10, time.Minute); len(got) != 0 {
		t.Fatalf("the receiver handed out %s before the giver's leases arrived", keysOf(got))
	}
	if s := receiver.Summary(at); s.Due != 3 || s.HeldBack != 3 || s.Leased != 0 {
		t.Fatalf("summary while held: due %d heldBack %d leased %d, want 3 3 0", s.Due, s.HeldBack, s.Leased)
	}
	ls := giver.ExportLeases(at, []int{slot}, time.Minute)
	giver.SetSlot(slot, SlotNone)
	want := map[string]time.Time{"k0": t0.Add(10 * time.Minute), "k4": at.Add(time.Minute)}
	if len(ls) != 2 {
		t.Fatalf("exported %+v", ls)
	}
	for _, l := range ls {
		if !l.Expires.Equal(want[l.Key]) || l.Rev != 7 || l.Slot != slot {
			t.Errorf("exported %+v, want expiry %v rev 7 slot %d", l, want[l.Key], slot)
		}
	}
	if n := receiver.ImportLeases(at, ls); n != 2 {
		t.Fatalf("imported %d leases, want 2", n)
	}
	receiver.Fence(at, []int{slot}, time.Time{}) // the giver had no fence: lifted
	got := receiver.Claim(at, 10, time.Minute)
	if keysOf(got) != "k8" {
		t.Fatalf("after the handover the receiver handed out %s, want k8 only", keysOf(got))
	}
	if s := receiver.Summary(at); s.HeldBack != 0 || s.Leased != 3 {
		t.Fatalf("summary after the handover: heldBack %d leased %d, want 0 3", s.HeldBack, s.Leased)
	}
	// the worker of k0 extends on the receiver with the giver's token
	if _, err := receiver.Extend(at, "k0", leased[0].Lease, 20*time.Minute); err != nil {
		t.Fatalf("extending k0 on the receiver: %v", err)
	}
	// k4's lease holds until its write could have landed, then the row is claimable again
	if got := receiver.Claim(at.Add(59*time.Second), 10, time.Hour); len(got) != 0 {
		t.Fatalf("k4 handed out while its completion may still be written: %s", keysOf(got))
	}
	if got := receiver.Claim(at.Add(time.Minute), 10, time.Hour); keysOf(got) != "k4,k8" {
		t.Fatalf("after k4's lease: %s, want k4,k8 (k8's lease of a minute ended too)", keysOf(got))
	}
	// and completes there
	cp, _, err := receiver.BeginCompleting(at.Add(time.Minute), "k0", leased[0].Lease)
	if err != nil || cp.ClaimedRev != 7 || !cp.AsClaimed {
		t.Fatalf("completing k0 on the receiver: %+v %v", cp, err)
	}
	// a token 0 is never a lease, even on a held-back row
	receiver.HoldSlots(at.Add(time.Minute), []int{slot})
	if err := receiver.Release(at.Add(time.Minute), "k8", 0); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("release with token 0: %v", err)
	}
}

// TestFenceEndsOnItsOwn: the rows of a slot fenced until a time are handed out from that time
// on; moving the fence moves the rows held back already; a slot that leaves drops its fence.
func TestFenceEndsOnItsOwn(t *testing.T) {
	c := newCore(t, policy.Config{})
	slot := slotOfKey("k0")
	c.Apply(t0, row("k0", t0.Add(-time.Hour), time.Hour, 1))
	c.Apply(t0, row("k1", t0.Add(-time.Hour), time.Hour, 1)) // another slot
	c.Fence(t0, []int{slot}, t0.Add(30*time.Second))
	if got := c.Claim(t0, 10, time.Hour); keysOf(got) != "k1" {
		t.Fatalf("claimed %s, want k1 only", keysOf(got))
	}
	if until, lifted := c.SlotFenceUntil(t0, slot); lifted || !until.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("fence of slot %d: %v %v", slot, until, lifted)
	}
	// held back already, then the fence moves later: the row waits for the new end
	c.Fence(t0.Add(time.Second), []int{slot}, t0.Add(time.Minute))
	if got := c.Claim(t0.Add(30*time.Second), 10, time.Minute); len(got) != 0 {
		t.Fatalf("claimed %s before the moved fence ended", keysOf(got))
	}
	if got := c.Claim(t0.Add(time.Minute), 10, time.Minute); keysOf(got) != "k0" {
		t.Fatalf("claimed %s when the fence ended, want k0", keysOf(got))
	}
	if fs := c.Fences(t0.Add(time.Minute)); len(fs) != 0 {
		t.Fatalf("fences after the end: %+v", fs)
	}
	c.HoldSlots(t0, []int{slot})
	c.SetSlot(slot, SlotNone)
	c.SetSlot(slot, SlotOwned)
	if _, lifted := c.SlotFenceUntil(t0, slot); lifted {
		t.Fatal("a slot that left and came back is still fenced")
	}
}
