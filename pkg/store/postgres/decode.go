package postgres

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// rowColumns is the column list every row-returning statement uses, in the order decodeRow reads.
const rowColumns = "key, key_hash, due_at, cadence_ms, route, source, urgent, rev"

// pgEpochMicros is 2000-01-01 00:00:00 UTC (PostgreSQL's timestamp epoch) in Unix microseconds.
const pgEpochMicros = 946684800 * 1000000

// microsToTime converts Unix microseconds to a UTC time. The extremes (PostgreSQL's ±infinity,
// which the schema forbids anyway) map to instants hundreds of thousands of years away rather than
// overflowing.
func microsToTime(us int64) time.Time {
	return time.UnixMicro(us).UTC()
}

// pgMicrosToTime converts a binary timestamptz (microseconds since 2000-01-01 UTC).
func pgMicrosToTime(v int64) time.Time {
	switch v {
	case math.MaxInt64, math.MinInt64:
		return microsToTime(v)
	}
	return microsToTime(v + pgEpochMicros)
}

// interner returns one string per distinct route, so a walk of a million rows does not allocate a
// million copies of a handful of route names.
type interner map[string]string

func (in interner) get(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if s, ok := in[string(b)]; ok { // no allocation for the lookup
		return s
	}
	if len(in) > 4096 { // many distinct routes: stop caching
		return string(b)
	}
	s := string(b)
	in[s] = s
	return s
}

// getString is get for a string that must not be retained as is (it may pin a larger buffer).
func (in interner) getString(b string) string {
	if len(b) == 0 {
		return ""
	}
	if s, ok := in[b]; ok {
		return s
	}
	s := strings.Clone(b)
	if len(in) <= 4096 {
		in[s] = s
	}
	return s
}

// decodeRow decodes one binary-format row of rowColumns.
func decodeRow(vals [][]byte, routes interner, r *schedule.Row) error {
	if len(vals) != 8 {
		return fmt.Errorf("row has %d columns, want 8", len(vals))
	}
	if vals[0] == nil || len(vals[1]) != 8 || len(vals[3]) != 8 || len(vals[6]) != 1 || len(vals[7]) != 8 {
		return fmt.Errorf("malformed row (column sizes %d,%d,%d,%d,%d,%d,%d,%d)",
			len(vals[0]), len(vals[1]), len(vals[2]), len(vals[3]), len(vals[4]), len(vals[5]), len(vals[6]), len(vals[7]))
	}
	r.Key = string(vals[0])
	r.KeyHash = int64(binary.BigEndian.Uint64(vals[1]))
	switch len(vals[2]) {
	case 8:
		r.Due = pgMicrosToTime(int64(binary.BigEndian.Uint64(vals[2])))
		r.HasDue = true
	default:
		if vals[2] != nil {
			return fmt.Errorf("key %q: malformed due_at (%d bytes)", r.Key, len(vals[2]))
		}
		r.Due = time.Time{}
		r.HasDue = false
	}
	r.Cadence = cadenceFromMillis(int64(binary.BigEndian.Uint64(vals[3])))
	r.Route = routes.get(vals[4])
	switch string(vals[5]) {
	case "submitted":
		r.Source = schedule.SourceSubmitted
	case "discovered":
		r.Source = schedule.SourceDiscovered
	default:
		return fmt.Errorf("key %q: unknown source %q", r.Key, vals[5])
	}
	r.Urgent = vals[6][0] != 0
	r.Rev = int64(binary.BigEndian.Uint64(vals[7]))
	return nil
}

// cadenceFromMillis converts a stored cadence. A cadence too long for time.Duration (about 292
// years) reads as -1ns, which no reader takes for a valid cadence, rather than wrapping around.
func cadenceFromMillis(ms int64) time.Duration {
	if ms > math.MaxInt64/int64(time.Millisecond) || ms < math.MinInt64/int64(time.Millisecond) {
		return -1
	}
	return time.Duration(ms) * time.Millisecond
}

// sourceName is the stored name of a source.
func sourceName(s schedule.Source) string { return s.String() }
