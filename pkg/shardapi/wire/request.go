package wire

import (
	"math"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// Status is what a RequestScan found.
type Status uint8

const (
	// Declined: the body is outside the fast grammar; decode it with encoding/json.
	Declined Status = iota
	// NeedMore: what arrived so far is in the fast grammar; scan again with more of the body.
	NeedMore
	// Valid: the whole body is in the fast grammar with at most the limit of items: decode it
	// with the scan's DecodeComplete or DecodeRelease.
	Valid
	// TooManyItems: the body is {"items":[ followed by the limit of valid items and a comma.
	TooManyItems
)

// scan phases: what the next Scan expects at RequestScan.pos
const (
	beforeItems = iota // the object's start and the items member's name
	inItems            // the first item, or a comma and the next item, or the array's end
	afterItems         // the object's closing brace
	afterObject        // nothing but whitespace
)

// RequestScan checks the body of a complete or release request as it arrives, without decoding
// it: a keeper can read a body and refuse one with too many items before it has all of it, and
// check it whole before it allocates the items.
type RequestScan struct {
	nextDue bool // complete: an item may have a nextDue
	max     int
	phase   int
	pos     int // where the next Scan starts: after the last whole part checked
	n       int // items checked
	status  Status
}

// NewCompleteScan returns a scan of a shardapi.CompleteRequest with at most maxItems items.
func NewCompleteScan(maxItems int) RequestScan {
	return RequestScan{nextDue: true, max: maxItems, status: NeedMore}
}

// NewReleaseScan returns a scan of a shardapi.ReleaseRequest with at most maxItems items.
func NewReleaseScan(maxItems int) RequestScan {
	return RequestScan{max: maxItems, status: NeedMore}
}

// Scan checks data, the body so far: each call passes the bytes of the previous one and perhaps
// more, atEOF when they are the whole body. Once it returned Declined, Valid or TooManyItems it
// returns the same again.
func (s *RequestScan) Scan(data []byte, atEOF bool) Status {
	if s.status != NeedMore {
		return s.status
	}
	p := parser{data: data, pos: s.pos}
	st := s.scan(&p, atEOF)
	if st == Declined && p.short && !atEOF {
		st = NeedMore
	}
	s.status = st
	return st
}

func (s *RequestScan) scan(p *parser, atEOF bool) Status {
	if s.phase == beforeItems {
		var it members
		name, done, ok := p.member(&it)
		switch {
		case !ok:
			return Declined
		case done: // {}
			s.phase = afterObject
		case string(name) != "items":
			return Declined
		case p.null():
			s.phase = afterItems
		default:
			empty, ok := p.open('[', ']')
			if !ok {
				return Declined
			}
			s.phase = inItems
			if empty {
				s.phase = afterItems
			}
		}
		s.pos = p.pos
	}
	if s.phase == inItems {
		var c shardapi.Completion
		var l shardapi.Lease
		for s.phase == inItems {
			if s.n == 0 {
				// the array's start was checked, perhaps before its end arrived: [ ]
				p.ws()
				if p.byte(']') {
					s.phase = afterItems
					s.pos = p.pos
					break
				}
			} else {
				more, ok := p.more(']')
				if !ok {
					return Declined
				}
				if !more {
					s.phase = afterItems
					s.pos = p.pos
					break
				}
				if s.n == s.max {
					return TooManyItems
				}
			}
			if s.nextDue && !p.completion(&c) || !s.nextDue && !p.lease(&l) {
				return Declined
			}
			s.n++
			s.pos = p.pos
		}
	}
	if s.phase == afterItems {
		if more, ok := p.more('}'); !ok || more {
			return Declined
		}
		s.phase = afterObject
		s.pos = p.pos
	}
	if !p.end() {
		return Declined
	}
	if !atEOF {
		return NeedMore
	}
	return Valid
}

// DecodeComplete decodes the body a complete scan found Valid.
func (s *RequestScan) DecodeComplete(data []byte, out *shardapi.CompleteRequest) bool {
	if s.status != Valid || !s.nextDue {
		return false
	}
	var r shardapi.CompleteRequest
	var ok bool
	if r.Items, ok = decodeItems(data, s.n, (*parser).completion); !ok {
		return false
	}
	*out = r
	return true
}

// DecodeRelease decodes the body a release scan found Valid.
func (s *RequestScan) DecodeRelease(data []byte, out *shardapi.ReleaseRequest) bool {
	if s.status != Valid || s.nextDue {
		return false
	}
	var r shardapi.ReleaseRequest
	var ok bool
	if r.Items, ok = decodeItems(data, s.n, (*parser).lease); !ok {
		return false
	}
	*out = r
	return true
}

// decodeItems decodes {"items": [...]} (or null, or {}).
func decodeItems[T any](data []byte, n int, elem func(*parser, *T) bool) ([]T, bool) {
	p := parser{data: data, build: true}
	var items []T
	var it members
	for {
		name, done, ok := p.member(&it)
		if !ok {
			return nil, false
		}
		if done {
			return items, p.end()
		}
		if string(name) != "items" || !it.once(1) {
			return nil, false
		}
		if items, ok = list(&p, n, elem); !ok {
			return nil, false
		}
	}
}

// DecodeCompleteRequest decodes data into *out as a json.Decoder that disallows unknown fields
// would (one value, nothing but whitespace after it), whatever the number of items, when data is
// in the fast grammar, and reports whether it did; otherwise *out is left alone. *out is
// expected to be the zero value.
func DecodeCompleteRequest(data []byte, out *shardapi.CompleteRequest) bool {
	s := NewCompleteScan(math.MaxInt)
	return s.Scan(data, true) == Valid && s.DecodeComplete(data, out)
}

// DecodeReleaseRequest is DecodeCompleteRequest for a shardapi.ReleaseRequest.
func DecodeReleaseRequest(data []byte, out *shardapi.ReleaseRequest) bool {
	s := NewReleaseScan(math.MaxInt)
	return s.Scan(data, true) == Valid && s.DecodeRelease(data, out)
}

// completion consumes one item of a complete request.
func (p *parser) completion(c *shardapi.Completion) bool {
	*c = shardapi.Completion{}
	var it members
	for {
		name, done, ok := p.member(&it)
		if !ok || done {
			return ok
		}
		var bit uint
		switch string(name) {
		case "key":
			bit = 1 << 0
			c.Key, ok = p.strOrNull()
		case "lease":
			bit = 1 << 1
			c.Lease, ok = p.strOrNull()
		case "nextDue":
			bit = 1 << 2
			c.NextDue, ok = p.timePtr()
		default:
			return false
		}
		if !ok || !it.once(bit) {
			return false
		}
	}
}

// lease consumes one item of a release request.
func (p *parser) lease(l *shardapi.Lease) bool {
	*l = shardapi.Lease{}
	var it members
	for {
		name, done, ok := p.member(&it)
		if !ok || done {
			return ok
		}
		var bit uint
		switch string(name) {
		case "key":
			bit = 1 << 0
			l.Key, ok = p.strOrNull()
		case "lease":
			bit = 1 << 1
			l.Lease, ok = p.strOrNull()
		default:
			return false
		}
		if !ok || !it.once(bit) {
			return false
		}
	}
}
