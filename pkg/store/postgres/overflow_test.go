package postgres

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/storetest"
)

// TestEventQueueOverflow: a flood of 20,000 events that nobody takes fills the subscription's
// queue to MaxQueuedEvents and no further — the rest are dropped and signalled as one gap — and
// once the consumer has taken the queue it is resumed and later writes flow again.
func TestEventQueueOverflow(t *testing.T) {
	const max, n = 500, 20000
	st, _ := openTestStore(t, Options{MaxQueuedEvents: max})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := st.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	sub := s.(*subscription)
	rows := make([]schedule.Row, n)
	for i := range rows {
		rows[i] = storetest.Row(fmt.Sprintf("flood/%d", i), time.Now())
	}
	for i := 0; i < n; i += 1000 { // 20 statements
		if _, err := st.Upsert(ctx, rows[i:i+1000]); err != nil {
			t.Fatal(err)
		}
	}
	// every event is either queued or dropped, and the queue never held more than max
	for deadline := time.Now().Add(30 * time.Second); ; {
		sub.mu.Lock()
		queued, _, dropped := sub.q.Stats()
		sub.mu.Unlock()
		if queued > max {
			t.Fatalf("%d events queued, more than %d", queued, max)
		}
		if int64(queued)+dropped == n {
			t.Logf("%d events queued, %d dropped", queued, dropped)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d queued and %d dropped of %d events", queued, dropped, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	got := storetest.ExpectOverflow(t, s, max, errOverflow, func() schedule.Row {
		out, err := st.Upsert(ctx, []schedule.Row{storetest.Row("after", time.Now())})
		if err != nil {
			t.Fatal(err)
		}
		return out[0]
	})
	if got != max {
		t.Fatalf("%d events before the gap, want %d", got, max)
	}
}

// TestEventQueueByteBound: with long keys the queue's byte bound is reached first.
func TestEventQueueByteBound(t *testing.T) {
	const maxBytes = 100 << 10
	st, _ := openTestStore(t, Options{MaxQueuedBytes: maxBytes})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := st.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	sub := s.(*subscription)
	rows := make([]schedule.Row, 1000)
	for i := range rows {
		rows[i] = storetest.Row(fmt.Sprintf("long/%04d/%s", i, strings.Repeat("k", 2000)), time.Now())
	}
	if _, err := st.Upsert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	perEvent := store.EventBytes(&store.Event{Row: rows[0]})
	for deadline := time.Now().Add(30 * time.Second); ; {
		sub.mu.Lock()
		queued, bytes, dropped := sub.q.Stats()
		sub.mu.Unlock()
		if bytes > maxBytes {
			t.Fatalf("%d bytes queued, more than %d", bytes, maxBytes)
		}
		if int64(queued)+dropped == int64(len(rows)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d queued and %d dropped", queued, dropped)
		}
		time.Sleep(10 * time.Millisecond)
	}
	want := int(maxBytes / perEvent)
	if got := storetest.ExpectOverflow(t, s, want, errOverflow, func() schedule.Row {
		out, err := st.Upsert(ctx, []schedule.Row{storetest.Row("after", time.Now())})
		if err != nil {
			t.Fatal(err)
		}
		return out[0]
	}); got != want {
		t.Fatalf("%d events before the gap, want %d (%d bytes each)", got, want, perEvent)
	}
}
