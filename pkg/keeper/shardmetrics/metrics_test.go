package shardmetrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/renderqueue/renderqueue/pkg/keeper/core"
)

func TestCadenceClass(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{time.Minute, "15m"}, {15 * time.Minute, "15m"}, {16 * time.Minute, "1h"}, {time.Hour, "1h"},
		{24 * time.Hour, "24h"}, {25 * time.Hour, "96h"}, {96 * time.Hour, "96h"}, {720 * time.Hour, "720h"},
		{721 * time.Hour, "+Inf"},
	} {
		if got := cadenceClass(c.d); got != c.want {
			t.Errorf("cadenceClass(%v) = %q, want %q", c.d, got, c.want)
		}
	}
	if got := strings.Join(CadenceClasses(), ","); got != "15m,1h,6h,24h,96h,168h,720h,+Inf" {
		t.Errorf("CadenceClasses %s", got)
	}
}

// BenchmarkMetricsClaimed measures what the claim metrics add to a claim of 100 rows (counted by
// class, relative lateness observed per row), outside the shard's lock.
func BenchmarkMetricsClaimed(b *testing.B) {
	m := New(prometheus.NewRegistry())
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	rows := make([]core.Claimed, 100)
	for i := range rows {
		rows[i] = core.Claimed{Due: now.Add(-time.Duration(i) * time.Minute), Cadence: []time.Duration{time.Hour, 24 * time.Hour, 96 * time.Hour}[i%3]}
	}
	b.ReportAllocs()
	for b.Loop() {
		m.Claimed(now, rows, time.Millisecond)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(rows)), "ns/row")
}
