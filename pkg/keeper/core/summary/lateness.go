package summary

import (
	"math"
	"slices"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/duetree"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// classLateness adds the due rows of run (one group of class cl) to the class's lateness: its
// most overdue row and the LateBy buckets, counted from the tree at each bucket's bound.
func classLateness(f *duetree.Forest, cl *Class, nowMs int64, run dueRun) {
	cl.MaxLateSeconds = max(cl.MaxLateSeconds, float64(nowMs-run.firstMs)/1000)
	// above is the number of due rows later than bucket i's bound: (now − due) × den >
	// cadence × num, that is due < now − cadence × num ÷ den, or due ≤ floor((now × den −
	// cadence × num − 1) ÷ den) (all positive).
	prev := run.n
	for i := range shardapi.LateBuckets - 1 {
		num, den := shardapi.LateBound(i)
		above := f.Rank(run.t, (nowMs*den-run.cadenceMs*num-1)/den)
		cl.LateBy[i] += prev - above
		prev = above
	}
	cl.LateBy[shardapi.LateBuckets-1] += prev
}

// dueRun is the due rows of one group's owned tree: its first n entries.
type dueRun struct {
	t         *duetree.Tree
	n         int
	cadenceMs int64
	first     duetree.Entry
	firstMs   int64 // the earliest due time of the run
	lastMs    int64 // the latest due time of the run (at or before now)
}

// lateness fills the lateness summary and the oldest row from the due rows of runs. The
// percentiles are exact nearest-rank values, found by binary search over the value with counts
// from the trees (no pass over the rows).
func lateness(f *duetree.Forest, s *Summary, nowMs int64, runs []dueRun, key func(id uint32) string) {
	total := 0
	oldest := runs[0]
	maxRel := 0.0
	for _, r := range runs {
		total += r.n
		if f.Compare(r.first, oldest.first) < 0 {
			oldest = r
		}
		maxRel = max(maxRel, relLate(nowMs, r.firstMs, r.cadenceMs))
	}
	s.Oldest = &OldestRow{Key: key(oldest.first.ID()), Due: time.UnixMilli(oldest.firstMs).UTC()}
	s.Lateness.MaxSeconds = float64(nowMs-oldest.firstMs) / 1000
	s.Lateness.MaxRelative = maxRel
	s.Lateness.P50Seconds = float64(nowMs-dueQuantile(f, runs, total, 0.50, oldest.firstMs, nowMs)) / 1000
	s.Lateness.P99Seconds = float64(nowMs-dueQuantile(f, runs, total, 0.99, oldest.firstMs, nowMs)) / 1000
	s.Lateness.P50Relative = relQuantile(f, runs, total, 0.50, nowMs, maxRel)
	s.Lateness.P99Relative = relQuantile(f, runs, total, 0.99, nowMs, maxRel)
}

func relLate(nowMs, dueMs, cadenceMs int64) float64 {
	return float64(nowMs-dueMs) / float64(cadenceMs)
}

// rankOf returns the nearest-rank position (1-based) of quantile q among n values.
func rankOf(q float64, n int) int {
	return max(1, min(n, int(math.Ceil(q*float64(n)))))
}

// quantileCandidates is how few rows a quantile search narrows down to before it reads them and
// picks the answer by sorting.
const quantileCandidates = 256

// dueQuantile returns the due time of the row whose lateness is the q-quantile (nearest rank) of
// the due rows: the k-th latest due time is the (total − k + 1)-th earliest. lo and hi bound the
// due rows' due times.
func dueQuantile(f *duetree.Forest, runs []dueRun, total int, q float64, lo, hi int64) int64 {
	j := total - rankOf(q, total) + 1
	// the answer is the smallest x with at least j rows due at or before it; bisect (lo, hi] with
	// count(lo) < j ≤ count(hi) until few rows lie between, then read those
	count := func(x int64) int {
		n := 0
		for _, r := range runs {
			n += f.Rank(r.t, x)
		}
		return n
	}
	lo--
	nlo, nhi := 0, total
	for nhi-nlo > quantileCandidates && hi-lo > 1 {
		m := lo + (hi-lo)/2
		if n := count(m); n >= j {
			hi, nhi = m, n
		} else {
			lo, nlo = m, n
		}
	}
	var cand []int64
	for _, r := range runs {
		f.Visit(r.t, f.Rank(r.t, lo), f.Rank(r.t, hi), func(e duetree.Entry) {
			cand = append(cand, f.DueMs(e))
		})
	}
	slices.Sort(cand)
	return cand[j-nlo-1]
}

// relQuantile returns the q-quantile (nearest rank) of the due rows' relative lateness, computed
// as float64(now − due) / float64(cadence): the smallest value x with at least k rows at or below
// it. The search bisects over the ordered bit patterns of non-negative float64s until few rows lie
// between its bounds, then reads those.
func relQuantile(f *duetree.Forest, runs []dueRun, total int, q float64, nowMs int64, maxRel float64) float64 {
	k := rankOf(q, total)
	// positions of each run's rows with relative lateness ≤ x are its last cntLE(r, x) due rows
	cntLE := func(r *dueRun, x float64) int { return r.n - f.Rank(r.t, relThreshold(r, nowMs, x)-1) }
	count := func(x float64) int {
		n := 0
		for i := range runs {
			n += cntLE(&runs[i], x)
		}
		return n
	}
	// the smallest value is the least late row of some run: start the search there
	minRel := maxRel
	for _, r := range runs {
		minRel = min(minRel, relLate(nowMs, r.lastMs, r.cadenceMs))
	}
	nlo := count(minRel)
	if nlo >= k {
		return minRel
	}
	lo, hi := math.Float64bits(minRel), math.Float64bits(maxRel) // count(lo) < k ≤ count(hi)
	nhi := total
	for nhi-nlo > quantileCandidates && hi-lo > 1 {
		m := lo + (hi-lo)/2
		if n := count(math.Float64frombits(m)); n >= k {
			hi, nhi = m, n
		} else {
			lo, nlo = m, n
		}
	}
	var cand []float64
	xlo, xhi := math.Float64frombits(lo), math.Float64frombits(hi)
	for i := range runs {
		r := &runs[i]
		f.Visit(r.t, r.n-cntLE(r, xhi), r.n-cntLE(r, xlo), func(e duetree.Entry) {
			cand = append(cand, relLate(nowMs, f.DueMs(e), r.cadenceMs))
		})
	}
	slices.Sort(cand)
	return cand[k-nlo-1]
}

// relThreshold returns the earliest due time d in [r.firstMs, now] whose relative lateness is at
// most x (x ≥ 0): relative lateness does not increase with d, so the rows of r with relative
// lateness ≤ x are those due in [d, now]. It starts from now − x·cadence and corrects the float
// rounding by stepping, falling back to bisection.
func relThreshold(r *dueRun, nowMs int64, x float64) int64 {
	le := func(d int64) bool { return relLate(nowMs, d, r.cadenceMs) <= x }
	lo, hi := r.firstMs, nowMs // le(hi) holds: relative lateness 0
	if le(lo) {
		return lo
	}
	// le(lo) is false and le(hi) true: find the boundary, first near the estimate
	if est := float64(nowMs) - x*float64(r.cadenceMs); est > float64(lo) && est < float64(hi) {
		d := int64(est)
		for range 4 {
			if le(d) {
				hi = d
				if !le(d - 1) {
					return d
				}
				d--
			} else {
				lo = d
				d++
			}
			if d <= lo || d >= hi {
				break
			}
		}
	}
	for hi-lo > 1 {
		m := lo + (hi-lo)/2
		if le(m) {
			hi = m
		} else {
			lo = m
		}
	}
	return hi
}
