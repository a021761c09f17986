package clientmetrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/renderqueue/renderqueue/pkg/client/clientmetrics"
)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := clientmetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := clientmetrics.New(reg); err == nil {
		t.Error("registering the metrics twice did not fail")
	}
	m.Claim("rows")
	m.Claimed(3)
	m.Completion("completed", 2)
	m.Completion("rejected", 0) // nothing, not even the series
	m.Release(1)
	m.Extension("refused", 1)
	m.Rendered("success", time.Second)
	m.InFlightAdd(2)
	m.InFlightAdd(-1)
	want := `
# HELP renderqueue_worker_claimed_rows_total Rows handed out by claims.
# TYPE renderqueue_worker_claimed_rows_total counter
renderqueue_worker_claimed_rows_total 3
# HELP renderqueue_worker_completions_total Rows sent for completion by result: completed, rejected by the shard (lease no longer current), error (not delivered).
# TYPE renderqueue_worker_completions_total counter
renderqueue_worker_completions_total{result="completed"} 2
# HELP renderqueue_worker_in_flight Rows being rendered now.
# TYPE renderqueue_worker_in_flight gauge
renderqueue_worker_in_flight 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "renderqueue_worker_claimed_rows_total",
		"renderqueue_worker_completions_total", "renderqueue_worker_in_flight"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(reg, "renderqueue_worker_render_seconds"); n != 1 {
		t.Errorf("%d render histograms, want 1", n)
	}

	var none *clientmetrics.Metrics // records nothing, and does not panic
	none.Claim("rows")
	none.InFlightAdd(1)
}
