package keeper

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

func TestCoreExtend(t *testing.T) {
	c := newCore(t, Config{UrgentMaxShare: 0.2})
	c.Apply(t0, row("a", t0.Add(-time.Hour), time.Hour, 1))
	c.Apply(t0, row("b", t0.Add(-time.Hour), time.Hour, 2))
	got := c.Claim(t0, 2, time.Minute)
	if len(got) != 2 {
		t.Fatalf("claimed %v", keysOf(got))
	}
	a, b := got[0], got[1]
	if a.Key != "a" {
		a, b = b, a
	}

	// the current lease is extended: it outlives its first expiry (whose heap entry still pops)
	exp, err := c.Extend(t0.Add(50*time.Second), a.Key, a.Lease, 2*time.Minute)
	if err != nil || !exp.Equal(t0.Add(170*time.Second)) {
		t.Fatalf("extend: %v %v", exp, err)
	}
	if err := c.CheckLease(t0.Add(90*time.Second), a.Key, a.Lease); err != nil {
		t.Fatalf("extended lease ended at its first expiry: %v", err)
	}
	if got := c.Claim(t0.Add(90*time.Second), 10, time.Minute); keysOf(got) != "b" {
		t.Fatalf("after b's lease lapsed, claimed %q, want b only (a is still leased)", keysOf(got))
	}
	// ... and lapses at the new expiry
	if err := c.CheckLease(t0.Add(170*time.Second), a.Key, a.Lease); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("at the new expiry: %v, want ErrLeaseLost", err)
	}

	// a stale lease is refused and changes nothing: b's first lease lapsed and b was claimed again
	if _, err := c.Extend(t0.Add(100*time.Second), b.Key, b.Lease, time.Hour); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("extending a lapsed lease: %v, want ErrLeaseLost", err)
	}
	if _, err := c.Extend(t0, "nope", a.Lease, time.Hour); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("extending an unknown key: %v, want ErrNotHeld", err)
	}
	// a released lease cannot be extended
	again := c.Claim(t0.Add(200*time.Second), 1, time.Minute)
	if len(again) != 1 || again[0].Key != "a" {
		t.Fatalf("claim a again: %v", keysOf(again))
	}
	if err := c.Release(t0.Add(201*time.Second), "a", again[0].Lease); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Extend(t0.Add(202*time.Second), "a", again[0].Lease, time.Hour); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("extending a released lease: %v, want ErrLeaseLost", err)
	}

	// shortening: the row is handed out again at the shorter expiry
	short := c.Claim(t0.Add(300*time.Second), 1, time.Hour)
	if len(short) != 1 {
		t.Fatal("no row to claim")
	}
	if _, err := c.Extend(t0.Add(300*time.Second), short[0].Key, short[0].Lease, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := c.Claim(t0.Add(309*time.Second), 1, time.Minute); len(got) != 0 && got[0].Key == short[0].Key {
		t.Fatalf("claimed %s before its shortened lease lapsed", got[0].Key)
	}
	if got := c.Claim(t0.Add(311*time.Second), 5, time.Minute); !strings.Contains(keysOf(got), short[0].Key) {
		t.Fatalf("after the shortened lease lapsed, claimed %q, want %s among them", keysOf(got), short[0].Key)
	}
}

func TestHTTPExtend(t *testing.T) {
	e := newShardEnv(t, allSlots(24*time.Hour))
	e.upsert(srow("a", t0.Add(-time.Hour), time.Hour), srow("b", t0.Add(-2*time.Hour), time.Hour))
	e.sh.Walk(e.ctx, true)
	claimed, err := e.sh.Claim(e.clock.Now(), 2, time.Minute)
	if err != nil || len(claimed) != 2 {
		t.Fatal(claimed, err)
	}
	srv := httptest.NewServer(e.sh.Handler(HandlerOptions{Token: "s3cret"}))
	defer srv.Close()
	post := func(body string, auth bool) (int, shardapi.ExtendResponse, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/extend", strings.NewReader(body))
		if auth {
			req.Header.Set("Authorization", "Bearer s3cret")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var out shardapi.ExtendResponse
		var raw json.RawMessage
		_ = json.NewDecoder(resp.Body).Decode(&raw)
		_ = json.Unmarshal(raw, &out)
		return resp.StatusCode, out, string(raw)
	}
	lease0, lease1 := FormatLease(claimed[0].Lease), FormatLease(claimed[1].Lease)
	item := func(key, lease string) string { return `{"key":"` + key + `","lease":"` + lease + `"}` }

	if code, _, raw := post(`{"items":[`+item(claimed[0].Key, lease0)+`]}`, false); code != 401 {
		t.Fatalf("without the token: %d %s", code, raw)
	}
	for _, bad := range []string{`{"items":[]}`, `{"items":[` + item(claimed[0].Key, lease0) + `],"leaseSeconds":-1}`,
		`{"items":[` + item(claimed[0].Key, "zz") + `]}`, `{"items":[` + item(claimed[0].Key, lease0) + `],"extra":1}`} {
		if code, _, raw := post(bad, true); code != 400 || !strings.Contains(raw, "error") {
			t.Errorf("%s: %d %s, want 400 with an error", bad, code, raw)
		}
	}
	// one current lease, one wrong lease: the first is extended, the second refused
	e.clock.Set(t0.Add(30 * time.Second))
	code, out, raw := post(`{"items":[`+item(claimed[0].Key, lease0)+`,`+item(claimed[1].Key, lease0)+`],"leaseSeconds":600}`, true)
	if code != 200 || out.Extended != 1 || len(out.Results) != 2 {
		t.Fatalf("extend: %d %s", code, raw)
	}
	if r := out.Results[0]; r.Error != "" || r.LeaseExpires == nil || !r.LeaseExpires.Equal(t0.Add(630*time.Second)) {
		t.Fatalf("first item: %+v", r)
	}
	if r := out.Results[1]; r.Error == "" || r.LeaseExpires != nil {
		t.Fatalf("second item (wrong lease) was not refused: %+v", r)
	}
	e.clock.Set(t0.Add(5 * time.Minute))
	if err := e.sh.core.CheckLease(e.clock.Now(), claimed[0].Key, claimed[0].Lease); err != nil {
		t.Fatalf("extended lease lapsed: %v", err)
	}
	// the second row's lease lapsed at one minute: extending it now is refused
	if code, out, raw := post(`{"items":[`+item(claimed[1].Key, lease1)+`]}`, true); code != 200 || out.Extended != 0 || out.Results[0].Error == "" {
		t.Fatalf("stale lease: %d %s", code, raw)
	}
	// leaseSeconds 0 takes the shard's default (one minute here)
	if code, out, raw := post(`{"items":[`+item(claimed[0].Key, lease0)+`]}`, true); code != 200 || out.Extended != 1 ||
		!out.Results[0].LeaseExpires.Equal(t0.Add(6*time.Minute)) {
		t.Fatalf("default lease: %d %s", code, raw)
	}
}
