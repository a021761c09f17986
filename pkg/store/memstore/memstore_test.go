package memstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T, o storetest.Options) store.Store {
			return New(Options{PageRows: o.PageRows, SegmentSlots: o.SegmentSlots, FailSegment: o.FailSegment})
		},
		BreakSubscriptions: func(t *testing.T, st store.Store) { st.(*Store).BreakSubscriptions() },
	})
}

// TestDisconnectLosesWrites: writes between DisconnectSubscriptions and ReconnectSubscriptions
// are not delivered, as with a real connection loss.
func TestDisconnectLosesWrites(t *testing.T) {
	st := New(Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub, err := st.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	st.DisconnectSubscriptions()
	if _, err := st.Upsert(ctx, []schedule.Row{storetest.Row("lost", time.Now())}); err != nil {
		t.Fatal(err)
	}
	st.ReconnectSubscriptions()
	if _, err := st.Upsert(ctx, []schedule.Row{storetest.Row("kept", time.Now())}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 3 {
		b, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if b.Kind != store.KindEvents {
			got = append(got, b.Kind.String())
			continue
		}
		for _, e := range b.Events {
			got = append(got, e.Row.Key)
		}
	}
	if want := []string{"gap", "resumed", "https://example.com/kept"}; len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestHashOption: a custom hash places rows in chosen slots.
func TestHashOption(t *testing.T) {
	lo, _ := schedule.SlotHashRange(5)
	st := New(Options{Hash: func(string) int64 { return lo + 1 }})
	out, err := st.Upsert(context.Background(), []schedule.Row{storetest.Row("x", time.Now())})
	if err != nil || out[0].Slot() != 5 {
		t.Fatalf("slot %d, err %v", out[0].Slot(), err)
	}
}

// TestEventQueueOverflow: a flood of events a consumer does not take fills its queue to
// MaxQueuedEvents, then becomes a gap; once the consumer has taken the queue it is resumed and
// later writes are delivered again.
func TestEventQueueOverflow(t *testing.T) {
	const max = 50
	st := New(Options{MaxQueuedEvents: max})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub, err := st.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	rows := make([]schedule.Row, 1000)
	for i := range rows {
		rows[i] = storetest.Row(fmt.Sprintf("flood/%d", i), time.Now())
	}
	if _, err := st.Upsert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	queued, _, _ := sub.(*subscription).q.Stats()
	st.mu.Unlock()
	if queued > max {
		t.Fatalf("%d events queued, at most %d", queued, max)
	}
	n := storetest.ExpectOverflow(t, sub, max, ErrOverflow, func() schedule.Row {
		out, err := st.Upsert(ctx, []schedule.Row{storetest.Row("after", time.Now())})
		if err != nil {
			t.Fatal(err)
		}
		return out[0]
	})
	if n != max {
		t.Fatalf("%d events before the gap, want %d", n, max)
	}
}
