package keeper

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// TestArrivingSlotAsksToRetry: a completion, release or extension under a lease this shard does
// not know, of a row in a slot coming to it (incoming: prepared, the commit not adopted here yet,
// while its giver, which adopts first, already sends workers here with movedTo), is answered
// ErrHandoverPending (503 with Retry-After: the lease may be on its way) and changes nothing —
// not refused as a lost lease, which would make the worker drop a render it did. In an owned slot
// with nothing arriving, the same is refused per item.
func TestArrivingSlotAsksToRetry(t *testing.T) {
	e := newShardEnv(t, allSlots(0))
	var rows []schedule.Row
	for i := 0; len(rows) < 2; i++ {
		r := e.upsert(srow(fmt.Sprintf("https://shop.example/p/%d", i), t0.Add(-time.Hour), time.Hour))[0]
		if len(rows) == 0 || schedule.SlotOf(r.KeyHash) != schedule.SlotOf(rows[0].KeyHash) {
			rows = append(rows, r)
		}
	}
	arriving := schedule.SlotOf(rows[0].KeyHash)
	settings := allSlots(0)
	settings.Epoch = 2
	settings.Incoming = schedule.SlotRange(arriving, arriving)
	settings.Owned = schedule.AllSlots().Minus(settings.Incoming)
	if err := e.sh.UpdateSettings(e.ctx, settings); err != nil {
		t.Fatal(err)
	}
	e.sh.Walk(e.ctx, true)
	const unknown = 0xfeedface
	now := e.clock.Now()

	arrivingItem := []CompleteItem{{Key: rows[0].Key, Lease: unknown}}
	if _, err := e.sh.Complete(e.ctx, arrivingItem); !errors.Is(err, ErrHandoverPending) {
		t.Errorf("completing an unknown lease of an arriving slot: %v, want ErrHandoverPending", err)
	}
	if _, err := e.sh.Release(now, arrivingItem); !errors.Is(err, ErrHandoverPending) {
		t.Errorf("releasing it: %v, want ErrHandoverPending", err)
	}
	if _, _, err := e.sh.Extend(now, arrivingItem, time.Minute); !errors.Is(err, ErrHandoverPending) {
		t.Errorf("extending it: %v, want ErrHandoverPending", err)
	}

	// an owned slot's row: a lease it does not know is refused per item, at once
	owned := []CompleteItem{{Key: rows[1].Key, Lease: unknown}}
	res, err := e.sh.Complete(e.ctx, owned)
	if err != nil || len(res) != 1 || res[0] == nil {
		t.Errorf("completing an unknown lease of an owned slot: %v, %v; want a per-item refusal", res, err)
	}

	// once the slot is owned and nothing arrives, the arriving row's unknown lease is refused too
	settings.Owned, settings.Incoming = schedule.AllSlots(), schedule.SlotSet{}
	settings.Epoch = 3
	if err := e.sh.UpdateSettings(e.ctx, settings); err != nil {
		t.Fatal(err)
	}
	e.sh.mu.Lock()
	e.sh.awaiting = nil // no giver to ask in this test: its handover is not awaited
	e.sh.mu.Unlock()
	res, err = e.sh.Complete(e.ctx, arrivingItem)
	if err != nil || len(res) != 1 || res[0] == nil {
		t.Errorf("completing an unknown lease once the slot is owned: %v, %v; want a per-item refusal", res, err)
	}
}
