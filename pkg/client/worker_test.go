package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/client/clientmetrics"
	"github.com/renderqueue/renderqueue/pkg/client/clienttest"
	"github.com/renderqueue/renderqueue/pkg/client/discovery"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// overdue returns n rows due an hour ago with a 96 h cadence (completed once, they are not due
// again during a test).
func overdue(prefix string, n int) []schedule.Row {
	rows := make([]schedule.Row, n)
	for i := range rows {
		rows[i] = schedule.Row{Key: fmt.Sprintf("https://shop.example.com/%s/%d", prefix, i), Due: time.Now().Add(-time.Hour),
			HasDue: true, Cadence: 96 * time.Hour, Route: prefix}
	}
	return rows
}

func newClient(t *testing.T, opts client.Options) *client.Client {
	t.Helper()
	c, err := client.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func static(t *testing.T, urls ...string) client.Discovery {
	t.Helper()
	d, err := discovery.Static(urls...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// checkOnce fails unless every row was completed exactly once.
func checkOnce(t *testing.T, cs *clienttest.CountingStore, rows []schedule.Row) {
	t.Helper()
	done := cs.Completions()
	var missing, twice []string
	for _, r := range rows {
		switch n := done[r.Key]; {
		case n == 0:
			missing = append(missing, r.Key)
		case n > 1:
			twice = append(twice, fmt.Sprintf("%s (%d)", r.Key, n))
		}
	}
	if len(missing) > 0 || len(twice) > 0 {
		t.Fatalf("%d rows never completed (%.3q...), %d completed more than once (%.3q...)", len(missing), missing, len(twice), twice)
	}
}

func TestRunCompletesEveryRowOnceAcrossShards(t *testing.T) {
	cl := clienttest.NewCluster(t, clienttest.Options{Token: "s3cret"}, "a", "b", "c")
	rows := overdue("product", 300)
	cl.Upsert(rows...)
	clienttest.Eventually(t, "the shards to hold every due row", func() bool { return cl.Due() == len(rows) })

	reg := prometheus.NewRegistry()
	m, err := clientmetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, client.Options{Discovery: static(t, cl.URLs()...), Token: "s3cret", Batch: 7, Metrics: m})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var handled atomic.Int64
	nextDue := time.Now().Add(240 * time.Hour).Truncate(time.Millisecond)
	runErr := make(chan error, 1)
	go func() {
		runErr <- c.Run(ctx, 8, func(ctx context.Context, it client.Item) (client.Result, error) {
			handled.Add(1)
			if it.Route == "product" && strings.HasSuffix(it.Key, "/7") {
				return client.Result{NextDue: nextDue}, nil
			}
			return client.Result{}, nil
		})
	}()
	clienttest.Eventually(t, "every row completed", func() bool { return len(cl.Store().Completions()) == len(rows) })
	cancel()
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkOnce(t, cl.Store(), rows)
	for _, st := range cl.Status() {
		if st.Due != 0 || st.Leased != 0 {
			t.Errorf("shard %s: due %d, leased %d after the run", st.Shard, st.Due, st.Leased)
		}
	}
	if got := cl.Store().LastDue(rows[7].Key); !got.Equal(nextDue) {
		t.Errorf("row 7 completed with next due %v, want the handler's %v", got, nextDue)
	}
	// without a NextDue the shard's reschedule policy decides: by default the row's own schedule,
	// due + 96 h for a row an hour late
	if got, want := cl.Store().LastDue(rows[8].Key), rows[8].Due.Add(96*time.Hour); got.UnixMilli() != want.UnixMilli() {
		t.Errorf("row 8 completed with next due %v, want its due + one cadence %v", got, want)
	}
	if s := c.Stats(); s.Completed != int64(len(rows)) || s.Rejected != 0 || s.Claimed != handled.Load() {
		t.Errorf("stats %+v, handled %d", s, handled.Load())
	}
	want := fmt.Sprintf(`
# HELP renderqueue_worker_completions_total Rows sent for completion by result: completed, rejected by the shard (lease no longer current), error (not delivered).
# TYPE renderqueue_worker_completions_total counter
renderqueue_worker_completions_total{result="completed"} %d
`, len(rows))
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "renderqueue_worker_completions_total"); err != nil {
		t.Error(err)
	}
}

// TestClaimFindsTheShardWithWork: whatever order the shards are tried in, a claim returns the
// rows of the one shard that has due rows, and the empty shards back off.
func TestClaimFindsTheShardWithWork(t *testing.T) {
	cl := clienttest.NewCluster(t, clienttest.Options{}, "a", "b", "c", "d")
	// rows of shard c's slots only
	var rows []schedule.Row
	owner := cl.Shards()[2]
	for _, r := range overdue("product", 400) {
		if len(rows) < 40 && ownedBy(t, owner, r.Key) {
			rows = append(rows, r)
		}
	}
	cl.Upsert(rows...)
	clienttest.Eventually(t, "shard c to hold the rows", func() bool { return cl.Due() == len(rows) })
	for i := range 4 {
		c := newClient(t, client.Options{Discovery: static(t, cl.URLs()...)})
		items, err := c.Claim(context.Background(), 5)
		if err != nil || len(items) != 5 {
			t.Fatalf("claim %d: %d items, %v; stats %+v", i, len(items), err, c.Stats())
		}
		for _, it := range items {
			if it.Shard != owner.URL {
				t.Fatalf("claim %d: item from %s, want shard c %s", i, it.Shard, owner.URL)
			}
		}
		if s := c.Stats(); s.Claims+s.Unavailable+s.Errors > 4 {
			t.Fatalf("claim %d asked %d shards, more than there are", i, s.Claims)
		}
	}
}

// ownedBy reports whether the shard owns key's slot (the in-memory store's hash).
func ownedBy(t *testing.T, s *clienttest.Shard, key string) bool {
	t.Helper()
	set, err := membershipParse(s.Keeper.Status(time.Now()).Membership.Owned)
	if err != nil {
		t.Fatal(err)
	}
	return set.Has(schedule.SlotOf(memstoreHash(key)))
}

// TestBackoffOnEmptyAndUnavailable: a worker facing only empty shards, or a shard answering 503,
// backs off (fewer and fewer claims) and starts working as soon as rows appear.
func TestBackoffOnEmptyAndUnavailable(t *testing.T) {
	cl := clienttest.NewCluster(t, clienttest.Options{}, "a")
	var claims atomic.Int64
	hc := &http.Client{Transport: countClaims(&claims)}
	c := newClient(t, client.Options{Discovery: static(t, cl.URLs()...), HTTPClient: hc,
		Backoff: waitBackoff(20*time.Millisecond, 2, 320*time.Millisecond)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() {
		runErr <- c.Run(ctx, 4, func(context.Context, client.Item) (client.Result, error) { return client.Result{}, nil })
	}()
	// back-off steps 20, 40, 80, 160, 320, 320, ... ms (jitter up to +50%): after 5 empty
	// claims each further claim waits at least 320 ms
	clienttest.Eventually(t, "six empty claims", func() bool { return claims.Load() >= 6 })
	start, n0 := time.Now(), claims.Load()
	clienttest.Eventually(t, "three more empty claims", func() bool { return claims.Load() >= n0+3 })
	if el := time.Since(start); el < 3*320*time.Millisecond-50*time.Millisecond {
		t.Fatalf("three claims within %v: the back-off did not grow to its cap of 320 ms", el)
	}
	if s := c.Stats(); s.Empty < 6 || s.Claimed != 0 {
		t.Fatalf("stats %+v", s)
	}
	rows := overdue("late", 5)
	cl.Upsert(rows...)
	clienttest.Eventually(t, "the rows to be completed after they appeared", func() bool { return len(cl.Store().Completions()) == 5 })
	cancel()
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
	checkOnce(t, cl.Store(), rows)
}

// TestUnavailableShardIsSkipped: a shard that has not loaded answers 503; the worker backs off from
// it and takes the rows of the other.
func TestUnavailableShardIsSkipped(t *testing.T) {
	cl := clienttest.NewCluster(t, clienttest.Options{}, "a")
	loading := clienttest.NewLoadingShard(t, clienttest.Options{})
	rows := overdue("product", 50)
	cl.Upsert(rows...)
	clienttest.Eventually(t, "the rows held", func() bool { return cl.Due() == len(rows) })
	c := newClient(t, client.Options{Discovery: static(t, append(cl.URLs(), loading)...)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() {
		runErr <- c.Run(ctx, 4, func(context.Context, client.Item) (client.Result, error) { return client.Result{}, nil })
	}()
	clienttest.Eventually(t, "every row completed", func() bool { return len(cl.Store().Completions()) == len(rows) })
	clienttest.Eventually(t, "a 503 from the loading shard", func() bool { return c.Stats().Unavailable > 0 })
	cancel()
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
	checkOnce(t, cl.Store(), rows)
}

// TestFatalAnswerStopsRun: a wrong token is not retried: Run stops with the 401.
func TestFatalAnswerStopsRun(t *testing.T) {
	cl := clienttest.NewCluster(t, clienttest.Options{Token: "right"}, "a")
	c := newClient(t, client.Options{Discovery: static(t, cl.URLs()...), Token: "wrong"})
	err := c.Run(context.Background(), 2, func(context.Context, client.Item) (client.Result, error) { return client.Result{}, nil })
	var se *client.StatusError
	if !errors.As(err, &se) || se.Code != http.StatusUnauthorized {
		t.Fatalf("Run returned %v, want a 401 StatusError", err)
	}
}

// TestLeaseExtension: a render that outlasts its lease keeps it (and completes), extending a
// current lease works, and a stale lease is refused.
func TestLeaseExtension(t *testing.T) {
	cl := clienttest.NewCluster(t, clienttest.Options{MaxLease: 2 * time.Hour}, "a")
	rows := overdue("slow", 3)
	cl.Upsert(rows...)
	clienttest.Eventually(t, "the rows held", func() bool { return cl.Due() == len(rows) })

	c := newClient(t, client.Options{Discovery: static(t, cl.URLs()...), Lease: 400 * time.Millisecond, Batch: 1})
	// the low-level calls: extend a current lease, refuse a released one
	items, err := c.Claim(context.Background(), 1)
	if err != nil || len(items) != 1 {
		t.Fatal(items, err)
	}
	ext, errs, err := c.Extend(context.Background(), items, time.Hour)
	if err != nil || errs[0] != nil || !ext[0].LeaseExpires.After(time.Now().Add(50*time.Minute)) {
		t.Fatalf("extending a current lease: %+v %v %v", ext, errs, err)
	}
	if errs, err := c.Release(context.Background(), items); err != nil || errs[0] != nil {
		t.Fatal(errs, err)
	}
	_, errs, err = c.Extend(context.Background(), items, time.Hour)
	if err != nil || !errors.Is(errs[0], client.ErrLeaseLost) {
		t.Fatalf("extending a released lease: %v %v, want ErrLeaseLost", errs, err)
	}

	// Run: renders of 1.5 s under a 400 ms lease are extended and complete
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() {
		runErr <- c.Run(ctx, 3, func(ctx context.Context, it client.Item) (client.Result, error) {
			select {
			case <-time.After(1500 * time.Millisecond): // the render
				return client.Result{}, nil
			case <-ctx.Done():
				return client.Result{}, context.Cause(ctx)
			}
		})
	}()
	clienttest.Eventually(t, "every row completed", func() bool { return len(cl.Store().Completions()) == len(rows) })
	cancel()
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
	checkOnce(t, cl.Store(), rows)
	if s := c.Stats(); s.Extended < 2*int64(len(rows)) || s.Rejected != 0 || s.LeaseLost != 0 {
		t.Fatalf("stats %+v: want every render extended at least twice and nothing rejected", s)
	}
}

// TestLeaseLostCancelsTheRender: when the shard refuses an extension (here: the lease was
// released behind the worker's back), the handler's context is cancelled with ErrLeaseLost and the
// row is not completed by this worker.
func TestLeaseLostCancelsTheRender(t *testing.T) {
	cl := clienttest.NewCluster(t, clienttest.Options{}, "a")
	rows := overdue("stolen", 1)
	cl.Upsert(rows...)
	clienttest.Eventually(t, "the row held", func() bool { return cl.Due() == 1 })
	c := newClient(t, client.Options{Discovery: static(t, cl.URLs()...), Lease: 300 * time.Millisecond})
	other := newClient(t, client.Options{Discovery: static(t, cl.URLs()...)})
	started := make(chan client.Item, 1)
	cause := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() {
		runErr <- c.Run(ctx, 1, func(ctx context.Context, it client.Item) (client.Result, error) {
			started <- it
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return client.Result{}, ctx.Err()
		})
	}()
	it := <-started
	if errs, err := other.Release(context.Background(), []client.Item{it}); err != nil || errs[0] != nil {
		t.Fatal(errs, err)
	}
	if err := <-cause; !errors.Is(err, client.ErrLeaseLost) {
		t.Fatalf("handler's context ended with %v, want ErrLeaseLost", err)
	}
	cancel()
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
	if n := len(cl.Store().Completions()); n != 0 {
		t.Fatalf("%d completions of a row whose lease was lost", n)
	}
	if s := c.Stats(); s.LeaseLost != 1 {
		t.Fatalf("stats %+v, want one lease lost", s)
	}
}

// TestShutdownDrainsAndReleases: cancelling Run lets running renders finish and completes them,
// cancels a render that outlasts the drain time (cause ErrShutdown) and releases its row.
func TestShutdownDrainsAndReleases(t *testing.T) {
	cl := clienttest.NewCluster(t, clienttest.Options{}, "a")
	rows := overdue("product", 20)
	cl.Upsert(rows...)
	clienttest.Eventually(t, "the rows held", func() bool { return cl.Due() == len(rows) })
	c := newClient(t, client.Options{Discovery: static(t, cl.URLs()...), DrainTimeout: 300 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	started := 0
	allStarted := make(chan struct{})
	finish := make(chan struct{})
	stuckCause := make(chan error, 1)
	runErr := make(chan error, 1)
	go func() {
		runErr <- c.Run(ctx, 3, func(hctx context.Context, it client.Item) (client.Result, error) {
			mu.Lock()
			started++
			n := started
			if n == 3 {
				close(allStarted)
			}
			mu.Unlock()
			if n == 3 { // ignores the shutdown until its context is cancelled
				<-hctx.Done()
				stuckCause <- context.Cause(hctx)
				return client.Result{}, hctx.Err()
			}
			<-finish
			return client.Result{}, nil
		})
	}()
	<-allStarted
	cancel()
	// the two renders finish after the cancellation: they are still completed
	close(finish)
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
	if err := <-stuckCause; !errors.Is(err, client.ErrShutdown) {
		t.Fatalf("the stuck render's context ended with %v, want ErrShutdown", err)
	}
	if n := len(cl.Store().Completions()); n != 2 {
		t.Fatalf("%d completions, want the 2 renders that finished", n)
	}
	st := cl.Status()[0]
	if st.Leased != 0 || st.Due != len(rows)-2 {
		t.Fatalf("after shutdown: leased %d, due %d; want 0 leased, %d due", st.Leased, st.Due, len(rows)-2)
	}
	if s := c.Stats(); s.Released != 1 || s.Claimed != 3 {
		t.Fatalf("stats %+v: want 3 claimed, 1 released", s)
	}
}

// TestShutdownReleasesClaimedButNotStarted: rows handed out by a claim that answers after the
// cancellation are never started and are released at once.
func TestShutdownReleasesClaimedButNotStarted(t *testing.T) {
	cl := clienttest.NewCluster(t, clienttest.Options{}, "a")
	rows := overdue("product", 20)
	cl.Upsert(rows...)
	clienttest.Eventually(t, "the rows held", func() bool { return cl.Due() == len(rows) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// the first claim's answer arrives just after the worker was told to stop
	hc := &http.Client{Transport: afterClaim(cancel)}
	c := newClient(t, client.Options{Discovery: static(t, cl.URLs()...), HTTPClient: hc})
	var handled atomic.Int64
	if err := c.Run(ctx, 5, func(context.Context, client.Item) (client.Result, error) {
		handled.Add(1)
		return client.Result{}, nil
	}); err != nil {
		t.Fatal(err)
	}
	st := cl.Status()[0]
	if s := c.Stats(); handled.Load() != 0 || s.Claimed != 5 || s.Released != 5 || st.Leased != 0 || st.Due != len(rows) {
		t.Fatalf("handled %d, stats %+v, shard leased %d due %d: want 5 claimed and released, none handled", handled.Load(), s, st.Leased, st.Due)
	}
}

// TestRetryAfterKeepsTheRowLeased: an error wrapped with RetryAfter leaves the row leased for that
// long instead of releasing it; a plain error releases it at once.
func TestRetryAfterKeepsTheRowLeased(t *testing.T) {
	cl := clienttest.NewCluster(t, clienttest.Options{}, "a")
	rows := overdue("flaky", 2)
	cl.Upsert(rows...)
	clienttest.Eventually(t, "the rows held", func() bool { return cl.Due() == len(rows) })
	c := newClient(t, client.Options{Discovery: static(t, cl.URLs()...)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	seen := map[string]int{}
	runErr := make(chan error, 1)
	go func() {
		runErr <- c.Run(ctx, 2, func(_ context.Context, it client.Item) (client.Result, error) {
			mu.Lock()
			seen[it.Key]++
			n := seen[it.Key]
			mu.Unlock()
			if it.Key == rows[0].Key {
				return client.Result{}, client.RetryAfter(errors.New("origin busy"), time.Hour)
			}
			if n == 1 {
				return client.Result{}, errors.New("origin 500")
			}
			return client.Result{}, nil
		})
	}()
	clienttest.Eventually(t, "the released row rendered again and completed", func() bool { return cl.Store().Completions()[rows[1].Key] == 1 })
	cancel()
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen[rows[0].Key] != 1 {
		t.Fatalf("the retry-after row was rendered %d times within its hour", seen[rows[0].Key])
	}
	if st := cl.Status()[0]; st.Leased != 1 {
		t.Fatalf("leased %d, want the retry-after row still leased", st.Leased)
	}
}

// TestDNSDiscovery resolves "localhost" (the hosts file) to the shard's loopback address.
func TestDNSDiscovery(t *testing.T) {
	cl := clienttest.NewCluster(t, clienttest.Options{}, "a")
	rows := overdue("product", 10)
	cl.Upsert(rows...)
	port := portOf(t, cl.URLs()[0])
	d, err := discovery.DNS("localhost", port, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, client.Options{Discovery: d})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() {
		runErr <- c.Run(ctx, 2, func(context.Context, client.Item) (client.Result, error) { return client.Result{}, nil })
	}()
	clienttest.Eventually(t, "every row completed", func() bool { return len(cl.Store().Completions()) == len(rows) })
	cancel()
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range c.Shards() {
		found = found || s.URL == fmt.Sprintf("http://127.0.0.1:%d", port)
	}
	if !found {
		t.Fatalf("shards %+v do not include 127.0.0.1:%d", c.Shards(), port)
	}
}

func TestOptionsValidated(t *testing.T) {
	d := static(t, "http://127.0.0.1:1")
	for _, o := range []client.Options{{}, {Discovery: d, Batch: -1}, {Discovery: d, Batch: 10001}, {Discovery: d, Lease: -time.Second}, {Discovery: d, Lease: 25 * time.Hour}} {
		if _, err := client.New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
	for _, u := range [][]string{{}, {"ftp://x"}, {"http://a:1", "http://a:1/"}, {"127.0.0.1:8080"}} {
		if _, err := discovery.Static(u...); err == nil {
			t.Errorf("discovery.Static(%q) accepted", u)
		}
	}
}

func TestGetStatus(t *testing.T) {
	cl := clienttest.NewCluster(t, clienttest.Options{Token: "tok"}, "web-shard-0")
	cl.Upsert(overdue("product", 3)...)
	clienttest.Eventually(t, "the rows held", func() bool { return cl.Due() == 3 })
	st, err := client.GetStatus(context.Background(), http.DefaultClient, cl.URLs()[0]+"/")
	if err != nil {
		t.Fatal(err)
	}
	if st.Shard != "web-shard-0" || st.Due != 3 || !st.Complete {
		t.Fatalf("status %+v", st)
	}
	var se *client.StatusError
	if _, err := client.GetStatus(context.Background(), http.DefaultClient, cl.URLs()[0]+"/nope"); !errors.As(err, &se) || se.Code != 404 {
		t.Fatalf("status of a wrong URL: %v, want a 404 StatusError", err)
	}
}

func TestGetShardStatus(t *testing.T) {
	cl := clienttest.NewCluster(t, clienttest.Options{}, "web-shard-0")
	base := cl.URLs()[0]
	if st, err := client.GetShardStatus(context.Background(), http.DefaultClient, base, "web-shard-0"); err != nil || st.Shard != "web-shard-0" {
		t.Fatalf("the right shard: %v %v", st, err)
	}
	if _, err := client.GetShardStatus(context.Background(), http.DefaultClient, base, "web-shard-1"); err == nil ||
		!strings.Contains(err.Error(), `reports shard "web-shard-0", not "web-shard-1"`) {
		t.Fatalf("another shard's address: %v", err)
	}
	if _, err := client.GetShardStatus(context.Background(), http.DefaultClient, "http://127.0.0.1:1", "x"); err == nil ||
		!strings.HasPrefix(err.Error(), "unreachable: ") {
		t.Fatalf("nothing listening: %v", err)
	}
	var se *client.StatusError
	if _, err := client.GetShardStatus(context.Background(), http.DefaultClient, base+"/nope", "web-shard-0"); !errors.As(err, &se) ||
		strings.HasPrefix(err.Error(), "unreachable") {
		t.Fatalf("a 404: %v", err)
	}
}

// TestCompletionRetriedWhileTheShardIsUnavailable: a shard that answers completions 503 (its
// database away, its request limits full) for several seconds does not lose them: Run keeps
// retrying while the leases last, no sooner than the shard's Retry-After, and every row is
// completed once the shard answers again.
func TestCompletionRetriedWhileTheShardIsUnavailable(t *testing.T) {
	cl := clienttest.NewCluster(t, clienttest.Options{}, "a")
	rows := overdue("product", 20)
	cl.Upsert(rows...)
	clienttest.Eventually(t, "the rows held", func() bool { return cl.Due() == len(rows) })

	const refusals = 4 // more than the three attempts the worker used to make
	var mu sync.Mutex
	var refused []time.Time
	hc := &http.Client{Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/v1/complete") {
			mu.Lock()
			n := len(refused)
			if n < refusals {
				refused = append(refused, time.Now())
			}
			mu.Unlock()
			if n < refusals {
				if r.Body != nil {
					_ = r.Body.Close()
				}
				return &http.Response{StatusCode: http.StatusServiceUnavailable, Request: r, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
					Header: http.Header{"Retry-After": {"1"}, "Content-Type": {"application/json"}},
					Body:   io.NopCloser(strings.NewReader(`{"error":"the store is unavailable"}`))}, nil
			}
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
	c := newClient(t, client.Options{Discovery: static(t, cl.URLs()...), HTTPClient: hc, Batch: len(rows)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() {
		runErr <- c.Run(ctx, 1, func(context.Context, client.Item) (client.Result, error) { return client.Result{}, nil })
	}()
	clienttest.Eventually(t, "every row completed after the refusals", func() bool { return len(cl.Store().Completions()) == len(rows) })
	cancel()
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
	checkOnce(t, cl.Store(), rows)
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(refused); i++ {
		if gap := refused[i].Sub(refused[i-1]); gap < 950*time.Millisecond {
			t.Errorf("attempt %d came %v after the previous one: the shard's Retry-After of 1 s was not honoured", i+1, gap)
		}
	}
}
