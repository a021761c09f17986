package changes

import (
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/internal/columns"
)

// The internals the external tests (package changes_test, which open subscriptions through a
// postgres.Store) check or use to forge payloads.

// Why payloads are refused and gaps signalled.
var (
	ErrOverflow      = errOverflow
	ErrUnsigned      = errUnsigned
	ErrBadSignature  = errBadSignature
	ErrStale         = errStale
	ErrReplayed      = errReplayed
	ErrBadPayload    = errBadPayload
	ErrTruncated     = errTruncated
	ErrSchemaChanged = errSchemaChanged
	ErrFlood         = errFlood
)

const (
	MaxPayloadBytes    = maxPayloadBytes
	KeyRefreshInterval = keyRefreshInterval
)

// Signature is the HMAC-SHA-256 under key of channel "," ts "," body.
var Signature = signature

// OpenPayload takes a payload apart: its body, its signing time (µs since the epoch) and whether
// it is signed under key for channel.
func OpenPayload(key []byte, channel, payload string) (body string, ts int64, authentic bool, err error) {
	e, err := openEnvelope(payload)
	if err != nil {
		return "", 0, false, err
	}
	return e.body, e.ts, e.authentic(key, channel), nil
}

// ParseBody parses a payload's body into events.
func ParseBody(body string) ([]store.Event, error) {
	return parseEntries(body, columns.Interner{}, nil)
}

// QueueStats is the event queue's Stats: events and bytes queued, events dropped.
func (sub *Subscription) QueueStats() (events int, bytes int64, dropped int64) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return sub.q.Stats()
}

// Opened is how many notifications the subscription has checked and parsed.
func (sub *Subscription) Opened() int64 { return sub.opened.Load() }
