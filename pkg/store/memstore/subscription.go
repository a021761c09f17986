package memstore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
)

// errDisconnected is the cause of gaps made by DisconnectSubscriptions.
var errDisconnected = errors.New("memstore: subscription disconnected by the test")

// ErrOverflow is the cause of the gap signalled when a subscription's queue is full.
var ErrOverflow = errors.New("memstore: change events arrived faster than they were taken: the queue is full and events were dropped")

// subscription implements store.Subscription. Its fields are guarded by s.mu (the store's lock),
// so publishing and SetSlots are ordered with writes.
type subscription struct {
	s     *Store
	slots [schedule.NumSlots]bool
	// q is the queue of events, gaps and resumptions (store.EventQueue: its bound and how gaps of
	// different causes combine); a test's disconnection is its SetLost.
	q            *store.EventQueue
	disconnected bool
	closed       bool
	wake         chan struct{}
	done         chan struct{}
	closeOnce    sync.Once
	stopAfter    func() bool
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
		if sub.slots[schedule.SlotOf(e.Row.KeyHash)] {
			sub.q.Push(e)
			n++
		}
	}
	if n > 0 {
		sub.signal()
	}
}

func (sub *subscription) disconnect() {
	if sub.disconnected || sub.closed {
		return
	}
	sub.disconnected = true
	sub.q.SetLost(true, errDisconnected)
	sub.signal()
}

func (sub *subscription) reconnect() {
	if !sub.disconnected || sub.closed {
		return
	}
	sub.disconnected = false
	sub.q.SetLost(false, nil)
	sub.signal()
}

// Next implements store.Subscription.
func (sub *subscription) Next(ctx context.Context) (store.Batch, error) {
	for {
		sub.s.mu.Lock()
		if sub.closed {
			sub.s.mu.Unlock()
			return store.Batch{}, store.ErrClosed
		}
		b, ok := sub.q.Take(&sub.slots)
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
		sub.q.Clear()
		delete(sub.s.subs, sub)
		sub.s.mu.Unlock()
		close(sub.done)
		if sub.stopAfter != nil {
			sub.stopAfter()
		}
	})
	return nil
}
