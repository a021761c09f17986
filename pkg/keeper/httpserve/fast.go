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

// Pooled buffers of replies and request bodies; larger ones are left to the garbage collector.
var (
	replyBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}
	bodyBuffers  = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}
)

// maxPooledBuffer is the largest buffer put back into a pool.
const maxPooledBuffer = 256 << 10

func putBuffer(p *sync.Pool, bp *[]byte) {
	if cap(*bp) <= maxPooledBuffer {
		*bp = (*bp)[:0]
		p.Put(bp)
	}
}

// MaxFastBodyBytes is the largest Content-Length of a complete or release request that Decode
// reads whole to decode it without reflection: a full claim batch (shardapi.MaxClaim items) with
// keys of up to about 350 bytes. What such bodies hold in buffers is part of the body bytes
// InFlight admits (Limits.MaxInFlightBytes); a body with too many items is refused as soon as the
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
