package keeper

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store/memstore"
)

// TestEventFloodBecomesAGap: while the shard cannot keep up (its lock held), a flood of 5,000
// writes overflows its subscription's queue of 100 events. The shard does not buffer the flood:
// it turns inexact with the overflow as the gap's reason, walks once the queue is resumed, and
// is exact again holding every row.
func TestEventFloodBecomesAGap(t *testing.T) {
	st := memstore.New(memstore.Options{MaxQueuedEvents: 100})
	sh, err := NewShard(Options{Name: "flood", Store: st, Log: logr.Discard()}, allSlots(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- sh.Run(ctx, nil) }()
	eventually(t, "the load", 10*time.Second, sh.Ready)

	const n = 5000
	rows := make([]schedule.Row, n)
	for i := range rows {
		rows[i] = srow(fmt.Sprintf("https://example.com/flood/%d", i), time.Now().Add(-time.Hour), time.Hour)
	}
	sh.mu.Lock() // the shard falls behind
	_, err = st.Upsert(ctx, rows)
	sh.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "exact again with every row", 20*time.Second, func() bool {
		s := sh.Status(time.Now())
		return s.Exact && s.Rows.Held == n
	})
	sh.mu.Lock()
	gap, _ := sh.cov.LastGap()
	seq, reason := gap.Seq, gap.Reason
	sh.mu.Unlock()
	if seq != 1 || !strings.Contains(reason, "queue is full") {
		t.Fatalf("gaps %d, last reason %q; want one, the overflow", seq, reason)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
