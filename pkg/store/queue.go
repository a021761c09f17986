package store

import (
	"unsafe"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// MaxBatchEvents caps the events one Subscription.Next returns.
const MaxBatchEvents = 8192

// queued is one queued subscription item: an event, or a gap or resumed signal.
type queued struct {
	kind BatchKind
	ev   Event
	err  error
}

// EventQueue is a subscription's queue of change events, gaps and resumptions, bounded for a
// consumer that falls behind: the one implementation of those rules for every Store.
//
//   - It holds at most maxEvents events and, when maxBytes > 0, events of at most maxBytes
//     (EventBytes). An event that finds it full starts an overflow: a gap (whose cause the
//     overflow function gives), and every event is dropped until the consumer has taken all that
//     are queued; then resumed.
//   - One gap covers every cause that holds at the time (a lost connection, an overflow, dropped
//     payloads): a second gap is not queued while one is open, and resumed is queued only once no
//     cause holds.
//
// It is not safe for concurrent use: the subscription serialises calls under its own lock.
type EventQueue struct {
	maxEvents int
	maxBytes  int64
	overflow  func(events int, bytes int64) error

	items []queued
	head  int
	// gapOpen: a gap is queued with no resumed after it; lost: the source is disconnected;
	// overflowing: events are being dropped.
	gapOpen, lost, overflowing bool
	events                     int   // queued events
	bytes                      int64 // EventBytes of the queued events
	dropped                    int64 // events dropped so far
}

// NewEventQueue returns an empty queue of at most maxEvents events and, when maxBytes > 0,
// maxBytes bytes. overflow returns the cause of the gap an overflow signals, given what is queued
// then (it may also log).
func NewEventQueue(maxEvents int, maxBytes int64, overflow func(events int, bytes int64) error) *EventQueue {
	return &EventQueue{maxEvents: maxEvents, maxBytes: maxBytes, overflow: overflow}
}

// EventBytes is about the memory a queued event holds: the queue entry and its key (routes are
// interned by the stores, shared by every row of the route).
func EventBytes(ev *Event) int64 {
	return int64(unsafe.Sizeof(queued{})) + int64(len(ev.Row.Key))
}

// Push queues an event, or drops it while the queue overflows.
func (q *EventQueue) Push(ev Event) {
	switch {
	case q.overflowing:
		q.dropped++
	case q.events >= q.maxEvents || (q.maxBytes > 0 && q.bytes+EventBytes(&ev) > q.maxBytes):
		q.overflowing = true
		q.dropped++
		q.Gap(q.overflow(q.events, q.bytes))
	default:
		q.add(queued{kind: KindEvents, ev: ev})
		q.events++
		q.bytes += EventBytes(&ev)
	}
}

// Gap queues a gap with cause err, unless one is open.
func (q *EventQueue) Gap(err error) {
	if !q.gapOpen {
		q.add(queued{kind: KindGap, err: err})
		q.gapOpen = true
	}
}

// Resumed queues resumed after an open gap, once no cause of a gap holds.
func (q *EventQueue) Resumed() {
	if q.gapOpen && !q.lost && !q.overflowing {
		q.add(queued{kind: KindResumed})
		q.gapOpen = false
	}
}

// SetLost records that the source of events was lost (a gap with cause err) or is back (resumed,
// unless the queue still overflows).
func (q *EventQueue) SetLost(lost bool, err error) {
	q.lost = lost
	if lost {
		q.Gap(err)
	} else {
		q.Resumed()
	}
}

// add appends an item, first moving the unread ones to the front once half the slice is read.
func (q *EventQueue) add(it queued) {
	if q.head > 0 && q.head >= len(q.items)/2 {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items = q.items[:n]
		q.head = 0
	}
	q.items = append(q.items, it)
}

// Take removes the next batch: up to MaxBatchEvents events of the slots in slots (events of other
// slots are dropped), or one gap or resumed. Once an overflowing queue is empty it queues resumed
// first: events are accepted again from here on. It reports false when nothing is queued.
func (q *EventQueue) Take(slots *[schedule.NumSlots]bool) (Batch, bool) {
	if q.overflowing && q.head == len(q.items) {
		q.overflowing = false
		q.Resumed()
	}
	var evs []Event
	for q.head < len(q.items) {
		it := &q.items[q.head]
		if it.kind != KindEvents {
			if len(evs) > 0 {
				break
			}
			b := Batch{Kind: it.kind, Err: it.err}
			*it = queued{}
			q.head++
			return b, true
		}
		q.events--
		q.bytes -= EventBytes(&it.ev)
		if slots[schedule.SlotOf(it.ev.Row.KeyHash)] {
			if evs == nil {
				evs = make([]Event, 0, min(MaxBatchEvents, len(q.items)-q.head))
			}
			evs = append(evs, it.ev)
		}
		*it = queued{}
		q.head++
		if len(evs) == MaxBatchEvents {
			break
		}
	}
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	}
	if len(evs) == 0 {
		return Batch{}, false
	}
	return Batch{Kind: KindEvents, Events: evs}, true
}

// Stats returns the events queued, their EventBytes and the events dropped so far.
func (q *EventQueue) Stats() (events int, bytes, dropped int64) {
	return q.events, q.bytes, q.dropped
}

// Clear drops everything queued (a closed subscription).
func (q *EventQueue) Clear() {
	clear(q.items)
	q.items, q.head, q.events, q.bytes = nil, 0, 0, 0
}
