package httpserve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/shardapi/wire"
)

// decoded is what Decode did with one request: its return, the reply it wrote and the value.
type decoded struct {
	ok     bool
	code   int
	header http.Header
	body   string
	value  any
}

// decodeRequest runs Decode (c nil) or c.Decode on a request with body, read through rd (nil:
// body as it is) and with Content-Length size.
func decodeRequest(c *Codec, body []byte, rd io.Reader, size int64, release bool) decoded {
	if rd == nil {
		rd = bytes.NewReader(body)
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/complete", rd)
	req.ContentLength = size
	rec := httptest.NewRecorder()
	var v any = &shardapi.CompleteRequest{}
	if release {
		v = &shardapi.ReleaseRequest{}
	}
	decode := Decode
	if c != nil {
		decode = c.Decode
	}
	ok := decode(rec, req, v)
	return decoded{ok: ok, code: rec.Code, header: rec.Header(), body: rec.Body.String(), value: v}
}

// sameAsStreaming decodes body through the fast path (its Content-Length known, read chunk bytes
// at a time), once with c's buffers and once without, and through the streaming decoding (no
// Content-Length), and fails the test unless all did the same. It returns what the fast path did
// with c's buffers.
func sameAsStreaming(t *testing.T, c *Codec, body []byte, chunk int, release bool) decoded {
	t.Helper()
	fast := decodeRequest(c, body, &chunked{b: body, n: chunk}, int64(len(body)), release)
	unpooled := decodeRequest(nil, body, &chunked{b: body, n: chunk}, int64(len(body)), release)
	ref := decodeRequest(nil, body, nil, -1, release)
	if !reflect.DeepEqual(fast, ref) {
		t.Errorf("%.200q (release %v):\n fast      %.300v\n streaming %.300v", body, release, fast, ref)
	}
	if !reflect.DeepEqual(unpooled, ref) {
		t.Errorf("%.200q (release %v):\n fast without a Codec %.300v\n streaming            %.300v", body, release, unpooled, ref)
	}
	return fast
}

// chunked delivers a body n bytes per Read.
type chunked struct {
	b []byte
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), c.n)], c.b)
	c.b = c.b[k:]
	return k, nil
}

// FuzzDecodeFast compares Decode's fast path with the streaming decoding on any body, read in
// pieces of any size, the fast path also with the buffers a Codec kept from the bodies before.
func FuzzDecodeFast(f *testing.F) {
	next := time.Date(2099, 12, 31, 23, 59, 59, 999_999_999, time.FixedZone("", -(11*3600+30*60)))
	for _, v := range []any{
		shardapi.CompleteRequest{Items: []shardapi.Completion{{Key: "https://x.example/a?b=1&c=<2>", Lease: "0000000000000001"},
			{Key: "k\u2028\xff", Lease: "0000000000000002", NextDue: &next}}},
		shardapi.ReleaseRequest{Items: []shardapi.Lease{{Key: "a", Lease: "0000000000000001"}, {Key: "b", Lease: "x"}}},
		shardapi.CompleteRequest{}, shardapi.CompleteRequest{Items: []shardapi.Completion{}},
	} {
		b, _ := json.Marshal(v)
		f.Add(b, false, uint8(0))
		f.Add(b, true, uint8(7))
	}
	for _, s := range []string{
		`{"items":[{"key":"a","lease":"0000000000000001","extra":1}]}`, `{"items":[{"key":"a","lease":"0000000000000001"}],"n":1}`,
		`{"ITEMS":[]}`, `{"items":[],"items":[]}`, `{"items":{"key":"a"}}`, `["items"]`, `{"items":null}`, ``, `{"items":[null]}`,
		`{"items":[{"key":"a","nextDue":"2024-01-01T00:00:00Z","nextDue":null}]}`, `{"items":[{"key":"a","nextDue":"soon"}]}`,
		`{"items":[{"key":"\ud83d\ude00\ud800","lease":"\u0000"}]} `, `{"items":[]} {}`, `{"items":[]`, `{"items":[       ] }`,
	} {
		f.Add([]byte(s), false, uint8(3))
		f.Add([]byte(s), true, uint8(1))
	}
	var c Codec
	f.Fuzz(func(t *testing.T, body []byte, release bool, chunk uint8) {
		sameAsStreaming(t, &c, body, int(chunk)+1, release)
	})
}

// itemsBody returns {"items":[ with n items, each from item(i), and then tail.
func itemsBody(n int, item func(i int) string, tail string) []byte {
	var b bytes.Buffer
	b.WriteString(`{"items":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(item(i))
	}
	b.WriteString(tail)
	return b.Bytes()
}

func plainItem(i int) string {
	return fmt.Sprintf(`{"key":"https://x.example/%07d","lease":"%016x"}`, i, i+1)
}

// timeoutReader returns its bytes, then a timeout.
type timeoutReader struct{ b []byte }

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

func (r *timeoutReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, timeoutError{}
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// TestDecodeFastSameAsStreaming: the limits and errors of big or odd bodies are the same
// through the fast path as through the streaming decoding: the item limit (at the same item),
// bad items before it, a body cut short by a timeout, bodies longer or shorter than declared;
// also when one Codec's buffers are reused from body to body.
func TestDecodeFastSameAsStreaming(t *testing.T) {
	var c Codec
	max := shardapi.MaxClaim
	badAt := func(j int, bad string) func(int) string {
		return func(i int) string {
			if i == j {
				return bad
			}
			return plainItem(i)
		}
	}
	for _, tc := range []struct {
		name     string
		body     []byte
		wantCode int
	}{
		{"MaxClaim items", itemsBody(max, plainItem, `]}`), http.StatusOK},
		{"MaxClaim+1 items", itemsBody(max+1, plainItem, `]}`), http.StatusRequestEntityTooLarge},
		{"twice MaxClaim items", itemsBody(2*max, plainItem, `]}`), http.StatusRequestEntityTooLarge},
		{"MaxClaim items and a comma", itemsBody(max, plainItem, `,]}`), http.StatusRequestEntityTooLarge},
		{"MaxClaim items and garbage", itemsBody(max, plainItem, ` x`), http.StatusRequestEntityTooLarge},
		{"MaxClaim items and a brace", itemsBody(max, plainItem, ` }`), http.StatusBadRequest},
		{"MaxClaim items cut short", itemsBody(max, plainItem, ``), http.StatusBadRequest},
		{"an unknown field before the limit", itemsBody(max+1, badAt(5, `{"key":"a","bad":1}`), `]}`), http.StatusBadRequest},
		{"a bad nextDue before the limit", itemsBody(max+1, badAt(max-1, `{"key":"a","nextDue":"soon"}`), `]}`), http.StatusBadRequest},
		{"a null item before the limit", itemsBody(max+1, badAt(max-1, `null`), `]}`), http.StatusRequestEntityTooLarge},
		{"a bad item after the limit", itemsBody(max+1, badAt(max, `{"key":"a","bad":1}`), `]}`), http.StatusRequestEntityTooLarge},
		{"an upper-case name", append([]byte(`{"ITEMS"`), itemsBody(max+1, plainItem, `]}`)[len(`{"items"`):]...), http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, release := range []bool{false, true} {
				got := sameAsStreaming(t, &c, tc.body, 1500, release)
				if got.code != tc.wantCode {
					t.Errorf("release %v: %d %.200s, want %d", release, got.code, got.body, tc.wantCode)
				}
			}
		})
	}

	body := itemsBody(3, plainItem, `]}`)
	ref := decodeRequest(nil, body, nil, -1, false)
	for _, tc := range []struct {
		name string
		rd   io.Reader
		size int64
	}{
		{"declared longer", bytes.NewReader(body), int64(len(body)) + 10},
		{"declared shorter", bytes.NewReader(body), int64(len(body)) - 10},
		{"declared empty", bytes.NewReader(body), 0},
	} {
		fast := decodeRequest(&c, body, tc.rd, tc.size, false)
		if !reflect.DeepEqual(fast, ref) {
			t.Errorf("%s: fast %+v, streaming %+v", tc.name, fast, ref)
		}
	}
	for _, cut := range []int{0, 5, len(body) - 1} {
		fast := decodeRequest(&c, body, &timeoutReader{b: body[:cut]}, int64(len(body)), false)
		ref := decodeRequest(nil, body, &timeoutReader{b: body[:cut]}, -1, false)
		if !reflect.DeepEqual(fast, ref) || fast.code != http.StatusRequestTimeout {
			t.Errorf("timeout after %d bytes: fast %+v, streaming %+v", cut, fast, ref)
		}
	}
}

// TestDecodeFastTakesPlainBodies: the bodies workers send (json.Marshal of the requests) take
// the fast path, read in any pieces, and a body with too many items is refused before the end of
// it is read.
func TestDecodeFastTakesPlainBodies(t *testing.T) {
	next := time.Date(2024, 1, 1, 0, 0, 0, 500, time.UTC)
	req := shardapi.CompleteRequest{Items: []shardapi.Completion{{Key: "a&b", Lease: "0000000000000001"}, {Key: "c", Lease: "0000000000000002", NextDue: &next}}}
	body, _ := json.Marshal(req)
	for _, n := range []int{1, 7, len(body)} {
		var got shardapi.CompleteRequest
		bp := new([]byte)
		scan := wire.NewCompleteScan(shardapi.MaxClaim)
		done, ok, _ := decodeFast(httptest.NewRecorder(), &chunked{b: body, n: n}, int64(len(body)), bp, &scan, &got)
		if !done || !ok || !reflect.DeepEqual(got, req) {
			t.Errorf("read %d bytes at a time: done %v ok %v %+v", n, done, ok, got)
		}
	}

	body = itemsBody(3*shardapi.MaxClaim, plainItem, `]}`)
	rd := &chunked{b: body, n: 4096}
	rec := httptest.NewRecorder()
	scan := wire.NewCompleteScan(shardapi.MaxClaim)
	done, _, _ := decodeFast(rec, rd, int64(len(body)), new([]byte), &scan, &shardapi.CompleteRequest{})
	limitAt := len(itemsBody(shardapi.MaxClaim, plainItem, ``))
	if !done || rec.Code != http.StatusRequestEntityTooLarge || len(body)-len(rd.b) > limitAt+4096 {
		t.Errorf("too many items: done %v, %d %s after %d bytes (the limit's item starts at %d)", done, rec.Code, rec.Body, len(body)-len(rd.b), limitAt)
	}
}

// TestWriteJSONSameAsEncoder: the hot replies are written byte for byte as json.Encoder writes
// them, and fail as it fails, by WriteJSON and by a Codec reusing its buffers from reply to reply.
func TestWriteJSONSameAsEncoder(t *testing.T) {
	var c Codec
	tm := time.Date(2024, 2, 29, 23, 59, 59, 120000000, time.FixedZone("", 5*3600+30*60))
	row := shardapi.ClaimedRow{Key: "a<b>&c\u2028\xff", Due: tm, Cadence: 1e-7, Route: "r", Source: "s", Urgent: true,
		Lease: "0000000000000001", LeaseExpires: tm}
	bad := row
	bad.Cadence = math.NaN()
	late := row
	late.LeaseExpires = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	results := []shardapi.ItemResult{{Key: "a"}, {Key: "b", Error: "lease <expired> & gone"}}
	for _, v := range []any{
		shardapi.ClaimResponse{Items: []shardapi.ClaimedRow{row, row}}, &shardapi.ClaimResponse{}, shardapi.ClaimResponse{Items: []shardapi.ClaimedRow{}},
		shardapi.ClaimResponse{Items: []shardapi.ClaimedRow{row, bad}}, shardapi.ClaimResponse{Items: []shardapi.ClaimedRow{late}},
		shardapi.CompleteResponse{Completed: 1, Results: results}, &shardapi.CompleteResponse{}, (*shardapi.CompleteResponse)(nil),
		shardapi.ReleaseResponse{Released: -1, Results: results}, (*shardapi.ReleaseResponse)(nil), (*shardapi.ClaimResponse)(nil),
		shardapi.Error{Error: "<x>"}, map[string]string{"status": "ok"},
	} {
		var want bytes.Buffer
		err := json.NewEncoder(&want).Encode(v)
		for _, write := range []struct {
			name string
			f    func(http.ResponseWriter, int, any)
		}{{"WriteJSON", WriteJSON}, {"Codec.WriteJSON", c.WriteJSON}} {
			fast := httptest.NewRecorder()
			write.f(fast, http.StatusOK, v)
			switch {
			case err != nil && fast.Code != http.StatusInternalServerError:
				t.Errorf("%T: encoding/json fails (%v), %s wrote %d %s", v, err, write.name, fast.Code, fast.Body)
			case err == nil && (fast.Code != http.StatusOK || fast.Body.String() != want.String()):
				t.Errorf("%T: %s wrote %d\n%s\nencoding/json\n%s", v, write.name, fast.Code, fast.Body, want.String())
			case err == nil && fast.Header().Get("Content-Type") != "application/json":
				t.Errorf("%T: %s: Content-Type %q", v, write.name, fast.Header().Get("Content-Type"))
			}
		}
	}
}

// TestFormatLease: a lease token's wire form is fmt's %016x, and ParseLease reads it back.
func TestFormatLease(t *testing.T) {
	for _, tok := range []uint64{0, 1, 0xf, 0x10, 0xdeadbeef, 1 << 63, math.MaxUint64, 0x0123456789abcdef} {
		s := FormatLease(tok)
		if want := fmt.Sprintf("%016x", tok); s != want {
			t.Errorf("%d: %q, want %q", tok, s, want)
		}
		if back, err := ParseLease(s); err != nil || back != tok {
			t.Errorf("ParseLease(%q) = %d, %v", s, back, err)
		}
	}
}

// BenchmarkDecodeComplete runs a Codec's Decode (as the keeper's handler does) on a 500-row
// complete request (64-byte keys, as the end-to-end bench's workers send): without a
// Content-Length it takes the streaming decoding (encoding/json item by item, what every request
// took before), with one the fast path, in the Codec's reused buffer.
func BenchmarkDecodeComplete(b *testing.B) {
	const rows = 500
	req := shardapi.CompleteRequest{Items: make([]shardapi.Completion, rows)}
	for i := range req.Items {
		req.Items[i] = shardapi.Completion{Key: fmt.Sprintf("https://shop.example.com/product/%031d", i), Lease: FormatLease(uint64(1<<40 + i))}
	}
	body, _ := json.Marshal(req)
	for _, path := range []struct {
		name string
		size int64
	}{{"streaming", -1}, {"fast", int64(len(body))}} {
		b.Run(path.name, func(b *testing.B) {
			b.ReportAllocs()
			rd := bytes.NewReader(body)
			var c Codec
			for b.Loop() {
				rd.Reset(body)
				r := httptest.NewRequest(http.MethodPost, "/v1/complete", rd)
				r.ContentLength = path.size
				var got shardapi.CompleteRequest
				if !c.Decode(httptest.NewRecorder(), r, &got) || len(got.Items) != rows {
					b.Fatal("not decoded")
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*rows), "ns/row")
		})
	}
}
