package simulate

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Search is the outcome of NeededWorkers.
type Search struct {
	// Workers is the fewest workers whose run kept every objective; 0 when none up to the limit did.
	Workers int
	// At is the run at Workers (at the limit when none kept them); Below the run at Workers − 1
	// (nil when Workers is 1 or 0).
	At, Below *Result
	// Runs is how many simulations the search ran.
	Runs int
}

// NeededWorkers searches the fewest render workers that keep every objective of cfg, each
// worker rendering one row per renderTime (capacity = workers × 1h / renderTime), up to
// maxWorkers. It starts from the fewest workers that could render the fleet's demand at all and
// doubles until a count keeps them, then bisects (a simulation is deterministic for its seed).
// Both neighbours of the answer were run: its run keeps every objective (At), the run with one
// worker fewer does not (Below).
func NeededWorkers(cfg Config, renderTime time.Duration, maxWorkers int) (*Search, error) {
	if len(cfg.Objectives) == 0 {
		return nil, errors.New("searching workers: no objectives to meet")
	}
	if renderTime <= 0 || maxWorkers < 1 {
		return nil, fmt.Errorf("searching workers: render time %v and at most %d workers: want both positive", renderTime, maxWorkers)
	}
	s := &Search{}
	runs := map[int]*Result{}
	at := func(n int) (*Result, error) {
		if r, ok := runs[n]; ok {
			return r, nil
		}
		c := cfg
		c.Load = 0
		c.Capacity = float64(n) * float64(time.Hour) / float64(renderTime)
		r, err := Run(c)
		if err != nil {
			return nil, fmt.Errorf("simulating %d workers: %w", n, err)
		}
		s.Runs++
		runs[n] = r
		return r, nil
	}
	// the fewest workers that could render the demand at all, then doubling
	lo := 0 // a count known not to keep them (0: none)
	hi := max(1, int(math.Ceil(cfg.Fleet.withDefaults().Demand()*renderTime.Hours())))
	for {
		hi = min(hi, maxWorkers)
		r, err := at(hi)
		if err != nil {
			return nil, err
		}
		if r.Met() {
			break
		}
		if hi == maxWorkers {
			s.At = r
			return s, nil
		}
		lo = hi
		hi *= 2
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		r, err := at(mid)
		if err != nil {
			return nil, err
		}
		if r.Met() {
			hi = mid
		} else {
			lo = mid
		}
	}
	s.Workers, s.At = hi, runs[hi]
	if hi > 1 {
		s.Below = runs[hi-1] // bisected: the count below was run and did not keep them
	}
	return s, nil
}
