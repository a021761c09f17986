// Package workersim simulates a fleet of render workers (`renderqueue worker-sim`), the stand-in
// renderer of the demo and the samples. It is a pkg/client worker whose handler "renders" each
// row for a simulated time: the library discovers the shards (a static list, the headless
// Service's DNS name, or the RenderQueue object), spreads the claims, backs off, completes each
// row on the shard that leased it (nextDue empty: the shard's
// reschedule policy), keeps long renders' leases,
// and on cancellation completes what was rendered and releases the rest.
package workersim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/renderqueue/renderqueue/pkg/client"
)

// Config configures a simulation. Client is required; zero values of the rest give the defaults.
type Config struct {
	// Client talks to the shards (discovery, token, batch, lease, back-off: client.Options).
	Client *client.Client
	// Concurrency is the number of rows rendering at once. Default 4.
	Concurrency int
	// RenderTime is the mean simulated render time of one row; 0 renders at once (workers claim
	// and complete as fast as the shards answer, as a throughput benchmark wants).
	RenderTime time.Duration
	// Jitter spreads render times uniformly over RenderTime·[1−Jitter, 1+Jitter] (0..1).
	Jitter float64
	// Seed seeds the render time jitter.
	Seed uint64
	// Render simulates rendering one row for d. Default: wait d or until ctx is done, returning
	// ctx.Err() then. A non-nil error means the row was not rendered (it is released).
	Render func(ctx context.Context, it client.Item, d time.Duration) error
}

// Sim is a simulation. Create it with New, run it with Run.
type Sim struct {
	cfg   Config
	rngMu sync.Mutex
	rng   *rand.Rand
}

// New checks cfg and returns a simulation ready to Run.
func New(cfg Config) (*Sim, error) {
	if cfg.Client == nil {
		return nil, errors.New("workersim: no client")
	}
	if cfg.Concurrency < 0 {
		return nil, fmt.Errorf("workersim: negative concurrency %d", cfg.Concurrency)
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 4
	}
	if cfg.RenderTime < 0 {
		return nil, fmt.Errorf("workersim: negative render time %v", cfg.RenderTime)
	}
	if cfg.Jitter < 0 || cfg.Jitter > 1 {
		return nil, fmt.Errorf("workersim: jitter %v is not within [0, 1]", cfg.Jitter)
	}
	if cfg.Render == nil {
		cfg.Render = sleepRender
	}
	return &Sim{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 1))}, nil
}

func sleepRender(ctx context.Context, _ client.Item, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stats returns the client's counts so far. It is safe to call while Run runs.
func (s *Sim) Stats() client.Stats { return s.cfg.Client.Stats() }

// Run renders until ctx is done (then it returns nil once every row was completed or released)
// or until a shard's answer shows the simulation is misconfigured (then it returns that error).
func (s *Sim) Run(ctx context.Context) error {
	return s.cfg.Client.Run(ctx, s.cfg.Concurrency, func(ctx context.Context, it client.Item) (client.Result, error) {
		return client.Result{}, s.cfg.Render(ctx, it, s.renderTime())
	})
}

func (s *Sim) renderTime() time.Duration {
	if s.cfg.Jitter == 0 {
		return s.cfg.RenderTime
	}
	s.rngMu.Lock()
	f := 1 + s.cfg.Jitter*(2*s.rng.Float64()-1)
	s.rngMu.Unlock()
	return time.Duration(f * float64(s.cfg.RenderTime))
}
