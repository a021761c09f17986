// Package columns converts render_schedule's stored values to Go: timestamps in microseconds,
// cadences in milliseconds, and route names through an interner. The store's row decoder
// (pkg/store/postgres) and the change-event payload parser (pkg/store/postgres/changes) share
// it, so a row read by a walk and the same row read from its event are equal.
package columns

import (
	"math"
	"strings"
	"time"
)

// MicrosToTime converts Unix microseconds to a UTC time. The extremes (PostgreSQL's ±infinity,
// which the schema forbids anyway) map to instants hundreds of thousands of years away rather than
// overflowing.
func MicrosToTime(us int64) time.Time {
	return time.UnixMicro(us).UTC()
}

// CadenceFromMillis converts a stored cadence. A cadence too long for time.Duration (about 292
// years) reads as -1ns, which no reader takes for a valid cadence, rather than wrapping around.
func CadenceFromMillis(ms int64) time.Duration {
	if ms > math.MaxInt64/int64(time.Millisecond) || ms < math.MinInt64/int64(time.Millisecond) {
		return -1
	}
	return time.Duration(ms) * time.Millisecond
}

// Interner returns one string per distinct route, so a walk of a million rows does not allocate a
// million copies of a handful of route names.
type Interner map[string]string

// maxInterned is how many distinct routes an Interner keeps; past it, it stops caching.
const maxInterned = 4096

// Get returns the string of b, shared when b was seen before.
func (in Interner) Get(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if s, ok := in[string(b)]; ok { // no allocation for the lookup
		return s
	}
	if len(in) > maxInterned { // many distinct routes: stop caching
		return string(b)
	}
	s := string(b)
	in[s] = s
	return s
}

// GetString is Get for a string that must not be retained as is (it may pin a larger buffer).
func (in Interner) GetString(b string) string {
	if len(b) == 0 {
		return ""
	}
	if s, ok := in[b]; ok {
		return s
	}
	s := strings.Clone(b)
	if len(in) <= maxInterned {
		in[s] = s
	}
	return s
}

// Strings copies decoded bytes into strings carved from shared blocks, so a walk of a million
// 64-byte keys makes about a thousand allocations instead of a million. A string keeps its whole block
// alive: use it for strings that are copied elsewhere (the keeper copies every held key into its
// own arena) or dropped soon, and clone one before keeping it long on its own
// (strings.Clone). The zero Strings is ready to use; it is not safe for concurrent use.
type Strings struct {
	b strings.Builder
}

// stringsBlock is the size of Strings' blocks; longer strings get their own allocation.
const stringsBlock = 64 << 10

// Get returns b as a string.
func (s *Strings) Get(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if len(b) > stringsBlock/8 {
		return string(b)
	}
	if s.b.Cap()-s.b.Len() < len(b) {
		s.b = strings.Builder{} // a new block: the strings of the old one stay as they are
		s.b.Grow(stringsBlock)
	}
	n := s.b.Len()
	s.b.Write(b)
	return s.b.String()[n:] // the bytes up to n are never written again
}
