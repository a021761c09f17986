package wire

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// AppendClaimResponse appends json.Marshal(r) to dst. On error (a time json.Marshal cannot
// encode, a NaN or infinite cadence) it returns dst unchanged.
func AppendClaimResponse(dst []byte, r *shardapi.ClaimResponse) ([]byte, error) {
	b := append(dst, `{"items":`...)
	if r.Items == nil {
		return append(b, `null}`...), nil
	}
	b = append(b, '[')
	var err error
	var due, expires lastTime // the rows of a claim share their lease's expiry, often their due time
	for i := range r.Items {
		it := &r.Items[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"key":`...)
		b = appendString(b, it.Key)
		b = append(b, `,"due":`...)
		if b, err = due.append(b, it.Due); err != nil {
			return dst, fmt.Errorf("item %d: due: %w", i, err)
		}
		b = append(b, `,"cadence":`...)
		if b, err = appendFloat(b, it.Cadence); err != nil {
			return dst, fmt.Errorf("item %d: cadence: %w", i, err)
		}
		b = append(b, `,"route":`...)
		b = appendString(b, it.Route)
		b = append(b, `,"source":`...)
		b = appendString(b, it.Source)
		b = append(b, `,"urgent":`...)
		b = strconv.AppendBool(b, it.Urgent)
		b = append(b, `,"lease":`...)
		b = appendString(b, it.Lease)
		b = append(b, `,"leaseExpires":`...)
		if b, err = expires.append(b, it.LeaseExpires); err != nil {
			return dst, fmt.Errorf("item %d: leaseExpires: %w", i, err)
		}
		b = append(b, '}')
	}
	return append(b, "]}"...), nil
}

// AppendCompleteResponse appends json.Marshal(r) to dst.
func AppendCompleteResponse(dst []byte, r *shardapi.CompleteResponse) []byte {
	b := append(dst, `{"completed":`...)
	b = strconv.AppendInt(b, int64(r.Completed), 10)
	return appendResults(b, r.Results)
}

// AppendReleaseResponse appends json.Marshal(r) to dst.
func AppendReleaseResponse(dst []byte, r *shardapi.ReleaseResponse) []byte {
	b := append(dst, `{"released":`...)
	b = strconv.AppendInt(b, int64(r.Released), 10)
	return appendResults(b, r.Results)
}

// appendResults appends `,"results":[...]}`.
func appendResults(b []byte, results []shardapi.ItemResult) []byte {
	b = append(b, `,"results":`...)
	if results == nil {
		return append(b, "null}"...)
	}
	b = append(b, '[')
	for i := range results {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"key":`...)
		b = appendString(b, results[i].Key)
		if results[i].Error != "" {
			b = append(b, `,"error":`...)
			b = appendString(b, results[i].Error)
		}
		if results[i].MovedTo != "" {
			b = append(b, `,"movedTo":`...)
			b = appendString(b, results[i].MovedTo)
		}
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// AppendCompleteRequest appends json.Marshal(r) to dst. On error (a nextDue json.Marshal cannot
// encode) it returns dst unchanged.
func AppendCompleteRequest(dst []byte, r *shardapi.CompleteRequest) ([]byte, error) {
	b := append(dst, `{"items":`...)
	if r.Items == nil {
		return append(b, "null}"...), nil
	}
	b = append(b, '[')
	var err error
	for i := range r.Items {
		it := &r.Items[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"key":`...)
		b = appendString(b, it.Key)
		b = append(b, `,"lease":`...)
		b = appendString(b, it.Lease)
		if it.NextDue != nil {
			b = append(b, `,"nextDue":`...)
			if b, err = appendTime(b, *it.NextDue); err != nil {
				return dst, fmt.Errorf("item %d: nextDue: %w", i, err)
			}
		}
		b = append(b, '}')
	}
	return append(b, "]}"...), nil
}

// AppendReleaseRequest appends json.Marshal(r) to dst.
func AppendReleaseRequest(dst []byte, r *shardapi.ReleaseRequest) []byte {
	b := append(dst, `{"items":`...)
	if r.Items == nil {
		return append(b, "null}"...)
	}
	b = append(b, '[')
	for i := range r.Items {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"key":`...)
		b = appendString(b, r.Items[i].Key)
		b = append(b, `,"lease":`...)
		b = appendString(b, r.Items[i].Lease)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// appendTime appends t as time.Time.MarshalJSON writes it (the same strict RFC 3339 formatting,
// which never needs escaping), and fails where it fails.
func appendTime(b []byte, t time.Time) ([]byte, error) {
	out, err := t.AppendText(append(b, '"'))
	if err != nil {
		return b, err
	}
	return append(out, '"'), nil
}

// lastTime remembers the last time it appended and where, to copy it when the same time comes
// again (the same instant in the same location: the same text).
type lastTime struct {
	t          time.Time
	start, end int
	set        bool
}

func (l *lastTime) append(b []byte, t time.Time) ([]byte, error) {
	if l.set && t.Equal(l.t) && t.Location() == l.t.Location() {
		return append(b, b[l.start:l.end]...), nil
	}
	start := len(b)
	b, err := appendTime(b, t)
	if err == nil {
		*l = lastTime{t: t, start: start, end: len(b), set: true}
	}
	return b, err
}

// errUnsupportedFloat is json.Marshal's refusal of NaN and infinities.
var errUnsupportedFloat = errors.New("unsupported value: NaN or an infinity")

// appendFloat appends f as encoding/json encodes a float64 (ES6 number formatting).
func appendFloat(b []byte, f float64) ([]byte, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return b, errUnsupportedFloat
	}
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// clean up e-09 to e-9
		n := len(b)
		if n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, nil
}

const hexDigits = "0123456789abcdef"

// safeRun returns the index of the first byte from i on that appendString may have to escape (a
// quote, a backslash, <, >, &, a control character or a byte of a multi-byte UTF-8 sequence),
// or where fewer than eight bytes are left: it looks at eight bytes at a time.
func safeRun(s string, i int) int {
	for ; i+8 <= len(s); i += 8 {
		w := s[i : i+8]
		x := uint64(w[0]) | uint64(w[1])<<8 | uint64(w[2])<<16 | uint64(w[3])<<24 |
			uint64(w[4])<<32 | uint64(w[5])<<40 | uint64(w[6])<<48 | uint64(w[7])<<56
		q, bs := x^(ones*'"'), x^(ones*'\\')
		lt, gt, amp := x^(ones*'<'), x^(ones*'>'), x^(ones*'&')
		// a byte below 0x20, or equal to one of those, or 0x80 and above
		if ((x-ones*0x20)&^x|(q-ones)&^q|(bs-ones)&^bs|(lt-ones)&^lt|(gt-ones)&^gt|(amp-ones)&^amp|x)&tops != 0 {
			return i
		}
	}
	return i
}

// htmlSafe[c] is true for the ASCII bytes encoding/json writes as they are (with its default
// HTML escaping): not the control characters, ", \, <, > and &.
var htmlSafe = func() (set [utf8.RuneSelf]bool) {
	for c := ' '; c < utf8.RuneSelf; c++ {
		set[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return set
}()

// appendString appends s as a JSON string exactly as encoding/json writes it with HTML escaping
// (its appendString): control characters as \b, \f, \n, \r, \t or \u00XX, <, > and & as
// \u003c, \u003e and \u0026, U+2028 and U+2029 escaped, each byte of invalid UTF-8 as \ufffd.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if i = safeRun(s, i); i >= len(s) {
			break
		}
		if c := s[i]; c < utf8.RuneSelf {
			if htmlSafe[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '\\', '"':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
