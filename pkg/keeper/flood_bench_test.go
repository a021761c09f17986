package keeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

// BenchmarkClaimsDuringNotificationFlood runs a shard (Run, real clock, 50,000 due rows, a 30 s
// verify interval) behind its HTTP API while 8 workers claim 5 rows and release them, one request
// after the other, and a role with no rights on the schema sends garbage notifications on every
// event channel — 10 statements of 120,000, one a second (≥ 1.2M in about 10 s; any role that can
// connect may NOTIFY). It reports the claims' latency during the flood (p50, p99, max), the
// notifications sent, how long the flood lasted, and how long after its end the shard was exact
// again. "bounded" is the keeper as shipped (flood rate 20,000 notifications a second);
// "unbounded" reads and checks every notification, as before issue 45.
func BenchmarkClaimsDuringNotificationFlood(b *testing.B) {
	for _, bc := range []struct {
		name string
		rate int
	}{{"bounded", 0}, {"unbounded", 1 << 30}} {
		b.Run(bc.name, func(b *testing.B) {
			var lat []time.Duration
			var sent int64
			var flood, exactAfter time.Duration
			for b.Loop() {
				r := floodOnce(b, bc.rate)
				lat = append(lat, r.lat...)
				sent += r.sent
				flood += r.flood
				exactAfter += r.exactAfter
			}
			slices.Sort(lat)
			q := func(f float64) float64 {
				return float64(lat[min(len(lat)-1, int(f*float64(len(lat))))].Microseconds()) / 1000
			}
			n := float64(b.N)
			b.ReportMetric(q(0.5), "p50-ms")
			b.ReportMetric(q(0.99), "p99-ms")
			b.ReportMetric(q(1), "max-ms")
			b.ReportMetric(float64(len(lat))/n, "claims")
			b.ReportMetric(float64(sent)/n, "notifies")
			b.ReportMetric(flood.Seconds()/n, "flood-s")
			b.ReportMetric(exactAfter.Seconds()/n, "exact-after-s")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// floodRun is one flood's figures.
type floodRun struct {
	lat               []time.Duration
	sent              int64
	flood, exactAfter time.Duration
}

func floodOnce(b *testing.B, rate int) floodRun {
	b.Helper()
	dsn := pgtest.NewDatabase(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := postgres.Open(ctx, dsn, postgres.Options{QuietCompletions: true, FloodRate: rate})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	if err := st.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	const rows = 50_000
	batch := make([]schedule.Row, 0, 5000)
	for i := range rows {
		batch = append(batch, srow(fmt.Sprintf("https://example.com/flood/%06d", i), time.Now().Add(-time.Hour), time.Hour))
		if len(batch) == cap(batch) {
			if _, err := st.Upsert(ctx, batch); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	settings := allSlots(24 * time.Hour)
	settings.VerifyInterval = 30 * time.Second
	sh, err := NewShard(Options{Name: "flooded", Store: st, Log: logr.Discard()}, settings)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sh.Run(ctx, nil) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			b.Errorf("Run stopped with %v", err)
		}
	}()
	exact := func() bool { return sh.Status(time.Now()).Exact }
	for deadline := time.Now().Add(time.Minute); !exact(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("not exact a minute after the start")
		}
	}
	srv := httptest.NewServer(sh.Handler(HandlerOptions{Token: "t"}))
	defer srv.Close()
	_, flooder := pgtest.Role(b, dsn, "rq_flooder_")
	fc, err := pgx.Connect(ctx, flooder)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = fc.Close(context.Background()) }()

	var run floodRun
	var mu sync.Mutex
	var flooding atomic.Bool
	flooding.Store(true)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			client := &http.Client{Transport: &http.Transport{}}
			var lat []time.Duration
			for flooding.Load() {
				start := time.Now()
				code, body := floodPost(b, client, srv.URL+"/v1/claim", `{"n":5,"leaseSeconds":60}`)
				lat = append(lat, time.Since(start))
				var cr shardapi.ClaimResponse
				if code != http.StatusOK || json.Unmarshal(body, &cr) != nil {
					b.Errorf("claim during the flood: %d %s", code, body)
					return
				}
				if len(cr.Items) > 0 {
					items := make([]string, len(cr.Items))
					for i, it := range cr.Items {
						items[i] = fmt.Sprintf(`{"key":%q,"lease":%q}`, it.Key, it.Lease)
					}
					floodPost(b, client, srv.URL+"/v1/release", `{"items":[`+strings.Join(items, ",")+`]}`)
				}
			}
			mu.Lock()
			run.lat = append(run.lat, lat...)
			mu.Unlock()
		})
	}
	start := time.Now()
	tick := time.NewTicker(time.Second)
	for i := range 10 {
		if i > 0 {
			<-tick.C
		}
		var n int64
		if err := fc.QueryRow(ctx, `SELECT count(pg_notify('rq_slots_' || (g % 64), 'garbage ' || g)) FROM generate_series(1, 120000) g`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		run.sent += n
	}
	tick.Stop()
	end := time.Now()
	run.flood = end.Sub(start)
	flooding.Store(false)
	wg.Wait()
	for deadline := end.Add(2 * time.Minute); !exact(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("not exact 2 minutes after the flood")
		}
	}
	run.exactAfter = time.Since(end)
	return run
}

// floodPost posts body with the test token and returns the status code and reply.
func floodPost(b *testing.B, client *http.Client, url, body string) (int, []byte) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer t")
	resp, err := client.Do(req)
	if err != nil {
		b.Error(err)
		return 0, nil
	}
	defer func() { _ = resp.Body.Close() }()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}
