package shardapi_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	legacyrouter "github.com/getkin/kin-openapi/routers/legacy"

	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/client/clienttest"
	"github.com/renderqueue/renderqueue/pkg/client/discovery"
	"github.com/renderqueue/renderqueue/pkg/keeper/httpserve"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// exchange is one recorded request and its reply.
type exchange struct {
	method, path string
	reqHeader    http.Header
	reqBody      []byte
	code         int
	respHeader   http.Header
	respBody     []byte
}

// recorder wraps a shard's handler and records every exchange.
type recorder struct {
	mu  sync.Mutex
	log []exchange
}

// wrap records what h reads of each request's body (as it reads it: a body the shard refuses
// unread is recorded empty, one that stalls as far as it came) and what h writes, passing both
// through: h keeps its connection (http.ResponseController reaches it through Unwrap), so read
// deadlines and closes behave as served.
func (r *recorder) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var body bytes.Buffer
		req.Body = struct {
			io.Reader
			io.Closer
		}{io.TeeReader(req.Body, &body), req.Body}
		tw := &teeWriter{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(tw, req)
		r.mu.Lock()
		r.log = append(r.log, exchange{method: req.Method, path: req.URL.RequestURI(), reqHeader: req.Header.Clone(), reqBody: body.Bytes(),
			code: tw.code, respHeader: w.Header().Clone(), respBody: tw.body.Bytes()})
		r.mu.Unlock()
	})
}

// teeWriter passes a reply through and keeps its status and body.
type teeWriter struct {
	http.ResponseWriter
	code int
	body bytes.Buffer
}

func (w *teeWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *teeWriter) Write(b []byte) (int, error) {
	w.body.Write(b)
	return w.ResponseWriter.Write(b)
}

// Unwrap gives http.ResponseController the connection's writer.
func (w *teeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (r *recorder) take() []exchange {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.log
	r.log = nil
	return out
}

func loadDoc(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(shardapi.OpenAPI)
	if err != nil {
		t.Fatalf("loading openapi.yaml: %v", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI 3 document: %v", err)
	}
	return doc
}

// TestOpenAPIDocumentMatchesTheHandlers drives real keeper shards (the handlers the keeper serves)
// through the Go client and with raw requests, good and bad, records every exchange, and checks it
// against openapi.yaml: every reply, error bodies included, must match its documented schema and
// status code; every request the shard accepts must match the request schema, and the malformed
// ones the document can describe must be refused by it too. Every documented operation must have
// been exercised. The test fails when code and document drift apart.
func TestOpenAPIDocumentMatchesTheHandlers(t *testing.T) {
	doc := loadDoc(t)
	rec := &recorder{}
	cl := clienttest.NewCluster(t, clienttest.Options{Token: "s3cret", Wrap: rec.wrap}, "web-shard-0")
	loading := clienttest.NewLoadingShard(t, clienttest.Options{Token: "s3cret", Wrap: rec.wrap})
	base := cl.URLs()[0]
	rows := []schedule.Row{
		{Key: "https://shop.example.com/p/1", Due: time.Now().Add(-time.Hour), HasDue: true, Cadence: time.Hour, Route: "product"},
		{Key: "https://shop.example.com/p/2", Due: time.Now().Add(-2 * time.Hour), HasDue: true, Cadence: 96 * time.Hour, Route: "product", Source: schedule.SourceSubmitted},
		{Key: "https://shop.example.com/", Due: time.Now().Add(-time.Minute), HasDue: true, Cadence: time.Hour, Route: "home", Urgent: true},
		{Key: "https://shop.example.com/p/3", Due: time.Now().Add(3 * time.Hour), HasDue: true, Cadence: 24 * time.Hour, Route: "product"},
		{Key: "plain-key", Due: time.Now().Add(3 * time.Hour), HasDue: true, Cadence: 24 * time.Hour, Route: "product"},
	}
	cl.Upsert(rows...)
	for cl.Due() != 3 {
		time.Sleep(5 * time.Millisecond)
	}
	ctx := context.Background()
	d, err := discovery.Static(base)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Options{Discovery: d, Token: "s3cret", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()

	// good traffic through the client
	if _, err := client.GetStatus(ctx, http.DefaultClient, base); err != nil {
		t.Fatal(err)
	}
	items, err := c.Claim(ctx, 3)
	if err != nil || len(items) != 3 {
		t.Fatalf("claim: %v %v", items, err)
	}
	if _, err := client.GetStatus(ctx, http.DefaultClient, base); err != nil { // leased rows, classes, lateness
		t.Fatal(err)
	}
	if _, _, err := c.Extend(ctx, items, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	// what the shard knows of a leased row, a row not due yet, and a key no row has (404)
	for _, key := range []string{items[0].Key, "https://shop.example.com/p/3"} {
		if e, err := client.ExplainRow(ctx, http.DefaultClient, base, "s3cret", key, false); err != nil || !e.Held {
			t.Fatalf("explaining %s: %+v %v", key, e, err)
		}
	}
	var notFound *client.StatusError
	if _, err := client.ExplainRow(ctx, http.DefaultClient, base, "s3cret", "https://shop.example.com/none", true); !errors.As(err, &notFound) || notFound.Code != 404 {
		t.Fatalf("explaining a key no row has: %v", err)
	}
	if _, err := c.Complete(ctx, []client.Completion{{Item: items[0]}, {Item: items[1], NextDue: time.Now().Add(48 * time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, items[2:]); err != nil {
		t.Fatal(err)
	}
	// refusals per item: the leases are gone
	if errs, err := c.Complete(ctx, []client.Completion{{Item: items[0]}}); err != nil || errs[0] == nil {
		t.Fatalf("completing twice: %v %v", errs, err)
	}
	if _, errs, err := c.Extend(ctx, items[:1], 0); err != nil || errs[0] == nil {
		t.Fatalf("extending a completed lease: %v %v", errs, err)
	}
	if errs, err := c.Release(ctx, items[:1]); err != nil || errs[0] == nil {
		t.Fatalf("releasing a completed lease: %v %v", errs, err)
	}
	if _, err := c.Claim(ctx, 10); err != nil { // one row left, then the empty claim
		t.Fatal(err)
	}
	if _, err := c.Claim(ctx, 10); err != nil {
		t.Fatal(err)
	}
	// a handoff under live leases: the new shard asks for their handover (POST /v1/handover),
	// and the leases that moved are completed through the old shard's movedTo
	var moving []schedule.Row
	for i := range 16 {
		moving = append(moving, schedule.Row{Key: fmt.Sprintf("https://shop.example.com/m/%d", i), Due: time.Now().Add(-time.Hour),
			HasDue: true, Cadence: time.Hour, Route: "product"})
	}
	cl.Upsert(moving...)
	var held []client.Item
	for len(held) < len(moving) {
		got, err := c.Claim(ctx, len(moving)-len(held))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, got...)
	}
	cl.Rebalance(nil, "web-shard-0", "web-shard-1")
	done := make([]client.Completion, len(held))
	for i, it := range held {
		done[i] = client.Completion{Item: it}
	}
	if errs, err := c.Complete(ctx, done); err != nil || errors.Join(errs...) != nil {
		t.Fatalf("completing leases that moved: %v %v", errs, err)
	}
	good := rec.take()

	// raw requests: (path, body, token, want code, request valid per the document)
	lease := items[2].Lease
	raw := []struct {
		url, method, path, body string
		token                   bool
		code                    int
		valid                   bool
		proxied                 bool // the token in X-Renderqueue-Authorization
	}{
		{base, "GET", "/healthz", "", false, 200, true, false},
		{base, "GET", "/readyz", "", false, 200, true, false},
		{loading, "GET", "/readyz", "", false, 503, true, false},
		{loading, "POST", "/v1/claim", `{"n":1}`, true, 503, true, false},
		{base, "POST", "/v1/claim", `{"n":1}`, false, 401, true, false},
		{base, "POST", "/v1/extend", `{"items":[{"key":"k","lease":"` + lease + `"}]}`, false, 401, true, false},
		{base, "POST", "/v1/claim", `{"n":0}`, true, 400, false, false},
		{base, "POST", "/v1/claim", `{"n":10001}`, true, 400, false, false},
		{base, "POST", "/v1/claim", `{"n":1,"leaseSeconds":-1}`, true, 400, false, false},
		{base, "POST", "/v1/claim", `{"n":1,"count":2}`, true, 400, false, false},
		{base, "POST", "/v1/claim", `{"n":`, true, 400, false, false},
		{base, "POST", "/v1/claim", `{"n":1,"leaseSeconds":` + strings.Repeat("1", httpserve.MaxRequestBytes) + `}`, true, 413, false, false},
		{base, "POST", "/v1/complete", `{"items":[]}`, true, 400, false, false},
		{base, "POST", "/v1/complete", `{"items":[{"key":"a","lease":"xyz"}]}`, true, 400, false, false},
		{base, "POST", "/v1/complete", `{"items":[{"key":"","lease":"` + lease + `"}]}`, true, 400, false, false},
		{base, "POST", "/v1/release", `{"items":[{"key":"a","lease":"` + lease + `"},{"key":"a","lease":"` + lease + `"}]}`, true, 400, true, false},
		{base, "POST", "/v1/extend", `{"items":[{"key":"a","lease":"` + lease + `"}],"leaseSeconds":90000}`, true, 400, false, false},
		{base, "POST", "/v1/extend", `{"items":[{"key":"a","lease":"` + lease + `"}],"leaseSeconds":0.0000001}`, true, 400, true, false},
		{base, "POST", "/v1/handover", `{"shard":"x","slots":"0-3"}`, false, 401, true, false},
		{base, "POST", "/v1/handover", `{"shard":"x","slots":"3-2"}`, true, 400, true, false},
		{base, "POST", "/v1/handover", `{"shard":"x","slots":"0-1023"}`, true, 200, true, false},
		{base, "GET", "/v1/rows/plain-key", "", true, 200, true, false}, // (an escaped URL's slashes: pkg/keeper's tests)
		{base, "GET", "/v1/rows/no-such-key", "", true, 404, true, false},
		{base, "GET", "/v1/rows?key=" + url.QueryEscape("https://shop.example.com/p/3"), "", false, 200, true, true},
		{base, "GET", "/v1/rows?key=" + url.QueryEscape("https://shop.example.com/p/3"), "", false, 401, true, false},
		{base, "GET", "/v1/rows?key=", "", true, 400, false, false},
		{base, "GET", "/v1/rows?key=" + strings.Repeat("k", 2049), "", true, 400, false, false},
		{base, "GET", "/v1/rows/a?key=b", "", true, 400, true, false},
		{loading, "GET", "/v1/rows?key=a", "", true, 503, true, false},
	}
	type rawCase struct {
		valid bool
		what  string
	}
	var rawCases []rawCase
	for _, r := range raw {
		req, err := http.NewRequest(r.method, r.url+r.path, strings.NewReader(r.body))
		if err != nil {
			t.Fatal(err)
		}
		if r.body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if r.token {
			req.Header.Set("Authorization", "Bearer s3cret")
		}
		if r.proxied {
			req.Header.Set(shardapi.ProxiedAuthorizationHeader, "Bearer s3cret")
		}
		// a shard refusing a body it does not read closes the connection: the client may see
		// that as a failed write before it reads the reply, so the code is taken from the record
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		rawCases = append(rawCases, rawCase{valid: r.valid, what: fmt.Sprintf("%s %s %.80s", r.method, r.path, r.body)})
	}
	bad := rec.take()
	if len(bad) != len(rawCases) {
		t.Fatalf("recorded %d raw exchanges, sent %d", len(bad), len(rawCases))
	}
	for i := range bad {
		if bad[i].code != raw[i].code {
			t.Errorf("%s: HTTP %d, want %d", rawCases[i].what, bad[i].code, raw[i].code)
		}
		bad[i].reqBody = []byte(raw[i].body) // as sent: a refusal may leave it unread
	}

	busy := stalledWrites(t, rec)

	doc.Servers = nil // match the test servers' addresses
	router, err := legacyrouter.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	exercised := map[string]bool{}
	check := func(ex exchange, wantValidRequest bool, what string) {
		t.Helper()
		req := httptest.NewRequest(ex.method, ex.path, bytes.NewReader(ex.reqBody))
		req.Header = ex.reqHeader
		route, params, err := router.FindRoute(req)
		if err != nil {
			t.Errorf("%s: not in the document: %v", what, err)
			return
		}
		exercised[route.Operation.OperationID] = true
		in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true}}
		reqErr := openapi3filter.ValidateRequest(context.Background(), in)
		switch {
		case wantValidRequest && reqErr != nil:
			t.Errorf("%s: the request the shard accepted does not match the document: %v", what, reqErr)
		case !wantValidRequest && reqErr == nil:
			t.Errorf("%s: the shard refused the request (HTTP %d: %s) but the document allows it", what, ex.code, ex.respBody)
		}
		out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: ex.code, Header: ex.respHeader,
			Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}}
		out.SetBodyBytes(ex.respBody)
		if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
			t.Errorf("%s: the reply HTTP %d %s does not match the document: %v", what, ex.code, truncate(ex.respBody), err)
		}
		if undeclared := undeclaredHeaders(route.Operation, ex.code, ex.respHeader); len(undeclared) > 0 {
			t.Errorf("%s: the reply HTTP %d has headers the document does not declare for it: %v", what, ex.code, undeclared)
		}
	}
	for _, ex := range good {
		check(ex, true, fmt.Sprintf("%s %s (client)", ex.method, ex.path))
	}
	for i, ex := range bad {
		check(ex, rawCases[i].valid, rawCases[i].what)
	}
	for _, b := range busy {
		check(b.ex, b.valid, b.what)
	}
	var missing []string
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if !exercised[op.OperationID] && path != "/metrics" { // the test shards serve no metrics
				missing = append(missing, method+" "+path)
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("documented but never exercised: %v", missing)
	}
	if len(good) < 11 {
		t.Errorf("only %d exchanges recorded through the client", len(good))
	}
}

// busyCase is an exchange of stalledWrites, and whether its request is one the document allows.
type busyCase struct {
	ex    exchange
	valid bool
	what  string
}

// stalledWrites serves a shard that handles one write at a time and waits 300 ms for a body
// (clienttest.Options.Limits), sends it a completion whose body stalls — it holds the writes'
// room — and then completions until one is refused 503 with Retry-After; the stalled one is
// answered 408 and its connection closed. It returns the exchanges (recorded by rec), each with
// its request as sent.
func stalledWrites(t *testing.T, rec *recorder) []busyCase {
	t.Helper()
	cl := clienttest.NewCluster(t, clienttest.Options{Token: "s3cret", Wrap: rec.wrap,
		Limits: httpserve.Limits{BodyTimeout: 300 * time.Millisecond, MaxInFlight: 1}}, "busy-shard-0")
	u, err := url.Parse(cl.URLs()[0])
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	const stalled = `{"items":[`
	if _, err := fmt.Fprintf(conn, "POST /v1/complete HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer s3cret\r\n"+
		"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n%s", u.Host, stalled); err != nil {
		t.Fatal(err)
	}
	// completions of a lease no row has (200, refused per item) until the stalled body holds the
	// room: then one is refused whole
	const other = `{"items":[{"key":"a","lease":"0000000000000000"}]}`
	var sent []string
	var retryAfter string
	for deadline := time.Now().Add(5 * time.Second); retryAfter == "" && time.Now().Before(deadline); {
		req, err := http.NewRequest("POST", cl.URLs()[0]+"/v1/complete", strings.NewReader(other))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer s3cret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue // refused unread, the connection closed under the body
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		sent = append(sent, other)
		if resp.StatusCode == http.StatusServiceUnavailable {
			retryAfter = resp.Header.Get("Retry-After")
		}
	}
	if retryAfter == "" {
		t.Fatal("no completion was refused 503 with Retry-After while another's body stalled")
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the stalled completion's reply: %v", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout || !resp.Close {
		t.Errorf("the stalled completion: HTTP %d, connection close %v; want 408 and the connection closed", resp.StatusCode, resp.Close)
	}
	var out []busyCase
	var seen408, seen503 bool
	for _, ex := range rec.take() {
		switch ex.code {
		case http.StatusRequestTimeout:
			seen408 = true
			ex.reqBody = []byte(stalled)
			out = append(out, busyCase{ex: ex, valid: false, what: "POST /v1/complete (a body that stalls)"})
		default:
			seen503 = seen503 || ex.code == http.StatusServiceUnavailable
			ex.reqBody = []byte(other)
			out = append(out, busyCase{ex: ex, valid: true, what: fmt.Sprintf("POST /v1/complete (while a body stalls: HTTP %d)", ex.code)})
		}
	}
	if !seen408 || !seen503 || len(out) != len(sent)+1 {
		t.Fatalf("recorded %d exchanges (408 %v, 503 %v), sent %d", len(out), seen408, seen503, len(sent)+1)
	}
	return out
}

// undeclaredHeaders lists the headers of a reply with status code to op that the document does
// not declare for it, leaving out those every HTTP reply may carry.
func undeclaredHeaders(op *openapi3.Operation, code int, h http.Header) []string {
	resp := op.Responses.Status(code)
	if resp == nil {
		resp = op.Responses.Default()
	}
	var out []string
	for name := range h {
		switch http.CanonicalHeaderKey(name) {
		case "Content-Type", "Content-Length", "Date":
			continue
		}
		declared := false
		if resp != nil && resp.Value != nil {
			for d := range resp.Value.Headers {
				declared = declared || strings.EqualFold(d, name)
			}
		}
		if !declared {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

func truncate(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "..."
	}
	return string(b)
}

// TestOpenAPIResponseSchemasAreOpen: every reply schema of openapi.yaml, nested objects
// included, admits fields it does not list (a strict generated client keeps working when a
// shard of a newer release adds one), and every request body schema is closed, as the handlers
// refuse a field they do not know.
func TestOpenAPIResponseSchemasAreOpen(t *testing.T) {
	doc := loadDoc(t)
	var closed func(where string, s *openapi3.SchemaRef, seen map[*openapi3.Schema]bool)
	closed = func(where string, s *openapi3.SchemaRef, seen map[*openapi3.Schema]bool) {
		if s == nil || s.Value == nil || seen[s.Value] {
			return
		}
		seen[s.Value] = true
		if has := s.Value.AdditionalProperties.Has; has != nil && !*has {
			t.Errorf("%s: a reply schema is closed (additionalProperties: false)", where)
		}
		for name, p := range s.Value.Properties {
			closed(where+"."+name, p, seen)
		}
		closed(where+"[]", s.Value.Items, seen)
		if s.Value.AdditionalProperties.Schema != nil {
			closed(where+"{}", s.Value.AdditionalProperties.Schema, seen)
		}
	}
	requests := 0
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			for code, resp := range op.Responses.Map() {
				for ct, mt := range resp.Value.Content {
					closed(fmt.Sprintf("%s %s %s %s", method, path, code, ct), mt.Schema, map[*openapi3.Schema]bool{})
				}
			}
			if op.RequestBody == nil {
				continue
			}
			for ct, mt := range op.RequestBody.Value.Content {
				requests++
				if has := mt.Schema.Value.AdditionalProperties.Has; has == nil || *has {
					t.Errorf("%s %s request %s: open, but the shard refuses fields it does not know", method, path, ct)
				}
			}
		}
	}
	if requests != 5 {
		t.Errorf("%d request bodies checked, want 5 (claim, complete, release, extend, handover)", requests)
	}
}
