package console

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/console/view"
)

// History keeps, per RenderQueue, the samples of the last [view.HistorySpan] in a ring buffer of
// fixed capacity: memory is bounded by the number of RenderQueues times the capacity. It is safe
// for concurrent use. Queues that disappear from a recorded list are forgotten.
type History struct {
	capacity int
	span     time.Duration

	mu     sync.Mutex
	queues map[string]*ring
}

// ring is a fixed-capacity ring buffer of samples, oldest first from start.
type ring struct {
	buf   []view.Sample
	start int
	n     int
}

func (r *ring) add(s view.Sample) {
	if r.n < len(r.buf) {
		r.buf[(r.start+r.n)%len(r.buf)] = s
		r.n++
		return
	}
	r.buf[r.start] = s
	r.start = (r.start + 1) % len(r.buf)
}

// since returns the samples at or after t, oldest first.
func (r *ring) since(t time.Time) []view.Sample {
	out := make([]view.Sample, 0, r.n)
	for i := 0; i < r.n; i++ {
		s := r.buf[(r.start+i)%len(r.buf)]
		if !s.At.Before(t) {
			out = append(out, s)
		}
	}
	return out
}

// NewHistory returns a History for samples taken every interval over [view.HistorySpan]: each
// queue keeps span/interval + 1 samples.
func NewHistory(interval time.Duration) (*History, error) {
	if interval <= 0 || interval > view.HistorySpan {
		return nil, fmt.Errorf("history sample interval %s must be positive and at most %s", interval, view.HistorySpan)
	}
	return &History{
		capacity: int(view.HistorySpan/interval) + 1,
		span:     view.HistorySpan,
		queues:   map[string]*ring{},
	}, nil
}

// Capacity is the number of samples kept per queue.
func (h *History) Capacity() int { return h.capacity }

func queueKey(namespace, name string) string { return namespace + "/" + name }

// Record adds one sample at now for every queue of rqs and forgets queues not among them.
func (h *History) Record(now time.Time, rqs []rqv1.RenderQueue) {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := make(map[string]bool, len(rqs))
	for i := range rqs {
		rq := &rqs[i]
		k := queueKey(rq.Namespace, rq.Name)
		seen[k] = true
		r := h.queues[k]
		if r == nil {
			r = &ring{buf: make([]view.Sample, h.capacity)}
			h.queues[k] = r
		}
		r.add(view.Sample{At: now, Due: rq.Status.Due, Exact: rq.Status.DueExact, Known: rq.Status.DueAsOf != nil})
	}
	for k := range h.queues {
		if !seen[k] {
			delete(h.queues, k)
		}
	}
}

// Samples returns the samples of the queue taken within [view.HistorySpan] before now, oldest
// first; nil when the queue has none.
func (h *History) Samples(namespace, name string, now time.Time) []view.Sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.queues[queueKey(namespace, name)]
	if r == nil {
		return nil
	}
	return r.since(now.Add(-h.span))
}

// Sampler is a manager.Runnable that records every RenderQueue's status.due into a History every
// Interval, read through Reader (the manager's cached client). It runs on every operator replica,
// leader or not: each replica's console shows its own history.
type Sampler struct {
	// Reader lists RenderQueues.
	Reader client.Reader
	// History receives the samples.
	History *History
	// Interval between samples.
	Interval time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Logger receives list errors (a missed sample leaves a gap in the chart).
	Logger logr.Logger
}

var (
	_ manager.Runnable               = (*Sampler)(nil)
	_ manager.LeaderElectionRunnable = (*Sampler)(nil)
)

// NeedLeaderElection reports false: every replica samples.
func (s *Sampler) NeedLeaderElection() bool { return false }

// Start samples until ctx is done.
func (s *Sampler) Start(ctx context.Context) error {
	if s.Interval <= 0 {
		return fmt.Errorf("console sampler: interval %s must be positive", s.Interval)
	}
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	s.SampleOnce(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.SampleOnce(ctx)
		}
	}
}

// SampleOnce lists the RenderQueues and records one sample of each.
func (s *Sampler) SampleOnce(ctx context.Context) {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	var list rqv1.RenderQueueList
	if err := s.Reader.List(ctx, &list); err != nil {
		s.Logger.Error(err, "Listing RenderQueues for the due history failed; this sample is skipped")
		return
	}
	s.History.Record(now(), list.Items)
}
