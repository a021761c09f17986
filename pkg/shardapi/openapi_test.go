package shardapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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

func (r *recorder) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
		r.mu.Lock()
		r.log = append(r.log, exchange{method: req.Method, path: req.URL.RequestURI(), reqHeader: req.Header.Clone(), reqBody: body,
			code: rec.Code, respHeader: rec.Header().Clone(), respBody: rec.Body.Bytes()})
		r.mu.Unlock()
	})
}

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
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		what := fmt.Sprintf("%s %s %.80s", r.method, r.path, r.body)
		if resp.StatusCode != r.code {
			t.Errorf("%s: HTTP %d, want %d", what, resp.StatusCode, r.code)
		}
		rawCases = append(rawCases, rawCase{valid: r.valid, what: what})
	}
	bad := rec.take()
	if len(bad) != len(rawCases) {
		t.Fatalf("recorded %d raw exchanges, sent %d", len(bad), len(rawCases))
	}

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
	}
	for _, ex := range good {
		check(ex, true, fmt.Sprintf("%s %s (client)", ex.method, ex.path))
	}
	for i, ex := range bad {
		check(ex, rawCases[i].valid, rawCases[i].what)
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

func truncate(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "..."
	}
	return string(b)
}
