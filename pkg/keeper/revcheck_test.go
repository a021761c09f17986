package keeper

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/go-logr/logr"

	"github.com/renderqueue/renderqueue/pkg/keeper/shardmetrics"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// TestCompletionKeepsProducerChange: a producer sets urgent and moves the due time earlier while
// the row is leased; the render's completion is refused ("changed since claimed"), the row keeps
// the producer's version in the database and in the shard, and is handed out again at once with
// it.
func TestCompletionKeepsProducerChange(t *testing.T) {
	e := newShardEnv(t, allSlots(24*time.Hour))
	reg := prometheus.NewPedanticRegistry()
	sh, err := NewShard(Options{Name: "rc", Store: e.st, Clock: e.clock.Now, Log: logr.Discard(), Metrics: shardmetrics.New(reg)}, allSlots(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Subscribe(e.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sh.sub.Close() }()
	row := e.upsert(srow("https://example.com/p", t0.Add(-time.Hour), 96*time.Hour))[0]
	sh.Walk(e.ctx, true)
	claimed, err := sh.Claim(e.clock.Now(), 1, time.Hour)
	if err != nil || len(claimed) != 1 {
		t.Fatal(claimed, err)
	}

	changed := row
	changed.Urgent, changed.Due = true, t0.Add(-50*time.Hour)
	stored := e.upsert(changed)[0]
	res, err := sh.Complete(e.ctx, []CompleteItem{{Key: row.Key, Lease: claimed[0].Lease}})
	if err != nil || !errors.Is(res[0], ErrChangedSinceClaimed) {
		t.Fatalf("completion after the producer's change: %v %v", res, err)
	}
	var urgent bool
	var due time.Time
	if err := e.st.Pool().QueryRow(e.ctx, `SELECT urgent, due_at FROM render_schedule WHERE key = $1`, row.Key).Scan(&urgent, &due); err != nil {
		t.Fatal(err)
	}
	if !urgent || !due.Equal(stored.Due) {
		t.Fatalf("stored row: urgent %v due %v, want the producer's (urgent, %v)", urgent, due, stored.Due)
	}
	again, err := sh.Claim(e.clock.Now(), 1, time.Hour)
	if err != nil || len(again) != 1 || !again[0].Urgent || again[0].Rev != stored.Rev || !again[0].Due.Equal(stored.Due) {
		t.Fatalf("claim after the refused completion: %+v %v, want the producer's version", again, err)
	}
	wantLines(t, scrape(t, sh, reg), `renderqueue_keeper_completed_rows_total{cadence_le="96h",result="changed",source="discovered"} 1`)

	// the new lease completes normally
	res, err = sh.Complete(e.ctx, []CompleteItem{{Key: row.Key, Lease: again[0].Lease}})
	if err != nil || res[0] != nil {
		t.Fatalf("completing the new lease: %v %v", res, err)
	}
}

// TestCompletionRacesProducer races a producer marking 300 leased rows urgent against the
// completions of their renders. Whichever comes first, no producer write is lost: every row ends
// urgent in the database, each completion is either written (before the producer's write) or
// refused as changed, and the shard holds every row at the database's rev.
func TestCompletionRacesProducer(t *testing.T) {
	e := newShardEnv(t, allSlots(0))
	const n = 300
	rows := make([]schedule.Row, n)
	for i := range rows {
		rows[i] = srow(fmt.Sprintf("https://example.com/race/%03d", i), t0.Add(-time.Duration(i+1)*time.Minute), time.Hour)
	}
	rows = e.upsert(rows...)
	e.sh.Walk(e.ctx, true)
	claimed, err := e.sh.Claim(e.clock.Now(), n, time.Hour)
	if err != nil || len(claimed) != n {
		t.Fatalf("claimed %d: %v", len(claimed), err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	pumped := make(chan struct{})
	go func() { // apply events as Run does
		defer close(pumped)
		for {
			b, err := e.sh.sub.Next(ctx)
			if err != nil {
				return
			}
			e.sh.HandleBatch(b)
		}
	}()

	var wg sync.WaitGroup
	var mu sync.Mutex
	outcome := map[string]int{}
	wg.Go(func() { // the workers: complete in batches of 10
		for i := 0; i < n; i += 10 {
			items := make([]CompleteItem, 0, 10)
			for _, c := range claimed[i:min(i+10, n)] {
				items = append(items, CompleteItem{Key: c.Key, Lease: c.Lease})
			}
			res, err := e.sh.Complete(e.ctx, items)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			for _, r := range res {
				switch {
				case r == nil:
					outcome["written"]++
				case errors.Is(r, ErrChangedSinceClaimed):
					outcome["changed"]++
				default:
					t.Errorf("completion: %v", r)
				}
			}
			mu.Unlock()
		}
	})
	wg.Go(func() { // the producer: mark every row urgent, in another order, in batches of 10
		order := rand.New(rand.NewPCG(1, 2)).Perm(n)
		for i := 0; i < n; i += 10 {
			batch := make([]schedule.Row, 0, 10)
			for _, j := range order[i:min(i+10, n)] {
				r := rows[j]
				r.Urgent = true
				batch = append(batch, r)
			}
			if _, err := e.st.Upsert(e.ctx, batch); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
	t.Logf("completions: %v", outcome)
	if outcome["written"]+outcome["changed"] != n {
		t.Fatalf("outcomes %v for %d completions", outcome, n)
	}

	dbRev := map[string]int64{}
	r, err := e.st.Pool().Query(e.ctx, `SELECT key, urgent, rev FROM render_schedule`)
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var k string
		var urgent bool
		var rev int64
		if err := r.Scan(&k, &urgent, &rev); err != nil {
			t.Fatal(err)
		}
		if !urgent {
			t.Errorf("%s lost the producer's urgent flag", k)
		}
		dbRev[k] = rev
	}
	r.Close()
	eventually(t, "the shard to hold every row at the database's rev", 20*time.Second, func() bool {
		e.sh.mu.Lock()
		defer e.sh.mu.Unlock()
		for k, rev := range dbRev {
			if got, held := e.sh.core.HeldRev(k); !held || got != rev {
				return false
			}
		}
		return true
	})
	cancel()
	<-pumped
}

// TestLeasedRevsStayBounded: the revs remembered per lease are forgotten once their leases
// expire, so the map stays within twice the leases in flight however many claims are made; the
// leases still current are kept (they complete).
func TestLeasedRevsStayBounded(t *testing.T) {
	const n = 2000
	e := loadedDueShard(t, n)
	now := t0
	for round := range 10 {
		e.clock.Set(now)
		claimed, err := e.sh.Claim(now, n, time.Minute)
		if err != nil || len(claimed) != n {
			t.Fatalf("round %d: claimed %d: %v", round, len(claimed), err)
		}
		waitLeaseSweep(t, e.sh)        // a sweep the claim started runs beside the claims, in steps
		now = now.Add(2 * time.Minute) // every lease expires
	}
	e.sh.mu.Lock()
	remembered := len(e.sh.leased)
	e.sh.mu.Unlock()
	if remembered > 2*n {
		t.Fatalf("%d lease revs remembered after 10 rounds of %d expired leases", remembered, n)
	}
	// the leases still current are kept: claim once more and complete
	e.clock.Set(now)
	claimed, err := e.sh.Claim(now, n, time.Minute)
	if err != nil || len(claimed) != n {
		t.Fatalf("last round: claimed %d: %v", len(claimed), err)
	}
	items := make([]CompleteItem, len(claimed))
	for i, c := range claimed {
		items[i] = CompleteItem{Key: c.Key, Lease: c.Lease}
	}
	results, err := e.sh.Complete(e.ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range results {
		if err != nil {
			t.Fatalf("completing %s after the sweeps: %v", items[i].Key, err)
		}
	}
}

// loadedDueShard returns a standalone shard that has loaded n rows, all due an hour ago.
func loadedDueShard(t *testing.T, n int) *shardEnv {
	t.Helper()
	e := newShardEnv(t, allSlots(0))
	rows := make([]schedule.Row, n)
	for i := range rows {
		rows[i] = srow(fmt.Sprintf("https://example.com/due/%05d", i), t0.Add(-time.Hour), time.Hour)
	}
	e.upsert(rows...)
	e.sh.Walk(e.ctx, true)
	return e
}

// waitLeaseSweep waits until no sweep of the shard's leases is running.
func waitLeaseSweep(t *testing.T, sh *Shard) {
	t.Helper()
	eventually(t, "the lease sweep to end", 20*time.Second, func() bool {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return !sh.leaseSweeping
	})
}

// TestLeaseSweepKeepsCurrentLeases: a sweep (which runs in steps, beside the claims) forgets the
// expired leases and keeps the current ones, among them those of the claim that started it.
func TestLeaseSweepKeepsCurrentLeases(t *testing.T) {
	const n = 4000
	e := loadedDueShard(t, n)
	e.clock.Set(t0)
	if _, err := e.sh.Claim(t0, n, time.Minute); err != nil {
		t.Fatal(err)
	}
	waitLeaseSweep(t, e.sh) // the first claim's sweep: every lease current, all kept
	// every lease expires; the next claim leases the rows again and, the map having doubled,
	// starts a sweep of the n expired leases and its own n: it must keep its own
	later := t0.Add(2 * time.Minute)
	e.clock.Set(later)
	again, err := e.sh.Claim(later, n, time.Minute)
	if err != nil || len(again) != n {
		t.Fatalf("claimed %d again: %v", len(again), err)
	}
	waitLeaseSweep(t, e.sh)
	e.sh.mu.Lock()
	defer e.sh.mu.Unlock()
	if len(e.sh.leased) != n {
		t.Errorf("%d leases remembered after the sweep, want the %d current ones", len(e.sh.leased), n)
	}
	for _, c := range again {
		if _, ok := e.sh.leased[c.Lease]; !ok {
			t.Fatalf("the current lease of %s was forgotten", c.Key)
		}
	}
}
