package httpserve

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"sync"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/shardapi/wire"
)

// errNotFast says appendFast has no encoder for a value.
var errNotFast = errors.New("no fast encoder")

// appendFast appends json.Marshal(v) to b for the types package wire encodes.
func appendFast(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case shardapi.ClaimResponse:
		return wire.AppendClaimResponse(b, &v)
	case *shardapi.ClaimResponse:
		if v != nil {
			return wire.AppendClaimResponse(b, v)
		}
	case shardapi.CompleteResponse:
		return wire.AppendCompleteResponse(b, &v), nil
	case *shardapi.CompleteResponse:
		if v != nil {
			return wire.AppendCompleteResponse(b, v), nil
		}
	case shardapi.ReleaseResponse:
		return wire.AppendReleaseResponse(b, &v), nil
	case *shardapi.ReleaseResponse:
		if v != nil {
			return wire.AppendReleaseResponse(b, v), nil
		}
	}
	return b, errNotFast
}

// Codec decodes request bodies and writes JSON replies as Decode and WriteJSON do, and keeps the
// buffers of the hot ones (the complete and release request bodies, the claim, complete and
// release replies) for the next requests of its handler, up to maxPooledBuffer each; the package
// functions start each with an empty buffer. A handler makes one Codec and shares it among its
// requests. The zero value is ready to use; a Codec must not be copied after its first use.
type Codec struct {
	replies, bodies sync.Pool // of *[]byte
}

// WriteJSON is the package's WriteJSON with the Codec's reply buffers.
func (c *Codec) WriteJSON(w http.ResponseWriter, code int, v any) {
	writeJSON(w, code, v, &c.replies)
}

// Decode is the package's Decode with the Codec's body buffers.
func (c *Codec) Decode(w http.ResponseWriter, r *http.Request, v any) bool {
	return decode(w, r, v, &c.bodies)
}

// newPooledBuffer is the capacity of a buffer a Codec makes when it has none to reuse.
const newPooledBuffer = 64 << 10

// maxPooledBuffer is the largest buffer put back into a pool.
const maxPooledBuffer = 256 << 10

// getBuffer takes a buffer from p: a kept one, else a new one of newPooledBuffer bytes. A nil p
// (the package functions) gives an empty buffer, which grows as it is filled.
func getBuffer(p *sync.Pool) *[]byte {
	if p == nil {
		return new([]byte)
	}
	if bp, ok := p.Get().(*[]byte); ok {
		return bp
	}
	b := make([]byte, 0, newPooledBuffer)
	return &b
}

// putBuffer gives bp back to p (emptied) unless it grew past maxPooledBuffer or p is nil.
func putBuffer(p *sync.Pool, bp *[]byte) {
	if p != nil && cap(*bp) <= maxPooledBuffer {
		*bp = (*bp)[:0]
		p.Put(bp)
	}
}

// MaxFastBodyBytes is the largest Content-Length of a complete or release request that Decode
// reads whole to decode it without reflection: a full claim batch (shardapi.MaxClaim items) with
// keys of up to about 350 bytes. What such bodies hold in buffers is part of the body bytes
// Admission admits (Limits.MaxInFlightBytes); a body with too many items is refused as soon as the
// item after the last allowed one starts, as by the streaming decoding.
const MaxFastBodyBytes = 4 << 20

// decodeFast reads the body (of declared length size) into *bp, checking it with scan as it
// arrives, and decodes it into v (a *shardapi.CompleteRequest or *shardapi.ReleaseRequest) once
// the scan found it whole and valid. done says the request is answered: decoded (ok), or refused
// (413) because its items array is longer than shardapi.MaxClaim, which the streaming decoding
// refuses the same way at the same item. Otherwise read is what was read of the body (all of it,
// or up to where the scan declined it, or up to a read error, or one byte past the declared
// length), for encoding/json to decode ahead of the rest.
func decodeFast(w http.ResponseWriter, body io.Reader, size int64, bp *[]byte, scan *wire.RequestScan, v any) (done, ok bool, read []byte) {
	buf := (*bp)[:0]
	defer func() { *bp = buf }()
	limit := int(size) + 1 // a byte more than declared is a body longer than its Content-Length
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, min(max(cap(buf), 4<<10), limit-len(buf)))
		}
		n, err := body.Read(buf[len(buf):min(cap(buf), limit)])
		buf = buf[:len(buf)+n]
		eof := err == io.EOF
		if err != nil && !eof || len(buf) == limit {
			return false, false, buf
		}
		switch scan.Scan(buf, eof) {
		case wire.NeedMore:
			if eof {
				return false, false, buf
			}
		case wire.TooManyItems:
			WriteError(w, http.StatusRequestEntityTooLarge, errTooManyItems{}.Error())
			return true, false, nil
		case wire.Valid:
			switch v := v.(type) {
			case *shardapi.CompleteRequest:
				ok = scan.DecodeComplete(buf, v)
			case *shardapi.ReleaseRequest:
				ok = scan.DecodeRelease(buf, v)
			}
			return ok, ok, buf
		default:
			return false, false, buf
		}
	}
}
