package keeper

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

func TestMetricsExposition(t *testing.T) {
	e := newShardEnv(t, allSlots(24*time.Hour))
	reg := prometheus.NewRegistry()
	sh, err := NewShard(Options{Name: "m", Store: e.fs, Clock: e.clock.Now, Log: logr.Discard(), Metrics: NewMetrics(reg)}, allSlots(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(NewStatusCollector(sh))
	e.upsert(srow("a", t0.Add(-time.Hour), time.Hour), srow("b", t0.Add(-2*time.Hour), 96*time.Hour))
	sh.Walk(e.ctx, true)
	sh.CheckEdge(e.clock.Now())
	claimed, err := sh.Claim(e.clock.Now(), 1, time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatal(claimed, err)
	}
	if _, err := sh.Complete(e.ctx, []CompleteItem{{Key: claimed[0].Key, Lease: claimed[0].Lease}, {Key: "b", Lease: 1}}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sh.Handler(HandlerOptions{Gatherer: reg}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	for _, want := range []string{
		"renderqueue_due 1",
		"renderqueue_exact 1",
		"renderqueue_complete 1",
		"renderqueue_rows_held 2", // "a" is held again, due in an hour
		"renderqueue_edge_ahead_seconds 86400",
		`renderqueue_walk_rows_total{kind="admitted"} 2`,
		`renderqueue_walks_total{result="complete"} 1`,
		`renderqueue_claimed_rows_total{cadence="1h0m0s",source="discovered"} 1`,
		`renderqueue_completed_rows_total{cadence="1h0m0s",result="ok",source="discovered"} 1`,
		`renderqueue_completed_rows_total{cadence="96h0m0s",result="lease_lost",source="discovered"} 1`,
		"renderqueue_claim_duration_seconds_count 1",
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestRecentStatusSharesOnePerSecond(t *testing.T) {
	e := newShardEnv(t, allSlots(24*time.Hour))
	e.upsert(srow("a", t0.Add(-time.Hour), time.Hour))
	e.sh.Walk(e.ctx, true)
	first := e.sh.RecentStatus(time.Second)
	if first.Due != 1 {
		t.Fatalf("due %d", first.Due)
	}
	claimed, err := e.sh.Claim(e.clock.Now(), 1, time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatal(claimed, err)
	}
	// within the second the same status (and its asOf) is served
	e.clock.Set(t0.Add(999 * time.Millisecond))
	if st := e.sh.RecentStatus(time.Second); st.Leased != 0 || !st.AsOf.Equal(first.AsOf) {
		t.Fatalf("not shared: leased %d asOf %v", st.Leased, st.AsOf)
	}
	// a second later it is computed again
	e.clock.Set(t0.Add(time.Second))
	if st := e.sh.RecentStatus(time.Second); st.Leased != 1 || !st.AsOf.Equal(t0.Add(time.Second)) {
		t.Fatalf("not refreshed: leased %d asOf %v", st.Leased, st.AsOf)
	}
}
