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

// TestCompletedRowsAsStored: a completion sends the store what the shard knows of the row
// (store.Completion.Known) and applies the row the store builds from it; claimed again once due,
// every row carries exactly the database's values — due time, cadence, route, source, urgent, rev.
func TestCompletedRowsAsStored(t *testing.T) {
	e := newShardEnv(t, allSlots(0))
	const n = 40
	rows := make([]schedule.Row, n)
	for i := range rows {
		r := srow(fmt.Sprintf("https://example.com/known/%02d", i), t0.Add(-time.Duration(i+1)*time.Minute), []time.Duration{time.Hour, 2 * time.Hour, 96 * time.Hour}[i%3])
		r.Route = []string{"product", "category", ""}[i%3]
		if i%2 == 1 {
			r.Source = schedule.SourceSubmitted
		}
		r.Urgent = i%5 == 0
		rows[i] = r
	}
	e.upsert(rows...)
	e.sh.Walk(e.ctx, true)
	claimed, err := e.sh.Claim(e.clock.Now(), n, time.Hour)
	if err != nil || len(claimed) != n {
		t.Fatalf("claimed %d: %v", len(claimed), err)
	}
	items := make([]CompleteItem, n)
	for i, c := range claimed {
		items[i] = CompleteItem{Key: c.Key, Lease: c.Lease}
	}
	res, err := e.sh.Complete(e.ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r != nil {
			t.Fatalf("completion of %s: %v", items[i].Key, r)
		}
	}
	e.clock.Set(t0.Add(200 * time.Hour)) // past every next due time
	again, err := e.sh.Claim(e.clock.Now(), n, time.Hour)
	if err != nil || len(again) != n {
		t.Fatalf("claimed %d again: %v", len(again), err)
	}
	type stored struct {
		due           time.Time
		cadenceMs     int64
		route, source string
		urgent        bool
		rev           int64
	}
	db := map[string]stored{}
	q, err := e.st.Pool().Query(e.ctx, `SELECT key, due_at, cadence_ms, route, source, urgent, rev FROM render_schedule`)
	if err != nil {
		t.Fatal(err)
	}
	for q.Next() {
		var k string
		var s stored
		if err := q.Scan(&k, &s.due, &s.cadenceMs, &s.route, &s.source, &s.urgent, &s.rev); err != nil {
			t.Fatal(err)
		}
		db[k] = s
	}
	q.Close()
	for _, c := range again {
		s, ok := db[c.Key]
		if !ok {
			t.Errorf("%s: claimed, not in the database", c.Key)
			continue
		}
		// the shard holds due times to the millisecond
		if !c.Due.Equal(s.due.Truncate(time.Millisecond)) || c.Cadence.Milliseconds() != s.cadenceMs || c.Route != s.route ||
			c.Source.String() != s.source || c.Urgent != s.urgent || c.Rev != s.rev {
			t.Errorf("%s: claimed due %v, cadence %v, route %q, source %v, urgent %v, rev %d; stored %+v", c.Key,
				c.Due, c.Cadence, c.Route, c.Source, c.Urgent, c.Rev, s)
		}
	}
}
