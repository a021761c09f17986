package keeper

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core"
	"github.com/renderqueue/renderqueue/pkg/keeper/httpserve"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// TestHandoverFromALaggingGiverAndUnreadRows takes a slot over from a giver and covers the two
// ways a 2-hour soak saw a row leased by two shards at once:
//   - the giver's answer comes from settings older than the receiver's (it had not yet come to
//     own the slot, and would still grant leases on it before giving it): the receiver keeps the
//     slot held back and asks again, whatever the stale answer says;
//   - a lease handed over for a row the receiver has not read yet (the giver applied a write
//     whose event the receiver has not): it waits for its row, which is leased the moment it is
//     read, and a completion under it is asked to come again meanwhile (core.ErrRowNotRead).
func TestHandoverFromALaggingGiverAndUnreadRows(t *testing.T) {
	// keys beyond the window (not held), to find two of one slot
	var far []schedule.Row
	for i := range 300 {
		far = append(far, srow(fmt.Sprintf("https://shop.example/h/%d", i), t0.Add(10*time.Hour), time.Hour))
	}
	settings := allSlots(2 * time.Hour)
	settings.Epoch = 2
	e := newShardEnv(t, settings)
	stored := e.upsert(far...)
	bySlot := map[int][]schedule.Row{}
	var a, b schedule.Row
	for _, r := range stored {
		sl := r.Slot()
		bySlot[sl] = append(bySlot[sl], r)
		if len(bySlot[sl]) == 2 {
			a, b = bySlot[sl][0], bySlot[sl][1]
			break
		}
	}
	if a.Key == "" {
		t.Fatal("no two keys of one slot")
	}
	sl := a.Slot()
	a = e.upsert(srow(a.Key, t0.Add(-time.Hour), time.Hour))[0] // overdue: held

	// epoch 2: the slot is incoming here (prepared); the rest owned
	settings.Incoming = schedule.SlotRange(sl, sl)
	settings.Owned = schedule.AllSlots().Minus(settings.Incoming)
	if err := e.sh.UpdateSettings(e.ctx, settings); err != nil {
		t.Fatal(err)
	}
	e.sh.Walk(e.ctx, true)

	// epoch 4: committed, the slot owned here, given by "giver"
	settings.Epoch = 4
	settings.Owned, settings.Incoming = schedule.AllSlots(), schedule.SlotSet{}
	settings.Arriving = []Arrival{{From: "giver", Slots: schedule.SlotRange(sl, sl), CommittedAt: t0}}
	if err := e.sh.UpdateSettings(e.ctx, settings); err != nil {
		t.Fatal(err)
	}
	claim := func(when string) []core.Claimed {
		t.Helper()
		got, err := e.sh.Claim(e.clock.Now(), 10, time.Minute)
		if err != nil {
			t.Fatalf("claim %s: %v", when, err)
		}
		return got
	}
	if got := claim("while the giver's leases are awaited"); len(got) != 0 {
		t.Fatalf("handed out %s while the giver's leases were awaited", got[0].Key)
	}

	// the giver answers from epoch 3: it does not own the slot yet, so it knows no record
	e.sh.applyHandover("giver", shardapi.HandoverResponse{Shard: "giver", Epoch: 3,
		Slots: []shardapi.HandoverSlots{{State: shardapi.HandoverUnknown, Slots: schedule.FormatSlots(schedule.SlotRange(sl, sl))}}})
	if got := claim("after a stale answer"); len(got) != 0 {
		t.Fatalf("handed out %s after an answer from a giver behind this shard's epoch", got[0].Key)
	}
	e.sh.mu.Lock()
	_, still := e.sh.awaiting[sl]
	e.sh.mu.Unlock()
	if !still {
		t.Fatal("a stale answer ended the wait for the giver's leases")
	}

	// b is written overdue; the giver read it and leased it, this shard has not read it yet
	b = e.upsert(srow(b.Key, t0.Add(-time.Hour), time.Hour))[0]
	expires := t0.Add(time.Minute)
	e.sh.applyHandover("giver", shardapi.HandoverResponse{Shard: "giver", Epoch: 4,
		Slots: []shardapi.HandoverSlots{{State: shardapi.HandoverGiven, Slots: schedule.FormatSlots(schedule.SlotRange(sl, sl)),
			Leases: []shardapi.HandoverLease{
				{Key: a.Key, Slot: sl, Lease: httpserve.FormatLease(77), Expires: expires, Rev: a.Rev},
				{Key: b.Key, Slot: sl, Lease: httpserve.FormatLease(78), Expires: expires, Rev: b.Rev},
			}}}})
	if got := claim("after the handover"); len(got) != 0 {
		t.Fatalf("handed out %s, leased by the giver", got[0].Key)
	}
	itemB := []CompleteItem{{Key: b.Key, Lease: 78}}
	if _, err := e.sh.Complete(e.ctx, itemB); !errors.Is(err, core.ErrRowNotRead) {
		t.Fatalf("completing b before its row was read: %v, want ErrRowNotRead", err)
	}
	e.pumpUntil("b read", func() bool {
		e.sh.mu.Lock()
		defer e.sh.mu.Unlock()
		_, held := e.sh.core.HeldRev(b.Key)
		return held
	})
	if got := claim("once b was read"); len(got) != 0 {
		t.Fatalf("handed out %s: b arrived leased by the giver's worker", got[0].Key)
	}
	res, err := e.sh.Complete(e.ctx, itemB)
	if err != nil || len(res) != 1 || res[0] != nil {
		t.Fatalf("completing b under the giver's lease: %v %v", res, err)
	}
	// a's lease ends: a is handed out again
	e.clock.Set(expires)
	if got := claim("after a's lease"); len(got) != 1 || got[0].Key != a.Key {
		t.Fatalf("after a's lease ended: %v, want a", got)
	}
}

// TestHandoverAnswerCountsFromTheCommit: a giver's answer counts from the epoch of the commit that
// gave the slot away when the settings name it (Arrival.Epoch) — a receiver that adopted later
// settings directly does not wait for the giver to reach those — and from the receiver's own
// epoch when they do not.
func TestHandoverAnswerCountsFromTheCommit(t *testing.T) {
	for _, tc := range []struct {
		name string
		// commit is Arrival.Epoch (0: not known); want the epoch the answer must come from
		commit, want int64
	}{
		{"commit known", 3, 3},
		{"commit not known", 0, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			settings := allSlots(0)
			settings.Epoch = 2
			settings.Owned = schedule.AllSlots().Minus(schedule.SlotRange(7, 7))
			e := newShardEnv(t, settings)
			settings.Epoch = 5
			settings.Owned = schedule.AllSlots()
			settings.Arriving = []Arrival{{From: "giver", Slots: schedule.SlotRange(7, 7), CommittedAt: t0, Epoch: tc.commit}}
			if err := e.sh.UpdateSettings(e.ctx, settings); err != nil {
				t.Fatal(err)
			}
			e.sh.mu.Lock()
			a, ok := e.sh.awaiting[7]
			e.sh.mu.Unlock()
			if !ok || a.epoch != tc.want {
				t.Fatalf("awaiting %+v %v, want the giver's answer from epoch %d", a, ok, tc.want)
			}
		})
	}
}
