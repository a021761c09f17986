package keeper

import (
	"runtime/metrics"
	"testing"
)

// runtimeSample is a reading of the Go runtime's own metrics, taken at both ends of a claim-load
// run: what the scheduler and the garbage collector did while the run measured its latencies.
type runtimeSample []metrics.Sample

// The metrics a runtimeSample reads, in this order.
const (
	rtSchedLatencies = iota // how long goroutines waited, runnable, to run
	rtGCPauses              // the collector's stop-the-world pauses
	rtGCCycles              // collections
	rtMutexWait             // how long goroutines waited for any sync.Mutex or RWMutex, or a lock of the runtime's
	rtCount
)

var runtimeMetricNames = [rtCount]string{
	rtSchedLatencies: "/sched/latencies:seconds",
	rtGCPauses:       "/sched/pauses/total/gc:seconds",
	rtGCCycles:       "/gc/cycles/total:gc-cycles",
	rtMutexWait:      "/sync/mutex/wait/total:seconds",
}

// readRuntime reads the runtime's metrics now.
func readRuntime() runtimeSample {
	s := make(runtimeSample, rtCount)
	for i, n := range runtimeMetricNames {
		s[i].Name = n
	}
	metrics.Read(s)
	return s
}

// histQuantile returns the upper bound of the bucket that holds quantile q of the counts that
// b added to a (two readings of one cumulative histogram); 0 when it added none.
func histQuantile(a, b *metrics.Float64Histogram, q float64) float64 {
	var total uint64
	for i := range b.Counts {
		total += b.Counts[i] - a.Counts[i]
	}
	if total == 0 {
		return 0
	}
	want := max(1, uint64(q*float64(total)))
	var seen uint64
	for i := range b.Counts {
		seen += b.Counts[i] - a.Counts[i]
		if seen >= want {
			return b.Buckets[i+1]
		}
	}
	return b.Buckets[len(b.Buckets)-1]
}

// report adds to b what the runtime did between the readings a and end: the scheduler's
// latency p99 (goroutines runnable but not running: every P busy, or its thread not running),
// the collections and their longest pause, and the total wait for mutexes.
func (a runtimeSample) report(b *testing.B, end runtimeSample) {
	if len(a) != rtCount || len(end) != rtCount {
		return
	}
	b.ReportMetric(1e6*histQuantile(a[rtSchedLatencies].Value.Float64Histogram(), end[rtSchedLatencies].Value.Float64Histogram(), 0.99), "sched-p99-us")
	b.ReportMetric(1e6*histQuantile(a[rtGCPauses].Value.Float64Histogram(), end[rtGCPauses].Value.Float64Histogram(), 1), "gc-pause-max-us")
	b.ReportMetric(float64(end[rtGCCycles].Value.Uint64()-a[rtGCCycles].Value.Uint64()), "gc-cycles")
	b.ReportMetric(end[rtMutexWait].Value.Float64()-a[rtMutexWait].Value.Float64(), "mutex-wait-s")
}
