package keeper

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"

	"github.com/renderqueue/renderqueue/pkg/membership"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

// cluster runs several in-process shards over one real database, each with its own store
// (connection pool and listener) and Run loop, and plays the operator's part of the handoff.
type cluster struct {
	t      testing.TB
	ctx    context.Context
	dsn    string
	assign membership.Assignment
	shards map[string]*clusterShard
	// shardsMu guards shards against the completers' reads (the test goroutine changes it)
	shardsMu sync.Mutex
	// writers pause (write lock) while the sampler compares with the database
	writeMu sync.RWMutex
	// noSample: rebalance does not sample after each phase (BenchmarkHandoff times the phases)
	noSample bool
	// onPhase, when set, is told of each phase rebalance publishes
	onPhase func(kind membership.ActionKind, epoch int64)
	// moves are the slots the last handoff moves, committedAt when it was committed (zero while
	// it prepares): the shards' Settings.Arriving
	moves       []membership.MoveText
	committedAt time.Time
	// stateDir, when set, holds each shard's state file (<name>.state), as a Pod's emptyDir does:
	// a shard started again after kill finds its predecessor's
	stateDir string
	// settings, when set, adjusts every shard's settings
	settings func(*Settings)
}

// inprocPeers asks the cluster's shards for handovers by calling them (their URL is
// "inproc://<name>"), as client.Peers does over HTTP.
type inprocPeers struct{ c *cluster }

func (p inprocPeers) Handover(_ context.Context, baseURL string, req shardapi.HandoverRequest) (shardapi.HandoverResponse, error) {
	name := strings.TrimPrefix(baseURL, "inproc://")
	p.c.shardsMu.Lock()
	cs := p.c.shards[name]
	p.c.shardsMu.Unlock()
	if cs == nil {
		return shardapi.HandoverResponse{}, fmt.Errorf("shard %s is not running", name)
	}
	return cs.sh.Handover(time.Now(), req)
}

type clusterShard struct {
	sh      *Shard
	updates chan Settings
	cancel  context.CancelFunc
	done    chan error
}

func newCluster(t testing.TB) *cluster {
	dsn := pgtest.NewDatabase(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c := &cluster{t: t, ctx: ctx, dsn: dsn, shards: map[string]*clusterShard{}}
	st := c.openStore()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *cluster) openStore() *postgres.Store {
	// a long idle health interval: an event left undelivered after a re-LISTEN would wait for it
	// and fail the sample's deadline
	st, err := postgres.Open(c.ctx, c.dsn, postgres.Options{ReconnectMin: 10 * time.Millisecond, ReconnectMax: 200 * time.Millisecond, HealthInterval: time.Minute, QuietCompletions: true})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = st.Close() })
	return st
}

func (c *cluster) settingsFor(name string) Settings {
	st := Settings{LeaseDuration: time.Minute, SubmittedBoost: 2, UrgentMaxShare: 0.2,
		Epoch: c.assign.Epoch, Owned: c.assign.Owned(name), Incoming: c.assign.Incoming(name)}
	for _, n := range c.assign.Shards() {
		st.Peers = append(st.Peers, Peer{Name: n, URL: "inproc://" + n, Owned: c.assign.Owned(n)})
	}
	for _, m := range c.moves {
		if m.To != name {
			continue
		}
		set, err := schedule.ParseSlots(m.Slots)
		if err != nil {
			c.t.Fatal(err)
		}
		a := Arrival{From: m.From, Slots: set, CommittedAt: c.committedAt}
		if !c.committedAt.IsZero() {
			a.Epoch = c.assign.Epoch
		}
		st.Arriving = append(st.Arriving, a)
	}
	if c.settings != nil {
		c.settings(&st)
	}
	return st
}

// publish hands every shard of the assignment its settings, starting shards that are new and
// telling those left without slots (they give them away) and stopping them once no shard awaits
// their handover.
func (c *cluster) publish() {
	c.t.Helper()
	inAssignment := map[string]bool{}
	for _, name := range c.assign.Shards() {
		inAssignment[name] = true
		s := c.settingsFor(name)
		if cs, ok := c.shards[name]; ok {
			cs.updates <- s
			continue
		}
		opts := Options{Name: name, Store: c.openStore(), Log: logr.Discard(), Peers: inprocPeers{c}}
		if c.stateDir != "" {
			opts.StateFile = filepath.Join(c.stateDir, name+".state")
		}
		sh, err := NewShard(opts, s)
		if err != nil {
			c.t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(c.ctx)
		cs := &clusterShard{sh: sh, updates: make(chan Settings, 4), cancel: cancel, done: make(chan error, 1)}
		go func() { cs.done <- sh.Run(ctx, cs.updates) }()
		c.shardsMu.Lock()
		c.shards[name] = cs
		c.shardsMu.Unlock()
	}
	for name, cs := range c.shards {
		if !inAssignment[name] {
			cs.updates <- c.settingsFor(name) // left without slots: it gives them away, then stops
		}
	}
	for name, cs := range c.shards {
		if !inAssignment[name] {
			c.awaitHandoversFrom(name)
			cs.cancel()
			if err := <-cs.done; !errors.Is(err, context.Canceled) {
				c.t.Errorf("shard %s stopped with %v", name, err)
			}
			c.shardsMu.Lock()
			delete(c.shards, name)
			c.shardsMu.Unlock()
		}
	}
}

// awaitHandoversFrom waits (up to 30 s) until no other shard awaits the handover of slots from
// shard name, as a keeper that is deleted serves its handovers while it drains.
func (c *cluster) awaitHandoversFrom(name string) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		awaited := false
		for other, cs := range c.shards {
			if other == name {
				continue
			}
			st := cs.sh.Status(time.Now())
			// a shard that has not adopted the assignment yet cannot be awaiting it
			awaited = awaited || st.Membership.Epoch < c.assign.Epoch
			for _, f := range st.Fences {
				awaited = awaited || (f.Until == nil && strings.Contains(f.Reason, name))
			}
		}
		if !awaited {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.t.Errorf("shards still await the handover of %s after 30 s", name)
}

// kill stops a shard's process without telling the coordinator.
func (c *cluster) kill(name string) {
	cs := c.shards[name]
	cs.cancel()
	if err := <-cs.done; !errors.Is(err, context.Canceled) {
		c.t.Errorf("shard %s stopped with %v", name, err)
	}
	c.shardsMu.Lock()
	delete(c.shards, name)
	c.shardsMu.Unlock()
}

// rebalance drives plan → prepare → wait for the receivers → commit (or rollback after timeout),
// sampling after every phase. It returns the handoff's final state.
func (c *cluster) rebalance(target []string, timeout time.Duration, duringPrepare func()) membership.HandoffState {
	c.t.Helper()
	plan, err := membership.PlanRebalance(c.assign, target)
	if err != nil {
		c.t.Fatal(err)
	}
	if plan.IsEmpty() {
		return membership.HandoffCommitted
	}
	h, act, err := membership.StartHandoff(c.assign, plan, time.Now(), timeout)
	if err != nil {
		c.t.Fatal(err)
	}
	for {
		switch act.Kind {
		case membership.ActionPrepare, membership.ActionCommit, membership.ActionRollback:
			c.t.Logf("%s %s epoch %d", time.Now().Format("15:04:05.000"), act.Kind, act.Phase.Epoch)
			next, err := membership.Apply(c.assign, act.Phase)
			if err != nil {
				c.t.Fatal(err)
			}
			if err := next.Validate(); err != nil {
				c.t.Fatalf("assignment after %s: %v", act.Kind, err)
			}
			c.assign = next
			c.moves, c.committedAt = h.Moves, time.Time{}
			if act.Kind == membership.ActionCommit {
				c.committedAt = time.Now()
			}
			c.publish()
			if c.onPhase != nil {
				c.onPhase(act.Kind, act.Phase.Epoch)
			}
			if !c.noSample {
				c.sample(string(act.Kind))
			}
			if act.Kind == membership.ActionPrepare && duringPrepare != nil {
				duringPrepare()
			}
		case membership.ActionNone:
			return h.State
		case membership.ActionWait:
			time.Sleep(20 * time.Millisecond) // the operator's RequeueAfter; receivers walk meanwhile
		}
		reports := map[string]int64{}
		for name, cs := range c.shards {
			reports[name] = cs.sh.Status(time.Now()).Membership.PreparedEpoch
		}
		h, act, err = h.Step(time.Now(), reports)
		if err != nil {
			c.t.Fatal(err)
		}
	}
}

// sample pauses the writers and checks, once every owner has adopted the assignment and applied
// the writes' events, that the due count summed by the committed assignment equals the count
// from SQL; it fails if that never happens.
func (c *cluster) sample(when string) {
	c.t.Helper()
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	conn, err := pgx.Connect(c.ctx, c.dsn)
	if err != nil {
		c.t.Fatal(err)
	}
	defer func() { _ = conn.Close(c.ctx) }()
	var truth int
	if err := conn.QueryRow(c.ctx, `SELECT count(*) FROM render_schedule WHERE due_at <= now()`).Scan(&truth); err != nil {
		c.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	var last string
	logged := false
	for {
		reports := map[string]membership.ShardDue{}
		allExact := true
		for name, cs := range c.shards {
			st := cs.sh.Status(time.Now())
			owned, err := schedule.ParseSlots(st.Membership.Owned)
			if err != nil {
				c.t.Fatal(err)
			}
			d := membership.ShardDue{Owned: owned, DuePerSlot: map[int]int{}}
			for k, v := range st.DuePerSlot {
				sl, _ := strconv.Atoi(k)
				d.DuePerSlot[sl] = v
			}
			reports[name] = d
			allExact = allExact && st.Exact
		}
		due, exact := membership.SumDue(c.assign, reports)
		if exact && allExact && due == truth {
			return
		}
		last = fmt.Sprintf("sum %d (exact %v, shards exact %v), SQL %d", due, exact, allExact, truth)
		if !logged && time.Until(deadline) < 8*time.Second {
			logged = true
			for name, cs := range c.shards {
				st := cs.sh.Status(time.Now())
				c.t.Logf("slow sample %s: %s exact=%v complete=%v status=%s epoch=%d owned=%s incoming=%s prepared=%d gap=%v walking=%v lastWalk=%+v err=%s", when, name, st.Exact, st.Complete, st.Status, st.Membership.Epoch, st.Membership.Owned, st.Membership.Incoming, st.Membership.PreparedEpoch, st.Gap, st.WalkingSince, st.LastWalk, st.Error)
			}
			c.t.Logf("slow sample %s: %s", when, last)
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("sample after %s (epoch %d): %s", when, c.assign.Epoch, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// complete runs a render worker until ctx ends: it claims up to 20 rows of each shard in turn
// and completes them, half due again a minute ago (so the due set does not drain), half due an
// hour on. The shards' stores complete quietly (QuietCompletions): a receiver preparing a slot
// learns of the giver's completions only because its listener recorded the slot.
func (c *cluster) complete(ctx context.Context, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 11))
	for ctx.Err() == nil {
		c.writeMu.RLock()
		c.shardsMu.Lock()
		shards := make([]*Shard, 0, len(c.shards))
		for _, cs := range c.shards {
			shards = append(shards, cs.sh)
		}
		c.shardsMu.Unlock()
		for _, sh := range shards {
			claimed, err := sh.Claim(time.Now(), 20, 0)
			if err != nil || len(claimed) == 0 {
				continue
			}
			items := make([]CompleteItem, len(claimed))
			for i, cl := range claimed {
				next := time.Now().Add(-time.Minute)
				if rng.IntN(2) == 0 {
					next = time.Now().Add(time.Hour)
				}
				items[i] = CompleteItem{Key: cl.Key, Lease: cl.Lease, NextDue: &next}
			}
			_, _ = sh.Complete(ctx, items)
		}
		c.writeMu.RUnlock()
	}
}

// write runs writers until ctx ends: upserts of random keys with due an hour either side of
// now, and deletes.
func (c *cluster) write(ctx context.Context, seed uint64) {
	st := c.openStore()
	rng := rand.New(rand.NewPCG(seed, 7))
	for ctx.Err() == nil {
		c.writeMu.RLock()
		if rng.IntN(10) == 0 {
			keys := []string{fmt.Sprintf("https://example.com/w/%d", rng.IntN(3000))}
			_, _ = st.Delete(ctx, keys)
		} else {
			rows := make([]schedule.Row, 0, 20)
			seen := map[string]bool{}
			for len(rows) < 20 {
				k := fmt.Sprintf("https://example.com/w/%d", rng.IntN(3000))
				if seen[k] {
					continue
				}
				seen[k] = true
				due := time.Now().Add(time.Hour)
				if rng.IntN(3) == 0 {
					due = time.Now().Add(-time.Hour)
				}
				rows = append(rows, schedule.Row{Key: k, Due: due, HasDue: true, Cadence: time.Hour, Route: "product"})
			}
			_, _ = st.Upsert(ctx, rows)
		}
		c.writeMu.RUnlock()
	}
}

func TestRebalanceKeepsDueExact(t *testing.T) {
	if testing.Short() {
		t.Skip("rebalance test runs several shards against PostgreSQL")
	}
	c := newCluster(t)
	seedSt := c.openStore()
	var rows []schedule.Row
	for i := 0; i < 5000; i++ {
		due := time.Now().Add(-time.Hour)
		if i%2 == 0 {
			due = time.Now().Add(time.Hour)
		}
		rows = append(rows, schedule.Row{Key: fmt.Sprintf("https://example.com/s/%d", i), Due: due, HasDue: true, Cadence: time.Hour})
	}
	if _, err := seedSt.Upsert(c.ctx, rows); err != nil {
		t.Fatal(err)
	}
	names := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("rq-shard-%d", i)
		}
		return out
	}
	// the first assignment: 3 shards
	if state := c.rebalance(names(3), 30*time.Second, nil); state != membership.HandoffCommitted {
		t.Fatalf("first assignment: %s", state)
	}

	wctx, stopWriters := context.WithCancel(c.ctx)
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(2)
		go func() { defer wg.Done(); c.write(wctx, uint64(i)) }()
		go func() { defer wg.Done(); c.complete(wctx, uint64(i)) }()
	}
	defer func() { stopWriters(); wg.Wait() }()

	for _, n := range []int{4, 6, 2} {
		if state := c.rebalance(names(n), 30*time.Second, nil); state != membership.HandoffCommitted {
			t.Fatalf("rebalance to %d: %s", n, state)
		}
		if got := len(c.assign.Shards()); got != n {
			t.Fatalf("after rebalance to %d: %d shards own slots", n, got)
		}
		c.sample(fmt.Sprintf("rebalance to %d", n))
	}

	// a receiver that dies during prepare: the handoff rolls back and nothing is lost
	before := c.assign
	state := c.rebalance(names(3), 500*time.Millisecond, func() { c.kill("rq-shard-2") })
	if state != membership.HandoffRolledBack {
		t.Fatalf("dead receiver: %s", state)
	}
	for sl := 0; sl < schedule.NumSlots; sl++ {
		if c.assign.Owner(sl) != before.Owner(sl) {
			t.Fatalf("slot %d moved from %s to %s despite the rollback", sl, before.Owner(sl), c.assign.Owner(sl))
		}
	}
	c.sample("rollback")
}
