package shardmetrics

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/renderqueue/renderqueue/pkg/keeper/core"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
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

// TestClassWaiting: renderqueue_keeper_class_waiting_seconds and _ratio are, per cadence class
// and source, the longest wait (in seconds, and in cadences) of its classes at the status's asOf;
// 0 for classes not waiting and for every class the shard does not have.
func TestClassWaiting(t *testing.T) {
	asOf := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) *time.Time { at := asOf.Add(-d); return &at }
	st := shardapi.Status{AsOf: asOf, Classes: []shardapi.Class{
		{Cadence: 3600, Source: "discovered", WaitingSince: ago(90 * time.Minute)},  // 1h: starving, 1.5 cadences
		{Cadence: 1800, Source: "discovered", WaitingSince: ago(30 * time.Minute)},  // also 1h: 1 cadence, shorter wait
		{Cadence: 24 * 3600, Source: "submitted", WaitingSince: ago(6 * time.Hour)}, // 0.25 cadences
		{Cadence: 96 * 3600, Source: "discovered"},                                  // not waiting
		{Cadence: 96 * 3600, Source: "submitted", WaitingSince: ago(-time.Minute)},  // since after asOf: not waiting
	}}
	c := NewStatusCollector(func() shardapi.Status { return st })
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	want := `
# HELP renderqueue_keeper_class_waiting_ratio How long the class has had due rows and no render, in cadences, by cadence class (cadence_le) and source: the largest of its classes; above 1 the class is starving (RenderQueueClassStarving).
# TYPE renderqueue_keeper_class_waiting_ratio gauge
`
	wantSeconds := `
# HELP renderqueue_keeper_class_waiting_seconds How long the class has had due rows and no render (waitingSince in /v1/status), by cadence class (cadence_le) and source: the longest of its classes; 0 when none is waiting.
# TYPE renderqueue_keeper_class_waiting_seconds gauge
`
	for _, cad := range CadenceClasses() {
		for _, src := range []string{"discovered", "submitted"} {
			ratio, secs := "0", "0"
			switch cad + "/" + src {
			case "1h/discovered":
				ratio, secs = "1.5", "5400"
			case "24h/submitted":
				ratio, secs = "0.25", "21600"
			}
			want += fmt.Sprintf("renderqueue_keeper_class_waiting_ratio{cadence_le=%q,source=%q} %s\n", cad, src, ratio)
			wantSeconds += fmt.Sprintf("renderqueue_keeper_class_waiting_seconds{cadence_le=%q,source=%q} %s\n", cad, src, secs)
		}
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want+wantSeconds),
		"renderqueue_keeper_class_waiting_ratio", "renderqueue_keeper_class_waiting_seconds"); err != nil {
		t.Error(err)
	}
}
