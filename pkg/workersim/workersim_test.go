package workersim

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// fakeShard implements /v1/claim, /v1/complete and /v1/release over a fixed set of rows, checking
// the bearer token and the leases.
type fakeShard struct {
	t       *testing.T
	token   string
	mu      sync.Mutex
	free    []string          // unleased, not completed
	leases  map[string]string // key -> current lease
	done    map[string]int    // key -> completions
	claimNs []int             // N of every claim request
	n       int
	// unavailable makes the first claims answer 503.
	unavailable int
	// allDone is closed when every row was completed.
	allDone chan struct{}
	total   int
	badReqs []string
}

func newFakeShard(t *testing.T, token string, rows int) *fakeShard {
	f := &fakeShard{t: t, token: token, leases: map[string]string{}, done: map[string]int{}, allDone: make(chan struct{}), total: rows}
	for i := range rows {
		f.free = append(f.free, fmt.Sprintf("https://shop.example.com/product/%d", i))
	}
	return f
}

func (f *fakeShard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reply := func(code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	if r.Method != http.MethodPost {
		reply(http.StatusMethodNotAllowed, shardapi.Error{Error: "POST only"})
		return
	}
	if f.token != "" && r.Header.Get("Authorization") != "Bearer "+f.token {
		reply(http.StatusUnauthorized, shardapi.Error{Error: "missing or wrong bearer token"})
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.URL.Path {
	case "/v1/claim":
		var req shardapi.ClaimRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.N < 1 || req.N > shardapi.MaxClaim {
			f.badReqs = append(f.badReqs, fmt.Sprintf("claim %+v %v", req, err))
			reply(http.StatusBadRequest, shardapi.Error{Error: "bad claim"})
			return
		}
		if f.unavailable > 0 {
			f.unavailable--
			reply(http.StatusServiceUnavailable, shardapi.Error{Error: "loading"})
			return
		}
		f.claimNs = append(f.claimNs, req.N)
		k := min(req.N, len(f.free))
		resp := shardapi.ClaimResponse{Items: []shardapi.ClaimedRow{}}
		for _, key := range f.free[:k] {
			f.n++
			lease := fmt.Sprintf("lease-%d", f.n)
			f.leases[key] = lease
			resp.Items = append(resp.Items, shardapi.ClaimedRow{Key: key, Cadence: 345600, Route: "product", Source: "submitted", Lease: lease})
		}
		f.free = f.free[k:]
		reply(http.StatusOK, resp)
	case "/v1/complete":
		var req shardapi.CompleteRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			reply(http.StatusBadRequest, shardapi.Error{Error: err.Error()})
			return
		}
		n := 0
		for _, it := range req.Items {
			if it.NextDue != nil {
				f.badReqs = append(f.badReqs, "completion with nextDue "+it.Key)
			}
			if l, ok := f.leases[it.Key]; !ok || l != it.Lease {
				f.badReqs = append(f.badReqs, fmt.Sprintf("complete %s with lease %q, current %q", it.Key, it.Lease, l))
				continue
			}
			delete(f.leases, it.Key)
			f.done[it.Key]++
			n++
		}
		if len(f.done) == f.total && f.total > 0 {
			select {
			case <-f.allDone:
			default:
				close(f.allDone)
			}
		}
		reply(http.StatusOK, shardapi.CompleteResponse{Completed: n})
	case "/v1/release":
		var req shardapi.ReleaseRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			reply(http.StatusBadRequest, shardapi.Error{Error: err.Error()})
			return
		}
		n := 0
		for _, it := range req.Items {
			if l, ok := f.leases[it.Key]; !ok || l != it.Lease {
				f.badReqs = append(f.badReqs, fmt.Sprintf("release %s with lease %q, current %q", it.Key, it.Lease, l))
				continue
			}
			delete(f.leases, it.Key)
			f.free = append(f.free, it.Key)
			n++
		}
		reply(http.StatusOK, shardapi.ReleaseResponse{Released: n})
	default:
		reply(http.StatusNotFound, shardapi.Error{Error: "no such endpoint"})
	}
}

func (f *fakeShard) check(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.badReqs) > 0 {
		t.Errorf("bad requests: %q", f.badReqs)
	}
	for k, n := range f.done {
		if n != 1 {
			t.Errorf("%s completed %d times", k, n)
		}
	}
	if len(f.leases) != 0 {
		t.Errorf("%d leases left outstanding after stop: %v", len(f.leases), f.leases)
	}
}

// gate is a Render hook that counts workers rendering at once and holds them until released.
type gate struct {
	active, peak atomic.Int64
	rendered     atomic.Int64
	open         chan struct{}
	reached      chan struct{} // closed when `want` workers render at once
	want         int64
	once         sync.Once
}

func newGate(want int) *gate {
	return &gate{open: make(chan struct{}), reached: make(chan struct{}), want: int64(want)}
}

func (g *gate) render(ctx context.Context, _ shardapi.ClaimedRow, _ time.Duration) error {
	a := g.active.Add(1)
	defer g.active.Add(-1)
	for {
		p := g.peak.Load()
		if a <= p || g.peak.CompareAndSwap(p, a) {
			break
		}
	}
	if a >= g.want {
		g.once.Do(func() { close(g.reached) })
	}
	select {
	case <-g.open:
		g.rendered.Add(1)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// handlerTransport serves requests in process, by host, so that tests can run in a synctest
// bubble (no network I/O): synctest.Wait then tells when every worker is blocked.
type handlerTransport map[string]http.Handler

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	h, ok := t[r.URL.Host]
	if !ok {
		return nil, fmt.Errorf("no handler for host %q", r.URL.Host)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec.Result(), nil
}

func TestClaimsRendersCompletesAndStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rows, conc, batch = 500, 5, 7
		shardA := newFakeShard(t, "s3cret", rows)
		shardB := newFakeShard(t, "s3cret", rows)
		shardA.unavailable = 3
		client := &http.Client{Transport: handlerTransport{"shard-a": shardA, "shard-b": shardB}}

		g := newGate(conc)
		sim, err := New(Config{Shards: []string{"http://shard-a", "http://shard-b/"}, Token: "s3cret", Concurrency: conc,
			Batch: batch, Client: client, Render: g.render})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		runErr := make(chan error, 1)
		go func() { runErr <- sim.Run(ctx) }()

		// Let (fake) time run past every backoff, then wait until every goroutine is blocked:
		// exactly Concurrency workers are rendering, one batch each, and no one else claims.
		<-g.reached
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if a := g.active.Load(); a != conc {
			t.Fatalf("%d workers rendering at once, want %d", a, conc)
		}
		if st := sim.Stats(); st.Claims != conc || st.Claimed != conc*batch || st.Unavailable != 3 {
			t.Fatalf("while rendering: stats %+v", st)
		}
		close(g.open)
		<-shardA.allDone
		<-shardB.allDone
		synctest.Wait() // the workers are backing off after empty claims
		if st := sim.Stats(); st.Empty == 0 {
			t.Errorf("no empty claim after the shards drained: %+v", st)
		}
		cancel()
		if err := <-runErr; err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
		if p := g.peak.Load(); p != conc {
			t.Errorf("peak concurrency %d, want %d", p, conc)
		}
		shardA.check(t)
		shardB.check(t)
		for _, f := range []*fakeShard{shardA, shardB} {
			if len(f.done) != rows {
				t.Errorf("completed %d of %d rows", len(f.done), rows)
			}
			for _, n := range f.claimNs {
				if n != batch {
					t.Errorf("claimed %d rows at once, want %d", n, batch)
				}
			}
		}
		// Round robin: both shards were claimed from about equally.
		if a, b := len(shardA.claimNs), len(shardB.claimNs); a < rows/batch || b < rows/batch {
			t.Errorf("claims per shard: %d and %d", a, b)
		}
		st := sim.Stats()
		if st.Completed != 2*rows || st.Claimed != 2*rows || st.Rejected != 0 || st.Errors != 0 || st.Unavailable != 3 || st.Released != 0 {
			t.Errorf("stats %+v", st)
		}
		if g.rendered.Load() != 2*rows {
			t.Errorf("rendered %d rows, want %d", g.rendered.Load(), 2*rows)
		}
	})
}

func TestCancelMidBatchCompletesRenderedAndReleasesRest(t *testing.T) {
	const conc, batch = 3, 4
	shard := newFakeShard(t, "tok", 100)
	srv := httptest.NewServer(shard)
	defer srv.Close()
	// Each worker renders the first row of its batch at once, then blocks on the second until
	// cancelled. The fake hands out rows in key order, so batches start at multiples of batch.
	var started atomic.Int64
	blocked := make(chan struct{})
	var once sync.Once
	render := func(ctx context.Context, row shardapi.ClaimedRow, _ time.Duration) error {
		var idx int
		if _, err := fmt.Sscanf(row.Key[strings.LastIndexByte(row.Key, '/')+1:], "%d", &idx); err != nil {
			t.Errorf("key %q: %v", row.Key, err)
		}
		if idx%batch == 0 {
			return nil
		}
		if started.Add(1) == conc {
			once.Do(func() { close(blocked) })
		}
		<-ctx.Done()
		return ctx.Err()
	}
	sim, err := New(Config{Shards: []string{srv.URL}, Token: "tok", Concurrency: conc, Batch: batch, Render: render, Backoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- sim.Run(ctx) }()
	waitFor(t, blocked, "workers blocked mid-batch")
	cancel()
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	shard.check(t) // no lease left outstanding, every completion with its lease
	st := sim.Stats()
	if st.Claimed != conc*batch || st.Completed != conc || st.Released != conc*(batch-1) || st.Errors != 0 {
		t.Errorf("stats %+v", st)
	}
	if len(shard.done) != conc || len(shard.free) != 100-conc {
		t.Errorf("%d done, %d free", len(shard.done), len(shard.free))
	}
}

func TestUnauthorizedStops(t *testing.T) {
	shard := newFakeShard(t, "right", 10)
	srv := httptest.NewServer(shard)
	defer srv.Close()
	sim, err := New(Config{Shards: []string{srv.URL}, Token: "wrong", Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	err = sim.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "bearer token") {
		t.Fatalf("Run: %v, want a 401 error naming the problem", err)
	}
	if st := sim.Stats(); st.Claimed != 0 || st.Errors == 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestEmptyClaimsBackOffUntilCancelled(t *testing.T) {
	shard := newFakeShard(t, "", 0) // no token: no auth
	srv := httptest.NewServer(shard)
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	sim, err := New(Config{Shards: []string{srv.URL}, Concurrency: 2, Backoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond,
		Render: func(context.Context, shardapi.ClaimedRow, time.Duration) error {
			t.Error("rendered from an empty shard")
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- sim.Run(ctx) }()
	for sim.Stats().Empty < 10 {
		select {
		case err := <-runErr:
			t.Fatalf("Run returned early: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	cancel()
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
	if st := sim.Stats(); st.Claimed != 0 || st.Errors != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{Shards: []string{"localhost:8080"}},
		{Shards: []string{"http://x"}, Batch: shardapi.MaxClaim + 1},
		{Shards: []string{"http://x"}, Jitter: 2},
		{Shards: []string{"http://x"}, RenderTime: -1},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v): no error", cfg)
		}
	}
}

func TestRenderTimeJitter(t *testing.T) {
	sim, err := New(Config{Shards: []string{"http://x"}, RenderTime: 100 * time.Millisecond, Jitter: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	rng := newRand(1)
	lo, hi := time.Hour, time.Duration(0)
	for range 10000 {
		d := sim.renderTime(rng)
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo < 50*time.Millisecond || hi > 150*time.Millisecond || lo > 55*time.Millisecond || hi < 145*time.Millisecond {
		t.Errorf("render times within [%v, %v], want about [50ms, 150ms]", lo, hi)
	}
}
