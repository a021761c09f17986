package keeper

import (
	"math"
	"runtime/metrics"
	"testing"
)

func TestHistQuantile(t *testing.T) {
	buckets := []float64{math.Inf(-1), 1, 2, 3, math.Inf(1)}
	a := &metrics.Float64Histogram{Buckets: buckets, Counts: []uint64{5, 5, 5, 5}}
	for _, tc := range []struct {
		name   string
		counts []uint64 // b's counts: a's plus what the run added
		q      float64
		want   float64
	}{
		{name: "nothing added", counts: []uint64{5, 5, 5, 5}, q: 0.99, want: 0},
		// 100 added: 98 in [1,2), 2 in [2,3): the 99th is in [2,3)
		{name: "p99 in the tail", counts: []uint64{5, 103, 7, 5}, q: 0.99, want: 3},
		{name: "p50", counts: []uint64{5, 103, 7, 5}, q: 0.5, want: 2},
		// what a had before does not count: only one added, in [-inf,1)
		{name: "earlier counts ignored", counts: []uint64{6, 5, 5, 5}, q: 1, want: 1},
		{name: "the last bucket", counts: []uint64{5, 5, 5, 6}, q: 1, want: math.Inf(1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &metrics.Float64Histogram{Buckets: buckets, Counts: tc.counts}
			if got := histQuantile(a, b, tc.q); got != tc.want {
				t.Errorf("histQuantile(q=%v) = %v, want %v", tc.q, got, tc.want)
			}
		})
	}
}
