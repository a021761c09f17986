// Package postgres is the schedule store on PostgreSQL (14 or newer), with
// github.com/jackc/pgx/v5.
//
// The schema (embedded migrations, applied by Migrate and `renderqueue schema migrate`) is the
// render_schedule table (docs/design.md, "Rows"): the database computes key_hash
// (hashtextextended(key, 0)), a trigger gives every insert and update a fresh rev from a sequence,
// and statement-level triggers with transition tables send each changed row's scheduling fields
// with pg_notify on its slot group's channel, rq_slots_<slot/16>, in payloads under 8000 bytes
// (see migrations/0001_render_schedule.sql for the format, 0004_slot_group_channels.sql for the
// channels). Deletes get a fresh rev in their event.
// Every payload is signed (HMAC-SHA-256 under a key only the schema owner and roles granted
// renderqueue_event_key() can read, migrations/0002_signed_events.sql); subscriptions (package
// changes, pkg/store/postgres/changes) drop a payload that is unsigned, badly signed, stale or
// replayed as a gap (docs/security.md).
//
//   - Walks are keyset-paginated over (key_hash, key) within the hash range of a segment (a run of
//     adjacent slots), read with the binary protocol on Options.WalkConns connections in parallel,
//     and handed to the caller's function from one goroutine.
//   - Subscriptions (package changes) hold one dedicated connection that LISTENs on the channels
//     of the subscribed slots' groups and delivers exactly those slots' events; when it is lost they signal a gap at once, reconnect with
//     backoff and signal resumed once LISTEN is active again. A TRUNCATE of the table is
//     signalled as a gap too. The store closes them when it is closed.
//   - Completions are group-committed: concurrent Complete calls are merged into one UPDATE
//     (one transaction, so one notifying commit), flushed when Options.FlushRows items are waiting
//     or Options.FlushDelay after the first one arrived; up to Options.CommitConns groups commit
//     at once (never two with a key in common). A group is one message flight to the server (its
//     statements pipelined, committed by the Sync that ends them), and its rows come back
//     without their keys, so its connection waits less on this process.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/changes"
)

// Options tunes a Store. The zero value gives the defaults.
type Options struct {
	// Logger receives reconnects and other operational messages. Default: discard.
	Logger logr.Logger
	// MaxConns caps the connection pool (walks, writes). Default: WalkConns + CommitConns + 2.
	MaxConns int32
	// WalkConns is how many connections one walk reads with in parallel. Default 4: on 2 cores
	// shared with PostgreSQL a 10M-row load took 21–22 s with 4 against 24–25 s with 2, and
	// the keeper spent a quarter less CPU on it (more data per socket read, fewer wake-ups);
	// docs/benchmarks.md. A paced verification walk reads far below what 4 connections carry.
	WalkConns int
	// WalkPageRows is the page size of walk queries. Default 50000: large enough that a segment
	// of a table of a few million rows is one query (PostgreSQL then reads it with one bitmap
	// scan instead of re-scanning per page), small enough to bound each query's duration.
	WalkPageRows int
	// SegmentSlots caps the number of adjacent slots read as one segment. Default 16.
	SegmentSlots int
	// WalkRetries is how many times a failed page query is retried (resuming after the last row
	// delivered) before its segment is reported failed. Default 1; negative means 0.
	WalkRetries int
	// FlushDelay is how long a group commit waits for more completions after the first arrives.
	// Default 2ms.
	FlushDelay time.Duration
	// FlushRows flushes a group commit at once when this many completions are waiting. Default 5000.
	FlushRows int
	// Partitions, when at least 2, makes Migrate create render_schedule as that many hash
	// partitions of the key (see MigrateOptions). 0: one table.
	Partitions int
	// CommitConns is how many group commits may run at once, each on its own connection (groups
	// with a key in common never run together). Default 2.
	CommitConns int
	// ReconnectMin and ReconnectMax bound the backoff of a subscription's reconnects. Defaults
	// 50ms and 5s.
	ReconnectMin, ReconnectMax time.Duration
	// HealthInterval is how long an idle subscription connection waits before checking it is alive
	// with a round trip. Default 5s (changes.Config).
	HealthInterval time.Duration
	// TCPUserTimeout is how long data sent on a TCP connection to the database (the pool's, the
	// subscriptions') may stay unacknowledged before the kernel drops the connection
	// (TCP_USER_TIMEOUT, Linux): how long a write sent into a partition can still land. Default
	// 15s; negative: the kernel's default (retransmissions for about 15 minutes). See dialer.
	TCPUserTimeout time.Duration
	// EventMaxAge is how far from the database's current time (as last measured) a change event
	// payload's signing time may be; a payload signed earlier (delayed, held in a long
	// transaction, or replayed) or later is dropped as a gap. Default 5m.
	EventMaxAge time.Duration
	// MaxQueuedEvents and MaxQueuedBytes cap the change events a subscription holds for its
	// consumer, in number and in bytes (the queue entry, about 130 bytes, and the key). When the
	// consumer falls that far behind, later events are dropped and signalled as a gap, then
	// resumed once it has taken what was queued. Defaults 262144 and 64 MiB.
	MaxQueuedEvents int
	MaxQueuedBytes  int64
	// MaxRememberedEvents caps the payloads a subscription remembers to refuse replays within
	// EventMaxAge (about 40 bytes each); beyond it the oldest are forgotten and payloads signed
	// no later than them are dropped as a gap. Default 524288.
	MaxRememberedEvents int
	// FloodRate bounds the notifications a second a subscription reads: past it (a flood of
	// NOTIFYs, which any role that can connect may send) it stops reading, signals a gap and
	// listens again after FloodPause, doubling while the flood goes on up to FloodPauseMax
	// (changes.Config). Defaults 20000 a second, 500ms and 2s.
	FloodRate                 int
	FloodPause, FloodPauseMax time.Duration

	// QuietCompletions makes Complete leave out the change events of the rows it writes whose
	// slot no other listener holds (schema version 7, migrations/0007_quiet_completions.sql), while
	// the store has exactly one subscription: the store's user applies what its completions wrote
	// from Complete's results, as a keeper does, and nobody else needs those events. Rows of slots
	// another keeper's subscription holds (a slot being handed over, a replacement loading) are
	// sent as before. A group commit that fails without knowing whether it was written signals a
	// gap on the subscription. Only for a role that may read the signing key (the keepers'); for
	// any other role, and on older schemas, every row is sent.
	QuietCompletions bool

	// failSegment, when set, makes the page queries of the segments it returns true for fail in
	// the database (a test hook).
	failSegment func(schedule.Run) bool
}

func (o *Options) setDefaults() {
	if o.Logger.GetSink() == nil {
		o.Logger = logr.Discard()
	}
	if o.WalkConns <= 0 {
		o.WalkConns = 4
	}
	if o.CommitConns <= 0 {
		o.CommitConns = 2
	}
	if o.MaxConns <= 0 {
		o.MaxConns = int32(o.WalkConns+o.CommitConns) + 2
	}
	if o.WalkPageRows <= 0 {
		o.WalkPageRows = 50000
	}
	if o.SegmentSlots <= 0 {
		o.SegmentSlots = 16
	}
	if o.WalkRetries == 0 {
		o.WalkRetries = 1
	} else if o.WalkRetries < 0 {
		o.WalkRetries = 0
	}
	if o.FlushDelay <= 0 {
		o.FlushDelay = 2 * time.Millisecond
	}
	if o.FlushRows <= 0 {
		o.FlushRows = 5000
	}
	if o.TCPUserTimeout == 0 {
		o.TCPUserTimeout = 15 * time.Second
	}
	// The subscriptions' options take their defaults in changes.Config.
}

// Store is the PostgreSQL schedule store. Create it with Open; it implements store.Store.
type Store struct {
	opts     Options
	pool     *pgxpool.Pool
	connCfg  *pgconn.Config // for subscription connections
	log      logr.Logger
	commits  chan *completeReq
	stop     chan struct{}
	done     chan struct{}
	closeMu  sync.Mutex
	isClosed bool
	subs     map[*changes.Subscription]struct{} // open subscriptions, closed with the store (closeMu)
}

var _ store.Store = (*Store)(nil)

// Open connects to the database named by dsn (a libpq connection string or URL). It does not
// migrate the schema; call Migrate (or run `renderqueue schema migrate`) first.
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	opts.setDefaults()
	poolCfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing the database DSN: %w", err)
	}
	poolCfg.MaxConns = opts.MaxConns
	poolCfg.ConnConfig.DialFunc = dialer(opts.TCPUserTimeout)
	if poolCfg.ConnConfig.RuntimeParams == nil {
		poolCfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	withServerKeepalives(poolCfg.ConnConfig.RuntimeParams, opts.TCPUserTimeout)
	connCfg := poolCfg.ConnConfig.Config.Copy()
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to the database: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to the database: %w", err)
	}
	s := &Store{
		opts:    opts,
		pool:    pool,
		connCfg: connCfg,
		log:     opts.Logger,
		commits: make(chan *completeReq, 1024),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		subs:    map[*changes.Subscription]struct{}{},
	}
	go s.committer()
	return s, nil
}

// Pool returns the store's connection pool (for tools and tests that need plain SQL).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

var _ store.Pinger = (*Store)(nil)

// Ping implements store.Pinger: one round trip on a pool connection (a broken idle one is
// replaced).
func (s *Store) Ping(ctx context.Context) error {
	if s.closed() {
		return store.ErrClosed
	}
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("ping: %w: %w", store.ErrUnavailable, err)
	}
	return nil
}

var _ store.Sessions = (*Store)(nil)

// BeginSession implements store.Sessions (renderqueue_keeper_begin, schema version 9; before it
// store.ErrNoSessions).
func (s *Store) BeginSession(ctx context.Context, sess store.Session) (store.Session, bool, error) {
	if s.closed() {
		return store.Session{}, false, store.ErrClosed
	}
	var prev store.Session
	var pod, instance *string
	var started, ended, until *time.Time
	err := s.pool.QueryRow(ctx, `SELECT instance, pod, started_at, ended_at, leases_until FROM renderqueue_keeper_begin($1, $2, $3)`,
		sess.Shard, sess.Instance, sess.Pod).Scan(&instance, &pod, &started, &ended, &until)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return store.Session{}, false, nil
	case err != nil:
		return store.Session{}, false, sessionError("beginning the keeper session of "+sess.Shard, err)
	}
	prev = store.Session{Shard: sess.Shard, Instance: deref(instance), Pod: deref(pod)}
	if started != nil {
		prev.StartedAt = *started
	}
	if ended != nil {
		prev.EndedAt = *ended
	}
	if until != nil {
		prev.LeasesUntil = *until
	}
	return prev, true, nil
}

// EndSession implements store.Sessions (renderqueue_keeper_end).
func (s *Store) EndSession(ctx context.Context, shard, instance string, leasesUntil time.Time) (bool, error) {
	if s.closed() {
		return false, store.ErrClosed
	}
	var until *time.Time
	if !leasesUntil.IsZero() {
		until = &leasesUntil
	}
	var ok bool
	if err := s.pool.QueryRow(ctx, `SELECT renderqueue_keeper_end($1, $2, $3)`, shard, instance, until).Scan(&ok); err != nil {
		return false, sessionError("ending the keeper session of "+shard, err)
	}
	return ok, nil
}

// sessionError wraps err of a session call: store.ErrNoSessions when the schema has no
// sessions (the function does not exist), store.ErrUnavailable when the database did not answer.
func sessionError(what string, err error) error {
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == "42883": // undefined_function
		return fmt.Errorf("%s: %w", what, store.ErrNoSessions)
	case errors.As(err, &pe):
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: %w: %w", what, store.ErrUnavailable, err)
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// Close closes the store's subscriptions, stops the group committer (waiting for the group in
// flight) and closes the pool.
func (s *Store) Close() error {
	s.closeMu.Lock()
	if s.isClosed {
		s.closeMu.Unlock()
		return nil
	}
	s.isClosed = true
	close(s.stop)
	subs := make([]*changes.Subscription, 0, len(s.subs))
	for sub := range s.subs {
		subs = append(subs, sub)
	}
	s.closeMu.Unlock()
	for _, sub := range subs {
		_ = sub.Close()
	}
	<-s.done
	s.pool.Close()
	return nil
}

// Subscribe implements store.Store: a change-event subscription (package changes) on its own
// connection, closed with the store.
func (s *Store) Subscribe(ctx context.Context, slots []int) (store.Subscription, error) {
	if s.closed() {
		return nil, store.ErrClosed
	}
	sub, err := changes.Subscribe(ctx, changes.Config{
		Conn:                s.connCfg,
		Logger:              s.log,
		ReconnectMin:        s.opts.ReconnectMin,
		ReconnectMax:        s.opts.ReconnectMax,
		HealthInterval:      s.opts.HealthInterval,
		EventMaxAge:         s.opts.EventMaxAge,
		MaxQueuedEvents:     s.opts.MaxQueuedEvents,
		MaxQueuedBytes:      s.opts.MaxQueuedBytes,
		MaxRememberedEvents: s.opts.MaxRememberedEvents,
		FloodRate:           s.opts.FloodRate,
		FloodPause:          s.opts.FloodPause,
		FloodPauseMax:       s.opts.FloodPauseMax,
		OnOpen: func(sub *changes.Subscription) error {
			s.closeMu.Lock()
			defer s.closeMu.Unlock()
			if s.isClosed {
				return store.ErrClosed
			}
			s.subs[sub] = struct{}{}
			return nil
		},
		OnClose: func(sub *changes.Subscription) {
			s.closeMu.Lock()
			delete(s.subs, sub)
			s.closeMu.Unlock()
		},
	}, slots)
	if err != nil {
		return nil, err
	}
	return sub, nil
}

func (s *Store) closed() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// isConnError reports whether err means the connection (rather than the statement) failed.
func isConnError(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC"
	}
	return err != nil
}
