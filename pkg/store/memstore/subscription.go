package memstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
)

// maxBatchEvents caps the events one Next returns.
const maxBatchEvents = 8192

// errDisconnected is the cause of gaps made by DisconnectSubscriptions.
var errDisconnected = errors.New("memstore: subscription disconnected by the test")

// ErrOverflow is the cause of the gap signalled when a subscription's queue is full.
var ErrOverflow = errors.New("memstore: change events arrived faster than they were taken: the queue is full and events were dropped")

type item struct {
	kind store.BatchKind
	ev   store.Event
	err  error
}

// subscription implements store.Subscription. Its fields are guarded by s.mu (the store's lock),
// so publishing and SetSlots are ordered with writes.
type subscription struct {
	s            *Store
	slots        [schedule.NumSlots]bool
	queue        []item
	disconnected bool
	// gapOpen: a gap is queued with no resumed after it; overflow: the queue was full and
	// events are dropped until the consumer has taken all that are queued.
	gapOpen, overflow bool
	closed            bool
	wake              chan struct{}
	done              chan struct{}
	closeOnce         sync.Once
	stopAfter         func() bool
}

func (sub *subscription) signal() {
	select {
	case sub.wake <- struct{}{}:
	default:
	}
}

// publish queues events of subscribed slots (caller holds s.mu).
func (sub *subscription) publish(evs []store.Event) {
	if sub.disconnected || sub.closed {
		return
	}
	n := 0
	for _, e := range evs {
		if !sub.slots[schedule.SlotOf(e.Row.KeyHash)] || sub.overflow {
			continue
		}
		if len(sub.queue) >= sub.s.opts.MaxQueuedEvents {
			sub.overflow = true
			sub.gap(fmt.Errorf("%w (%d events)", ErrOverflow, sub.s.opts.MaxQueuedEvents))
			n++
			continue
		}
		sub.queue = append(sub.queue, item{kind: store.KindEvents, ev: e})
		n++
	}
	if n > 0 {
		sub.signal()
	}
}

// gap queues a gap unless one is open; resumed queues resumed once no cause of a gap holds.
func (sub *subscription) gap(err error) {
	if !sub.gapOpen {
		sub.queue = append(sub.queue, item{kind: store.KindGap, err: err})
		sub.gapOpen = true
	}
}

func (sub *subscription) resumed() {
	if sub.gapOpen && !sub.disconnected && !sub.overflow {
		sub.queue = append(sub.queue, item{kind: store.KindResumed})
		sub.gapOpen = false
	}
}

func (sub *subscription) disconnect() {
	if sub.disconnected || sub.closed {
		return
	}
	sub.disconnected = true
	sub.gap(errDisconnected)
	sub.signal()
}

func (sub *subscription) reconnect() {
	if !sub.disconnected || sub.closed {
		return
	}
	sub.disconnected = false
	sub.resumed()
	sub.signal()
}

// take removes the next batch (caller holds s.mu). Once an overflowing queue is empty, it
// queues resumed.
func (sub *subscription) take() (store.Batch, bool) {
	if sub.overflow && len(sub.queue) == 0 {
		sub.overflow = false
		sub.resumed()
	}
	var evs []store.Event
	i := 0
	for ; i < len(sub.queue); i++ {
		it := sub.queue[i]
		if it.kind != store.KindEvents {
			if len(evs) > 0 {
				break
			}
			sub.queue = sub.queue[i+1:]
			return store.Batch{Kind: it.kind, Err: it.err}, true
		}
		if sub.slots[schedule.SlotOf(it.ev.Row.KeyHash)] {
			evs = append(evs, it.ev)
			if len(evs) == maxBatchEvents {
				i++
				break
			}
		}
	}
	sub.queue = sub.queue[i:]
	if len(sub.queue) == 0 {
		sub.queue = nil
	}
	if len(evs) == 0 {
		return store.Batch{}, false
	}
	return store.Batch{Kind: store.KindEvents, Events: evs}, true
}

// Next implements store.Subscription.
func (sub *subscription) Next(ctx context.Context) (store.Batch, error) {
	for {
		sub.s.mu.Lock()
		if sub.closed {
			sub.s.mu.Unlock()
			return store.Batch{}, store.ErrClosed
		}
		b, ok := sub.take()
		sub.s.mu.Unlock()
		if ok {
			return b, nil
		}
		select {
		case <-sub.wake:
		case <-sub.done:
		case <-ctx.Done():
			return store.Batch{}, ctx.Err()
		}
	}
}

// SetSlots implements store.Subscription; it takes effect at once.
func (sub *subscription) SetSlots(ctx context.Context, slots []int) error {
	norm, err := store.NormalizeSlots(slots)
	if err != nil {
		return fmt.Errorf("set slots: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("set slots: %w", err)
	}
	sub.s.mu.Lock()
	defer sub.s.mu.Unlock()
	if sub.closed {
		return store.ErrClosed
	}
	sub.slots = [schedule.NumSlots]bool{}
	for _, sl := range norm {
		sub.slots[sl] = true
	}
	return nil
}

// Close implements store.Subscription.
func (sub *subscription) Close() error {
	sub.closeOnce.Do(func() {
		sub.s.mu.Lock()
		sub.closed = true
		sub.queue = nil
		delete(sub.s.subs, sub)
		sub.s.mu.Unlock()
		close(sub.done)
		if sub.stopAfter != nil {
			sub.stopAfter()
		}
	})
	return nil
}
