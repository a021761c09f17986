package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// Handler renders one row. Its context is cancelled when the row's lease is lost (cause
// ErrLeaseLost: the row may be someone else's now, stop rendering it) or when Run's drain time is
// up (cause ErrShutdown); context.Cause tells which.
type Handler func(ctx context.Context, it Item) (Result, error)

// Result is a successful render.
type Result struct {
	// NextDue overrides the row's next render time; zero leaves it to the RenderQueue's
	// spec.priority.reschedule policy (by default the row's own schedule: due + whole cadences).
	NextDue time.Time
}

// ErrShutdown is the cause of a handler's cancelled context when Run's drain time is up.
var ErrShutdown = errors.New("worker shutting down: drain time is up")

// MaxRetryAfter is the longest RetryAfter the shards can honour (their longest lease).
const MaxRetryAfter = 24 * time.Hour

// RetryAfter wraps a render error so that Run, instead of releasing the row at once, leaves it
// leased for d (at most MaxRetryAfter): the row is handed out again once d has passed. The row's
// due time does not change.
func RetryAfter(err error, d time.Duration) error {
	return &retryAfterError{err: err, after: min(d, MaxRetryAfter)}
}

type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("%v (retry after %v)", e.err, e.after)
}

func (e *retryAfterError) Unwrap() error { return e.err }

// Run claims rows and renders them with h, up to concurrency at once, until ctx is cancelled or a
// shard's answer shows the client is misconfigured (a *StatusError that is Fatal: wrong token,
// wrong URL). It claims only as many rows as it has idle handlers (at most Options.Batch per
// claim), from the shards with the most work (see Claim), backing off while none has any.
//
// A handler's nil error completes the row on the shard that leased it (at Result.NextDue when
// set); an error releases it (or leaves it leased for the RetryAfter time). Completions and
// releases to one shard are sent together when several are waiting. While a handler runs, its
// row's lease is extended each time half of it has passed; if the shard refuses (the lease
// lapsed or the row moved), the handler's context is cancelled with ErrLeaseLost and the row is
// neither completed nor released.
//
// When ctx is cancelled Run stops claiming, releases every row claimed but not started, lets the
// running handlers finish (for up to Options.DrainTimeout, then cancels their contexts with
// ErrShutdown), sends their completions and releases (for up to Options.StopTimeout) and returns
// nil. After a fatal answer it does the same and returns that error.
func (c *Client) Run(ctx context.Context, concurrency int, h Handler) error {
	if concurrency < 1 {
		return fmt.Errorf("run: concurrency %d is below 1", concurrency)
	}
	if h == nil {
		return errors.New("run: no handler")
	}
	if err := c.waitKnown(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	handlersCtx, stopHandlers := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopHandlers(nil)
	ackCtx, stopAcks := context.WithCancel(context.WithoutCancel(ctx))
	defer stopAcks()
	a := &acker{c: c, ctx: ackCtx, queues: map[string]*ackQueue{}}

	work := make(chan Item)
	busy := make(chan struct{}, concurrency) // one token per row handed to a handler, not finished
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for it := range work {
				c.handle(handlersCtx, a, h, it)
				<-busy
			}
		})
	}

	var runErr error
claiming:
	for {
		select {
		case busy <- struct{}{}:
		case <-ctx.Done():
			break claiming
		}
		n := 1
	fill:
		for n < c.opts.Batch {
			select {
			case busy <- struct{}{}:
				n++
			default:
				break fill
			}
		}
		items, err := c.claimWait(ctx, n)
		for range n - len(items) {
			<-busy
		}
		if err != nil {
			runErr = err
			break
		}
		for i, it := range items {
			if ctx.Err() != nil {
				// claimed but never started: hand back at once
				for _, rest := range items[i:] {
					a.release(rest)
					<-busy
				}
				break claiming
			}
			work <- it
		}
	}
	close(work)

	drain := time.AfterFunc(c.opts.DrainTimeout, func() { stopHandlers(ErrShutdown) })
	wg.Wait()
	drain.Stop()
	stop := time.AfterFunc(c.opts.StopTimeout, stopAcks)
	a.wait()
	stop.Stop()
	return runErr
}

// claimWait claims up to n rows, waiting (per-shard back-off, or a change of the shard set) while
// no shard has any. It returns no rows and no error once ctx is done, and an error only when
// retrying cannot help. The claim request itself is not cut short by ctx: rows it hands out after
// ctx is done are returned, and Run releases them.
func (c *Client) claimWait(ctx context.Context, n int) ([]Item, error) {
	idle := c.opts.Backoff // used while there is no shard at all
	for {
		items, err := c.Claim(context.WithoutCancel(ctx), n)
		if len(items) > 0 {
			return items, nil
		}
		var se *StatusError
		if errors.As(err, &se) && se.Fatal() {
			return nil, err
		}
		if err != nil {
			c.log.V(1).Info("No shard answered the claim; backing off", "error", err.Error())
		}
		at, changed, ok := c.nextTry()
		d := time.Until(at)
		if !ok {
			d = idle.Step()
		}
		d = max(d, 5*time.Millisecond)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-changed:
		case <-ctx.Done():
			t.Stop()
			return nil, nil
		}
		t.Stop()
	}
}

// handle runs h on one row and settles the row: complete, release, or leave it leased for a
// retry.
func (c *Client) handle(base context.Context, a *acker, h Handler, it Item) {
	hctx, cancel := context.WithCancelCause(base)
	defer cancel(nil)
	lk := c.keepLease(a.ctx, it, cancel)
	c.opts.Metrics.InFlightAdd(1)
	start := time.Now()
	res, err := call(hctx, h, it)
	took := time.Since(start)
	c.opts.Metrics.InFlightAdd(-1)
	it, lost := lk.stop()
	switch {
	case lost:
		c.opts.Metrics.Rendered("lease_lost", took)
	case err == nil:
		c.opts.Metrics.Rendered("success", took)
		a.complete(Completion{Item: it, NextDue: res.NextDue})
	default:
		c.opts.Metrics.Rendered("error", took)
		c.log.V(1).Info("Render failed", "key", it.Key, "error", err.Error())
		var ra *retryAfterError
		if errors.As(err, &ra) && ra.after > 0 {
			_, errs, xerr := c.Extend(a.ctx, []Item{it}, ra.after)
			if xerr == nil {
				if errs[0] != nil {
					c.st.leaseLost.Add(1)
				}
				return
			}
			// the shard could not be asked: release it instead
		}
		a.release(it)
	}
}

// call runs h, turning a panic into an error.
func call(ctx context.Context, h Handler, it Item) (res Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return h(ctx, it)
}

// leaseKeeper extends one rendering row's lease each time half of it has passed.
type leaseKeeper struct {
	c      *Client
	ctx    context.Context
	cancel context.CancelCauseFunc

	mu      sync.Mutex
	it      Item
	timer   *time.Timer
	stopped bool
	lost    bool
}

func (c *Client) keepLease(ctx context.Context, it Item, cancel context.CancelCauseFunc) *leaseKeeper {
	k := &leaseKeeper{c: c, ctx: ctx, cancel: cancel, it: it}
	if it.leaseFor > 0 {
		k.timer = time.AfterFunc(time.Until(it.claimedAt.Add(it.leaseFor/2)), k.extend)
	}
	return k
}

func (k *leaseKeeper) extend() {
	k.mu.Lock()
	if k.stopped {
		k.mu.Unlock()
		return
	}
	it := k.it
	k.mu.Unlock()
	leaseFor := k.c.opts.Lease
	if leaseFor == 0 || (it.leaseFor > 0 && it.leaseFor < leaseFor) {
		leaseFor = it.leaseFor // the shard gives no more than its longest lease
	}
	ctx, cancel := context.WithTimeout(k.ctx, max(leaseFor/4, time.Second))
	sent := time.Now()
	out, errs, err := k.c.Extend(ctx, []Item{it}, k.c.opts.Lease)
	cancel()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped {
		return
	}
	switch {
	case err != nil:
		// not asked: try again soon, while the lease may still stand
		k.timer = time.AfterFunc(max(leaseFor/10, 100*time.Millisecond), k.extend)
	case errs[0] != nil:
		k.lost = true
		k.c.st.leaseLost.Add(1)
		k.c.log.Info("Lease lost while rendering; cancelling the render", "key", it.Key, "shard", it.Shard, "reason", errs[0].Error())
		k.cancel(fmt.Errorf("%w: %v", ErrLeaseLost, errs[0]))
	default:
		k.it = out[0]
		k.it.claimedAt, k.it.leaseFor = sent, leaseFor
		k.timer = time.AfterFunc(leaseFor/2, k.extend)
	}
}

// stop ends the extensions and returns the row as last extended, and whether its lease was lost.
func (k *leaseKeeper) stop() (Item, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopped = true
	if k.timer != nil {
		k.timer.Stop()
	}
	return k.it, k.lost
}

// acker sends completions and releases, per shard, several at a time: while one request to a
// shard is in flight, the next ones wait and go together.
type acker struct {
	c   *Client
	ctx context.Context

	mu     sync.Mutex
	queues map[string]*ackQueue
	wg     sync.WaitGroup
}

type ackQueue struct {
	complete []Completion
	release  []Item
	running  bool
}

func (a *acker) complete(d Completion) { a.add(d.Item.Shard, &d, nil) }
func (a *acker) release(it Item)       { a.add(it.Shard, nil, &it) }

func (a *acker) add(shard string, d *Completion, it *Item) {
	a.mu.Lock()
	defer a.mu.Unlock()
	q := a.queues[shard]
	if q == nil {
		q = &ackQueue{}
		a.queues[shard] = q
	}
	if d != nil {
		q.complete = append(q.complete, *d)
	}
	if it != nil {
		q.release = append(q.release, *it)
	}
	if !q.running {
		q.running = true
		a.wg.Go(func() { a.flush(q) })
	}
}

func (a *acker) flush(q *ackQueue) {
	for {
		a.mu.Lock()
		done, rel := q.complete, q.release
		if len(done) > shardapi.MaxClaim {
			done, q.complete = done[:shardapi.MaxClaim], done[shardapi.MaxClaim:]
		} else {
			q.complete = nil
		}
		if len(rel) > shardapi.MaxClaim {
			rel, q.release = rel[:shardapi.MaxClaim], rel[shardapi.MaxClaim:]
		} else {
			q.release = nil
		}
		if len(done) == 0 && len(rel) == 0 {
			q.running = false
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		if len(done) > 0 {
			until := leasesEnd(len(done), func(i int) Item { return done[i].Item })
			a.retry("Completing rows failed; their leases will lapse and the rows be handed out again", len(done), until, func(ctx context.Context) error {
				_, err := a.c.Complete(ctx, done)
				return err
			})
		}
		if len(rel) > 0 {
			until := leasesEnd(len(rel), func(i int) Item { return rel[i] })
			a.retry("Releasing rows failed; their leases will lapse and the rows be handed out again", len(rel), until, func(ctx context.Context) error {
				_, err := a.c.Release(ctx, rel)
				return err
			})
		}
	}
}

// leasesEnd returns when the first of n leases lapses, by this process's clock.
func leasesEnd(n int, item func(i int) Item) time.Time {
	var end time.Time
	for i := range n {
		it := item(i)
		if e := it.claimedAt.Add(it.leaseFor); i == 0 || e.Before(end) {
			end = e
		}
	}
	return end
}

// retry repeats a request the shard did not answer (a network error or a 5xx: a shard
// restarting, its database away) with a growing, jittered back-off (at least the shard's
// Retry-After) for as long as the leases last: a completion that reaches the shard before the
// first lease lapses still counts, and one the shard already wrote is answered as written again.
// It stops at an answer retrying cannot change (Fatal), when the next attempt would come after
// until, or when the worker stops.
func (a *acker) retry(failed string, n int, until time.Time, f func(ctx context.Context) error) {
	b := Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 1 << 30, Cap: 10 * time.Second}
	var err error
	attempts := 0
	for {
		attempts++
		if err = f(a.ctx); err == nil {
			return
		}
		var se *StatusError
		if errors.As(err, &se) && se.Fatal() || a.ctx.Err() != nil {
			break
		}
		d := b.Step()
		if se != nil {
			d = max(d, se.RetryAfter)
		}
		if !time.Now().Add(d).Before(until) {
			break
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-a.ctx.Done():
		}
		t.Stop()
	}
	a.c.log.Error(err, failed, "rows", n, "attempts", attempts)
}

func (a *acker) wait() { a.wg.Wait() }
