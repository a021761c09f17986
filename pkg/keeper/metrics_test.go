package keeper

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/renderqueue/renderqueue/pkg/keeper/shardmetrics"
	"github.com/renderqueue/renderqueue/pkg/store"
)

// scrape serves reg the way the keeper does and returns the /metrics body.
func scrape(t *testing.T, sh *Shard, reg *prometheus.Registry) string {
	t.Helper()
	srv := httptest.NewServer(sh.Handler(HandlerOptions{Gatherer: reg}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	return string(body)
}

// unixSeconds is t as Prometheus timestamps are written: seconds since the epoch, with fraction.
func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// promFloat formats v as the text exposition format does.
func promFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

func wantLines(t *testing.T, body string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(body, "\n"+w+"\n") {
			t.Errorf("/metrics lacks %q", w)
		}
	}
}

func metricsShard(t *testing.T, e *shardEnv, st store.Store) (*Shard, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	sh, err := NewShard(Options{Name: "m", Store: st, Clock: e.clock.Now, Log: logr.Discard(), Metrics: shardmetrics.New(reg)}, allSlots(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(NewStatusCollector(sh))
	return sh, reg
}

func TestMetricsExposition(t *testing.T) {
	e := newShardEnv(t, allSlots(24*time.Hour))
	sh, reg := metricsShard(t, e, e.fs)
	e.upsert(srow("a", t0.Add(-time.Hour), time.Hour), srow("b", t0.Add(-2*time.Hour), 96*time.Hour),
		srow("c", t0.Add(90*time.Minute), 96*time.Hour))
	sh.Walk(e.ctx, true)
	claimed, err := sh.Claim(e.clock.Now(), 1, time.Minute)
	if err != nil || len(claimed) != 1 || claimed[0].Key != "a" {
		t.Fatal(claimed, err)
	}
	if _, err := sh.Complete(e.ctx, []CompleteItem{{Key: claimed[0].Key, Lease: claimed[0].Lease}, {Key: "b", Lease: 1}, {Key: "zz", Lease: 1}}); err != nil {
		t.Fatal(err)
	}
	body := scrape(t, sh, reg)
	wantLines(t, body,
		"renderqueue_keeper_due 1",
		"renderqueue_keeper_exact 1",
		"renderqueue_keeper_complete 1",
		"renderqueue_keeper_rows_held 3", // "a" is held again, due in an hour
		`renderqueue_keeper_class_due{cadence_le="96h",source="discovered"} 1`,
		`renderqueue_keeper_class_held{cadence_le="96h",source="discovered"} 2`,
		`renderqueue_keeper_class_held{cadence_le="1h",source="discovered"} 1`,
		`renderqueue_keeper_class_due{cadence_le="1h",source="discovered"} 0`,
		`renderqueue_keeper_class_waiting_seconds{cadence_le="96h",source="discovered"} 7200`, // "b": due 2 h ago, never claimed
		`renderqueue_keeper_class_waiting_ratio{cadence_le="96h",source="discovered"} 0.020833333333333332`,
		`renderqueue_keeper_class_waiting_seconds{cadence_le="1h",source="discovered"} 0`, // "a" rendered
		`renderqueue_keeper_coming_due{hours_ahead="1"} 1`,                                // "a", due again in an hour
		`renderqueue_keeper_coming_due{hours_ahead="2"} 1`,                                // "c", due in 90 minutes
		`renderqueue_keeper_coming_due{hours_ahead="3"} 0`,
		"renderqueue_keeper_lateness_max_seconds 7200",
		"renderqueue_keeper_lateness_max_ratio 0.020833333333333332", // 2 h late on a 96 h cadence
		"renderqueue_keeper_edge_timestamp_seconds "+promFloat(unixSeconds(t0.Add(24*time.Hour))),
		"renderqueue_keeper_last_walk_end_timestamp_seconds "+promFloat(unixSeconds(t0)),
		"renderqueue_keeper_last_walk_partial 0",
		"renderqueue_keeper_membership_epoch 0",
		`renderqueue_keeper_walk_rows_total{kind="admitted"} 3`,
		`renderqueue_keeper_walks_total{result="complete"} 1`,
		`renderqueue_keeper_walks_total{result="partial"} 0`, // created up front: increase() sees the first
		"renderqueue_keeper_walk_unread_segments_total 0",
		`renderqueue_keeper_claimed_rows_total{cadence_le="1h",source="discovered"} 1`,
		`renderqueue_keeper_claimed_rows_total{cadence_le="96h",source="submitted"} 0`,
		`renderqueue_keeper_claimed_lateness_ratio_bucket{cadence_le="1h",le="1"} 1`, // an hour late on 1 h
		`renderqueue_keeper_claimed_lateness_ratio_bucket{cadence_le="1h",le="0.5"} 0`,
		`renderqueue_keeper_completed_rows_total{cadence_le="1h",result="ok",source="discovered"} 1`,
		`renderqueue_keeper_completed_rows_total{cadence_le="96h",result="lease_lost",source="discovered"} 1`,
		`renderqueue_keeper_completed_rows_total{cadence_le="",result="not_held",source=""} 1`,
		"renderqueue_keeper_claim_duration_seconds_count 1",
	)
	// no raw cadence ever becomes a label value
	for line := range strings.SplitSeq(body, "\n") {
		if strings.Contains(line, `cadence="`) || strings.Contains(line, "0m0s") {
			t.Errorf("unbounded cadence label: %s", line)
		}
	}
}

// A partial walk counts one walk (result partial) and its unread segments in their own counter.
func TestMetricsPartialWalk(t *testing.T) {
	e := newShardEnv(t, allSlots(24*time.Hour))
	sh, reg := metricsShard(t, e, e.fs)
	e.fs.set(false, 3, 700)
	if rep := sh.Walk(e.ctx, true); !rep.Partial || rep.UnreadSegments != 2 {
		t.Fatalf("walk %+v", rep)
	}
	body := scrape(t, sh, reg)
	wantLines(t, body,
		`renderqueue_keeper_walks_total{result="partial"} 1`,
		`renderqueue_keeper_walks_total{result="complete"} 0`,
		"renderqueue_keeper_walk_unread_segments_total 2",
		"renderqueue_keeper_last_walk_partial 1",
		"renderqueue_keeper_exact 0",
	)
	if strings.Contains(body, "unread_segments\"") {
		t.Error("unread segments are still a walks_total result")
	}
}

// blockingStore blocks walks until released, so a test can scrape during a long walk.
type blockingStore struct {
	store.Store
	entered chan struct{}
	release chan struct{}
}

func (b *blockingStore) Walk(ctx context.Context, slots []int, fn store.WalkFunc) (store.WalkResult, error) {
	if b.entered != nil {
		b.entered <- struct{}{}
		<-b.release
	}
	return b.Store.Walk(ctx, slots, fn)
}

// The state gauges are computed at scrape time: while a walk runs longer than the window, the
// scrape shows the edge that is now behind the clock and the shard incomplete — nothing stays
// at its value from before the walk.
func TestMetricsCurrentDuringLongWalk(t *testing.T) {
	e := newShardEnv(t, allSlots(24*time.Hour))
	bs := &blockingStore{Store: e.fs}
	sh, reg := metricsShard(t, e, bs)
	e.upsert(srow("a", t0.Add(-time.Hour), time.Hour))
	sh.Walk(e.ctx, true)
	edge := "renderqueue_keeper_edge_timestamp_seconds " + promFloat(unixSeconds(t0.Add(24*time.Hour)))
	wantLines(t, scrape(t, sh, reg), edge, "renderqueue_keeper_complete 1", "renderqueue_keeper_due 1")

	bs.entered, bs.release = make(chan struct{}), make(chan struct{})
	done := make(chan WalkReport)
	e.clock.Set(t0.Add(2 * time.Hour))
	go func() { done <- sh.Walk(e.ctx, true) }()
	<-bs.entered
	e.clock.Set(t0.Add(25 * time.Hour)) // the walk is still running when the edge passes
	wantLines(t, scrape(t, sh, reg), edge, "renderqueue_keeper_complete 0", "renderqueue_keeper_exact 0",
		"renderqueue_keeper_lateness_max_seconds 93600")
	close(bs.release)
	if rep := <-done; rep.Failed || rep.Partial {
		t.Fatalf("walk %+v", rep)
	}
	e.clock.Set(t0.Add(25*time.Hour + time.Second)) // past the status shared for a second
	wantLines(t, scrape(t, sh, reg), "renderqueue_keeper_edge_timestamp_seconds "+promFloat(unixSeconds(t0.Add(26*time.Hour))),
		"renderqueue_keeper_complete 1")
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
