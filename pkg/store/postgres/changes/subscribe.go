package changes

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/internal/columns"
)

// ListenerApplicationName is the application_name of subscription connections (unless the
// connection configuration, the store's DSN, sets one), so operators can find them in
// pg_stat_activity.
const ListenerApplicationName = "renderqueue-listener"

// errOverflow is the gap cause reported when the event queue overflowed.
var errOverflow = errors.New("change events arrived faster than they were taken: the queue is full and events were dropped")

// errTruncated is the gap cause reported when the table was truncated.
var errTruncated = errors.New("render_schedule was truncated: rows were removed without change events")

// errFlood is the gap cause reported when notifications arrive faster than Config.FloodRate: the
// subscription stops reading them (it closes its connection) and listens again after a pause.
var errFlood = errors.New("change event notifications arrived faster than the flood rate: not reading them; listening again after a pause")

// errSchemaChanged is the gap cause reported when a migration moved change events to other
// channels (a payload on SchemaChannel): the subscription reconnects to listen where they go now.
var errSchemaChanged = errors.New("the schema was migrated and sends change events on other channels: reconnecting to listen on them")

// Config configures a subscription. Zero durations and sizes take the defaults.
type Config struct {
	// Conn is the connection configuration (copied): one dedicated connection, its
	// application_name ListenerApplicationName unless Conn sets one. Required.
	Conn *pgconn.Config
	// Logger receives reconnects and refused payloads. Default: discard.
	Logger logr.Logger
	// ReconnectMin and ReconnectMax bound the backoff of reconnects. Defaults 50ms and 5s.
	ReconnectMin, ReconnectMax time.Duration
	// HealthInterval is how long an idle connection waits before checking it is alive with a
	// round trip, which must be answered within HealthInterval (at least healthCheckTimeout).
	// Default 5s: a connection cut off is found within 10s.
	HealthInterval time.Duration
	// EventMaxAge is how far from the database's current time (as last measured) a payload's
	// signing time may be; a payload signed earlier or later is dropped as a gap. Default 5m.
	EventMaxAge time.Duration
	// MaxQueuedEvents and MaxQueuedBytes cap the events held for the consumer (store.EventQueue);
	// beyond them events are dropped and signalled as a gap. Defaults 262144 and 64 MiB.
	MaxQueuedEvents int
	MaxQueuedBytes  int64
	// MaxRememberedEvents caps the payloads remembered to refuse replays within EventMaxAge.
	// Default 524288.
	MaxRememberedEvents int
	// FloodRate bounds the notifications a second the subscription reads and checks: past it (a
	// flood: any role that can connect may NOTIFY on the event channels) it stops parsing, signals
	// a gap and closes its connection, and listens again after FloodPause (doubling while floods
	// go on, up to FloodPauseMax), so that a flood costs the keeper a walk, not its claims.
	// Defaults 20000 a second, 500ms and 2s.
	FloodRate                 int
	FloodPause, FloodPauseMax time.Duration
	// OnOpen, when set, is called with the subscription once it is connected and before it
	// starts; an error closes it and Subscribe returns that error. OnClose, when set, is called
	// each time Close has stopped it. A store uses them to close its open subscriptions.
	OnOpen  func(*Subscription) error
	OnClose func(*Subscription)
}

func (c *Config) setDefaults() {
	if c.Logger.GetSink() == nil {
		c.Logger = logr.Discard()
	}
	if c.ReconnectMin <= 0 {
		c.ReconnectMin = 50 * time.Millisecond
	}
	if c.ReconnectMax < c.ReconnectMin {
		c.ReconnectMax = 5 * time.Second
		if c.ReconnectMax < c.ReconnectMin {
			c.ReconnectMax = c.ReconnectMin
		}
	}
	if c.HealthInterval <= 0 {
		c.HealthInterval = 5 * time.Second
	}
	if c.EventMaxAge <= 0 {
		c.EventMaxAge = 5 * time.Minute
	}
	if c.MaxQueuedEvents <= 0 {
		c.MaxQueuedEvents = 1 << 18
	}
	if c.MaxQueuedBytes <= 0 {
		c.MaxQueuedBytes = 64 << 20
	}
	if c.MaxRememberedEvents <= 0 {
		c.MaxRememberedEvents = 1 << 19
	}
	if c.FloodRate <= 0 {
		c.FloodRate = 20000
	}
	if c.FloodPause <= 0 {
		c.FloodPause = 500 * time.Millisecond
	}
	if c.FloodPauseMax < c.FloodPause {
		c.FloodPauseMax = max(2*time.Second, c.FloodPause)
	}
}

// qitem is one item for the queue: an event, or a gap or resumed signal (deliverPending collects
// them while reading payloads, then queues them under one hold of the lock). A gap with lost set
// stays open until the reconnect that follows it (the queue's SetLost).
type qitem struct {
	kind store.BatchKind
	ev   store.Event
	err  error
	lost bool
}

// setReq is a SetSlots call waiting for the reader goroutine.
type setReq struct {
	slots [schedule.NumSlots]bool
	reply chan error
}

// Subscription is a store.Subscription with one dedicated connection, owned by the reader
// goroutine (run). Create it with Subscribe.
type Subscription struct {
	opts    Config
	log     logr.Logger
	connCfg *pgconn.Config

	// pending collects notifications as pgconn reads them (OnNotification runs on the reader
	// goroutine, inside whatever call is reading the connection); spare is the other buffer.
	pending, spare []*pgconn.Notification
	routes         columns.Interner
	// key verifies the payloads' signatures; keyAt is when it was read, clockOffset the
	// database's clock minus ours then. guard refuses stale and replayed payloads. badLog
	// limits the log lines about refused payloads (reader goroutine only).
	key         []byte
	keyAt       time.Time
	clockOffset time.Duration
	guard       *replayGuard
	badLog      logLimiter
	// listening is the set of channels LISTEN is active on; legacy is true when the schema is
	// older than GroupChannelsVersion (events on slot channels) and version is the schema's
	// version as read when connecting; accept is the set of slots whose events are queued
	// (events of other slots of a listened group are dropped as they are read); restart, when
	// set, ends the connection so that the reconnect reads the version again (reader goroutine
	// only).
	listening map[string]bool
	legacy    bool
	version   int
	accept    [schedule.NumSlots]bool
	restart   error
	// flood counts the notifications read in the current second (windowStart); flooded is set
	// when they passed Config.FloodRate, and the connection is then ended unread (reader
	// goroutine only).
	flood struct {
		windowStart time.Time
		count       int
		flooded     bool
		pause       time.Duration // the pause before listening again after the last flood
		last        time.Time     // when the last flood was found
	}

	ctrl chan *setReq
	// carried is a SetSlots request whose LISTEN failed with the connection; reconnect applies it
	// (reader goroutine only).
	carried *setReq

	// opened counts the notifications checked and parsed (open); a flood's are not.
	opened atomic.Int64

	mu sync.Mutex
	// pid is the backend pid of the connection that last recorded its slots in
	// renderqueue_listeners (ListenerSlotsVersion and later; 0 before the first, or on an older
	// schema).
	pid uint32
	// q is the queue of events, gaps and resumptions (store.EventQueue: its bounds and how gaps of
	// different causes combine); a lost connection is its SetLost.
	q          *store.EventQueue
	slots      [schedule.NumSlots]bool // the current set; Next drops events of other slots
	waitCancel context.CancelFunc      // interrupts the reader's wait (SetSlots)
	closed     bool

	wake   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

var _ store.Subscription = (*Subscription)(nil)

// Subscribe LISTENs on the channels of slots and returns the subscription: the change events
// of those slots' rows, and a gap (then resumed) whenever events may have been lost — the
// connection was lost, a payload was refused, the queue overflowed or the table was truncated.
// It ends when ctx does or when it is closed.
func Subscribe(ctx context.Context, cfg Config, slots []int) (*Subscription, error) {
	norm, err := store.NormalizeSlots(slots)
	if err != nil {
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	if cfg.Conn == nil {
		return nil, errors.New("subscribe: no connection configuration")
	}
	cfg.setDefaults()
	sub := &Subscription{
		opts:   cfg,
		log:    cfg.Logger,
		routes: columns.Interner{},
		guard:  newReplayGuard(cfg.EventMaxAge, cfg.MaxRememberedEvents),
		ctrl:   make(chan *setReq, 16),
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
	sub.q = store.NewEventQueue(cfg.MaxQueuedEvents, cfg.MaxQueuedBytes, func(events int, bytes int64) error {
		sub.log.Info("Change event queue full: dropping events and signalling a gap until the consumer catches up",
			"queued", events, "queuedBytes", bytes)
		return fmt.Errorf("%w (%d events, %d bytes)", errOverflow, events, bytes)
	})
	sub.connCfg = cfg.Conn.Copy()
	if sub.connCfg.RuntimeParams == nil {
		sub.connCfg.RuntimeParams = map[string]string{}
	}
	if sub.connCfg.RuntimeParams["application_name"] == "" {
		sub.connCfg.RuntimeParams["application_name"] = ListenerApplicationName
	}
	sub.connCfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		sub.pending = append(sub.pending, n)
	}
	var want [schedule.NumSlots]bool
	for _, sl := range norm {
		want[sl] = true
	}
	conn, err := sub.connect(ctx, want)
	if err != nil {
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	sub.slots = want
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	sub.cancel = cancel
	if cfg.OnOpen != nil {
		if err := cfg.OnOpen(sub); err != nil {
			cancel()
			_ = conn.Close(context.Background())
			return nil, err
		}
	}
	stopAfter := context.AfterFunc(ctx, func() { _ = sub.Close() })
	go func() {
		defer stopAfter()
		sub.run(runCtx, conn)
	}()
	return sub, nil
}

// connect opens the subscription's connection, LISTENs on the channels of the wanted slots for
// the schema's version and on SchemaChannel, and reads the key the payloads are signed with.
//
// The version is read after LISTEN is active, and LISTEN is changed (and the version read again)
// until they agree: a migration that moves the events commits either before that read (which
// sees its version) or after the LISTEN on SchemaChannel (which receives its payload).
func (sub *Subscription) connect(ctx context.Context, want [schedule.NumSlots]bool) (*pgconn.PgConn, error) {
	conn, err := pgconn.ConnectConfig(ctx, sub.connCfg)
	if err != nil {
		return nil, fmt.Errorf("connecting the listener: %w", err)
	}
	sub.listening = map[string]bool{}
	sub.restart = nil
	for attempt := 0; ; attempt++ {
		err := sub.relisten(ctx, conn, &want)
		if err == nil {
			sub.version, err = readSchemaVersion(ctx, conn)
		}
		if err == nil && attempt == 3 {
			err = errors.New("the schema's version keeps changing while connecting the listener")
		}
		if err != nil {
			_ = conn.Close(context.Background())
			return nil, err
		}
		if legacy := sub.version < GroupChannelsVersion; legacy != sub.legacy {
			sub.legacy = legacy
			continue
		}
		break
	}
	if err := sub.readKey(ctx, conn); err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	if err := sub.register(ctx, conn, &want); err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	sub.accept = want
	return conn, nil
}

// register records the connection's slots in renderqueue_listeners (schema version
// ListenerSlotsVersion and later), so that a keeper's completions of rows in those slots send
// their change events (migrations/0007_quiet_completions.sql). It returns once the record is
// committed; that waits for the completions that decided to send no events to commit, so a walk
// that starts after it reads what they wrote.
func (sub *Subscription) register(ctx context.Context, conn *pgconn.PgConn, want *[schedule.NumSlots]bool) error {
	if sub.version < ListenerSlotsVersion {
		return nil
	}
	bits := make([]byte, schedule.NumSlots)
	for sl, ok := range want {
		bits[sl] = '0'
		if ok {
			bits[sl] = '1'
		}
	}
	if _, err := conn.Exec(ctx, "SELECT renderqueue_listen_slots(B'"+string(bits)+"')").ReadAll(); err != nil {
		return fmt.Errorf("recording the listener's slots: %w", err)
	}
	sub.mu.Lock()
	sub.pid = conn.PID()
	sub.mu.Unlock()
	return nil
}

// olderVersion is the version readSchemaVersion reports for a schema without
// renderqueue_schema_version(): older than GroupChannelsVersion (2 or 3; older ones have no
// signing key, which readKey then says).
const olderVersion = GroupChannelsVersion - 1

// readSchemaVersion reads the schema's version with renderqueue_schema_version() (added by
// version 4, executable by every role).
func readSchemaVersion(ctx context.Context, conn *pgconn.PgConn) (int, error) {
	res, err := conn.Exec(ctx, `SELECT renderqueue_schema_version()`).ReadAll()
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42883": // undefined_function
		return olderVersion, nil
	case errors.As(err, &pgErr) && pgErr.Code == "42501": // insufficient_privilege
		return 0, fmt.Errorf("reading the schema's version: %w (schema migrate grants EXECUTE ON FUNCTION renderqueue_schema_version() to PUBLIC; grant it to the keeper's role if it was revoked; see docs/security.md)", err)
	}
	if err == nil && (len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1) {
		err = errors.New("unexpected result shape")
	}
	if err != nil {
		return 0, fmt.Errorf("reading the schema's version: %w", err)
	}
	v, err := strconv.Atoi(string(res[0].Rows[0][0]))
	if err != nil {
		return 0, fmt.Errorf("reading the schema's version: %w", err)
	}
	return v, nil
}

// readKey reads the key change events are signed with (renderqueue_event_key(), which the
// keeper's role must be granted) and the database's clock. It first declares that this
// subscription listens where schema version 4 sends events (renderqueue.event_channels: from
// version 4, renderqueue_event_key() refuses sessions that do not, which older keepers are).
func (sub *Subscription) readKey(ctx context.Context, conn *pgconn.PgConn) error {
	before := time.Now()
	res, err := conn.Exec(ctx, `SET renderqueue.event_channels = 'rq_slots'; `+
		`SELECT renderqueue_event_key(), floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint`).ReadAll()
	after := time.Now()
	if err == nil && (len(res) != 2 || len(res[1].Rows) != 1 || len(res[1].Rows[0]) != 2) {
		err = errors.New("unexpected result shape")
	}
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42501": // insufficient_privilege
		return fmt.Errorf("reading the change-event signing key: %w (the keeper's role needs GRANT EXECUTE ON FUNCTION renderqueue_event_key(); see docs/security.md)", err)
	case errors.As(err, &pgErr) && pgErr.Code == "42883": // undefined_function
		return fmt.Errorf("reading the change-event signing key: %w (the schema is older than this keeper: run renderqueue schema migrate)", err)
	case err != nil:
		return fmt.Errorf("reading the change-event signing key: %w", err)
	}
	row := res[1].Rows[0]
	if row[0] == nil {
		return errors.New("reading the change-event signing key: there is none (run SELECT renderqueue_rotate_event_key() as the schema owner)")
	}
	key, err := hex.DecodeString(string(row[0]))
	if err != nil || len(key) == 0 {
		return fmt.Errorf("reading the change-event signing key: %q is not a hex key", row[0])
	}
	dbNow, err := strconv.ParseInt(string(row[1]), 10, 64)
	if err != nil {
		return fmt.Errorf("reading the database's clock: %w", err)
	}
	mid := before.Add(after.Sub(before) / 2)
	sub.key, sub.keyAt = key, after
	sub.clockOffset = time.UnixMicro(dbNow).Sub(mid)
	return nil
}

// keyRefreshInterval is the least time between two reads of the signing key prompted by bad
// signatures (after a rotation, the first payload signed with the new key prompts one).
const keyRefreshInterval = time.Second

// healthCheckTimeout is the least time an idle connection's check is given to be answered.
const healthCheckTimeout = 5 * time.Second

// open checks a notification and returns its body: signed by the schema's triggers with the
// current key (read again, at most once per keyRefreshInterval, when the signature does not
// match: the key may have been rotated; conn is nil when the connection is gone), fresh, and
// not seen before.
func (sub *Subscription) open(conn *pgconn.PgConn, n *pgconn.Notification) (string, error) {
	e, err := openEnvelope(n.Payload)
	if err != nil {
		return "", err
	}
	if !e.authentic(sub.key, n.Channel) {
		if conn == nil || conn.IsClosed() || time.Since(sub.keyAt) < keyRefreshInterval {
			return "", errBadSignature
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := sub.readKey(ctx, conn)
		cancel()
		if err != nil {
			return "", fmt.Errorf("%w; reading the key again: %w", errBadSignature, err)
		}
		if !e.authentic(sub.key, n.Channel) {
			return "", errBadSignature
		}
	}
	now := time.Now().Add(sub.clockOffset).UnixMicro()
	if err := sub.guard.admit(e.ts, &e.mac, now); err != nil {
		return "", err
	}
	return e.body, nil
}

// logLimiter lets one log line through per interval and counts the ones it held back.
type logLimiter struct {
	last       time.Time
	suppressed int
}

func (l *logLimiter) allow(now time.Time) (ok bool, suppressed int) {
	if now.Sub(l.last) < time.Second {
		l.suppressed++
		return false, 0
	}
	l.last = now
	n := l.suppressed
	l.suppressed = 0
	return true, n
}

// channels returns the channels a subscription to the slots in want LISTENs on: SchemaChannel,
// and the group channels of the groups with a slot in want (each slot's channel when legacy).
func channels(want *[schedule.NumSlots]bool, legacy bool) []string {
	out := []string{SchemaChannel}
	last := -1
	for sl := range schedule.NumSlots {
		switch {
		case !want[sl]:
		case legacy:
			out = append(out, SlotChannel(sl))
		case GroupOf(sl) != last:
			last = GroupOf(sl)
			out = append(out, GroupChannel(last))
		}
	}
	return out
}

// relisten changes the LISTENed channels to those of want (channels), in one round trip. A slot
// added to a group already listened to changes no channel and needs no round trip.
func (sub *Subscription) relisten(ctx context.Context, conn *pgconn.PgConn, want *[schedule.NumSlots]bool) error {
	chans := channels(want, sub.legacy)
	next := make(map[string]bool, len(chans))
	var b strings.Builder
	for _, ch := range chans {
		next[ch] = true
		if !sub.listening[ch] {
			b.WriteString("LISTEN " + ch + ";")
		}
	}
	for _, ch := range slices.Sorted(maps.Keys(sub.listening)) {
		if !next[ch] {
			b.WriteString("UNLISTEN " + ch + ";")
		}
	}
	if b.Len() == 0 {
		return nil
	}
	if _, err := conn.Exec(ctx, b.String()).ReadAll(); err != nil {
		return fmt.Errorf("changing LISTEN channels: %w", err)
	}
	sub.listening = next
	return nil
}

// run is the reader goroutine: serve the connection until it fails, signal a gap, reconnect,
// signal resumed, and so on until the subscription is closed.
func (sub *Subscription) run(ctx context.Context, conn *pgconn.PgConn) {
	defer close(sub.done)
	defer sub.markClosed()
	for {
		err := sub.serve(ctx, conn)
		_ = conn.Close(context.Background())
		sub.deliverPending(nil)
		if ctx.Err() != nil {
			sub.failWaiting(store.ErrClosed)
			return
		}
		switch {
		case errors.Is(err, errSchemaChanged):
			sub.log.Info("Change event subscription reconnecting: the schema moved change events to other channels", "error", err.Error())
			sub.setLost(true, err)
		case errors.Is(err, errFlood):
			pause := sub.floodPause()
			sub.log.Error(err, "Change event notifications flood the listener: not reading them; the shard walks instead once it listens again",
				"floodRate", sub.opts.FloodRate, "listeningAgainIn", pause)
			sub.setLost(true, err)
			if !sub.sleep(ctx, pause) {
				sub.failWaiting(store.ErrClosed)
				return
			}
		default:
			sub.log.Info("change event subscription lost its connection; reconnecting", "error", err.Error())
			sub.setLost(true, fmt.Errorf("listener connection lost: %w", err))
		}
		conn = sub.reconnect(ctx)
		if conn == nil {
			sub.failWaiting(store.ErrClosed)
			return
		}
		sub.log.Info("change event subscription resumed")
		sub.setLost(false, nil)
	}
}

// serve waits for notifications, handles SetSlots requests and checks the connection when idle.
// It returns the error that ended the connection, or errSchemaChanged (via sub.restart) when a
// migration moved the change events.
func (sub *Subscription) serve(ctx context.Context, conn *pgconn.PgConn) error {
	for {
		if err := sub.handleSetSlots(ctx, conn); err != nil {
			return err
		}
		// notifications that arrived while LISTEN/UNLISTEN ran are buffered by the connection:
		// hand them over now, not when the next notification or health check wakes the wait
		sub.deliverPending(conn)
		if err := sub.stopReading(); err != nil {
			return err
		}
		waitCtx, cancel := context.WithTimeout(ctx, sub.opts.HealthInterval)
		sub.mu.Lock()
		sub.waitCancel = cancel
		if len(sub.ctrl) > 0 {
			cancel()
		}
		sub.mu.Unlock()
		err := conn.WaitForNotification(waitCtx)
		sub.mu.Lock()
		sub.waitCancel = nil
		sub.mu.Unlock()
		timedOut := errors.Is(waitCtx.Err(), context.DeadlineExceeded)
		cancel()
		sub.deliverPending(conn)
		if err := sub.stopReading(); err != nil {
			return err
		}
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if conn.IsClosed() || waitCtx.Err() == nil {
			return err
		}
		if timedOut {
			// a check that gets no answer within this is a lost connection (a partition): the gap
			// is signalled, so the keeper stops claiming exactness, within HealthInterval plus this
			pctx, pcancel := context.WithTimeout(ctx, max(sub.opts.HealthInterval, healthCheckTimeout))
			_, perr := conn.Exec(pctx, "SELECT 1").ReadAll()
			pcancel()
			sub.deliverPending(conn)
			if perr != nil {
				return fmt.Errorf("health check: %w", perr)
			}
			if err := sub.stopReading(); err != nil {
				return err
			}
		}
	}
}

// handleSetSlots applies queued SetSlots requests on a live connection.
//
// Once LISTEN covers the new set, the events read from then on are filtered by it (accept):
// every notification of a write committed after SetSlots returns is read after that, so its
// events are delivered when its slot is in the new set, as with a LISTEN on a channel of its own;
// events of an added slot committed shortly before may be delivered too (notifications read
// before but handled after the switch), which LISTEN allows as well. Next drops events of a
// removed slot that are already queued.
func (sub *Subscription) handleSetSlots(ctx context.Context, conn *pgconn.PgConn) error {
	for {
		var req *setReq
		select {
		case req = <-sub.ctrl:
		default:
			return nil
		}
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := sub.relisten(lctx, conn, &req.slots)
		if err == nil {
			err = sub.register(lctx, conn, &req.slots)
		}
		cancel()
		if err != nil {
			// The desired set is kept for the reconnect; the caller is answered once it is active.
			sub.carried = req
			return err
		}
		sub.accept = req.slots
		sub.mu.Lock()
		sub.slots = req.slots
		sub.mu.Unlock()
		req.reply <- nil
	}
}

// reconnect reconnects with backoff, taking SetSlots requests into account, and returns the new
// connection (LISTENing on the current set) or nil when the subscription is closed.
func (sub *Subscription) reconnect(ctx context.Context) *pgconn.PgConn {
	backoff := sub.opts.ReconnectMin
	var waiting []*setReq
	sub.mu.Lock()
	want := sub.slots
	sub.mu.Unlock()
	take := func(req *setReq) {
		want = req.slots
		waiting = append(waiting, req)
	}
	if sub.carried != nil {
		take(sub.carried)
		sub.carried = nil
	}
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			d := backoff/2 + rand.N(backoff/2+1)
			t := time.NewTimer(d)
		wait:
			for {
				select {
				case <-ctx.Done():
					t.Stop()
					for _, r := range waiting {
						r.reply <- store.ErrClosed
					}
					return nil
				case req := <-sub.ctrl:
					take(req)
				case <-t.C:
					break wait
				}
			}
			backoff = min(2*backoff, sub.opts.ReconnectMax)
		}
		for drained := false; !drained; {
			select {
			case req := <-sub.ctrl:
				take(req)
			default:
				drained = true
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		conn, err := sub.connect(cctx, want)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				continue // the wait above returns
			}
			sub.log.Info("change event subscription: reconnect failed", "attempt", attempt+1, "error", err.Error())
			continue
		}
		sub.mu.Lock()
		sub.slots = want
		sub.mu.Unlock()
		for _, r := range waiting {
			r.reply <- nil
		}
		return conn
	}
}

// failWaiting answers SetSlots requests still queued when the subscription ends.
func (sub *Subscription) failWaiting(err error) {
	if sub.carried != nil {
		sub.carried.reply <- err
		sub.carried = nil
	}
	for {
		select {
		case req := <-sub.ctrl:
			req.reply <- err
		default:
			return
		}
	}
}

// deliverPending checks and parses the notifications read so far and queues the events of the
// slots in accept (a group channel carries the events of all 16 slots of its group). A payload
// that is not authentic, fresh and new, or that does not parse, is dropped and signalled as a gap
// (then resumed: the subscription itself is fine), so the keeper walks rather than trusts it. A
// notification on a channel no longer listened to (its slots or the channel layout were left) is
// dropped unread. An authentic payload on SchemaChannel naming a version newer than the one read
// when connecting opens a gap and sets restart: the connection is ended and the reconnect
// listens where the events go now. conn is the live connection (to read a rotated key), or nil.
func (sub *Subscription) deliverPending(conn *pgconn.PgConn) {
	for len(sub.pending) > 0 {
		if sub.flooding(len(sub.pending)) {
			// a flood: dropped unread, the connection ends (stopReading) and a gap is signalled
			clear(sub.pending)
			sub.pending = sub.pending[:0]
			return
		}
		// reading the key again may read more notifications into a fresh pending
		batch := sub.pending
		sub.pending, sub.spare = sub.spare[:0], nil
		var items []qitem
		var evs []store.Event
		for i, n := range batch {
			batch[i] = nil
			if !sub.listening[n.Channel] {
				continue
			}
			sub.opened.Add(1)
			body, err := sub.open(conn, n)
			if err == nil && n.Channel == SchemaChannel {
				var v int
				if v, err = strconv.Atoi(body); err != nil {
					err = fmt.Errorf("%w: schema version %q", errBadPayload, prefix(body))
				} else if v > sub.version && sub.restart == nil {
					sub.restart = fmt.Errorf("%w (version %d, was %d)", errSchemaChanged, v, sub.version)
					items = append(items, qitem{kind: store.KindGap, err: sub.restart, lost: true})
				}
				if err == nil {
					continue
				}
			}
			if err == nil && body == truncateBody {
				items = append(items, qitem{kind: store.KindGap, err: errTruncated}, qitem{kind: store.KindResumed})
				continue
			}
			if err == nil {
				evs, err = parseEntries(body, sub.routes, evs[:0])
				for _, ev := range evs {
					if sub.accept[schedule.SlotOf(ev.Row.KeyHash)] {
						items = append(items, qitem{kind: store.KindEvents, ev: ev})
					}
				}
			}
			if err != nil {
				if ok, more := sub.badLog.allow(time.Now()); ok {
					sub.log.Error(err, "Dropping a change event payload; signalling a gap", "channel", n.Channel,
						"payloadPrefix", prefix(n.Payload), "droppedSinceLastLine", more)
				}
				items = append(items, qitem{kind: store.KindGap, err: fmt.Errorf("channel %s: %w", n.Channel, err)},
					qitem{kind: store.KindResumed})
			}
		}
		sub.spare = batch[:0]
		sub.push(items...)
	}
}

// flooding counts n notifications read into the current second and says whether the
// subscription is flooded: more than Config.FloodRate notifications in a second (from the first
// notification of that second), or flooded already on this connection.
func (sub *Subscription) flooding(n int) bool {
	if sub.flood.flooded {
		return true
	}
	now := time.Now()
	if now.Sub(sub.flood.windowStart) >= time.Second {
		sub.flood.windowStart, sub.flood.count = now, 0
	}
	sub.flood.count += n
	if sub.flood.count > sub.opts.FloodRate {
		sub.flood.flooded = true
	}
	return sub.flood.flooded
}

// stopReading returns why the connection must end after the notifications read were handed over:
// a flood (errFlood) or a migration that moved the events (restart); nil to go on.
func (sub *Subscription) stopReading() error {
	if sub.flood.flooded {
		return errFlood
	}
	return sub.restart
}

// floodPause returns how long to wait before listening again after a flood was found: FloodPause,
// doubled for each flood found within FloodPauseMax of listening again after the last one (the
// flood goes on), up to FloodPauseMax. It resets the flood count for the next connection.
func (sub *Subscription) floodPause() time.Duration {
	now := time.Now()
	switch {
	case sub.flood.pause == 0 || now.Sub(sub.flood.last) > sub.flood.pause+sub.opts.FloodPauseMax:
		sub.flood.pause = sub.opts.FloodPause
	default:
		sub.flood.pause = min(2*sub.flood.pause, sub.opts.FloodPauseMax)
	}
	sub.flood.last = now
	sub.flood.flooded, sub.flood.count, sub.flood.windowStart = false, 0, time.Time{}
	return sub.flood.pause
}

// sleep waits d, or until ctx ends (then it returns false). SetSlots requests wait meanwhile and
// are taken by the reconnect.
func (sub *Subscription) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// push queues items: events, and gap and resumed signals of payloads that were dropped (each a
// gap followed by resumed).
func (sub *Subscription) push(items ...qitem) {
	if len(items) == 0 {
		return
	}
	sub.mu.Lock()
	for _, it := range items {
		switch {
		case it.kind == store.KindGap && it.lost:
			sub.q.SetLost(true, it.err)
		case it.kind == store.KindGap:
			sub.q.Gap(it.err)
		case it.kind == store.KindResumed:
			sub.q.Resumed()
		default:
			sub.q.Push(it.ev)
		}
	}
	sub.mu.Unlock()
	sub.signal()
}

// setLost records that the connection was lost (a gap, with cause err) or is back (resumed,
// unless the queue still overflows).
func (sub *Subscription) setLost(lost bool, err error) {
	sub.mu.Lock()
	sub.q.SetLost(lost, err)
	sub.mu.Unlock()
	sub.signal()
}

func (sub *Subscription) signal() {
	select {
	case sub.wake <- struct{}{}:
	default:
	}
}

func (sub *Subscription) markClosed() {
	sub.mu.Lock()
	sub.closed = true
	sub.mu.Unlock()
	select {
	case sub.wake <- struct{}{}:
	default:
	}
}

// Next implements store.Subscription.
func (sub *Subscription) Next(ctx context.Context) (store.Batch, error) {
	for {
		sub.mu.Lock()
		if sub.closed {
			sub.mu.Unlock()
			return store.Batch{}, store.ErrClosed
		}
		b, ok := sub.q.Take(&sub.slots)
		sub.mu.Unlock()
		if ok {
			return b, nil
		}
		select {
		case <-sub.wake:
		case <-ctx.Done():
			return store.Batch{}, ctx.Err()
		}
	}
}

// ListenerPID is the backend pid of the subscription's connection as recorded with its slots in
// renderqueue_listeners, or 0 when the schema is older than ListenerSlotsVersion (or nothing was
// recorded yet). After the connection is lost it is the lost connection's pid until the
// reconnect records the new one: a listener that is gone counts for nobody.
func (sub *Subscription) ListenerPID() uint32 {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return sub.pid
}

// Gap signals a gap (then resumed) to the consumer, with cause err: events may have been lost
// that the connection never carried — the store's own completions written without change events
// whose outcome it does not know.
func (sub *Subscription) Gap(err error) {
	sub.push(qitem{kind: store.KindGap, err: err}, qitem{kind: store.KindResumed})
}

// SetSlots implements store.Subscription.
func (sub *Subscription) SetSlots(ctx context.Context, slots []int) error {
	norm, err := store.NormalizeSlots(slots)
	if err != nil {
		return fmt.Errorf("set slots: %w", err)
	}
	req := &setReq{reply: make(chan error, 1)}
	for _, sl := range norm {
		req.slots[sl] = true
	}
	select {
	case sub.ctrl <- req:
	case <-sub.done:
		return store.ErrClosed
	case <-ctx.Done():
		return fmt.Errorf("set slots: %w", ctx.Err())
	}
	sub.mu.Lock()
	if sub.waitCancel != nil {
		sub.waitCancel()
	}
	sub.mu.Unlock()
	select {
	case err := <-req.reply:
		if err != nil {
			return fmt.Errorf("set slots: %w", err)
		}
		return nil
	case <-sub.done:
		return store.ErrClosed
	case <-ctx.Done():
		return fmt.Errorf("set slots (the new set still takes effect): %w", ctx.Err())
	}
}

// Close implements store.Subscription.
func (sub *Subscription) Close() error {
	sub.cancel()
	<-sub.done
	if sub.opts.OnClose != nil {
		sub.opts.OnClose(sub)
	}
	return nil
}
