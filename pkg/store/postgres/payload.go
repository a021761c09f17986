package postgres

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
)

// truncatePayload is the payload sent on every slot channel when the table is truncated.
const truncatePayload = "T"

// maxPayloadBytes is PostgreSQL's limit on a NOTIFY payload (it must be shorter than this).
const maxPayloadBytes = 8000

// channelName is the notification channel of a slot.
func channelName(slot int) string { return "rq_slot_" + strconv.Itoa(slot) }

var errBadPayload = errors.New("malformed change event payload")

// parsePayload appends the events of one notification payload (format: see
// migrations/0001_render_schedule.sql) to evs. Keys are copied out of the payload so events do
// not pin it in memory.
func parsePayload(p string, routes interner, evs []store.Event) ([]store.Event, error) {
	if len(p) == 0 || p[0] != '1' {
		return evs, fmt.Errorf("%w: unknown format %q", errBadPayload, prefix(p))
	}
	p = p[1:]
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
			r.Due, r.HasDue = microsToTime(us), true
		}
		var ms, flags, n int64
		if ms, p, err = parseInt(p, ','); err != nil {
			return evs, fmt.Errorf("%w: cadence: %w", errBadPayload, err)
		}
		r.Cadence = cadenceFromMillis(ms)
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
		r.Route, p = routes.getString(p[:n]), p[n:]
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
