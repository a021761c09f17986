package workersim

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/client/clienttest"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

func newClient(t *testing.T, urls []string, token string) *client.Client {
	t.Helper()
	d, err := client.StaticDiscovery(urls...)
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

func mustStatic(t *testing.T, urls []string) client.Discovery {
	t.Helper()
	d, err := client.StaticDiscovery(urls...)
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
