package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// TestMarshalIsJSONMarshal: Marshal gives json.Marshal's bytes and errors, for the requests it
// encodes itself (values and pointers, nil included) and for anything else.
func TestMarshalIsJSONMarshal(t *testing.T) {
	late := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	due := trickyTimes[3]
	for _, v := range []any{
		shardapi.CompleteRequest{Items: []shardapi.Completion{{Key: "a&b", Lease: "l", NextDue: &due}, {Key: "c"}}},
		&shardapi.CompleteRequest{Items: []shardapi.Completion{{Key: "\u2028", Lease: "l"}}},
		shardapi.CompleteRequest{Items: []shardapi.Completion{{Key: "a", NextDue: &late}}},
		(*shardapi.CompleteRequest)(nil), shardapi.CompleteRequest{},
		shardapi.ReleaseRequest{Items: []shardapi.Lease{{Key: "<", Lease: ">"}}}, &shardapi.ReleaseRequest{},
		(*shardapi.ReleaseRequest)(nil), shardapi.ClaimRequest{N: 500, LeaseSeconds: 300}, map[string]int{"n": 1},
	} {
		got, err := Marshal(v)
		want, werr := json.Marshal(v)
		if !bytes.Equal(got, want) || fmt.Sprint(err) != fmt.Sprint(werr) {
			t.Errorf("%T %+v: %s (%v), json.Marshal %s (%v)", v, v, got, err, want, werr)
		}
	}
}

// TestUnmarshalIsJSONUnmarshal: Unmarshal leaves json.Unmarshal's results and errors as they
// are, into zero values and into values already set (which json.Unmarshal merges into).
func TestUnmarshalIsJSONUnmarshal(t *testing.T) {
	for _, data := range []string{
		`{"items":[{"key":"k","cadence":1}]}`, `{"completed":1,"results":[{"key":"k"}]}`, `{"released":1}`, `{"results":[]}`, `{}`,
		`{"items":[{"key":"k","Cadence":1}]}`, `{"completed":1.5}`, `nonsense`, `{"items":[]} x`,
	} {
		for _, mk := range []func() any{
			func() any { return &shardapi.ClaimResponse{} },
			func() any { return &shardapi.ClaimResponse{Items: []shardapi.ClaimedRow{{Key: "old"}}} },
			func() any { return &shardapi.CompleteResponse{} },
			func() any { return &shardapi.CompleteResponse{Completed: 7} },
			func() any { return &shardapi.ReleaseResponse{} },
			func() any { return &shardapi.ReleaseResponse{Results: []shardapi.ItemResult{{Key: "old"}}} },
			func() any { return (*shardapi.ClaimResponse)(nil) },
			func() any { return &shardapi.Status{} },
		} {
			got, want := mk(), mk()
			err := Unmarshal([]byte(data), got)
			werr := json.Unmarshal([]byte(data), want)
			if !reflect.DeepEqual(got, want) || fmt.Sprint(err) != fmt.Sprint(werr) {
				t.Errorf("%s into %T: %+v (%v), json.Unmarshal %+v (%v)", data, got, got, err, want, werr)
			}
		}
	}
}
