package store

import (
	"errors"
	"slices"
	"testing"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

var errFull = errors.New("full")

func ev(key string, hash int64) Event {
	return Event{Row: schedule.Row{Key: key, KeyHash: hash}}
}

func kinds(t *testing.T, q *EventQueue, slots *[schedule.NumSlots]bool) []string {
	t.Helper()
	var out []string
	for {
		b, ok := q.Take(slots)
		if !ok {
			return out
		}
		switch b.Kind {
		case KindEvents:
			for _, e := range b.Events {
				out = append(out, e.Row.Key)
			}
		default:
			out = append(out, b.Kind.String())
		}
	}
}

func TestEventQueue(t *testing.T) {
	all := &[schedule.NumSlots]bool{}
	for i := range all {
		all[i] = true
	}
	t.Run("overflow: a gap, drops until drained, then resumed", func(t *testing.T) {
		q := NewEventQueue(2, 0, func(n int, _ int64) error { return errFull })
		for _, k := range []string{"a", "b", "c", "d"} {
			q.Push(ev(k, 0))
		}
		if n, _, dropped := q.Stats(); n != 2 || dropped != 2 {
			t.Fatalf("queued %d dropped %d", n, dropped)
		}
		got := kinds(t, q, all)
		if want := []string{"a", "b", "gap", "resumed"}; !slices.Equal(got, want) {
			t.Fatalf("took %v, want %v", got, want)
		}
		q.Push(ev("e", 0))
		if got := kinds(t, q, all); !slices.Equal(got, []string{"e"}) {
			t.Fatalf("after resuming: %v", got)
		}
	})
	t.Run("one gap for overlapping causes; resumed once none holds", func(t *testing.T) {
		q := NewEventQueue(1, 0, func(int, int64) error { return errFull })
		q.SetLost(true, errors.New("lost"))
		q.Push(ev("a", 0))
		q.Push(ev("b", 0)) // overflow while lost: no second gap
		q.SetLost(false, nil)
		// still overflowing: no resumed until the queue is drained, and resumed means continuity:
		// an event pushed right after it is delivered, never dropped silently
		var got []string
		for range 3 {
			b, ok := q.Take(all)
			if !ok {
				t.Fatalf("took only %v", got)
			}
			got = append(got, b.Kind.String())
		}
		if !slices.Equal(got, []string{"gap", "events", "resumed"}) {
			t.Fatalf("took %v", got)
		}
		q.Push(ev("d", 0))
		if got := kinds(t, q, all); !slices.Equal(got, []string{"d"}) {
			t.Fatalf("after resumed: %v", got)
		}
		q.Gap(errors.New("bad payload"))
		q.Gap(errors.New("another"))
		q.Resumed()
		if got := kinds(t, q, all); !slices.Equal(got, []string{"gap", "resumed"}) {
			t.Fatalf("took %v", got)
		}
	})
	t.Run("byte bound and slot filter", func(t *testing.T) {
		per := EventBytes(&Event{Row: schedule.Row{Key: "k1"}})
		q := NewEventQueue(100, 2*per, func(int, int64) error { return errFull })
		q.Push(ev("k1", 0))
		q.Push(ev("k2", 0))
		q.Push(ev("k3", 0))
		if n, b, d := q.Stats(); n != 2 || b != 2*per || d != 1 {
			t.Fatalf("queued %d (%d bytes), dropped %d", n, b, d)
		}
		none := &[schedule.NumSlots]bool{}
		if got := kinds(t, q, none); !slices.Equal(got, []string{"gap", "resumed"}) {
			t.Fatalf("with no slots: %v", got)
		}
		if n, b, _ := q.Stats(); n != 0 || b != 0 {
			t.Fatalf("after taking: %d events, %d bytes", n, b)
		}
	})
}
