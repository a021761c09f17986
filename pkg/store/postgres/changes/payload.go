package changes

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/internal/columns"
)

// truncateBody is the body of the payload sent on every event channel when the table is
// truncated.
const truncateBody = "T"

// maxPayloadBytes is PostgreSQL's limit on a NOTIFY payload (it must be shorter than this).
const maxPayloadBytes = 8000

// Change events go to one channel per group of GroupSlots adjacent slots
// (pkg/store/postgres/migrations/0004_slot_group_channels.sql); before schema version 4 they went
// to one channel per slot.
const (
	// GroupSlots is the number of adjacent slots whose events share a channel.
	GroupSlots = 16
	// NumGroups is the number of slot groups, and of group channels.
	NumGroups = schedule.NumSlots / GroupSlots
	// GroupChannelsVersion is the schema version from which events go to group channels.
	GroupChannelsVersion = 4
	// ListenerSlotsVersion is the schema version from which a subscription records the slots
	// it listens to (renderqueue_listeners) and keepers' completions send the events of only
	// those rows whose slot another listener holds.
	ListenerSlotsVersion = 7
)

// GroupOf is the slot group of a slot: its events go to channel GroupChannel(GroupOf(slot)).
func GroupOf(slot int) int { return slot / GroupSlots }

// GroupChannel is the notification channel of a slot group, rq_slots_<group>.
func GroupChannel(group int) string { return "rq_slots_" + strconv.Itoa(group) }

// SlotChannel is the notification channel of a slot before schema version 4, rq_slot_<slot>.
func SlotChannel(slot int) string { return "rq_slot_" + strconv.Itoa(slot) }

// SchemaChannel is the channel every subscription LISTENs on besides its event channels: a
// migration that moves change events to other channels sends a signed payload there (its body
// the new schema version), and the subscription reconnects to listen where events now go.
const SchemaChannel = "rq_schema"

var errBadPayload = errors.New("malformed change event payload")

// Why a payload was not accepted as one the schema's triggers sent
// (pkg/store/postgres/migrations/0002_signed_events.sql).
var (
	errUnsigned     = errors.New("unsigned change event payload (not sent by the schema's triggers, or by a schema older than version 2)")
	errBadSignature = errors.New("change event payload with a wrong signature (forged, or signed with another key)")
	errStale        = errors.New("change event payload signed too far from the database's current time (delayed, replayed or the clocks differ)")
	errReplayed     = errors.New("change event payload received twice (replayed)")
)

// envelope is a signed payload taken apart (format 2,
// pkg/store/postgres/migrations/0002_signed_events.sql): "2" ts "," mac "," body.
type envelope struct {
	ts     int64  // microseconds since the epoch, the database's clock
	tsText string // ts as signed
	mac    [sha256.Size]byte
	body   string
}

// openEnvelope takes a payload apart without checking its signature.
func openEnvelope(p string) (envelope, error) {
	var e envelope
	if len(p) == 0 || p[0] != '2' {
		// the format only: the reason reaches the shard's unauthenticated status, and an old
		// format's payload carries keys
		return e, fmt.Errorf("%w: format %q", errUnsigned, p[:min(1, len(p))])
	}
	ts, rest, ok := strings.Cut(p[1:], ",")
	if !ok {
		return e, fmt.Errorf("%w: no signing time", errBadPayload)
	}
	v, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return e, fmt.Errorf("%w: signing time: %w", errBadPayload, err)
	}
	mac, body, ok := strings.Cut(rest, ",")
	if !ok || len(mac) != 2*sha256.Size {
		return e, fmt.Errorf("%w: no signature", errBadPayload)
	}
	if _, err := hex.Decode(e.mac[:], []byte(mac)); err != nil {
		return e, fmt.Errorf("%w: signature: %w", errBadPayload, err)
	}
	e.ts, e.tsText, e.body = v, ts, body
	return e, nil
}

// signature is the HMAC-SHA-256 under key of channel "," ts "," body.
func signature(key []byte, channel, ts, body string) [sha256.Size]byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(channel))
	m.Write([]byte{','})
	m.Write([]byte(ts))
	m.Write([]byte{','})
	m.Write([]byte(body))
	var out [sha256.Size]byte
	m.Sum(out[:0])
	return out
}

// authentic reports whether e was signed under key for channel.
func (e *envelope) authentic(key []byte, channel string) bool {
	want := signature(key, channel, e.tsText, e.body)
	return hmac.Equal(want[:], e.mac[:])
}

// replayGuard accepts each authentic payload once, and only while it is fresh: signed within
// maxAge of the database's current time. It remembers the payloads it accepted until they are
// too old to be accepted again, at most max of them; when more arrive, the oldest are forgotten
// and payloads signed no later than them are refused (as if stale), so memory stays bounded and
// a replay is never mistaken for a new payload.
type replayGuard struct {
	maxAge int64 // µs
	max    int
	seen   map[uint64]struct{}
	ring   []seenPayload // in arrival order, from head
	head   int
	floor  int64 // payloads signed at or before this (µs) are refused
}

type seenPayload struct {
	ts  int64
	mac uint64
}

func newReplayGuard(maxAge time.Duration, max int) *replayGuard {
	return &replayGuard{maxAge: maxAge.Microseconds(), max: max, seen: map[uint64]struct{}{}, floor: -1 << 63}
}

// admit checks an authentic payload signed at ts (µs) with signature mac when the database's
// clock reads now (µs), and remembers it.
func (g *replayGuard) admit(ts int64, mac *[sha256.Size]byte, now int64) error {
	for g.head < len(g.ring) && g.ring[g.head].ts < now-g.maxAge {
		g.drop()
	}
	switch {
	case ts < now-g.maxAge || ts > now+g.maxAge:
		return fmt.Errorf("%w: signed at %s, the database's clock reads %s (at most %v apart)", errStale,
			time.UnixMicro(ts).UTC().Format(time.RFC3339Nano), time.UnixMicro(now).UTC().Format(time.RFC3339Nano),
			time.Duration(g.maxAge)*time.Microsecond)
	case ts <= g.floor:
		return fmt.Errorf("%w: signed at %s, before the oldest of the %d payloads remembered to detect replays", errStale,
			time.UnixMicro(ts).UTC().Format(time.RFC3339Nano), g.max)
	}
	id := binary.LittleEndian.Uint64(mac[:8])
	if _, dup := g.seen[id]; dup {
		return errReplayed
	}
	g.seen[id] = struct{}{}
	g.ring = append(g.ring, seenPayload{ts: ts, mac: id})
	for len(g.ring)-g.head > g.max {
		g.floor = max(g.floor, g.ring[g.head].ts)
		g.drop()
	}
	return nil
}

// drop forgets the oldest remembered payload.
func (g *replayGuard) drop() {
	delete(g.seen, g.ring[g.head].mac)
	g.ring[g.head] = seenPayload{}
	g.head++
	if g.head > 1024 && g.head > len(g.ring)/2 {
		n := copy(g.ring, g.ring[g.head:])
		g.ring = g.ring[:n]
		g.head = 0
	}
}

// parseEntries appends the events of a payload's body (the entries of format 1, see
// pkg/store/postgres/migrations/0001_render_schedule.sql) to evs. Keys are copied out of the
// payload so events do not pin it in memory.
func parseEntries(p string, routes columns.Interner, evs []store.Event) ([]store.Event, error) {
	for len(p) > 0 {
		var ev store.Event
		var err error
		r := &ev.Row
		if r.Rev, p, err = parseInt(p, ','); err != nil {
			return evs, fmt.Errorf("%w: rev: %w", errBadPayload, err)
		}
		if r.KeyHash, p, err = parseInt(p, ','); err != nil {
			return evs, fmt.Errorf("%w: key_hash: %w", errBadPayload, err)
		}
		if len(p) > 0 && p[0] == ',' {
			p = p[1:]
		} else {
			var us int64
			if us, p, err = parseInt(p, ','); err != nil {
				return evs, fmt.Errorf("%w: due: %w", errBadPayload, err)
			}
			r.Due, r.HasDue = columns.MicrosToTime(us), true
		}
		var ms, flags, n int64
		if ms, p, err = parseInt(p, ','); err != nil {
			return evs, fmt.Errorf("%w: cadence: %w", errBadPayload, err)
		}
		r.Cadence = columns.CadenceFromMillis(ms)
		if flags, p, err = parseInt(p, ','); err != nil {
			return evs, fmt.Errorf("%w: flags: %w", errBadPayload, err)
		}
		if flags&1 != 0 {
			r.Source = schedule.SourceSubmitted
		} else {
			r.Source = schedule.SourceDiscovered
		}
		r.Urgent = flags&2 != 0
		ev.Deleted = flags&4 != 0
		if n, p, err = parseInt(p, ':'); err != nil || n < 0 || int64(len(p)) < n {
			return evs, fmt.Errorf("%w: key length", errBadPayload)
		}
		r.Key, p = strings.Clone(p[:n]), p[n:]
		if n, p, err = parseInt(p, ':'); err != nil || n < 0 || int64(len(p)) < n {
			return evs, fmt.Errorf("%w: route length", errBadPayload)
		}
		r.Route, p = routes.GetString(p[:n]), p[n:]
		evs = append(evs, ev)
	}
	return evs, nil
}

// parseInt parses a decimal integer up to sep and returns it and the rest after sep.
func parseInt(p string, sep byte) (int64, string, error) {
	i := strings.IndexByte(p, sep)
	if i < 0 {
		return 0, p, fmt.Errorf("missing %q", sep)
	}
	v, err := strconv.ParseInt(p[:i], 10, 64)
	if err != nil {
		return 0, p, err
	}
	return v, p[i+1:], nil
}

func prefix(p string) string {
	if len(p) > 20 {
		return p[:20] + "..."
	}
	return p
}
