package keeper

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/httpserve"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// serveLimited serves the shard's handler with limits l on a loopback port, as the keeper
// command does, and returns its address.
func serveLimited(t *testing.T, sh *Shard, l httpserve.Limits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveLimitedOn(t, sh, l, ln)
}

// serveLimitedOn is serveLimited on the listener ln.
func serveLimitedOn(t *testing.T, sh *Shard, l httpserve.Limits, ln net.Listener) string {
	t.Helper()
	srv := httpserve.NewServer(sh.Handler(HandlerOptions{Token: "t", Limits: l}), l)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// rawRequest opens a connection and writes s to it.
func rawRequest(t *testing.T, addr, s string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatal(err)
	}
	return c
}

// readUntilClosed reads c until the server closes it and returns what it sent; it fails the
// test when the connection is still open after 20 s (the limits under test are far shorter).
func readUntilClosed(t *testing.T, c net.Conn) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	b, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server kept the connection open (%d bytes read so far: %.200q)", len(b), b)
	}
	return string(b)
}

// TestStalledBodyIsCutOff: a request whose body stops arriving is answered 408 and its
// connection closed after the read timeout, and it no longer counts as in flight.
func TestStalledBodyIsCutOff(t *testing.T) {
	e := newShardEnv(t, allSlots(time.Hour))
	addr := serveLimited(t, e.sh, httpserve.Limits{ReadTimeout: 300 * time.Millisecond, MaxInFlight: 1})
	c := rawRequest(t, addr, "POST /v1/complete HTTP/1.1\r\nHost: shard\r\nAuthorization: Bearer t\r\n"+
		"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"+`{"items":[{"key":"a",`)
	got := readUntilClosed(t, c)
	if !strings.HasPrefix(got, "HTTP/1.1 408 ") || !strings.Contains(got, "did not arrive in time") {
		t.Fatalf("reply to a stalled body: %q", got)
	}
	// the one in-flight slot is free again
	if code, _ := postJSON(t, "http://"+addr, "/v1/complete", `{"items":[{"key":"a","lease":"0000000000000001"}]}`); code != http.StatusOK {
		t.Fatalf("after the stalled request: %d", code)
	}
}

// TestBodyDeadline: a body that stops arriving is answered 408 and its connection closed once
// the body deadline (BodyTimeout) has passed, however long the read and idle timeouts are —
// small bodies (read before admission) and large ones (read by the decoder), and bodies that
// hold a whole JSON object but stop short of their Content-Length (before, 400 "trailing data"
// after the read timeout).
func TestBodyDeadline(t *testing.T) {
	e := newShardEnv(t, allSlots(time.Hour))
	addr := serveLimited(t, e.sh, httpserve.Limits{BodyTimeout: 300 * time.Millisecond, ReadTimeout: time.Hour, IdleTimeout: time.Hour})
	whole := `{"items":[{"key":"a","lease":"0000000000000001"}]}`
	for _, tc := range []struct {
		name, path string
		length     int
		sent       string
	}{
		{"small", "/v1/complete", 1000, `{"items":[{"key":"a",`},
		{"small whole object", "/v1/release", 1000, whole},
		{"claim", "/v1/claim", 100, `{"n":`},
		{"large", "/v1/complete", 1 << 20, `{"items":[{"key":"a",`},
		{"large whole object", "/v1/complete", 1 << 20, whole},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			c := rawRequest(t, addr, fmt.Sprintf("POST %s HTTP/1.1\r\nHost: shard\r\nAuthorization: Bearer t\r\n"+
				"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", tc.path, tc.length, tc.sent))
			got := readUntilClosed(t, c)
			if !strings.HasPrefix(got, "HTTP/1.1 408 ") || !strings.Contains(got, "did not arrive in time") {
				t.Fatalf("reply to a stalled body: %q", got)
			}
			t.Logf("408 after %v", time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestIdleConnectionIsClosed: a keep-alive connection with no next request is closed after the
// idle timeout.
func TestIdleConnectionIsClosed(t *testing.T) {
	e := newShardEnv(t, allSlots(time.Hour))
	addr := serveLimited(t, e.sh, httpserve.Limits{IdleTimeout: 300 * time.Millisecond})
	c := rawRequest(t, addr, "GET /healthz HTTP/1.1\r\nHost: shard\r\n\r\n")
	got := readUntilClosed(t, c)
	if !strings.HasPrefix(got, "HTTP/1.1 200 ") {
		t.Fatalf("healthz: %q", got)
	}
}

// TestSlowReaderIsCutOff: a client that never reads its (large) reply does not hold the
// connection or its in-flight slot past the write timeout.
func TestSlowReaderIsCutOff(t *testing.T) {
	e := newShardEnv(t, allSlots(0))
	e.upsert(bigRows(shardapi.MaxClaim)...)
	e.sh.Walk(e.ctx, true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := serveLimitedOn(t, e.sh, httpserve.Limits{WriteTimeout: 300 * time.Millisecond, MaxInFlightClaims: 1}, smallSendBuffers{ln})
	// A claim of 10,000 rows with 2 kB keys: a 21 MB reply. Both ends' socket buffers are set
	// small, so the reply cannot be written in full unread whatever the host's TCP autotuning
	// allows (with net.ipv4.tcp_rmem up to 32 MB, a receive buffer can hold all of it).
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, smallSocketBuffer)
		}); err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	body := `{"n":10000}`
	if _, err := fmt.Fprintf(c, "POST /v1/claim HTTP/1.1\r\nHost: shard\r\nAuthorization: Bearer t\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
		t.Fatal(err)
	}
	// The first bytes of the reply (or the connection's end) arrive only once the server has
	// admitted the claim: before that, a probe below could take the one slot itself and pass
	// while the claim still waits, and the claim's reply would then be read in full.
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	first := make([]byte, 12)
	n, err := io.ReadFull(c, first)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("waiting for the claim's reply to start: %v", err)
	}
	if n > 0 && !strings.HasPrefix("HTTP/1.1 200", string(first[:n])) {
		t.Fatalf("the claim's reply starts %q", first[:n])
	}
	// the handler finishes (its write fails at the deadline) and frees the one claim slot (claims
	// have a room of their own: a release would not wait for it)
	eventually(t, "the claim slot to be free", 20*time.Second, func() bool {
		code, _ := postJSON(t, "http://"+addr, "/v1/claim", `{"n":1}`)
		return code == http.StatusOK
	})
	// and the reply the client did not read is cut short: the connection is closed
	got := string(first[:n]) + readUntilClosed(t, c)
	if len(got) >= shardapi.MaxClaim*schedule.MaxKeyBytes {
		t.Fatalf("the whole reply (%d bytes) was written to a client that did not read", len(got))
	}
}

// smallSocketBuffer is the socket buffer size TestSlowReaderIsCutOff sets at both ends.
const smallSocketBuffer = 64 << 10

// smallSendBuffers is a listener whose accepted connections have a send buffer of
// smallSocketBuffer bytes (the kernel's autotuning no longer grows it).
type smallSendBuffers struct{ net.Listener }

// Accept accepts a connection and sets its send buffer.
func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		if err := tc.SetWriteBuffer(smallSocketBuffer); err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("setting the send buffer: %w", err)
		}
	}
	return c, err
}

// bigRows returns n due rows with keys of the longest allowed length.
func bigRows(n int) []schedule.Row {
	rows := make([]schedule.Row, n)
	for i := range rows {
		k := fmt.Sprintf("https://x.example/%06d/", i)
		rows[i] = srow(k+strings.Repeat("k", schedule.MaxKeyBytes-len(k)), t0.Add(-time.Hour), time.Hour)
	}
	return rows
}

// postJSON posts body with the test token and returns the status code and reply.
func postJSON(t *testing.T, base, path, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer t")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// post sends body to path with the test token and returns the status code, reply and
// Retry-After.
func post(t *testing.T, base, path string, body []byte) (int, []byte, string) {
	t.Helper()
	code, b, retry, err := postWithin(base, path, body, 0)
	if err != nil {
		t.Fatal(err)
	}
	return code, b, retry
}

// postWithin is post with a client timeout (0: none), returning the client's error.
func postWithin(base, path string, body []byte, timeout time.Duration) (int, []byte, string, error) {
	req, _ := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer t")
	resp, err := (&http.Client{Timeout: timeout}).Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header.Get("Retry-After"), nil
}

// TestInFlightCap: complete, release and extend requests are admitted up to MaxInFlight and
// MaxInFlightBytes of declared bodies, answered 503 with Retry-After before their bodies are read;
// claims up to MaxInFlightClaims once their bodies are in. A full room leaves the claims' room
// (when it is not the one full), health, readiness and status open; a freed room admits requests
// again.
func TestInFlightCap(t *testing.T) {
	e := newShardEnv(t, allSlots(time.Hour))
	e.sh.Walk(e.ctx, true)
	release := []byte(`{"items":[{"key":"x","lease":"0000000000000001"}]}`)
	claim := []byte(`{"n":1}`)
	for _, tc := range []struct {
		name   string
		l      httpserve.Limits
		holder int64  // Content-Length of the stalled completions that hold their room (0: none)
		hold   int    // how many
		probe  []byte // refused while the room is full
		path   string
		open   [][2]string // path and body of requests other rooms still take
	}{
		{"count", httpserve.Limits{MaxInFlight: 2}, 1000, 2, release, "/v1/release", [][2]string{{"/v1/claim", string(claim)}}},
		{"bytes", httpserve.Limits{MaxInFlight: 100, MaxInFlightBytes: httpserve.MaxRequestBytes}, httpserve.MaxRequestBytes - 10, 1, release, "/v1/release",
			[][2]string{{"/v1/claim", string(claim)}}},
		// the shard's lock, held by the test, keeps one claim in its handler
		{"claims", httpserve.Limits{MaxInFlightClaims: 1}, 0, 0, claim, "/v1/claim", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := serveLimited(t, e.sh, tc.l)
			base := "http://" + addr
			hold := func() net.Conn {
				return rawRequest(t, addr, fmt.Sprintf("POST /v1/complete HTTP/1.1\r\nHost: shard\r\nAuthorization: Bearer t\r\n"+
					"Content-Length: %d\r\n\r\n{", tc.holder))
			}
			var held []net.Conn
			for range tc.hold {
				held = append(held, hold())
			}
			inHandler := make(chan int, 1)
			if tc.hold == 0 {
				e.sh.mu.Lock()
				go func() {
					code, _, _ := post(t, base, tc.path, tc.probe)
					inHandler <- code
				}()
			}
			var code int
			var body []byte
			var retry string
			eventually(t, "a 503", 10*time.Second, func() bool {
				// a holder whose headers the server read only after a probe had taken a slot was
				// refused: it holds nothing, so it tries again (the probes end at once)
				for i, c := range held {
					_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
					if n, _ := c.Read(make([]byte, 1)); n > 0 {
						_ = c.Close()
						held[i] = hold()
					}
				}
				if tc.hold == 0 {
					// a probe admitted before the holder waits for the lock in its turn: it holds
					// the room, and the next probe is refused
					code, body, retry, _ = postWithin(base, tc.path, tc.probe, 200*time.Millisecond)
				} else {
					code, body, retry = post(t, base, tc.path, tc.probe)
				}
				return code == http.StatusServiceUnavailable
			})
			var eb shardapi.Error
			if retry != "1" || json.Unmarshal(body, &eb) != nil || !strings.Contains(eb.Error, "busy") {
				t.Fatalf("503 reply: Retry-After %q body %s", retry, body)
			}
			for _, o := range tc.open {
				if code, b, _ := post(t, base, o[0], []byte(o[1])); code != http.StatusOK {
					t.Errorf("%s while the %s room is full: %d %s", o[0], tc.name, code, b)
				}
			}
			for _, p := range []string{"/healthz", "/readyz", "/v1/status"} {
				if tc.hold == 0 && p != "/healthz" {
					continue // they take the shard's lock, which the test holds
				}
				resp, err := http.Get(base + p)
				if err != nil {
					t.Fatal(err)
				}
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("%s while the API is saturated: %d", p, resp.StatusCode)
				}
			}
			for _, c := range held {
				_ = c.Close()
			}
			if tc.hold == 0 {
				e.sh.mu.Unlock()
				// (refused when a probe took the room first)
				if code := <-inHandler; code != http.StatusOK && code != http.StatusServiceUnavailable {
					t.Fatalf("the request sent to hold the room: %d", code)
				}
			}
			eventually(t, "admitted again", 10*time.Second, func() bool {
				code, _, _ := post(t, base, tc.path, tc.probe)
				return code == http.StatusOK
			})
		})
	}
}

// countingReader counts the bytes read from it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// itemsBody returns a /v1/complete body with n small items and the length of its first
// firstN items' prefix.
func itemsBody(n, firstN int) ([]byte, int) {
	var b bytes.Buffer
	b.WriteString(`{"items":[`)
	prefix := 0
	for i := range n {
		if i == firstN {
			prefix = b.Len()
		}
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"key":"https://x.example/%07d","lease":"%016x"}`, i, i+1)
	}
	b.WriteString(`]}`)
	return b.Bytes(), prefix
}

// TestTooManyItemsRefusedEarly: a body whose items array is longer than a claim batch is refused
// (413) once item MaxClaim+1 starts, without reading the rest of the body; a body of MaxClaim
// items is decoded whole.
func TestTooManyItemsRefusedEarly(t *testing.T) {
	e := newShardEnv(t, allSlots(time.Hour))
	h := e.sh.Handler(HandlerOptions{})
	send := func(body []byte) (*httptest.ResponseRecorder, *countingReader) {
		cr := &countingReader{r: bytes.NewReader(body)}
		req := httptest.NewRequest(http.MethodPost, "/v1/release", io.NopCloser(cr))
		req.ContentLength = int64(len(body))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec, cr
	}
	body, prefix := itemsBody(200_000, shardapi.MaxClaim+1) // 12 MB
	rec, cr := send(body)
	if rec.Code != http.StatusRequestEntityTooLarge || !strings.Contains(rec.Body.String(), fmt.Sprintf("more than %d items", shardapi.MaxClaim)) {
		t.Fatalf("%d items: %d %s", 200_000, rec.Code, rec.Body)
	}
	if cr.n > prefix+64<<10 {
		t.Fatalf("read %d bytes of a %d-byte body before refusing it; item %d starts at byte %d", cr.n, len(body), shardapi.MaxClaim+1, prefix)
	}
	t.Logf("refused after reading %d of %d bytes", cr.n, len(body))

	// exactly MaxClaim items are decoded (and answered item by item: none is leased here)
	body, _ = itemsBody(shardapi.MaxClaim, 0)
	rec, _ = send(body)
	var rr shardapi.ReleaseResponse
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &rr) != nil || len(rr.Results) != shardapi.MaxClaim {
		t.Fatalf("%d items: %d %.200s", shardapi.MaxClaim, rec.Code, rec.Body)
	}

	// the items member is matched as encoding/json matches names (case-insensitively): another
	// spelling cannot bypass the count, nor can a second items member
	for _, tc := range []struct{ body, want string }{
		{`{"ITEMS":[` + strings.Repeat(`{"key":"a","lease":"0000000000000001"},`, shardapi.MaxClaim) + `{"key":"a","lease":"0000000000000001"}]}`, "more than"},
		{`{"items":[{"key":"a","lease":"0000000000000001"}],"items":[]}`, "given twice"},
		{`{"items":{"key":"a"}}`, "must be an array"},
		{`{"items":[{"key":"a","lease":"0000000000000001","extra":1}]}`, `item 0: json: unknown field "extra"`},
		{`{"items":[{"key":"a","lease":"0000000000000001"}],"n":1}`, `unknown field "n"`},
		{`["items"]`, "want a JSON object"},
		{`{"items":null}`, "items is empty"},
	} {
		rec, _ := send([]byte(tc.body))
		var eb shardapi.Error
		if rec.Code/100 != 4 || json.Unmarshal(rec.Body.Bytes(), &eb) != nil || !strings.Contains(eb.Error, tc.want) {
			t.Errorf("%.60s: %d %.200s, want %q", tc.body, rec.Code, rec.Body, tc.want)
		}
	}
}

// TestFullBatchCompletes: a claim of MaxClaim rows with keys of the longest length can be
// completed, each item with a nextDue, in one request.
func TestFullBatchCompletes(t *testing.T) {
	e := newShardEnv(t, allSlots(0))
	e.upsert(bigRows(shardapi.MaxClaim)...)
	e.sh.Walk(e.ctx, true)
	srv := httptest.NewServer(e.sh.Handler(HandlerOptions{Token: "t"}))
	defer srv.Close()
	code, body := postJSON(t, srv.URL, "/v1/claim", fmt.Sprintf(`{"n":%d}`, shardapi.MaxClaim))
	var cr shardapi.ClaimResponse
	if code != http.StatusOK || json.Unmarshal(body, &cr) != nil || len(cr.Items) != shardapi.MaxClaim {
		t.Fatalf("claim: %d, %d items", code, len(cr.Items))
	}
	next := time.Date(2099, 12, 31, 23, 59, 59, 999_999_999, time.FixedZone("", -(11*3600+30*60)))
	req := shardapi.CompleteRequest{Items: make([]shardapi.Completion, len(cr.Items))}
	for i, it := range cr.Items {
		req.Items[i] = shardapi.Completion{Key: it.Key, Lease: it.Lease, NextDue: &next}
	}
	b, _ := json.MarshalIndent(req, "", "  ")
	t.Logf("complete body: %d bytes (limit %d)", len(b), httpserve.MaxRequestBytes)
	code, body = postJSON(t, srv.URL, "/v1/complete", string(b))
	var res shardapi.CompleteResponse
	if code != http.StatusOK || json.Unmarshal(body, &res) != nil || res.Completed != shardapi.MaxClaim {
		t.Fatalf("complete: %d %.300s", code, body)
	}
}
