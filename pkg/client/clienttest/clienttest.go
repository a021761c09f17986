// Package clienttest runs real keeper shards in the test process, for tests of render workers
// and of tools that read the shard API: each shard is pkg/keeper's shard service (the same code
// the operator runs) over one in-memory store (pkg/store/memstore), served by an httptest server.
// A Cluster can add and remove shards with the two-phase slot handoff the operator uses, so a
// test can rebalance under a running worker.
package clienttest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/keeper"
	"github.com/renderqueue/renderqueue/pkg/keeper/httpserve"
	"github.com/renderqueue/renderqueue/pkg/membership"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/memstore"
)

// TB is the part of testing.TB a Cluster uses.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

var _ TB = testing.TB(nil)

// Options configure a Cluster. The zero value gives the defaults.
type Options struct {
	// Token is the shards' bearer token; empty runs them without authentication.
	Token string
	// Lease is the shards' default lease. Default 1 minute.
	Lease time.Duration
	// MaxLease is the shards' longest lease (keeper.Settings.MaxLease); 0: Lease.
	MaxLease time.Duration
	// Window is the shards' window (0: hold every row).
	Window time.Duration
	// ReceiversFirst makes a commit reach the shards that receive slots before those that give
	// them (by default the givers adopt it first). Shards see a new assignment in no fixed order:
	// either way a row is leased by one shard at a time, its leases travelling with its slot.
	ReceiversFirst bool
	// Wrap, when set, wraps each shard's HTTP handler (to record the traffic, say).
	Wrap func(http.Handler) http.Handler
	// Limits are the shards' request limits (keeper.HandlerOptions.Limits); zero fields take
	// the defaults.
	Limits httpserve.Limits
}

// Cluster is a set of real keeper shards over one in-memory store.
type Cluster struct {
	t     TB
	ctx   context.Context
	opts  Options
	store *CountingStore

	mu     sync.Mutex
	assign membership.Assignment
	shards map[string]*Shard
	// moves are the last handoff's, committedAt when it was committed (zero while it prepares)
	moves       []membership.MoveText
	committedAt time.Time
}

// Shard is one running keeper shard.
type Shard struct {
	// Name of the shard.
	Name string
	// URL is the base URL of its HTTP API.
	URL string
	// Keeper is the shard service.
	Keeper *keeper.Shard

	srv     *httptest.Server
	updates chan keeper.Settings
	cancel  context.CancelFunc
	done    chan error
}

// CountingStore is the in-memory store, counting the completions written per key.
type CountingStore struct {
	*memstore.Store
	mu   sync.Mutex
	done map[string]int
	last map[string]time.Time
}

// Complete implements store.Store and counts the completions that found their row.
func (s *CountingStore) Complete(ctx context.Context, items []store.Completion) ([]store.CompleteResult, error) {
	res, err := s.Store.Complete(ctx, items)
	if err == nil {
		s.mu.Lock()
		for i, r := range res {
			if r.Found {
				s.done[items[i].Key]++
				s.last[items[i].Key] = items[i].Due
			}
		}
		s.mu.Unlock()
	}
	return res, err
}

// Completions returns how many completions were written for each key so far.
func (s *CountingStore) Completions() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.done))
	for k, v := range s.done {
		out[k] = v
	}
	return out
}

// Hash is the ownership hash of the cluster's store: FNV-1a 64 with a final mix (the
// splitmix64 finaliser), so that keys differing only in their last characters spread over the
// slots as PostgreSQL's hash spreads them.
func Hash(key string) int64 {
	z := uint64(memstore.FNVHash(key))
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return int64(z ^ z>>31)
}

// LastDue returns the due time the last completion of key wrote (zero if none).
func (s *CountingStore) LastDue(key string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[key]
}

// NewCluster returns a cluster of the named shards, the slots spread over them, each loaded
// and serving. The shards stop when the test ends.
func NewCluster(t TB, opts Options, names ...string) *Cluster {
	t.Helper()
	if opts.Lease == 0 {
		opts.Lease = time.Minute
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Cluster{
		t: t, ctx: ctx, opts: opts,
		store:  &CountingStore{Store: memstore.New(memstore.Options{Hash: Hash}), done: map[string]int{}, last: map[string]time.Time{}},
		shards: map[string]*Shard{},
	}
	t.Cleanup(func() {
		cancel()
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, s := range c.shards {
			if err := <-s.done; !errors.Is(err, context.Canceled) {
				t.Errorf("clienttest: shard %s stopped with %v", s.Name, err)
			}
			s.srv.Close()
		}
	})
	plan, err := membership.PlanRebalance(membership.Assignment{}, names)
	if err != nil {
		t.Fatalf("clienttest: %v", err)
	}
	for _, p := range plan.Phases {
		if c.assign, err = membership.Apply(c.assign, p); err != nil {
			t.Fatalf("clienttest: %v", err)
		}
	}
	c.moves = nil // the first assignment: its moves come from "", no earlier owner
	for _, m := range plan.Moves() {
		c.moves = append(c.moves, membership.MoveText{From: m.From, To: m.To, Slots: schedule.FormatSlots(m.Slots)})
	}
	c.committedAt = time.Now()
	c.publish(nil)
	for _, n := range names {
		c.waitReady(n)
	}
	return c
}

// Store is the cluster's store.
func (c *Cluster) Store() *CountingStore { return c.store }

// Upsert writes rows to the store (the shards learn of them by their change events).
func (c *Cluster) Upsert(rows ...schedule.Row) {
	c.t.Helper()
	if _, err := c.store.Upsert(c.ctx, rows); err != nil {
		c.t.Fatalf("clienttest: upsert: %v", err)
	}
}

// Shards returns the running shards, by name.
func (c *Cluster) Shards() []*Shard {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*Shard, 0, len(c.shards))
	for _, s := range c.shards {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// URLs returns the base URLs of the running shards, by name.
func (c *Cluster) URLs() []string {
	var out []string
	for _, s := range c.Shards() {
		out = append(out, s.URL)
	}
	return out
}

// Status returns every running shard's current status, by name.
func (c *Cluster) Status() []shardapi.Status {
	var out []shardapi.Status
	for _, s := range c.Shards() {
		out = append(out, s.Keeper.Status(time.Now()))
	}
	return out
}

// Due returns the due rows summed over the owners (incoming slots are not counted).
func (c *Cluster) Due() int {
	n := 0
	for _, st := range c.Status() {
		n += st.Due
	}
	return n
}

// settingsFor is shard name's settings as the operator publishes them: with its peers (every
// shard's URL and owned slots) and who gives it its incoming slots (or gave it those of the last
// committed handoff). urls are the shards' URLs. Called with c.mu held.
func (c *Cluster) settingsFor(name string, urls map[string]string) keeper.Settings {
	st := keeper.Settings{Window: c.opts.Window, LeaseDuration: c.opts.Lease, MaxLease: c.opts.MaxLease, SubmittedBoost: 2, UrgentMaxShare: 0.2,
		Epoch: c.assign.Epoch, Owned: c.assign.Owned(name), Incoming: c.assign.Incoming(name)}
	for _, n := range c.assign.Shards() {
		st.Peers = append(st.Peers, keeper.Peer{Name: n, URL: urls[n], Owned: c.assign.Owned(n)})
	}
	for _, m := range c.moves {
		if m.To != name {
			continue
		}
		set, err := schedule.ParseSlots(m.Slots)
		if err != nil {
			c.t.Fatalf("clienttest: %v", err)
		}
		a := keeper.Arrival{From: m.From, Slots: set, CommittedAt: c.committedAt}
		if !c.committedAt.IsZero() {
			a.Epoch = c.assign.Epoch
		}
		st.Arriving = append(st.Arriving, a)
	}
	return st
}

// publish hands every shard of the assignment its settings, givers (shards losing slots) first,
// starting shards that are new and stopping those left without slots.
func (c *Cluster) publish(givers map[string]bool) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	names := c.assign.Shards()
	for name := range c.shards {
		if !slices.Contains(names, name) {
			names = append(names, name) // left without slots: it gives them away, then stops
		}
	}
	first := func(name string) bool { return givers[name] != c.opts.ReceiversFirst }
	sort.SliceStable(names, func(i, j int) bool { return first(names[i]) && !first(names[j]) })
	// the new shards' addresses first: every shard's settings name them all
	urls := map[string]string{}
	for name, s := range c.shards {
		urls[name] = s.URL
	}
	fresh := map[string]*httptest.Server{}
	for _, name := range names {
		if _, ok := c.shards[name]; !ok {
			srv := httptest.NewUnstartedServer(nil)
			fresh[name], urls[name] = srv, "http://"+srv.Listener.Addr().String()
		}
	}
	for _, name := range names {
		st := c.settingsFor(name, urls)
		if s, ok := c.shards[name]; ok {
			s.updates <- st
			continue
		}
		sh, err := keeper.NewShard(keeper.Options{Name: name, Store: c.store, Log: logr.Discard(),
			Peers: &client.Peers{HTTP: &http.Client{Timeout: 5 * time.Second}, Token: c.opts.Token}}, st)
		if err != nil {
			c.t.Fatalf("clienttest: %v", err)
		}
		ctx, cancel := context.WithCancel(c.ctx)
		s := &Shard{Name: name, Keeper: sh, updates: make(chan keeper.Settings, 8), cancel: cancel, done: make(chan error, 1)}
		h := sh.Handler(keeper.HandlerOptions{Token: c.opts.Token, Limits: c.opts.Limits})
		if c.opts.Wrap != nil {
			h = c.opts.Wrap(h)
		}
		s.srv = fresh[name]
		s.srv.Config.Handler = h
		s.srv.Start()
		s.URL = s.srv.URL
		go func() { s.done <- sh.Run(ctx, s.updates) }()
		c.shards[name] = s
	}
}

// stopSurplus stops the shards the assignment gives no slots, once no shard awaits their
// handover (as a keeper that is deleted serves its handovers while it drains).
func (c *Cluster) stopSurplus() {
	c.t.Helper()
	c.mu.Lock()
	epoch := c.assign.Epoch
	c.mu.Unlock()
	// every shard first adopts the commit (its settings reach it through a channel): a receiver
	// that has not yet cannot be awaiting its handover
	c.waitFor("every shard to adopt the commit", func() bool {
		for _, st := range c.Status() {
			if st.Membership.Epoch < epoch {
				return false
			}
		}
		return true
	})
	c.waitFor("the handovers of the slots that moved", func() bool {
		for _, st := range c.Status() {
			for _, f := range st.Fences {
				if f.Until == nil {
					return false
				}
			}
		}
		return true
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	inAssignment := map[string]bool{}
	for _, name := range c.assign.Shards() {
		inAssignment[name] = true
	}
	for name, s := range c.shards {
		if !inAssignment[name] {
			s.cancel()
			if err := <-s.done; !errors.Is(err, context.Canceled) {
				c.t.Errorf("clienttest: shard %s stopped with %v", name, err)
			}
			s.srv.Close()
			delete(c.shards, name)
		}
	}
}

// waitReady waits until shard name has loaded.
func (c *Cluster) waitReady(name string) {
	c.t.Helper()
	c.waitFor(fmt.Sprintf("shard %s to load", name), func() bool {
		c.mu.Lock()
		s := c.shards[name]
		c.mu.Unlock()
		return s != nil && s.Keeper.Ready()
	})
}

func (c *Cluster) waitFor(what string, cond func() bool) {
	c.t.Helper()
	Eventually(c.t, what, cond)
}

// Eventually polls cond every 5 ms until it holds, failing the test after 30 s with what it was
// waiting for.
func Eventually(t TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Rebalance moves the slots to the shards named by target as the operator does: prepare (the
// receivers walk their incoming slots; new shards start), wait until every receiver reports them
// prepared, commit (givers adopt first), and stop the shards left without slots. between, when
// set, runs after the prepare and after the commit, with the phase's name.
func (c *Cluster) Rebalance(between func(phase string), target ...string) {
	c.t.Helper()
	c.mu.Lock()
	current := c.assign
	c.mu.Unlock()
	plan, err := membership.PlanRebalance(current, target)
	if err != nil {
		c.t.Fatalf("clienttest: %v", err)
	}
	if plan.IsEmpty() {
		return
	}
	h, act, err := membership.StartHandoff(current, plan, time.Now(), time.Minute)
	if err != nil {
		c.t.Fatalf("clienttest: %v", err)
	}
	givers := map[string]bool{}
	for _, m := range plan.Moves() {
		givers[m.From] = true
	}
	for act.Kind != membership.ActionNone {
		switch act.Kind {
		case membership.ActionPrepare, membership.ActionCommit, membership.ActionRollback:
			c.mu.Lock()
			c.assign, err = membership.Apply(c.assign, act.Phase)
			c.moves, c.committedAt = h.Moves, time.Time{}
			if act.Kind == membership.ActionCommit {
				c.committedAt = time.Now()
			}
			c.mu.Unlock()
			if err != nil {
				c.t.Fatalf("clienttest: %s: %v", act.Kind, err)
			}
			c.publish(givers)
			if act.Kind == membership.ActionRollback {
				c.t.Fatalf("clienttest: the handoff rolled back")
			}
			if between != nil {
				between(string(act.Kind))
			}
			if act.Kind == membership.ActionCommit {
				c.stopSurplus()
				return
			}
		case membership.ActionWait:
			time.Sleep(5 * time.Millisecond)
		}
		prepared := map[string]int64{}
		for _, s := range c.Shards() {
			prepared[s.Name] = s.Keeper.Status(time.Now()).Membership.PreparedEpoch
		}
		if h, act, err = h.Step(time.Now(), prepared); err != nil {
			c.t.Fatalf("clienttest: %v", err)
		}
	}
}

// NewLoadingShard serves a shard that never loads (it answers claims with 503, as a shard does
// during its first walk), with opts' token and wrapper, and returns its base URL.
func NewLoadingShard(t TB, opts Options) string {
	t.Helper()
	sh, err := keeper.NewShard(keeper.Options{Name: "loading", Store: memstore.New(memstore.Options{}), Log: logr.Discard()},
		keeper.Settings{LeaseDuration: time.Minute, SubmittedBoost: 2, UrgentMaxShare: 0.2, Owned: schedule.AllSlots()})
	if err != nil {
		t.Fatalf("clienttest: %v", err)
	}
	h := sh.Handler(keeper.HandlerOptions{Token: opts.Token, Limits: opts.Limits})
	if opts.Wrap != nil {
		h = opts.Wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}
