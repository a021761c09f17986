package keeper

import (
	"context"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// rowEstimator is a store that can estimate its number of rows cheaply (the PostgreSQL store
// reads the planner's estimate).
type rowEstimator interface {
	EstimateRows(ctx context.Context) (int64, error)
}

// presize sizes the core's key index before the load, so that the load does not rebuild it as it
// grows. Only when the window is 0: then every row of the held slots is held, and the store's
// estimate times the share of slots held is the size to expect. With a window the share of rows
// held is not known before the first walk, and the index grows as needed (each rebuild reads the
// keys in storage order); later walks find it sized by the rows held.
func (s *Shard) presize(ctx context.Context) {
	est, ok := s.st.(rowEstimator)
	if !ok {
		return
	}
	s.mu.Lock()
	skip := s.cov.Loaded() || s.settings.Window > 0
	slots := len(s.settings.held())
	s.mu.Unlock()
	if skip || slots == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := est.EstimateRows(ctx)
	if err != nil || n <= 0 {
		return // only a hint: the load sizes the index as it goes
	}
	want := int(n * int64(slots) / schedule.NumSlots)
	s.mu.Lock()
	s.core.Reserve(want + want/16) // the estimate is approximate: some room above it
	s.mu.Unlock()
}
