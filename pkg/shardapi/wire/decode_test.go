package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// unmarshalled compares a fast decoder with json.Unmarshal into the zero value: what the fast
// decoder accepts json.Unmarshal must accept with the same result, and what it declines it must
// leave alone. It returns whether the fast decoder decoded data.
func unmarshalled[T any](t *testing.T, what string, data []byte, fast func([]byte, *T) bool) bool {
	t.Helper()
	var got, want, zero T
	ok := fast(data, &got)
	err := json.Unmarshal(data, &want)
	switch {
	case !ok && !reflect.DeepEqual(got, zero):
		t.Errorf("%s %q: declined, but changed the value to %+v", what, data, got)
	case ok && err != nil:
		t.Errorf("%s %q: decoded %+v, json.Unmarshal refuses it: %v", what, data, got, err)
	case ok && !reflect.DeepEqual(got, want):
		t.Errorf("%s %q:\n fast %+v\n json %+v", what, data, got, want)
	}
	return ok
}

// strictly decodes data as the keeper's streaming decoding does when the items are few: one
// value, unknown fields refused, nothing but whitespace after it.
func strictly(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more than one value")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("trailing data: %v", err)
	}
	return nil
}

// decodedStrictly is unmarshalled for the request decoders, against strictly.
func decodedStrictly[T any](t *testing.T, what string, data []byte, fast func([]byte, *T) bool) bool {
	t.Helper()
	var got, want, zero T
	ok := fast(data, &got)
	err := strictly(data, &want)
	switch {
	case !ok && !reflect.DeepEqual(got, zero):
		t.Errorf("%s %q: declined, but changed the value to %+v", what, data, got)
	case ok && err != nil:
		t.Errorf("%s %q: decoded %+v, encoding/json refuses it: %v", what, data, got, err)
	case ok && !reflect.DeepEqual(got, want):
		t.Errorf("%s %q:\n fast %+v\n json %+v", what, data, got, want)
	}
	return ok
}

// checkDecoders runs every fast decoder on data against encoding/json, and checks that scanning
// data in pieces finds what scanning it whole finds. It returns which decoded it, by name.
func checkDecoders(t *testing.T, data []byte) map[string]bool {
	t.Helper()
	got := map[string]bool{
		"claim reply":      unmarshalled(t, "claim reply", data, DecodeClaimResponse),
		"complete reply":   unmarshalled(t, "complete reply", data, DecodeCompleteResponse),
		"release reply":    unmarshalled(t, "release reply", data, DecodeReleaseResponse),
		"complete request": decodedStrictly(t, "complete request", data, DecodeCompleteRequest),
		"release request":  decodedStrictly(t, "release request", data, DecodeReleaseRequest),
	}
	for _, max := range []int{0, 1, 2, math.MaxInt} {
		for _, newScan := range []func(int) RequestScan{NewCompleteScan, NewReleaseScan} {
			whole := newScan(max)
			want := whole.Scan(data, true)
			for _, cuts := range [][]int{{len(data) / 2}, {1, len(data) / 3, len(data) - 1}, {len(data) - 1}} {
				s := newScan(max)
				st := NeedMore
				for _, c := range cuts {
					if c >= 0 && c <= len(data) && st == NeedMore {
						st = s.Scan(data[:c], false)
					}
				}
				if st == NeedMore {
					st = s.Scan(data, true)
				}
				if st != want {
					t.Errorf("scan (max %d) of %q cut at %v: %v, whole %v", max, data, cuts, st, want)
				}
			}
			// the limit: a body with more items than max is refused, with at most max accepted
			if unlimited := newScan(math.MaxInt); unlimited.Scan(data, true) == Valid && want != Valid {
				if want != TooManyItems || unlimited.n <= max {
					t.Errorf("scan (max %d) of %q: %v, without a limit Valid with %d items", max, data, want, unlimited.n)
				}
			}
		}
	}
	return got
}

// TestDecodeTricky: tricky bodies decode as encoding/json decodes them or are declined, as
// each case expects.
func TestDecodeTricky(t *testing.T) {
	item := func(fields string) string { return `{"items":[{"key":"k","lease":"0000000000000001"` + fields + `}]}` }
	claim := func(fields string) string {
		return `{"items":[{"key":"k","due":"2024-01-01T00:00:00Z","cadence":3600,"route":"r","source":"s","urgent":false,` +
			`"lease":"0000000000000001","leaseExpires":"2024-01-01T00:05:00Z"` + fields + `}]}`
	}
	for _, tc := range []struct {
		body string
		want string // the decoders that decode it, comma-separated
	}{
		// strings
		{`{"items":[{"key":"a\u0000b","lease":"\u003c\u003e\u0026"}]}`, "complete request,release request,claim reply"},
		{`{"items":[{"key":"<>&","lease":"\/\"\\\b\f\n\r\t"}]}`, "complete request,release request,claim reply"},
		{`{"items":[{"key":"\ud83d\ude00 \uD83D\uDE00","lease":"x"}]}`, "complete request,release request,claim reply"},
		{`{"items":[{"key":"\ud83d","lease":"\ude00"}]}`, "complete request,release request,claim reply"},
		{`{"items":[{"key":"\ud83d\u0041 \ud83dx \udc00\ud83d","lease":"x"}]}`, "complete request,release request,claim reply"},
		{"{\"items\":[{\"key\":\"\xff\xed\xa0\x80\xc3\",\"lease\":\"é\u2028\"}]}", "complete request,release request,claim reply"},
		{`{"items":[{"key":"a\'b","lease":"x"}]}`, ""},
		{`{"items":[{"key":"a\xb","lease":"x"}]}`, ""},
		{`{"items":[{"key":"\u00zz","lease":"x"}]}`, ""},
		{"{\"items\":[{\"key\":\"a\tb\",\"lease\":\"x\"}]}", ""},
		{"{\"items\":[{\"key\":\"a\x7fb\",\"lease\":\"x\"}]}", "complete request,release request,claim reply"},
		{`{"items":[{"key":"k","lease":null}]}`, "complete request,release request,claim reply"},
		{`{"items":[{"key":1,"lease":"x"}]}`, ""},
		{`{"items":[{"k\u0065y":"k","lease":"x"}]}`, ""},
		// shapes
		{`{"items":[]}`, "complete request,release request,claim reply"},
		{`{"items":null}`, "complete request,release request,claim reply"},
		{`{}`, "complete request,release request,claim reply,complete reply,release reply"},
		{`{"items":[{}]}`, "complete request,release request,claim reply"},
		{" \t\r\n{ \"items\" :\n[ { \"key\" : \"k\" ,\"lease\":\"l\" } , {\"key\":\"j\"}\t] }\r\n ", "complete request,release request,claim reply"},
		{`{"items":[null]}`, ""},
		{`{"items":[{"key":"k"}],}`, ""},
		{`{"items":[{"key":"k"},]}`, ""},
		{`{"items":[{"key":"k",}]}`, ""},
		{`{"items":[{"key":"k"}]}{}`, ""},
		{`{"items":[{"key":"k"}]} x`, ""},
		{`{"items":[{"key":"k"}]`, ""},
		{`{"items":[{"key":"k","key":"j"}]}`, ""},
		{`{"items":[],"items":[]}`, ""},
		{`{"ITEMS":[{"key":"k"}]}`, ""},
		{`{"items":[{"Key":"k"}]}`, ""},
		{`{"items":[{"key":"k","extra":1}]}`, ""},
		{`{"items":{"key":"k"}}`, ""},
		{`["items"]`, ""},
		{``, ""},
		{` `, ""},
		{`null`, ""},
		{"\xef\xbb\xbf{}", ""},
		// nextDue
		{item(``), "complete request,release request,claim reply"},
		{item(`,"nextDue":null`), "complete request"},
		{item(`,"nextDue":"2024-01-01T00:00:00Z"`), "complete request"},
		{item(`,"nextDue":"2024-01-01T00:00:00.123456789Z"`), "complete request"},
		{item(`,"nextDue":"2024-01-01T00:00:00.1+05:30"`), "complete request"},
		{item(`,"nextDue":"2099-12-31T23:59:59.999999999-11:30"`), "complete request"},
		{item(`,"nextDue":"` + time.Date(2024, 6, 1, 12, 0, 0, 0, time.Local).Format(time.RFC3339Nano) + `"`), "complete request"},
		{item(`,"nextDue":"2024-01-01t00:00:00z"`), ""},
		{item(`,"nextDue":"2024-13-01T00:00:00Z"`), ""},
		{item(`,"nextDue":"2024-01-01T00:00:00"`), ""},
		{item(`,"nextDue":"2024-01-01T00:00:00+0530"`), ""},
		{item(`,"nextDue":"\u0032024-01-01T00:00:00Z"`), ""},
		{item(`,"nextDue":1704067200`), ""},
		{item(`,"nextDue":"2024-01-01T00:00:00Z","nextDue":null`), ""},
		// numbers, booleans and times of the replies
		{claim(``), "claim reply"},
		{strings.Replace(claim(``), "3600", "1e400", 1), ""},
		{strings.Replace(claim(``), "3600", "1e-400", 1), "claim reply"},
		{strings.Replace(claim(``), "3600", "-0.0E+2", 1), "claim reply"},
		{strings.Replace(claim(``), "3600", "01", 1), ""},
		{strings.Replace(claim(``), "3600", "1.", 1), ""},
		{strings.Replace(claim(``), "3600", ".5", 1), ""},
		{strings.Replace(claim(``), "3600", "+1", 1), ""},
		{strings.Replace(claim(``), "3600", "NaN", 1), ""},
		{strings.Replace(claim(``), "3600", "null", 1), "claim reply"},
		{strings.Replace(claim(``), "3600", `"3600"`, 1), ""},
		{strings.Replace(claim(``), "false", "true", 1), "claim reply"},
		{strings.Replace(claim(``), "false", "null", 1), "claim reply"},
		{strings.Replace(claim(``), "false", "0", 1), ""},
		{strings.Replace(claim(``), "false", "tru", 1), ""},
		{strings.Replace(claim(``), `"2024-01-01T00:00:00Z"`, "null", 1), "claim reply"},
		{strings.Replace(claim(``), `"2024-01-01T00:00:00Z"`, `"yesterday"`, 1), ""},
		{claim(`,"extra":1`), ""},
		{`{"completed":2,"results":[{"key":"a"},{"key":"b","error":"lease expired"}]}`, "complete reply"},
		{`{"released":2,"results":[{"key":"a","error":null},{"key":"b","error":"x"}]}`, "release reply"},
		{`{"completed":-0,"results":null}`, "complete reply"},
		{`{"completed":null,"results":[]}`, "complete reply"},
		{`{"completed":9223372036854775807,"results":[]}`, "complete reply"},
		{`{"completed":9223372036854775808,"results":[]}`, ""},
		{`{"completed":1.0,"results":[]}`, ""},
		{`{"completed":1e2,"results":[]}`, ""},
		{`{"completed":1,"completed":2}`, ""},
		{`{"completed":1,"results":[{"key":"a","error":"x","error":"y"}]}`, ""},
		{`{"results":[{"key":"a"}],"completed":1}`, "complete reply"},
	} {
		got := checkDecoders(t, []byte(tc.body))
		for name, ok := range got {
			if want := strings.Contains(","+tc.want+",", ","+name+","); ok != want {
				t.Errorf("%s %q: decoded %v, want %v", name, tc.body, ok, want)
			}
		}
	}
}

// TestRoundTrip: what the fast encoders write, the fast decoders decode (the common traffic
// takes the fast path both ways).
func TestRoundTrip(t *testing.T) {
	for i, s := range trickyStrings {
		tm := trickyTimes[i%7] // years 0-9999 and offsets json.Marshal takes
		claim := shardapi.ClaimResponse{Items: []shardapi.ClaimedRow{{Key: s, Due: tm, Cadence: float64(i) / 3, Route: s,
			Source: "file", Urgent: i%2 == 0, Lease: "0123456789abcdef", LeaseExpires: tm.Add(-time.Minute)}}}
		complete := shardapi.CompleteRequest{Items: []shardapi.Completion{{Key: s, Lease: s}, {Key: "k", Lease: "l", NextDue: &tm}}}
		release := shardapi.ReleaseRequest{Items: []shardapi.Lease{{Key: s, Lease: s}}}
		cres := shardapi.CompleteResponse{Completed: 1, Results: []shardapi.ItemResult{{Key: s}, {Key: "k", Error: s}, {Key: "m", Error: "moved", MovedTo: s}}}
		rres := shardapi.ReleaseResponse{Released: i, Results: []shardapi.ItemResult{{Key: s, Error: "lease expired"}}}
		b, err := AppendClaimResponse(nil, &claim)
		if err != nil || !checkDecoders(t, b)["claim reply"] {
			t.Errorf("claim reply %q (%v) not decoded", b, err)
		}
		b, err = AppendCompleteRequest(nil, &complete)
		if err != nil || !checkDecoders(t, b)["complete request"] {
			t.Errorf("complete request %q (%v) not decoded", b, err)
		}
		if b = AppendReleaseRequest(nil, &release); !checkDecoders(t, b)["release request"] {
			t.Errorf("release request %q not decoded", b)
		}
		if b = AppendCompleteResponse(nil, &cres); !checkDecoders(t, b)["complete reply"] {
			t.Errorf("complete reply %q not decoded", b)
		}
		if b = AppendReleaseResponse(nil, &rres); !checkDecoders(t, b)["release reply"] {
			t.Errorf("release reply %q not decoded", b)
		}
	}
}

// TestScanTooManyItems: a scan with a limit refuses the item after the last allowed one as soon
// as its comma arrives, and declines what is not in the grammar before it.
func TestScanTooManyItems(t *testing.T) {
	items := func(n int) string {
		return `{"items":[` + strings.TrimSuffix(strings.Repeat(`{"key":"k","lease":"l"},`, n), ",")
	}
	for _, tc := range []struct {
		body   string
		atEOF  bool
		want   Status
		wantOf string
	}{
		{items(3) + `]}`, true, Valid, ""},
		{items(3) + `]}`, false, NeedMore, ""},
		{items(3) + ` `, false, NeedMore, ""},
		{items(3) + `,`, false, TooManyItems, ""},
		{items(3) + ` ,`, false, TooManyItems, ""},
		{items(3) + `, garbage`, true, TooManyItems, ""},
		{items(3) + `}`, true, Declined, ""},
		{items(3) + `x`, false, Declined, ""},
		{items(2) + `,{"key":"k","bad":1},`, false, Declined, ""},
		{items(2) + `,{"key":"k","nextDue":"never"},`, false, Declined, ""},
		{items(2) + `,{"key":"k","lease":"l"`, false, NeedMore, ""},
		{items(2) + `,{"key":"k","lease":"l"`, true, Declined, ""},
	} {
		s := NewCompleteScan(3)
		if got := s.Scan([]byte(tc.body), tc.atEOF); got != tc.want {
			t.Errorf("%q (atEOF %v): %v, want %v", tc.body, tc.atEOF, got, tc.want)
		}
	}
}

// FuzzDecode compares the fast decoders with encoding/json on any input.
func FuzzDecode(f *testing.F) {
	for _, s := range trickyStrings {
		claim := shardapi.ClaimResponse{Items: []shardapi.ClaimedRow{{Key: s, Due: trickyTimes[3], Cadence: 0.25, Route: s, Lease: s,
			LeaseExpires: trickyTimes[4]}}}
		b, _ := json.Marshal(claim)
		f.Add(b)
		b, _ = json.Marshal(shardapi.CompleteRequest{Items: []shardapi.Completion{{Key: s, Lease: s, NextDue: &trickyTimes[2]}}})
		f.Add(b)
		b, _ = json.Marshal(shardapi.CompleteResponse{Completed: 3, Results: []shardapi.ItemResult{{Key: s, Error: s}}})
		f.Add(b)
		b, _ = json.Marshal(shardapi.ReleaseResponse{Released: 3, Results: []shardapi.ItemResult{{Key: s}}})
		f.Add(b)
	}
	for _, s := range []string{
		`{"items":[{"key":"\ud83d\u0041","lease":"\u003c"}]}`, `{"items":[{"key":"k","lease":"l","nextDue":null}]}`,
		`{"items":[{"key":"k","lease":"l","nextDue":"2024-01-01T00:00:00.5+05:30"}]}`, `{"items":null}`, `{}`, ` { "items" : [ ] } `,
		`{"completed":-0,"results":[{"key":"a","error":null}]}`, `{"items":[{"cadence":1e-400,"urgent":null,"due":null}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecoders(t, data)
	})
}
