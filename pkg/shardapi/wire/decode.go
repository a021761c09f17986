package wire

import (
	"bytes"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// DecodeClaimResponse decodes data into *out as json.Unmarshal would, when data is in the fast
// grammar (see the package doc), and reports whether it did; otherwise *out is left alone.
// *out is expected to be the zero value, as json.Unmarshal leaves absent fields as they are.
func DecodeClaimResponse(data []byte, out *shardapi.ClaimResponse) bool {
	p := parser{data: data, build: true}
	var r shardapi.ClaimResponse
	var it members
	for {
		name, done, ok := p.member(&it)
		if !ok {
			return false
		}
		if done {
			break
		}
		if string(name) != "items" || !it.once(1) {
			return false
		}
		if r.Items, ok = list(&p, rowsHint(data), (*parser).claimedRow); !ok {
			return false
		}
	}
	if !p.end() {
		return false
	}
	*out = r
	return true
}

// DecodeCompleteResponse is DecodeClaimResponse for a shardapi.CompleteResponse.
func DecodeCompleteResponse(data []byte, out *shardapi.CompleteResponse) bool {
	var r shardapi.CompleteResponse
	if !decodeResults(data, "completed", &r.Completed, &r.Results) {
		return false
	}
	*out = r
	return true
}

// DecodeReleaseResponse is DecodeClaimResponse for a shardapi.ReleaseResponse.
func DecodeReleaseResponse(data []byte, out *shardapi.ReleaseResponse) bool {
	var r shardapi.ReleaseResponse
	if !decodeResults(data, "released", &r.Released, &r.Results) {
		return false
	}
	*out = r
	return true
}

// decodeResults decodes {"<count>": n, "results": [...]}.
func decodeResults(data []byte, count string, n *int, results *[]shardapi.ItemResult) bool {
	p := parser{data: data, build: true}
	var it members
	for {
		name, done, ok := p.member(&it)
		if !ok {
			return false
		}
		if done {
			return p.end()
		}
		switch {
		case string(name) == count && it.once(1):
			*n, ok = p.int()
		case string(name) == "results" && it.once(2):
			*results, ok = list(&p, rowsHint(data), (*parser).itemResult)
		default:
			return false
		}
		if !ok {
			return false
		}
	}
}

// rowsHint is a guess of the elements of a reply's list, to size it: the objects that start
// with a key, as the keeper writes them.
func rowsHint(data []byte) int {
	return max(bytes.Count(data, []byte(`{"key":`)), 1)
}

// members walks an object's members with parser.member.
type members struct {
	started bool
	seen    uint
}

// once marks the member with bit as seen, and is false when it was seen before: a repeated
// member is declined (encoding/json would take its last value).
func (m *members) once(bit uint) bool {
	if m.seen&bit != 0 {
		return false
	}
	m.seen |= bit
	return true
}

// member consumes the object's opening brace (at the first call) or the comma after the
// previous member, and the next member's name and colon; done when the object ended instead.
func (p *parser) member(m *members) (name []byte, done, ok bool) {
	if !m.started {
		m.started = true
		p.ws()
		empty, ok := p.open('{', '}')
		if !ok || empty {
			return nil, empty, ok
		}
	} else {
		more, ok := p.more('}')
		if !ok || !more {
			return nil, ok, ok
		}
	}
	name, ok = p.name()
	return name, false, ok
}

// list consumes null (nil) or an array whose elements elem consumes ([] is an empty, non-nil
// slice, as encoding/json makes it).
func list[T any](p *parser, capacity int, elem func(*parser, *T) bool) ([]T, bool) {
	if p.null() {
		return nil, true
	}
	empty, ok := p.open('[', ']')
	if !ok {
		return nil, false
	}
	var out []T
	if p.build {
		out = make([]T, 0, capacity)
	}
	if empty {
		return out, true
	}
	var v T
	for {
		if !elem(p, &v) {
			return nil, false
		}
		if p.build {
			out = append(out, v)
		}
		more, ok := p.more(']')
		if !ok {
			return nil, false
		}
		if !more {
			return out, true
		}
	}
}

// claimedRow consumes one element of a claim reply's items.
func (p *parser) claimedRow(r *shardapi.ClaimedRow) bool {
	*r = shardapi.ClaimedRow{}
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
			r.Key, ok = p.strOrNull()
		case "due":
			bit = 1 << 1
			r.Due, ok = p.time(&p.due)
		case "cadence":
			bit = 1 << 2
			r.Cadence, ok = p.float()
		case "route":
			bit = 1 << 3
			r.Route, ok = p.strOrNullAs(&p.route)
		case "source":
			bit = 1 << 4
			r.Source, ok = p.strOrNullAs(&p.source)
		case "urgent":
			bit = 1 << 5
			r.Urgent, ok = p.bool()
		case "lease":
			bit = 1 << 6
			r.Lease, ok = p.strOrNull()
		case "leaseExpires":
			bit = 1 << 7
			r.LeaseExpires, ok = p.time(&p.expires)
		default:
			return false
		}
		if !ok || !it.once(bit) {
			return false
		}
	}
}

// itemResult consumes one element of a complete or release reply's results.
func (p *parser) itemResult(r *shardapi.ItemResult) bool {
	*r = shardapi.ItemResult{}
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
			r.Key, ok = p.strOrNull()
		case "error":
			bit = 1 << 1
			r.Error, ok = p.strOrNull()
		case "movedTo":
			bit = 1 << 2
			r.MovedTo, ok = p.strOrNull()
		default:
			return false
		}
		if !ok || !it.once(bit) {
			return false
		}
	}
}
