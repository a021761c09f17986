package console

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

func queueWithDue(ns, name string, due int64, exact bool, asOf *metav1.Time) rqv1.RenderQueue {
	return rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Status: rqv1.RenderQueueStatus{Due: due, DueExact: exact, DueAsOf: asOf}}
}

func TestHistoryBoundedAndOrdered(t *testing.T) {
	h, err := NewHistory(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if h.Capacity() != 61 {
		t.Fatalf("capacity = %d, want 61 (an hour of 1-minute samples, both ends)", h.Capacity())
	}
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	asOf := metav1.NewTime(t0)
	// Three hours of samples: only the last hour's 61 are kept, oldest first.
	var now time.Time
	for i := range 181 {
		now = t0.Add(time.Duration(i) * time.Minute)
		h.Record(now, []rqv1.RenderQueue{queueWithDue("ns", "a", int64(i), i%2 == 0, &asOf)})
	}
	got := h.Samples("ns", "a", now)
	if len(got) != 61 {
		t.Fatalf("%d samples kept, want 61", len(got))
	}
	for i, s := range got {
		want := int64(120 + i)
		if s.Due != want || !s.At.Equal(t0.Add(time.Duration(want)*time.Minute)) || s.Exact != (want%2 == 0) || !s.Known {
			t.Fatalf("sample %d = %+v, want due %d", i, s, want)
		}
	}
	// Samples older than an hour before now are not returned even when still in the ring.
	if n := len(h.Samples("ns", "a", now.Add(30*time.Minute))); n != 31 {
		t.Errorf("half an hour later %d samples are within the hour, want 31", n)
	}
	if h.Samples("ns", "b", now) != nil {
		t.Error("an unknown queue has samples")
	}
}

func TestHistoryForgetsDeletedQueues(t *testing.T) {
	h, err := NewHistory(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	h.Record(now, []rqv1.RenderQueue{queueWithDue("ns", "a", 1, true, nil), queueWithDue("ns", "b", 2, true, nil)})
	h.Record(now.Add(10*time.Second), []rqv1.RenderQueue{queueWithDue("ns", "b", 3, true, nil)})
	if s := h.Samples("ns", "a", now.Add(10*time.Second)); s != nil {
		t.Errorf("a deleted queue kept its samples: %+v", s)
	}
	s := h.Samples("ns", "b", now.Add(10*time.Second))
	if len(s) != 2 || s[0].Known || s[1].Due != 3 {
		t.Errorf("b = %+v (a status without dueAsOf is recorded as not known)", s)
	}
	if len(h.queues) != 1 {
		t.Errorf("%d queues held, want 1", len(h.queues))
	}
}

func TestNewHistoryRejectsBadIntervals(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second, 2 * time.Hour} {
		if _, err := NewHistory(d); err == nil {
			t.Errorf("NewHistory(%s) succeeded", d)
		}
	}
}
