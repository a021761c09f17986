package client_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/client/clienttest"
)

// clusterDiscovery follows the cluster's running shards, as kube.RenderQueue follows the
// RenderQueue's status.
type clusterDiscovery struct{ cl *clienttest.Cluster }

func (d clusterDiscovery) Run(ctx context.Context, update func([]client.Shard)) error {
	var last []string
	for {
		var shards []client.Shard
		var urls []string
		for _, s := range d.cl.Shards() {
			shards = append(shards, client.Shard{Name: s.Name, URL: s.URL})
			urls = append(urls, s.URL)
		}
		if !slices.Equal(urls, last) {
			update(shards)
			last = urls
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// leaseAudit records every lease a worker got and how it ended, and finds the leases of one row
// that overlapped in time: the row handed out again while an earlier lease still stood.
type leaseAudit struct {
	mu     sync.Mutex
	leases map[string][]*auditLease
	acked  map[string]int
	errs   map[string]int
}

type auditLease struct {
	lease, shard string
	claimed      time.Time
	expires      time.Time
	ended        time.Time // acknowledged or refused
	outcome      string
}

func newLeaseAudit() *leaseAudit {
	return &leaseAudit{leases: map[string][]*auditLease{}, acked: map[string]int{}, errs: map[string]int{}}
}

func (a *leaseAudit) claimed(items []client.Item, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, it := range items {
		a.leases[it.Key] = append(a.leases[it.Key], &auditLease{lease: it.Lease, shard: it.Shard, claimed: at, expires: it.LeaseExpires})
	}
}

func (a *leaseAudit) answered(done []client.Completion, errs []error, at time.Time) (again []client.Completion) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, err := range errs {
		var ie *client.ItemError
		outcome := "acknowledged"
		switch {
		case err == nil:
			a.acked[done[i].Item.Key]++
		case errors.As(err, &ie):
			outcome = "refused: " + ie.Reason
			a.errs[ie.Reason]++
		default:
			again = append(again, done[i]) // not answered: sent again with the same lease
			continue
		}
		for _, l := range a.leases[done[i].Item.Key] {
			if l.lease == done[i].Item.Lease && l.shard == done[i].Item.Shard {
				l.ended, l.outcome = at, outcome
			}
		}
	}
	return again
}

// overlaps returns the pairs of leases of one key that overlapped in time.
func (a *leaseAudit) overlaps() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for k, ls := range a.leases {
		sort.Slice(ls, func(i, j int) bool { return ls[i].claimed.Before(ls[j].claimed) })
		for i := range ls {
			end := ls[i].expires
			if !ls[i].ended.IsZero() && ls[i].ended.Before(end) {
				end = ls[i].ended
			}
			for j := i + 1; j < len(ls) && ls[j].claimed.Before(end); j++ {
				out = append(out, fmt.Sprintf("%s: %s from %s (%s), again %s from %s (%s)", k, ls[i].lease, ls[i].shard,
					ls[i].outcome, ls[j].lease, ls[j].shard, ls[j].outcome))
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestLeasesSurviveHandoffs runs workers that hold their leases for a while across slot
// handoffs (1→3→2→4→1 shards), the commits reaching givers first in some and receivers first in
// others: no row may be leased twice at once, every completion must be acknowledged (a lease
// that moved with its slot is followed to its new shard), and every row completed exactly once.
func TestLeasesSurviveHandoffs(t *testing.T) {
	for _, receiversFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("receiversFirst=%v", receiversFirst), func(t *testing.T) {
			cl := clienttest.NewCluster(t, clienttest.Options{Token: "t0k", Lease: 20 * time.Second, ReceiversFirst: receiversFirst}, "s0")
			rows := overdue("handoff", 600)
			cl.Upsert(rows...)
			clienttest.Eventually(t, "the rows held", func() bool { return cl.Due() == len(rows) })
			c := newClient(t, client.Options{Discovery: clusterDiscovery{cl}, Token: "t0k", Batch: 4})
			audit := newLeaseAudit()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var wg sync.WaitGroup
			for w := range 6 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 7))
					for ctx.Err() == nil {
						items, err := c.Claim(ctx, 4)
						if err != nil || len(items) == 0 {
							time.Sleep(5 * time.Millisecond)
							continue
						}
						audit.claimed(items, time.Now())
						// the render: long enough that leases stand while slots move
						time.Sleep(time.Duration(20+rng.IntN(60)) * time.Millisecond)
						done := make([]client.Completion, len(items))
						for i, it := range items {
							done[i] = client.Completion{Item: it}
						}
						for attempt := 0; attempt < 50 && len(done) > 0; attempt++ {
							errs, _ := c.Complete(context.Background(), done)
							done = audit.answered(done, errs, time.Now())
							if len(done) > 0 {
								time.Sleep(20 * time.Millisecond)
							}
						}
					}
				})
			}
			clienttest.Eventually(t, "the workers to start completing", func() bool { return len(cl.Store().Completions()) > 30 })
			for _, target := range [][]string{{"s0", "s1", "s2"}, {"s1", "s2"}, {"s1", "s2", "s3", "s4"}, {"s3"}} {
				cl.Rebalance(nil, target...)
				time.Sleep(30 * time.Millisecond)
			}
			deadline := time.Now().Add(15 * time.Second)
			for cl.Due() > 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if due := cl.Due(); due > 0 {
				for _, st := range cl.Status() {
					t.Logf("%s: due %d leased %d heldBack %d fences %+v", st.Shard, st.Due, st.Leased, st.HeldBack, st.Fences)
				}
				t.Errorf("%d rows still due 15 s after the last handoff", due)
			}
			cancel()
			wg.Wait()
			if o := audit.overlaps(); len(o) > 0 {
				t.Errorf("%d overlapping leases, the first: %s", len(o), strings.Join(o[:min(5, len(o))], "; "))
			}
			if len(audit.errs) > 0 {
				t.Errorf("completions refused: %v", audit.errs)
			}
			checkOnce(t, cl.Store(), rows)
			moved := 0
			for _, s := range cl.Shards() {
				moved += s.Keeper.Status(time.Now()).HeldBack
			}
			if moved != 0 {
				t.Errorf("%d rows still held back at the end", moved)
			}
		})
	}
}
