// Package memstore is an in-memory store.Store for fast, deterministic tests of the keeper
// service. It passes the same conformance suite (pkg/store/storetest) as the PostgreSQL store.
//
// It is kept because those tests use it where PostgreSQL cannot do the job as well: the shards of
// pkg/client's tests (pkg/client/clienttest, many shards and a membership in one process), the
// keeper's flood test (a shard held behind its lock while thousands of events arrive) and its
// status and claim benchmarks (a shard of 1M rows with no database in the figures), and the
// monitoring tests' keeper. Its subscription queue is the store's own (store.EventQueue), so the
// rules of gaps and overflow are written once for both stores.
//
// Differences from PostgreSQL, all deliberate:
//   - The ownership hash is FNV-1a 64 of the key unless Options.Hash says otherwise (PostgreSQL's
//     hashtextextended is not reimplemented). Tests that need rows in particular slots can set
//     Options.Hash.
//   - Every write is its own transaction, applied at once under one lock (Complete is not
//     batched), and events are queued for subscribers in that order.
//   - Continuity is lost only when a test says so: BreakSubscriptions (gap, then resumed at once),
//     or DisconnectSubscriptions and ReconnectSubscriptions (writes in between are not delivered).
//   - FailSegment makes chosen walk segments fail.
//   - A subscription's queue overflows (MaxQueuedEvents) only by events published while the
//     consumer does not take them, as with PostgreSQL, but without a connection in between.
package memstore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"sync"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
)

// Options configure a Store. The zero value gives the defaults.
type Options struct {
	// Hash computes a key's ownership hash. Default: FNV-1a 64.
	Hash func(key string) int64
	// PageRows is the walk page size. Default 1000.
	PageRows int
	// SegmentSlots caps the slots of a walk segment. Default 16.
	SegmentSlots int
	// FailSegment, when set, makes the walk of every segment it returns true for fail.
	FailSegment func(schedule.Run) bool
	// MaxQueuedEvents caps the events a subscription holds for its consumer; beyond it events
	// are dropped and signalled as a gap, then resumed once the consumer has taken the queue.
	// Default 262144.
	MaxQueuedEvents int
}

// FNVHash is the default ownership hash: FNV-1a 64 of the key.
func FNVHash(key string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return int64(h.Sum64())
}

// ErrInjected is the error of a segment failed by Options.FailSegment.
var ErrInjected = errors.New("memstore: injected walk failure")

// Store is an in-memory schedule store. Create it with New.
type Store struct {
	opts Options

	mu     sync.Mutex
	rows   map[string]schedule.Row
	order  []string // keys in (key_hash, key) order; rebuilt lazily when dirty
	dirty  bool
	rev    int64
	subs   map[*subscription]struct{}
	closed bool
	// sessions are the keeper sessions, by shard (store.Sessions)
	sessions map[string]store.Session
}

var _ store.Store = (*Store)(nil)

// New returns an empty store.
func New(opts Options) *Store {
	if opts.Hash == nil {
		opts.Hash = FNVHash
	}
	if opts.PageRows <= 0 {
		opts.PageRows = 1000
	}
	if opts.SegmentSlots <= 0 {
		opts.SegmentSlots = 16
	}
	if opts.MaxQueuedEvents <= 0 {
		opts.MaxQueuedEvents = 1 << 18
	}
	return &Store{opts: opts, rows: map[string]schedule.Row{}, subs: map[*subscription]struct{}{}}
}

var _ store.RowReader = (*Store)(nil)

// ReadRow implements store.RowReader.
func (s *Store) ReadRow(_ context.Context, key string) (schedule.Row, bool, error) {
	if why := schedule.KeyProblem(key); why != "" {
		return schedule.Row{}, false, fmt.Errorf("reading a row: %s", why)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return schedule.Row{}, false, store.ErrClosed
	}
	if r, ok := s.rows[key]; ok {
		return r, true, nil
	}
	return schedule.Row{Key: key, KeyHash: s.opts.Hash(key)}, false, nil
}

var _ store.Sessions = (*Store)(nil)

// BeginSession implements store.Sessions.
func (s *Store) BeginSession(_ context.Context, sess store.Session) (store.Session, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.Session{}, false, store.ErrClosed
	}
	if s.sessions == nil {
		s.sessions = map[string]store.Session{}
	}
	prev, found := s.sessions[sess.Shard]
	sess.StartedAt, sess.EndedAt, sess.LeasesUntil = time.Now(), time.Time{}, time.Time{}
	s.sessions[sess.Shard] = sess
	return prev, found, nil
}

// EndSession implements store.Sessions.
func (s *Store) EndSession(_ context.Context, shard, instance string, leasesUntil time.Time) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false, store.ErrClosed
	}
	sess, ok := s.sessions[shard]
	if !ok || sess.Instance != instance {
		return false, nil
	}
	sess.EndedAt, sess.LeasesUntil = time.Now(), leasesUntil
	s.sessions[shard] = sess
	return true, nil
}

// Migrate implements store.Store; there is no schema.
func (s *Store) Migrate(context.Context) error { return nil }

// Close implements store.Store.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	subs := make([]*subscription, 0, len(s.subs))
	for sub := range s.subs {
		subs = append(subs, sub)
	}
	s.mu.Unlock()
	for _, sub := range subs {
		_ = sub.Close()
	}
	return nil
}

// Len returns the number of rows.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.rows)
}

func (s *Store) nextRev() int64 {
	s.rev++
	return s.rev
}

// publish queues an event for every subscription (caller holds s.mu).
func (s *Store) publish(evs []store.Event) {
	for sub := range s.subs {
		sub.publish(evs)
	}
}

// Upsert implements store.Store.
func (s *Store) Upsert(ctx context.Context, in []schedule.Row) ([]schedule.Row, error) {
	if err := store.ValidateRows(in); err != nil {
		return nil, fmt.Errorf("upsert: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("upsert: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, store.ErrClosed
	}
	if len(in) == 0 {
		return nil, nil
	}
	out := make([]schedule.Row, len(in))
	evs := make([]store.Event, len(in))
	for i, r := range in {
		r.KeyHash = s.opts.Hash(r.Key)
		if r.HasDue {
			r.Due = r.Due.UTC().Truncate(time.Microsecond) // as PostgreSQL stores it
		} else {
			r.Due = time.Time{}
		}
		r.Rev = s.nextRev()
		if _, ok := s.rows[r.Key]; !ok {
			s.dirty = true
		}
		s.rows[r.Key] = r
		out[i] = r
		evs[i] = store.Event{Row: r}
	}
	s.publish(evs)
	return out, nil
}

// Complete implements store.Store. Each call is applied at once, as one transaction.
func (s *Store) Complete(ctx context.Context, items []store.Completion) ([]store.CompleteResult, error) {
	if err := store.ValidateCompletions(items); err != nil {
		return nil, fmt.Errorf("complete: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("complete: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, store.ErrClosed
	}
	if len(items) == 0 {
		return nil, nil
	}
	res := make([]store.CompleteResult, len(items))
	var evs []store.Event
	for i, it := range items {
		r, ok := s.rows[it.Key]
		if !ok {
			res[i].Row.Key = it.Key
			continue
		}
		if it.Rev != 0 && r.Rev != it.Rev {
			res[i] = store.CompleteResult{Row: r, Found: true, Changed: true}
			continue
		}
		r.Due, r.HasDue, r.Urgent = it.Due.UTC().Truncate(time.Microsecond), true, false
		r.Rev = s.nextRev()
		s.rows[it.Key] = r
		res[i] = store.CompleteResult{Row: r, Found: true}
		evs = append(evs, store.Event{Row: r})
	}
	s.publish(evs)
	return res, nil
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, keys []string) ([]store.DeleteResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("delete: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, store.ErrClosed
	}
	out := make([]store.DeleteResult, len(keys))
	var evs []store.Event
	for i, k := range keys {
		out[i].Key = k
		r, ok := s.rows[k]
		if !ok {
			continue
		}
		delete(s.rows, k)
		s.dirty = true
		r.Rev = s.nextRev()
		out[i] = store.DeleteResult{Key: k, KeyHash: r.KeyHash, Rev: r.Rev, Found: true}
		evs = append(evs, store.Event{Row: r, Deleted: true})
	}
	s.publish(evs)
	return out, nil
}

// sorted returns the keys in (key_hash, key) order (caller holds s.mu).
func (s *Store) sorted() []string {
	if !s.dirty && s.order != nil {
		return s.order
	}
	s.order = s.order[:0]
	for k := range s.rows {
		s.order = append(s.order, k)
	}
	sort.Slice(s.order, func(i, j int) bool {
		a, b := s.rows[s.order[i]], s.rows[s.order[j]]
		if a.KeyHash != b.KeyHash {
			return a.KeyHash < b.KeyHash
		}
		return a.Key < b.Key
	})
	s.dirty = false
	return s.order
}

// page returns up to n rows in [lo, hi] after (afterHash, afterKey) in (key_hash, key) order.
func (s *Store) page(lo, hi int64, started bool, afterHash int64, afterKey string, n int) ([]schedule.Row, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, store.ErrClosed
	}
	order := s.sorted()
	i := sort.Search(len(order), func(i int) bool {
		r := s.rows[order[i]]
		if !started {
			return r.KeyHash >= lo
		}
		return r.KeyHash > afterHash || (r.KeyHash == afterHash && r.Key > afterKey)
	})
	var out []schedule.Row
	for ; i < len(order) && len(out) < n; i++ {
		r := s.rows[order[i]]
		if r.KeyHash > hi {
			break
		}
		out = append(out, r)
	}
	return out, nil
}

// Walk implements store.Store. Pages are read one at a time under the lock; fn runs without it,
// so fn may write to the store.
func (s *Store) Walk(ctx context.Context, slots []int, fn store.WalkFunc) (store.WalkResult, error) {
	norm, err := store.NormalizeSlots(slots)
	if err != nil {
		return store.WalkResult{}, fmt.Errorf("walk: %w", err)
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return store.WalkResult{}, store.ErrClosed
	}
	segs := store.Segments(norm, s.opts.SegmentSlots)
	res := store.WalkResult{Segments: make([]store.SegmentResult, len(segs))}
	for i, g := range segs {
		res.Segments[i].Segment = g
		if err := ctx.Err(); err != nil {
			for j := i; j < len(segs); j++ {
				res.Segments[j] = store.SegmentResult{Segment: segs[j], Err: err}
			}
			return res, fmt.Errorf("walk: %w", err)
		}
		segErr := s.walkSegment(ctx, g, &res.Segments[i], &res.Rows, fn)
		var stop *stopError
		if errors.As(segErr, &stop) {
			res.Segments[i].Err = fmt.Errorf("walk stopped: %w", stop.err)
			for j := i + 1; j < len(segs); j++ {
				res.Segments[j] = store.SegmentResult{Segment: segs[j], Err: res.Segments[i].Err}
			}
			return res, stop.err
		}
		res.Segments[i].Err = segErr
		if err := fn(store.WalkItem{Segment: g, End: true, Err: segErr}); err != nil {
			for j := i + 1; j < len(segs); j++ {
				res.Segments[j] = store.SegmentResult{Segment: segs[j], Err: fmt.Errorf("walk stopped: %w", err)}
			}
			return res, err
		}
	}
	return res, nil
}

// stopError wraps an error returned by the walk callback.
type stopError struct{ err error }

func (e *stopError) Error() string { return e.err.Error() }

func (s *Store) walkSegment(ctx context.Context, g schedule.Run, sr *store.SegmentResult, total *int, fn store.WalkFunc) error {
	if s.opts.FailSegment != nil && s.opts.FailSegment(g) {
		return fmt.Errorf("walking slots %v: %w", g, ErrInjected)
	}
	lo, hi := g.HashRange()
	var (
		started  bool
		lastHash int64
		lastKey  string
	)
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("walking slots %v: %w", g, err)
		}
		rows, err := s.page(lo, hi, started, lastHash, lastKey, s.opts.PageRows)
		if err != nil {
			return fmt.Errorf("walking slots %v: %w", g, err)
		}
		if len(rows) > 0 {
			last := rows[len(rows)-1]
			started, lastHash, lastKey = true, last.KeyHash, last.Key
			sr.Rows += len(rows)
			*total += len(rows)
			if err := fn(store.WalkItem{Segment: g, Rows: rows}); err != nil {
				return &stopError{err}
			}
		}
		if len(rows) < s.opts.PageRows {
			return nil
		}
	}
}

// Subscribe implements store.Store.
func (s *Store) Subscribe(ctx context.Context, slots []int) (store.Subscription, error) {
	norm, err := store.NormalizeSlots(slots)
	if err != nil {
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	max := s.opts.MaxQueuedEvents
	sub := &subscription{s: s, wake: make(chan struct{}, 1), done: make(chan struct{}),
		q: store.NewEventQueue(max, 0, func(int, int64) error { return fmt.Errorf("%w (%d events)", ErrOverflow, max) })}
	for _, sl := range norm {
		sub.slots[sl] = true
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, store.ErrClosed
	}
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
	sub.stopAfter = context.AfterFunc(ctx, func() { _ = sub.Close() })
	return sub, nil
}

// BreakSubscriptions makes every subscription lose continuity and come back at once: each gets a
// gap signal and then a resumed signal. Nothing written is lost (there is no window between them);
// use DisconnectSubscriptions and ReconnectSubscriptions for that.
func (s *Store) BreakSubscriptions() {
	s.DisconnectSubscriptions()
	s.ReconnectSubscriptions()
}

// DisconnectSubscriptions signals a gap on every connected subscription; events written until
// ReconnectSubscriptions are not delivered to it.
func (s *Store) DisconnectSubscriptions() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.subs {
		sub.disconnect()
	}
}

// ReconnectSubscriptions signals resumed on every disconnected subscription; events written from
// now on are delivered again.
func (s *Store) ReconnectSubscriptions() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.subs {
		sub.reconnect()
	}
}
