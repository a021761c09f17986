package postgres

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/internal/columns"
)

// rowColumns is the column list every row-returning statement uses, in the order decodeRow reads.
const rowColumns = "key, key_hash, due_at, cadence_ms, route, source, urgent, rev"

// pgEpochMicros is 2000-01-01 00:00:00 UTC (PostgreSQL's timestamp epoch) in Unix microseconds.
const pgEpochMicros = 946684800 * 1000000

// pgMicrosToTime converts a binary timestamptz (microseconds since 2000-01-01 UTC).
func pgMicrosToTime(v int64) time.Time {
	switch v {
	case math.MaxInt64, math.MinInt64:
		return columns.MicrosToTime(v)
	}
	return columns.MicrosToTime(v + pgEpochMicros)
}

// decodeRow decodes one binary-format row of rowColumns, its key through keys.
func decodeRow(vals [][]byte, keys *columns.Strings, routes columns.Interner, r *schedule.Row) error {
	if len(vals) != 8 {
		return fmt.Errorf("row has %d columns, want 8", len(vals))
	}
	if vals[0] == nil {
		return fmt.Errorf("malformed row (a NULL key)")
	}
	r.Key = keys.Get(vals[0])
	return decodeAfterKey(vals[1:], routes, r)
}

// decodeAfterKey decodes the binary-format columns of rowColumns after key (7 of them) into r,
// whose Key is set already. Its errors name a row by its key_hash, never by its key: they reach
// a shard's unauthenticated status (a failed walk's error).
func decodeAfterKey(vals [][]byte, routes columns.Interner, r *schedule.Row) error {
	if len(vals) != 7 {
		return fmt.Errorf("a row: %d columns after the key, want 7", len(vals))
	}
	if len(vals[0]) != 8 || len(vals[2]) != 8 || len(vals[5]) != 1 || len(vals[6]) != 8 {
		return fmt.Errorf("a row: malformed (column sizes after the key %d,%d,%d,%d,%d,%d,%d)",
			len(vals[0]), len(vals[1]), len(vals[2]), len(vals[3]), len(vals[4]), len(vals[5]), len(vals[6]))
	}
	r.KeyHash = int64(binary.BigEndian.Uint64(vals[0]))
	switch len(vals[1]) {
	case 8:
		r.Due = pgMicrosToTime(int64(binary.BigEndian.Uint64(vals[1])))
		r.HasDue = true
	default:
		if vals[1] != nil {
			return fmt.Errorf("the row of key_hash %d: malformed due_at (%d bytes)", r.KeyHash, len(vals[1]))
		}
		r.Due = time.Time{}
		r.HasDue = false
	}
	r.Cadence = columns.CadenceFromMillis(int64(binary.BigEndian.Uint64(vals[2])))
	r.Route = routes.Get(vals[3])
	switch string(vals[4]) {
	case "submitted":
		r.Source = schedule.SourceSubmitted
	case "discovered":
		r.Source = schedule.SourceDiscovered
	default:
		return fmt.Errorf("the row of key_hash %d: unknown source %q", r.KeyHash, vals[4])
	}
	r.Urgent = vals[5][0] != 0
	r.Rev = int64(binary.BigEndian.Uint64(vals[6]))
	return nil
}

// sourceName is the stored name of a source.
func sourceName(s schedule.Source) string { return s.String() }
