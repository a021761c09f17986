package wire

import (
	"encoding/json"
	"time"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// Marshal is json.Marshal, by the fast encoders for the complete and release requests (values or
// non-nil pointers) and by json.Marshal for other values and where a fast encoder fails.
func Marshal(v any) ([]byte, error) {
	switch v := v.(type) {
	case shardapi.CompleteRequest:
		if b, err := AppendCompleteRequest(make([]byte, 0, completeSize(v.Items)), &v); err == nil {
			return b, nil
		}
	case *shardapi.CompleteRequest:
		if v != nil {
			if b, err := AppendCompleteRequest(make([]byte, 0, completeSize(v.Items)), v); err == nil {
				return b, nil
			}
		}
	case shardapi.ReleaseRequest:
		return AppendReleaseRequest(make([]byte, 0, releaseSize(v.Items)), &v), nil
	case *shardapi.ReleaseRequest:
		if v != nil {
			return AppendReleaseRequest(make([]byte, 0, releaseSize(v.Items)), v), nil
		}
	}
	return json.Marshal(v)
}

// completeSize is the length of a complete request's encoding when no string needs escaping.
func completeSize(items []shardapi.Completion) int {
	n := len(`{"items":[]}`)
	for i := range items {
		n += len(`{"key":"","lease":""},`) + len(items[i].Key) + len(items[i].Lease)
		if items[i].NextDue != nil {
			n += len(`,"nextDue":""`) + len(time.RFC3339Nano)
		}
	}
	return n
}

// releaseSize is the length of a release request's encoding when no string needs escaping.
func releaseSize(items []shardapi.Lease) int {
	n := len(`{"items":[]}`)
	for i := range items {
		n += len(`{"key":"","lease":""},`) + len(items[i].Key) + len(items[i].Lease)
	}
	return n
}

// Unmarshal is json.Unmarshal, by the fast decoders for a claim, complete or release reply into
// its zero value, and by json.Unmarshal for other values and for data the fast decoders decline.
func Unmarshal(data []byte, v any) error {
	var ok bool
	switch v := v.(type) {
	case *shardapi.ClaimResponse:
		ok = v != nil && v.Items == nil && DecodeClaimResponse(data, v)
	case *shardapi.CompleteResponse:
		ok = v != nil && v.Completed == 0 && v.Results == nil && DecodeCompleteResponse(data, v)
	case *shardapi.ReleaseResponse:
		ok = v != nil && v.Released == 0 && v.Results == nil && DecodeReleaseResponse(data, v)
	}
	if ok {
		return nil
	}
	return json.Unmarshal(data, v)
}
