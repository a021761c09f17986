package keeper

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/renderqueue/renderqueue/pkg/buildinfo"
	"github.com/renderqueue/renderqueue/pkg/keeper/httpserve"
	"github.com/renderqueue/renderqueue/pkg/keeper/shardmetrics"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/changes"
)

// exposureDoc reads docs/security.md's table of the shard API: each path's "what it exposes"
// cell, and the backquoted names in it.
func exposureDoc(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	sec := string(b)
	start := strings.Index(sec, "## Shard API")
	if start < 0 {
		t.Fatal(`docs/security.md has no "## Shard API"`)
	}
	sec = sec[start:]
	sec = sec[:strings.Index(sec[3:], "\n## ")+3]
	quoted := regexp.MustCompile("`([^`]+)`")
	out := map[string][]string{}
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(line, " | ")
		if !strings.HasPrefix(line, "| ") || len(cells) != 3 || strings.HasPrefix(line, "| path") {
			continue
		}
		names := []string{} // a row with none is still a row
		for _, m := range quoted.FindAllStringSubmatch(cells[2], -1) {
			names = append(names, m[1])
		}
		for _, m := range quoted.FindAllStringSubmatch(cells[0], -1) {
			p := m[1]
			if i := strings.Index(p, "/"); i >= 0 {
				p = p[i:]
			}
			out[p] = names
		}
		if strings.HasPrefix(line, "| anything else") {
			out["*"] = names
		}
	}
	for _, p := range []string{"/v1/claim", "/v1/complete", "/v1/release", "/v1/extend", "/v1/status", "/metrics", "/healthz", "/readyz", "*"} {
		if out[p] == nil {
			t.Fatalf("docs/security.md's shard API table does not say what %s exposes (rows: %v)", p, out)
		}
	}
	return out
}

// TestUnauthenticatedResponses reads every response a client without the token gets from a
// loaded shard — with leased rows, several routes, a change event refused with a key in its
// payload — over a real socket, as the keeper command serves it, and checks it against
// docs/security.md's table: /v1/status's fields, /metrics' families and labels, the probes' and
// the error replies' fields are among those the table lists, and no response carries a row's key
// or the token. Before issue 45, /v1/status's oldest carried the most overdue row's key.
func TestUnauthenticatedResponses(t *testing.T) {
	doc := exposureDoc(t)
	const token = "tok-3b1f0c9e5d7a"
	e := newShardEnv(t, allSlots(24*time.Hour))
	var keys []string
	var rows []schedule.Row
	for i := range 40 {
		r := srow(fmt.Sprintf("https://private.example/account/%d/secret-9f2c", i), t0.Add(-time.Duration(i+1)*time.Minute), time.Hour)
		r.Route = []string{"product", "home", "category"}[i%3]
		r.Urgent = i == 7
		rows = append(rows, r)
		keys = append(keys, r.Key)
	}
	e.upsert(rows...)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildinfo.NewCollector("keeper", buildinfo.Read("test")))
	m := shardmetrics.New(reg)
	sh, err := NewShard(Options{Name: "exposed", Store: e.fs, Clock: e.clock.Now, Log: logr.Discard(), Metrics: m}, allSlots(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(NewStatusCollector(sh))
	if err := sh.Subscribe(e.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sh.sub.Close() })
	if rep := sh.Walk(e.ctx, true); rep.Failed {
		t.Fatal(rep.Err)
	}
	if got, err := sh.Claim(e.clock.Now(), 5, time.Minute); err != nil || len(got) != 5 {
		t.Fatalf("claim: %d rows, %v", len(got), err)
	}
	// a refused change event whose payload carries a key (an old format, unsigned): a gap
	if _, err := e.st.Pool().Exec(e.ctx, `SELECT pg_notify($1, $2)`, changes.GroupChannel(0), "1,1,"+keys[0]); err != nil {
		t.Fatal(err)
	}
	ctxGap := e.ctx
	for sh.Status(e.clock.Now()).Gap == nil {
		b, err := sh.sub.Next(ctxGap)
		if err != nil {
			t.Fatal(err)
		}
		sh.HandleBatch(b)
	}

	l := httpserve.Limits{}
	srv := httpserve.NewServer(sh.Handler(HandlerOptions{Token: token, Gatherer: reg, Limits: l}), l)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(httpserve.Listen(ln, nil, l, m)) }()
	t.Cleanup(func() { _ = srv.Close() })
	addr := ln.Addr().String()

	// every response a client without the token can get
	type exchange struct{ method, path, auth, body string }
	var exchanges []exchange
	for _, p := range []string{"/v1/status", "/metrics", "/healthz", "/readyz", "/", "/v1/nope", "/v1/claim"} {
		exchanges = append(exchanges, exchange{"GET", p, "", ""})
	}
	for _, p := range []string{"/v1/claim", "/v1/complete", "/v1/release", "/v1/extend", "/v1/status"} {
		body := fmt.Sprintf(`{"items":[{"key":%q,"lease":"0000000000000001"}],"n":1}`, keys[1])
		exchanges = append(exchanges, exchange{"POST", p, "", body}, exchange{"POST", p, "Bearer wrong", body})
	}
	// what the token holder may ask of a row (GET /v1/rows/{key}), without it: the key in the
	// path and in the query, without a token and with a wrong one
	for _, p := range []string{"/v1/rows/" + url.PathEscape(keys[2]), "/v1/rows?key=" + url.QueryEscape(keys[2])} {
		exchanges = append(exchanges, exchange{"GET", p, "", ""}, exchange{"GET", p, "Bearer wrong", ""})
	}
	leaks := append(slices.Clone(keys), "secret-9f2c", "private.example", token)
	for _, ex := range exchanges {
		raw, resp, body := rawExchange(t, addr, ex.method, ex.path, ex.auth, ex.body)
		for _, leak := range leaks {
			if strings.Contains(raw, leak) {
				t.Errorf("%s %s (auth %q) answered %d with %q in it:\n%.600s", ex.method, ex.path, ex.auth, resp.StatusCode, leak, raw)
			}
		}
		path := ex.path
		if ex.auth != "" || ex.method == "POST" || resp.StatusCode/100 != 2 {
			path = "*"
		}
		switch path {
		case "/v1/status":
			var st map[string]json.RawMessage
			if err := json.Unmarshal(body, &st); err != nil {
				t.Fatalf("status: %v", err)
			}
			for f := range st {
				if !slices.Contains(doc[path], f) {
					t.Errorf("/v1/status carries %q, which docs/security.md does not list", f)
				}
			}
			var oldest map[string]any
			if err := json.Unmarshal(st["oldest"], &oldest); err != nil || len(oldest) != 1 || oldest["due"] == nil {
				t.Errorf("/v1/status's oldest is %s, want its due time only", st["oldest"])
			}
			if !strings.Contains(string(body), `"product"`) || !strings.Contains(string(body), `"gap":{`) {
				t.Errorf("the status shows no route or no gap, so the test checks less than it says: %.300s", body)
			}
		case "/metrics":
			checkMetricsExposure(t, body, doc[path])
		default:
			var obj map[string]any
			if plain := strings.TrimSpace(string(body)); path == "*" && slices.Contains(doc[path], plain) {
				continue // the router's own plain-text 404 or 405
			}
			if err := json.Unmarshal(body, &obj); err != nil {
				t.Errorf("%s %s answered %d with a body that is not a JSON object: %.200s", ex.method, ex.path, resp.StatusCode, body)
			}
			for f := range obj {
				if !slices.Contains(doc[path], f) {
					t.Errorf("%s %s (%d) carries %q, which docs/security.md does not list for it", ex.method, ex.path, resp.StatusCode, f)
				}
			}
		}
	}
}

// rawExchange sends one request on a new connection and returns the whole reply as sent, parsed,
// and its body.
func rawExchange(t *testing.T, addr, method, path, auth, body string) (string, *http.Response, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: shard\r\nConnection: close\r\n", method, path)
	if auth != "" {
		req += "Authorization: " + auth + "\r\n"
	}
	if method == "POST" {
		req += fmt.Sprintf("Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	if _, err := io.WriteString(c, req+"\r\n"+body); err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(raw))), nil)
	if err != nil {
		t.Fatalf("%s %s: %v in %.200q", method, path, err, raw)
	}
	b, _ := io.ReadAll(resp.Body)
	return string(raw), resp, b
}

// checkMetricsExposure checks that every metric family of body (the text format) is one of the
// documented families (a name, or a prefix ending in *) and every label one of the documented
// names.
func checkMetricsExposure(t *testing.T, body []byte, documented []string) {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	known := func(name string) bool {
		for _, d := range documented {
			if d == name || (strings.HasSuffix(d, "*") && strings.HasPrefix(name, strings.TrimSuffix(d, "*"))) {
				return true
			}
		}
		return false
	}
	for name, f := range fams {
		if !known(name) {
			t.Errorf("/metrics exports the family %s, which docs/security.md does not list", name)
		}
		for _, mt := range f.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if !slices.Contains(documented, lp.GetName()) {
					t.Errorf("/metrics labels %s with %s, which docs/security.md does not list", name, lp.GetName())
				}
			}
		}
	}
	if len(fams) < 20 {
		t.Errorf("/metrics has only %d families", len(fams))
	}
}
