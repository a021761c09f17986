// Package workersim simulates a fleet of render workers against keeper shards' HTTP API
// (`renderqueue worker-sim`): each worker claims a batch of due rows (POST /v1/claim), "renders"
// each one for a simulated time, and completes the rendered rows with their leases
// (POST /v1/complete, leaving nextDue empty so the shard schedules now + cadence).
//
// Workers take the shards round robin. A 503 (the shard is still loading), an empty claim or a
// transient failure makes the worker back off (doubling up to MaxBackoff, reset by the next
// successful claim); a reply that says the simulator itself is misconfigured (400, 401, 403, 404)
// stops the whole run with an error. When the context is cancelled the workers stop: rows already
// rendered are completed and the rest of each claimed batch is released (POST /v1/release), so no
// lease is left to expire.
package workersim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// Config configures a simulation. Shards is required; zero values of the rest give the defaults.
type Config struct {
	// Shards are the base URLs of the keeper shards (e.g. http://127.0.0.1:8080).
	Shards []string
	// Token is the bearer token sent with every request; empty sends none.
	Token string
	// Concurrency is the number of workers. Default 4.
	Concurrency int
	// Batch is how many rows a worker claims at once (1..shardapi.MaxClaim). Default 10.
	Batch int
	// RenderTime is the mean simulated render time of one row. Default 50ms.
	RenderTime time.Duration
	// Jitter spreads render times uniformly over RenderTime·[1−Jitter, 1+Jitter] (0..1).
	Jitter float64
	// LeaseSeconds is the lease asked for with each claim; 0 takes the shard's default.
	LeaseSeconds float64
	// Backoff is the first wait after a 503, an empty claim or a failure. Default 100ms.
	Backoff time.Duration
	// MaxBackoff caps the doubling backoff. Default 2s.
	MaxBackoff time.Duration
	// StopTimeout bounds the final complete and release calls made after the context is
	// cancelled. Default 5s.
	StopTimeout time.Duration
	// Client makes the requests. Default: a client with a 30s timeout.
	Client *http.Client
	// Seed seeds the render time jitter.
	Seed uint64
	// Render simulates rendering one row for d. Default: wait d or until ctx is done, returning
	// ctx.Err() then. A non-nil error means the row was not rendered.
	Render func(ctx context.Context, row shardapi.ClaimedRow, d time.Duration) error
}

// Stats counts what a simulation did so far.
type Stats struct {
	// Claims is the number of successful claim requests, Claimed the rows they returned.
	Claims, Claimed int64
	// Completed is the rows the shards confirmed completed; Rejected the rows sent for completion
	// that the shards did not complete (lease expired or superseded).
	Completed, Rejected int64
	// Released is the rows handed back unrendered at stop.
	Released int64
	// Empty counts claims that returned no rows; Unavailable counts 503 replies.
	Empty, Unavailable int64
	// Errors counts failed requests (network errors, unexpected replies); LastError is the last.
	Errors    int64
	LastError string
}

// Sim is a running or finished simulation. Create it with New, run it with Run.
type Sim struct {
	cfg    Config
	shards []string

	next atomic.Uint64 // round robin

	claims, claimed, completed, rejected, released atomic.Int64
	empty, unavailable, errs                       atomic.Int64
	lastErrMu                                      sync.Mutex
	lastErr                                        string
}

// New checks cfg and returns a simulation ready to Run.
func New(cfg Config) (*Sim, error) {
	if len(cfg.Shards) == 0 {
		return nil, errors.New("workersim: no shard URL")
	}
	shards := make([]string, 0, len(cfg.Shards))
	for _, s := range cfg.Shards {
		s = strings.TrimRight(strings.TrimSpace(s), "/")
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("workersim: shard URL %q is not an http(s) URL", s)
		}
		shards = append(shards, s)
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 10
	}
	if cfg.Batch > shardapi.MaxClaim {
		return nil, fmt.Errorf("workersim: batch %d is more than the shard allows (%d)", cfg.Batch, shardapi.MaxClaim)
	}
	if cfg.RenderTime < 0 {
		return nil, fmt.Errorf("workersim: negative render time %v", cfg.RenderTime)
	}
	if cfg.RenderTime == 0 {
		cfg.RenderTime = 50 * time.Millisecond
	}
	if cfg.Jitter < 0 || cfg.Jitter > 1 {
		return nil, fmt.Errorf("workersim: jitter %v is not within [0, 1]", cfg.Jitter)
	}
	if cfg.LeaseSeconds < 0 {
		return nil, fmt.Errorf("workersim: negative lease %v", cfg.LeaseSeconds)
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.Backoff {
		cfg.MaxBackoff = max(2*time.Second, cfg.Backoff)
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = 5 * time.Second
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 30 * time.Second}
	}
	if cfg.Render == nil {
		cfg.Render = sleepRender
	}
	return &Sim{cfg: cfg, shards: shards}, nil
}

func sleepRender(ctx context.Context, _ shardapi.ClaimedRow, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stats returns the counts so far. It is safe to call while Run runs.
func (s *Sim) Stats() Stats {
	s.lastErrMu.Lock()
	last := s.lastErr
	s.lastErrMu.Unlock()
	return Stats{
		Claims: s.claims.Load(), Claimed: s.claimed.Load(),
		Completed: s.completed.Load(), Rejected: s.rejected.Load(), Released: s.released.Load(),
		Empty: s.empty.Load(), Unavailable: s.unavailable.Load(),
		Errors: s.errs.Load(), LastError: last,
	}
}

// Run runs the workers until ctx is done (then it returns nil once every worker has completed or
// released what it held) or until a shard's reply shows the simulation is misconfigured (then it
// stops the workers the same way and returns that error).
func (s *Sim) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for w := range s.cfg.Concurrency {
		rng := rand.New(rand.NewPCG(s.cfg.Seed, uint64(w)+1))
		wg.Go(func() {
			if err := s.worker(ctx, rng); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// fatalError is a reply that retrying cannot fix.
type fatalError struct{ err error }

func (e fatalError) Error() string { return e.err.Error() }
func (e fatalError) Unwrap() error { return e.err }

// statusError is a non-2xx reply.
type statusError struct {
	url    string
	code   int
	detail string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%s: %d %s: %s", e.url, e.code, http.StatusText(e.code), e.detail)
}

func (s *Sim) worker(ctx context.Context, rng *rand.Rand) error {
	backoff := s.cfg.Backoff
	wait := func() {
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		backoff = min(2*backoff, s.cfg.MaxBackoff)
	}
	for ctx.Err() == nil {
		shard := s.shards[(s.next.Add(1)-1)%uint64(len(s.shards))]
		var resp shardapi.ClaimResponse
		err := s.post(ctx, shard, "/v1/claim", shardapi.ClaimRequest{N: s.cfg.Batch, LeaseSeconds: s.cfg.LeaseSeconds}, &resp)
		if ctx.Err() != nil {
			// Rows the shard leased to a claim whose reply we abandoned lapse with their lease.
			return nil
		}
		var se *statusError
		switch {
		case errors.As(err, &se) && se.code == http.StatusServiceUnavailable:
			s.unavailable.Add(1)
			wait()
			continue
		case errors.As(err, &se) && isFatal(se.code):
			s.fail(err)
			return fatalError{err}
		case err != nil:
			s.fail(err)
			wait()
			continue
		}
		s.claims.Add(1)
		if len(resp.Items) == 0 {
			s.empty.Add(1)
			wait()
			continue
		}
		backoff = s.cfg.Backoff
		s.claimed.Add(int64(len(resp.Items)))
		if err := s.renderBatch(ctx, rng, shard, resp.Items); err != nil {
			return err
		}
	}
	return nil
}

func isFatal(code int) bool {
	switch code {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed:
		return true
	}
	return false
}

// renderBatch renders the claimed rows one after another and completes those rendered; when ctx
// is done midway it completes what was rendered and releases the rest.
func (s *Sim) renderBatch(ctx context.Context, rng *rand.Rand, shard string, items []shardapi.ClaimedRow) error {
	done := make([]shardapi.Completion, 0, len(items))
	var rest []shardapi.Lease
	for i, it := range items {
		if err := s.cfg.Render(ctx, it, s.renderTime(rng)); err != nil {
			for _, r := range items[i:] {
				rest = append(rest, shardapi.Lease{Key: r.Key, Lease: r.Lease})
			}
			break
		}
		done = append(done, shardapi.Completion{Key: it.Key, Lease: it.Lease})
	}
	// Finish with a context that outlives a cancelled run, for a bounded time.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.StopTimeout)
	defer cancel()
	var fatal error
	if len(done) > 0 {
		var resp shardapi.CompleteResponse
		if err := s.post(fctx, shard, "/v1/complete", shardapi.CompleteRequest{Items: done}, &resp); err != nil {
			s.fail(fmt.Errorf("completing %d rows: %w", len(done), err))
			if se := (*statusError)(nil); errors.As(err, &se) && isFatal(se.code) {
				fatal = fatalError{err}
			}
		} else {
			s.completed.Add(int64(resp.Completed))
			s.rejected.Add(int64(max(len(done)-resp.Completed, 0)))
		}
	}
	if len(rest) > 0 {
		var resp shardapi.ReleaseResponse
		if err := s.post(fctx, shard, "/v1/release", shardapi.ReleaseRequest{Items: rest}, &resp); err != nil {
			s.fail(fmt.Errorf("releasing %d rows: %w", len(rest), err))
		} else {
			s.released.Add(int64(resp.Released))
		}
	}
	return fatal
}

func (s *Sim) renderTime(rng *rand.Rand) time.Duration {
	if s.cfg.Jitter == 0 {
		return s.cfg.RenderTime
	}
	f := 1 + s.cfg.Jitter*(2*rng.Float64()-1)
	return time.Duration(f * float64(s.cfg.RenderTime))
}

func (s *Sim) fail(err error) {
	s.errs.Add(1)
	s.lastErrMu.Lock()
	s.lastErr = err.Error()
	s.lastErrMu.Unlock()
}

// maxReply bounds the size of a reply body read.
const maxReply = 64 << 20

// post sends body as JSON to shard+path and decodes a 2xx reply into out.
func (s *Sim) post(ctx context.Context, shard, path string, body, out any) error {
	u := shard + path
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("encoding the %s request: %w", path, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("building the %s request: %w", path, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if s.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+s.cfg.Token)
	}
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", u, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxReply))
	if err != nil {
		return fmt.Errorf("POST %s: reading the reply: %w", u, err)
	}
	if resp.StatusCode/100 != 2 {
		detail := strings.TrimSpace(string(data))
		var e shardapi.Error
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			detail = e.Error
		}
		if len(detail) > 300 {
			detail = detail[:300] + "..."
		}
		return &statusError{url: "POST " + u, code: resp.StatusCode, detail: detail}
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("POST %s: decoding the reply: %w", u, err)
	}
	return nil
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0)) }
