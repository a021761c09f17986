package wire

import (
	"encoding/binary"
	"strconv"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// parser reads the fast grammar from data. Its methods return false when the input is outside
// it; short is then set when the parse ran into the end of data (more data could have matched).
type parser struct {
	data  []byte
	pos   int
	short bool
	// build is false while only checking the input (strings are not unquoted then).
	build bool
	// the last values of a claim reply's rows, which the next row often repeats
	due, expires  timeMemo
	route, source string
}

// timeMemo holds the last time a field decoded, and its JSON literal.
type timeMemo struct {
	raw []byte
	t   time.Time
}

// ws skips JSON whitespace.
func (p *parser) ws() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// next is the byte at pos; false at the end of data.
func (p *parser) next() (byte, bool) {
	if p.pos < len(p.data) {
		return p.data[p.pos], true
	}
	p.short = true
	return 0, false
}

// byte consumes c if it is next.
func (p *parser) byte(c byte) bool {
	if b, ok := p.next(); ok && b == c {
		p.pos++
		return true
	}
	return false
}

// literal consumes s if it comes next.
func (p *parser) literal(s string) bool {
	for i := range len(s) {
		if p.pos+i >= len(p.data) {
			p.short = true
			return false
		}
		if p.data[p.pos+i] != s[i] {
			return false
		}
	}
	p.pos += len(s)
	return true
}

// null consumes the literal null if it comes next.
func (p *parser) null() bool {
	if b, ok := p.next(); ok && b == 'n' {
		return p.literal("null")
	}
	return false
}

// rawString consumes a JSON string and returns its bytes between the quotes, and whether it
// needs unquoting (it has escapes or bytes that are not valid UTF-8). It checks what
// encoding/json's scanner checks: no control characters, only the escapes \" \\ \/ \b \f \n \r
// \t and \u with four hex digits.
func (p *parser) rawString() (raw []byte, plain, ok bool) {
	if !p.byte('"') {
		return nil, false, false
	}
	d := p.data
	start := p.pos
	plain, ascii := true, true
	for i := start; i < len(d); i++ {
		i = plainRun(d, i)
		if i >= len(d) {
			break
		}
		switch c := d[i]; {
		case c == '"':
			p.pos = i + 1
			raw = d[start:i]
			if !ascii && plain && !utf8.Valid(raw) {
				plain = false
			}
			return raw, plain, true
		case c == '\\':
			plain = false
			i++
			if i >= len(d) {
				p.short = true
				return nil, false, false
			}
			switch d[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				for range 4 {
					i++
					if i >= len(d) {
						p.short = true
						return nil, false, false
					}
					if !isHex(d[i]) {
						return nil, false, false
					}
				}
			default:
				return nil, false, false
			}
		case c < ' ':
			return nil, false, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	p.short = true
	return nil, false, false
}

// Masks of plainRun: a byte of 0x01, and the top bit of each byte, in a word of eight bytes.
const (
	ones = 0x0101010101010101
	tops = 0x8080808080808080
)

// plainRun returns the index of the first byte from i on that may end a run of plain string
// bytes (a quote, a backslash, a control character or a byte of a multi-byte UTF-8 sequence),
// or where fewer than eight bytes are left: it looks at eight bytes at a time.
func plainRun(d []byte, i int) int {
	for ; i+8 <= len(d); i += 8 {
		x := binary.LittleEndian.Uint64(d[i:])
		q := x ^ ones*'"'
		bs := x ^ ones*'\\'
		// a byte that is zero in q or bs, or below 0x20 in x, or has its top bit set in x
		if ((q-ones)&^q|(bs-ones)&^bs|(x-ones*0x20)&^x|x)&tops != 0 {
			return i
		}
	}
	return i
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

// str consumes a JSON string and returns its value as encoding/json decodes it ("" while not
// building).
func (p *parser) str() (string, bool) {
	raw, plain, ok := p.rawString()
	switch {
	case !ok:
		return "", false
	case !p.build:
		return "", true
	case plain:
		return string(raw), true
	}
	return string(unquote(raw)), true
}

// strOrNull consumes a string, or null, which leaves a string field as it is (""), as
// encoding/json does.
func (p *parser) strOrNull() (string, bool) {
	if p.null() {
		return "", true
	}
	return p.str()
}

// strOrNullAs is strOrNull, returning *last (and keeping the string as the next *last) when the
// value is the same: rows share one string instead of allocating their own.
func (p *parser) strOrNullAs(last *string) (string, bool) {
	if p.null() {
		return "", true
	}
	raw, plain, ok := p.rawString()
	switch {
	case !ok:
		return "", false
	case !p.build:
		return "", true
	case plain && string(raw) == *last:
		return *last, true
	case plain:
		*last = string(raw)
		return *last, true
	}
	return string(unquote(raw)), true
}

// name consumes an object member's name and the colon after it, and returns the name's raw
// bytes. Names with escapes are not matched (encoding/json would unescape them first): a member
// spelled that way is declined.
func (p *parser) name() ([]byte, bool) {
	if !p.byte('"') {
		return nil, false
	}
	// names are short, and those the decoders know are plain ASCII: a name with an escape, a
	// control character or another byte is declined (as unknown, or as bad JSON)
	d, start, end := p.data, p.pos, -1
	for i := start; i < len(d); i++ {
		c := d[i]
		if c == '"' {
			end = i
			break
		}
		if c == '\\' || c < ' ' || c >= utf8.RuneSelf {
			return nil, false
		}
	}
	if end < 0 {
		p.short = true
		return nil, false
	}
	raw := d[start:end]
	p.pos = end + 1
	p.ws()
	if !p.byte(':') {
		return nil, false
	}
	p.ws()
	return raw, true
}

// more consumes what follows an object member or array element: a comma (true) or the closing
// byte (false, done). ok is false for anything else.
func (p *parser) more(closing byte) (more, ok bool) {
	p.ws()
	c, ok := p.next()
	switch {
	case !ok:
		return false, false
	case c == ',':
		p.pos++
		p.ws()
		return true, true
	case c == closing:
		p.pos++
		return false, true
	}
	return false, false
}

// open consumes an opening brace or bracket and reports whether the object or array is empty
// (then its closing byte is consumed too).
func (p *parser) open(opening, closing byte) (empty, ok bool) {
	if !p.byte(opening) {
		return false, false
	}
	p.ws()
	if c, ok := p.next(); ok && c == closing {
		p.pos++
		return true, true
	}
	return false, true
}

// end checks that only whitespace is left.
func (p *parser) end() bool {
	p.ws()
	return p.pos == len(p.data)
}

// time consumes a JSON string (or null) for a time.Time field: its raw literal goes to
// time.Time.UnmarshalJSON, as encoding/json passes it. null leaves the field as it is (zero).
// With a memo, a literal the same as the memo's last one takes its time.
func (p *parser) time(m *timeMemo) (time.Time, bool) {
	var t time.Time
	if p.null() {
		return t, true
	}
	start := p.pos
	if _, _, ok := p.rawString(); !ok {
		return t, false
	}
	raw := p.data[start:p.pos]
	if m != nil && m.raw != nil && string(raw) == string(m.raw) {
		return m.t, true
	}
	if err := t.UnmarshalJSON(raw); err != nil {
		return t, false
	}
	if m != nil {
		*m = timeMemo{raw: raw, t: t}
	}
	return t, true
}

// timePtr consumes a JSON string or null for a *time.Time field: null sets it to nil.
func (p *parser) timePtr() (*time.Time, bool) {
	if p.null() {
		return nil, true
	}
	t, ok := p.time(nil)
	if !ok {
		return nil, false
	}
	if !p.build {
		return nil, true
	}
	return &t, true
}

// number consumes a JSON number and returns its bytes.
func (p *parser) number() ([]byte, bool) {
	d, i := p.data, p.pos
	digits := func() bool {
		if i >= len(d) {
			p.short = true
			return false
		}
		if d[i] < '0' || d[i] > '9' {
			return false
		}
		for i < len(d) && '0' <= d[i] && d[i] <= '9' {
			i++
		}
		return true
	}
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i >= len(d):
		p.short = true
		return nil, false
	case d[i] == '0':
		i++
	case !digits():
		return nil, false
	}
	if i < len(d) && d[i] == '.' {
		i++
		if !digits() {
			return nil, false
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if !digits() {
			return nil, false
		}
	}
	raw := d[p.pos:i]
	p.pos = i
	return raw, true
}

// int consumes a number (or null: zero) for an int field, declining what encoding/json refuses
// (fractions, exponents, overflow).
func (p *parser) int() (int, bool) {
	if p.null() {
		return 0, true
	}
	raw, ok := p.number()
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || int64(int(n)) != n {
		return 0, false
	}
	return int(n), true
}

// float consumes a number (or null: zero) for a float64 field, declining what encoding/json
// refuses (out of range).
func (p *parser) float() (float64, bool) {
	if p.null() {
		return 0, true
	}
	raw, ok := p.number()
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil {
		return 0, false
	}
	return f, true
}

// bool consumes true, false or null (false) for a bool field.
func (p *parser) bool() (bool, bool) {
	c, ok := p.next()
	switch {
	case !ok:
		return false, false
	case c == 't':
		return true, p.literal("true")
	case c == 'f':
		return false, p.literal("false")
	}
	return false, p.null()
}

// unquote decodes the bytes between a JSON string's quotes (checked by rawString) as
// encoding/json does (its unquoteBytes): escapes replaced, a \u surrogate pair combined, a lone
// surrogate and each byte of invalid UTF-8 replaced by U+FFFD.
func unquote(s []byte) []byte {
	b := make([]byte, 0, len(s)+2*utf8.UTFMax)
	for r := 0; r < len(s); {
		switch c := s[r]; {
		case c == '\\':
			switch s[r+1] {
			case 'b':
				b = append(b, '\b')
			case 'f':
				b = append(b, '\f')
			case 'n':
				b = append(b, '\n')
			case 'r':
				b = append(b, '\r')
			case 't':
				b = append(b, '\t')
			case 'u':
				rr := getu4(s[r:])
				r += 6
				if utf16.IsSurrogate(rr) {
					rr1 := getu4(s[r:])
					if dec := utf16.DecodeRune(rr, rr1); dec != unicode.ReplacementChar {
						r += 6
						b = utf8.AppendRune(b, dec)
						continue
					}
					rr = unicode.ReplacementChar
				}
				b = utf8.AppendRune(b, rr)
				continue
			default: // " \ /
				b = append(b, s[r+1])
			}
			r += 2
		case c < utf8.RuneSelf:
			b = append(b, c)
			r++
		default:
			rr, size := utf8.DecodeRune(s[r:])
			r += size
			b = utf8.AppendRune(b, rr)
		}
	}
	return b
}

// getu4 decodes \uXXXX from the start of s, or returns -1.
func getu4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[2:6] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}
