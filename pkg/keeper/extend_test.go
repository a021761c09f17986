package keeper

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/httpserve"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

func TestHTTPExtend(t *testing.T) {
	settings := allSlots(24 * time.Hour)
	settings.MaxLease = time.Hour
	e := newShardEnv(t, settings)
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
	lease0, lease1 := httpserve.FormatLease(claimed[0].Lease), httpserve.FormatLease(claimed[1].Lease)
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
