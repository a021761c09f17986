package workersim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/client/clienttest"
	"github.com/renderqueue/renderqueue/pkg/client/discovery"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

func newClient(t *testing.T, urls []string, token string) *client.Client {
	t.Helper()
	d, err := discovery.Static(urls...)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Discovery: d, Token: token, Batch: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestSimulatesRendersAgainstRealShards: the simulator renders every due row of two real keeper
// shards once, then stops cleanly, leaving nothing leased.
func TestSimulatesRendersAgainstRealShards(t *testing.T) {
	cl := clienttest.NewCluster(t, clienttest.Options{Token: "tok"}, "s0", "s1")
	rows := make([]schedule.Row, 120)
	for i := range rows {
		rows[i] = schedule.Row{Key: fmt.Sprintf("https://shop.example.com/p/%d", i), Due: time.Now().Add(-time.Minute), HasDue: true,
			Cadence: 24 * time.Hour, Route: "product"}
	}
	cl.Upsert(rows...)
	clienttest.Eventually(t, "the rows held", func() bool { return cl.Due() == len(rows) })
	sim, err := New(Config{Client: newClient(t, cl.URLs(), "tok"), Concurrency: 6, RenderTime: 2 * time.Millisecond, Jitter: 0.5, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sim.Run(ctx) }()
	clienttest.Eventually(t, "every row completed", func() bool { return sim.Stats().Completed == int64(len(rows)) })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for k, n := range cl.Store().Completions() {
		if n != 1 {
			t.Errorf("%s completed %d times", k, n)
		}
	}
	for _, st := range cl.Status() {
		if st.Leased != 0 || st.Due != 0 {
			t.Errorf("shard %s: leased %d due %d after the run", st.Shard, st.Leased, st.Due)
		}
	}
}

// TestCancelReleasesUnrendered: renders cut short by the stop are released, not completed.
func TestCancelReleasesUnrendered(t *testing.T) {
	cl := clienttest.NewCluster(t, clienttest.Options{}, "s0")
	rows := make([]schedule.Row, 10)
	for i := range rows {
		rows[i] = schedule.Row{Key: fmt.Sprintf("k%d", i), Due: time.Now().Add(-time.Minute), HasDue: true, Cadence: time.Hour}
	}
	cl.Upsert(rows...)
	clienttest.Eventually(t, "the rows held", func() bool { return cl.Due() == len(rows) })
	c, err := client.New(client.Options{Discovery: mustStatic(t, cl.URLs()), DrainTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	started := make(chan struct{}, 10)
	sim, err := New(Config{Client: c, Concurrency: 3, RenderTime: time.Hour, Render: func(ctx context.Context, _ client.Item, d time.Duration) error {
		started <- struct{}{}
		return sleepRender(ctx, client.Item{}, d)
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sim.Run(ctx) }()
	for range 3 {
		<-started
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st := cl.Status()[0]
	if s := sim.Stats(); s.Released != 3 || s.Completed != 0 || st.Leased != 0 || st.Due != len(rows) {
		t.Fatalf("stats %+v, shard leased %d due %d: want the 3 renders released", s, st.Leased, st.Due)
	}
}

// TestRetriesCompletionAfter503: a shard that answers a completion 503 (its store's write
// failed: the leases stand) gets the same completion again, with the same leases; every row is
// rendered once and completed once.
func TestRetriesCompletionAfter503(t *testing.T) {
	var mu sync.Mutex
	var completes []shardapi.CompleteRequest
	failed := false
	wrap := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/complete" {
				h.ServeHTTP(w, r)
				return
			}
			body, err := io.ReadAll(r.Body)
			if err != nil {
				t.Error(err)
				return
			}
			var req shardapi.CompleteRequest
			if err := json.Unmarshal(body, &req); err != nil {
				t.Error(err)
			}
			mu.Lock()
			completes = append(completes, req)
			fail := !failed
			failed = true
			mu.Unlock()
			if fail { // as the keeper answers when its write failed
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = io.WriteString(w, `{"error":"writing 3 completions: group commit of 1 request(s): FATAL: terminating connection due to administrator command (SQLSTATE 57P01)"}`)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			h.ServeHTTP(w, r)
		})
	}
	cl := clienttest.NewCluster(t, clienttest.Options{Wrap: wrap}, "s0")
	rows := make([]schedule.Row, 3)
	for i := range rows {
		rows[i] = schedule.Row{Key: fmt.Sprintf("https://shop.example.com/r/%d", i), Due: time.Now().Add(-time.Minute), HasDue: true, Cadence: 24 * time.Hour}
	}
	cl.Upsert(rows...)
	clienttest.Eventually(t, "the rows held", func() bool { return cl.Due() == len(rows) })
	var rendered sync.Map
	sim, err := New(Config{Client: newClient(t, cl.URLs(), ""), Concurrency: 3, Render: func(_ context.Context, it client.Item, _ time.Duration) error {
		n, _ := rendered.LoadOrStore(it.Key, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sim.Run(ctx) }()
	clienttest.Eventually(t, "every row completed", func() bool { return sim.Stats().Completed == int64(len(rows)) })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	first := map[string]string{}
	sent := map[string]int{}
	for _, req := range completes {
		for _, it := range req.Items {
			if l, ok := first[it.Key]; ok && l != it.Lease {
				t.Errorf("%s completed with lease %s, then %s", it.Key, l, it.Lease)
			}
			first[it.Key] = it.Lease
			sent[it.Key]++
		}
	}
	retried := 0
	for _, r := range rows {
		if n, _ := rendered.Load(r.Key); n == nil || n.(*atomic.Int32).Load() != 1 {
			t.Errorf("%s rendered %v times", r.Key, n)
		}
		if c := cl.Store().Completions()[r.Key]; c != 1 {
			t.Errorf("%s completed %d times", r.Key, c)
		}
		if sent[r.Key] == 2 {
			retried++
		}
	}
	if retried == 0 {
		t.Fatalf("no completion was sent again after the 503: %+v", completes)
	}
}

func mustStatic(t *testing.T, urls []string) client.Discovery {
	t.Helper()
	d, err := discovery.Static(urls...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestNewRejectsBadConfig(t *testing.T) {
	c := newClient(t, []string{"http://127.0.0.1:1"}, "")
	for _, cfg := range []Config{{}, {Client: c, Concurrency: -1}, {Client: c, RenderTime: -time.Second}, {Client: c, Jitter: 1.5}} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

func TestRenderTimeJitter(t *testing.T) {
	c := newClient(t, []string{"http://127.0.0.1:1"}, "")
	sim, err := New(Config{Client: c, RenderTime: 100 * time.Millisecond, Jitter: 0.5, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := time.Hour, time.Duration(0)
	for range 1000 {
		d := sim.renderTime()
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo < 50*time.Millisecond || hi > 150*time.Millisecond || hi-lo < 80*time.Millisecond {
		t.Fatalf("render times within [%v, %v], want spread over [50ms, 150ms]", lo, hi)
	}
}

// TestZeroRenderTime checks that a render time of 0 means no render time (it once meant the
// 50 ms default): the workers complete what they claim at once.
func TestZeroRenderTime(t *testing.T) {
	c := newClient(t, []string{"http://127.0.0.1:1"}, "")
	sim, err := New(Config{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	if d := sim.renderTime(); d != 0 {
		t.Fatalf("render time %v with RenderTime 0, want 0", d)
	}
	if err := sim.cfg.Render(context.Background(), client.Item{}, 0); err != nil {
		t.Fatalf("rendering for 0: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := sim.cfg.Render(ctx, client.Item{}, 0); err == nil {
		t.Fatal("rendering for 0 after the run was cancelled: no error")
	}
}
