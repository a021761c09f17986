package keeper

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/httpserve"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// abusedShard serves a loaded shard of n due rows with limits l on a loopback port, and opens the
// abuse of issue 45 against it through real sockets, all authenticated: 64 requests whose bodies
// stall after their first byte (32 completions and 24 claims of small bodies, 8 completions
// declaring 1 MiB) and 4 completions declaring 16 MiB. It returns the server's base URL once every
// abusive request has been sent.
func abusedShard(tb testing.TB, n int, l httpserve.Limits) string {
	tb.Helper()
	e := newShardEnv(tb, allSlots(0))
	rows := make([]schedule.Row, n)
	for i := range rows {
		rows[i] = srow(fmt.Sprintf("https://example.com/abuse/%06d", i), t0.Add(-time.Hour), time.Hour)
	}
	for lo := 0; lo < n; lo += 5000 {
		e.upsert(rows[lo:min(lo+5000, n)]...)
	}
	if rep := e.sh.Walk(e.ctx, true); rep.Failed {
		tb.Fatal(rep.Err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := httpserve.NewServer(e.sh.Handler(HandlerOptions{Token: "t", Limits: l}), l)
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Close() })
	addr := ln.Addr().String()
	stall := func(path string, length int64) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = c.Close() })
		if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: shard\r\nAuthorization: Bearer t\r\nContent-Type: application/json\r\n"+
			"Content-Length: %d\r\n\r\n{", path, length); err != nil {
			tb.Fatal(err)
		}
	}
	for range 32 {
		stall("/v1/complete", 1000)
	}
	for range 24 {
		stall("/v1/claim", 100)
	}
	for range 8 {
		stall("/v1/complete", 1<<20)
	}
	for range 4 {
		stall("/v1/complete", 16<<20)
	}
	return "http://" + addr
}

// claimRun is what well-behaved workers saw: each claim's status code and latency.
type claimRun struct {
	codes   map[int]int
	latency []time.Duration
}

// claimHard has workers workers send claims of 5 rows, one after the other on a keep-alive
// connection each, perWorker claims each.
func claimHard(tb testing.TB, base string, workers, perWorker int) claimRun {
	tb.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: time.Minute}
	var mu sync.Mutex
	run := claimRun{codes: map[int]int{}}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			lat := make([]time.Duration, 0, perWorker)
			codes := map[int]int{}
			for range perWorker {
				req, _ := http.NewRequest(http.MethodPost, base+"/v1/claim", strings.NewReader(`{"n":5,"leaseSeconds":600}`))
				req.Header.Set("Authorization", "Bearer t")
				start := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					codes[-1]++
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				lat = append(lat, time.Since(start))
				codes[resp.StatusCode]++
			}
			mu.Lock()
			defer mu.Unlock()
			run.latency = append(run.latency, lat...)
			for c, n := range codes {
				run.codes[c] += n
			}
		})
	}
	wg.Wait()
	slices.Sort(run.latency)
	return run
}

// ok returns the share of claims answered 200.
func (r claimRun) ok() float64 {
	total := 0
	for _, n := range r.codes {
		total += n
	}
	return float64(r.codes[http.StatusOK]) / float64(total)
}

// quantile returns the q-quantile of the claims' latencies.
func (r claimRun) quantile(q float64) time.Duration {
	if len(r.latency) == 0 {
		return 0
	}
	return r.latency[min(len(r.latency)-1, int(q*float64(len(r.latency))))]
}

// abuseLimits are the keeper's defaults with a body deadline long enough that the abusive
// requests stay stalled throughout (the deadline has a test of its own).
var abuseLimits = httpserve.Limits{BodyTimeout: 2 * time.Minute, ReadTimeout: 2 * time.Minute}

// TestClaimsHaveTheirOwnRoom: under the abuse of abusedShard (64 stalled authenticated bodies and
// 4 connections declaring 16 MiB), at least 99% of the claims of well-behaved workers are answered
// 200, and nothing else than 200 or 503. Before, the stalled bodies filled the in-flight limit and
// the declared bodies its byte budget: 57 of 90 claims got 503 for 30 s.
func TestClaimsHaveTheirOwnRoom(t *testing.T) {
	base := abusedShard(t, 5000, abuseLimits)
	run := claimHard(t, base, 8, 50)
	for code, n := range run.codes {
		if code != http.StatusOK && code != http.StatusServiceUnavailable {
			t.Errorf("%d claims answered %d", n, code)
		}
	}
	if run.ok() < 0.99 {
		t.Fatalf("%.1f%% of the claims answered 200 under abuse (codes %v), want at least 99%%", 100*run.ok(), run.codes)
	}
	t.Logf("codes %v; p50 %v p99 %v", run.codes, run.quantile(0.5), run.quantile(0.99))

	// a claim or a write declaring more than its endpoint takes is refused at once, whatever the
	// rooms hold
	for _, tc := range []struct {
		path string
		size int64
	}{{"/v1/claim", httpserve.MaxClaimBodyBytes + 1}, {"/v1/claim", 16 << 20}, {"/v1/complete", httpserve.MaxRequestBytes + 1}} {
		c := rawRequest(t, strings.TrimPrefix(base, "http://"), fmt.Sprintf("POST %s HTTP/1.1\r\nHost: shard\r\nAuthorization: Bearer t\r\n"+
			"Content-Length: %d\r\n\r\n{", tc.path, tc.size))
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b := make([]byte, 12)
		if _, err := io.ReadFull(c, b); err != nil || string(b) != "HTTP/1.1 413" {
			t.Errorf("%s declaring %d bytes: %q %v, want 413", tc.path, tc.size, b, err)
		}
	}
}

// BenchmarkClaimsUnderAbuse measures the claims of 8 well-behaved workers (claims of 5 rows, one
// after the other on a keep-alive connection each) against a shard under the abuse of
// abusedShard: the share answered 200 and the latency (p50, p99, max) of all claims.
func BenchmarkClaimsUnderAbuse(b *testing.B) {
	base := abusedShard(b, 50_000, abuseLimits)
	var all claimRun
	all.codes = map[int]int{}
	for b.Loop() {
		run := claimHard(b, base, 8, 100)
		all.latency = append(all.latency, run.latency...)
		for c, n := range run.codes {
			all.codes[c] += n
		}
	}
	slices.Sort(all.latency)
	b.ReportMetric(100*all.ok(), "%ok")
	b.ReportMetric(float64(all.quantile(0.5).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(all.quantile(0.99).Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(all.latency[len(all.latency)-1].Microseconds())/1000, "max-ms")
	b.ReportMetric(0, "ns/op")
}
