package seed

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// Upserter is the part of store.Store that Write needs.
type Upserter interface {
	Upsert(ctx context.Context, rows []schedule.Row) ([]schedule.Row, error)
}

// WriteOptions tunes Write.
type WriteOptions struct {
	// Batch is how many rows go into one Upsert. Default 5000.
	Batch int
	// Parallel is how many Upserts may be in flight at once. Default 2.
	Parallel int
	// Now is the instant due times are relative to. Required.
	Now time.Time
	// Clock measures elapsed time for progress reports. Default time.Now.
	Clock func() time.Time
	// Progress, when set, is called after every written batch (never concurrently).
	Progress func(Progress)
}

// Progress is a report on a Write in progress.
type Progress struct {
	Written int
	Total   int
	Elapsed time.Duration
}

// RowsPerSecond is the average write rate so far.
func (p Progress) RowsPerSecond() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Written) / p.Elapsed.Seconds()
}

// Summary describes the rows a Write wrote.
type Summary struct {
	Progress
	// DueNow counts the rows due at or before WriteOptions.Now.
	DueNow int
	// Urgent and Submitted count urgent and submitted rows.
	Urgent, Submitted int
	// ByRoute counts rows per route.
	ByRoute map[string]int
}

func (s *Summary) add(rows []schedule.Row, now time.Time) {
	if s.ByRoute == nil {
		s.ByRoute = make(map[string]int)
	}
	for i := range rows {
		r := &rows[i]
		s.Written++
		s.ByRoute[r.Route]++
		if r.HasDue && !r.Due.After(now) {
			s.DueNow++
		}
		if r.Urgent {
			s.Urgent++
		}
		if r.Source == schedule.SourceSubmitted {
			s.Submitted++
		}
	}
}

// Write generates the plan's rows and upserts them through up, opts.Batch rows per call, and
// returns what it wrote. On the first failed Upsert it stops (waiting for the calls in flight)
// and returns the error; the summary then counts the batches written before.
func Write(ctx context.Context, up Upserter, plan Plan, opts WriteOptions) (Summary, error) {
	plan = plan.Defaults()
	if err := plan.Validate(); err != nil {
		return Summary{}, fmt.Errorf("invalid seed plan: %w", err)
	}
	if opts.Now.IsZero() {
		return Summary{}, errors.New("seed: WriteOptions.Now is required")
	}
	if opts.Batch <= 0 {
		opts.Batch = 5000
	}
	if opts.Parallel <= 0 {
		opts.Parallel = 2
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	start := opts.Clock()
	sum := Summary{Progress: Progress{Total: plan.Rows}, ByRoute: map[string]int{}}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	starts := make(chan int)
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel()
	}
	for range opts.Parallel {
		wg.Go(func() {
			buf := make([]schedule.Row, 0, opts.Batch)
			for from := range starts {
				n := min(opts.Batch, plan.Rows-from)
				buf = plan.AppendRows(buf[:0], from, n, opts.Now)
				if _, err := up.Upsert(ctx, buf); err != nil {
					fail(fmt.Errorf("writing rows %d-%d: %w", from, from+n-1, err))
					return
				}
				mu.Lock()
				sum.add(buf, opts.Now)
				sum.Elapsed = opts.Clock().Sub(start)
				if opts.Progress != nil {
					opts.Progress(sum.Progress)
				}
				mu.Unlock()
			}
		})
	}
feed:
	for from := 0; from < plan.Rows; from += opts.Batch {
		select {
		case starts <- from:
		case <-ctx.Done():
			break feed
		}
	}
	close(starts)
	wg.Wait()
	sum.Elapsed = opts.Clock().Sub(start)
	if firstErr != nil {
		return sum, firstErr
	}
	if err := ctx.Err(); err != nil {
		return sum, fmt.Errorf("seeding stopped after %d of %d rows: %w", sum.Written, plan.Rows, err)
	}
	return sum, nil
}
