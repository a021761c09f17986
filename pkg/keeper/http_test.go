package keeper

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/httpserve"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

func TestHTTPAPIRejectsBadRequests(t *testing.T) {
	e := newShardEnv(t, allSlots(24*time.Hour))
	e.upsert(srow("a", t0.Add(-time.Hour), time.Hour), srow("b", t0.Add(-2*time.Hour), time.Hour))
	e.sh.Walk(e.ctx, true)
	// one leased row, so release/complete requests have something they could wrongly change
	claimed, err := e.sh.Claim(e.clock.Now(), 1, time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatal(claimed, err)
	}
	lease := httpserve.FormatLease(claimed[0].Lease)
	srv := httptest.NewServer(e.sh.Handler(HandlerOptions{Token: "s3cret"}))
	defer srv.Close()

	before := e.status()
	cases := []struct {
		name, path, body string
		auth             bool
		want             int    // status code
		msg              string // substring of the error
	}{
		{"no token", "/v1/claim", `{"n":1}`, false, 401, "bearer token"},
		{"no token complete", "/v1/complete", `{"items":[{"key":"` + claimed[0].Key + `","lease":"` + lease + `"}]}`, false, 401, "bearer token"},
		{"no token release", "/v1/release", `{"items":[{"key":"` + claimed[0].Key + `","lease":"` + lease + `"}]}`, false, 401, "bearer token"},
		{"empty body", "/v1/claim", ``, true, 400, "empty request body"},
		{"not json", "/v1/claim", `n=1`, true, 400, "malformed JSON"},
		{"unknown field", "/v1/claim", `{"n":1,"count":5}`, true, 400, `unknown field "count"`},
		{"trailing data", "/v1/claim", `{"n":1} {"n":2}`, true, 400, "more than one JSON value"},
		{"n zero", "/v1/claim", `{"n":0}`, true, 400, "n must be within"},
		{"n too large", "/v1/claim", `{"n":100000}`, true, 400, "n must be within"},
		{"n not a number", "/v1/claim", `{"n":"5"}`, true, 400, "malformed JSON"},
		{"negative lease", "/v1/claim", `{"n":1,"leaseSeconds":-5}`, true, 400, "leaseSeconds"},
		{"huge lease", "/v1/claim", `{"n":1,"leaseSeconds":1e9}`, true, 400, "leaseSeconds"},
		{"no items", "/v1/complete", `{"items":[]}`, true, 400, "items is empty"},
		{"bad lease", "/v1/complete", `{"items":[{"key":"a","lease":"xyz"}]}`, true, 400, "not 16 hex digits"},
		{"empty key", "/v1/complete", `{"items":[{"key":"","lease":"` + lease + `"}]}`, true, 400, "empty key"},
		{"one bad item refuses all", "/v1/complete", `{"items":[{"key":"` + claimed[0].Key + `","lease":"` + lease + `"},{"key":"b","lease":"1"}]}`, true, 400, "item 1"},
		{"duplicate key", "/v1/release", `{"items":[{"key":"a","lease":"` + lease + `"},{"key":"a","lease":"` + lease + `"}]}`, true, 400, "same key"},
		{"bad next due", "/v1/complete", `{"items":[{"key":"` + claimed[0].Key + `","lease":"` + lease + `","nextDue":"1900-01-01T00:00:00Z"}]}`, true, 400, "outside"},
		{"null due", "/v1/complete", `{"items":[{"key":"` + claimed[0].Key + `","lease":"` + lease + `","nextDue":"yesterday"}]}`, true, 400, "malformed JSON"},
		{"too large", "/v1/claim", `{"n":1,"leaseSeconds":` + strings.Repeat("1", httpserve.MaxRequestBytes) + `}`, true, 413, "over"},
	}
	for _, tc := range cases {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+tc.path, strings.NewReader(tc.body))
		if tc.auth {
			req.Header.Set("Authorization", "Bearer s3cret")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		var e shardapi.Error
		if resp.StatusCode != tc.want || json.Unmarshal(body, &e) != nil || !strings.Contains(e.Error, tc.msg) {
			t.Errorf("%s: %d %s, want %d with %q", tc.name, resp.StatusCode, body, tc.want, tc.msg)
		}
	}
	after := e.status()
	if after.Leased != before.Leased || after.Due != before.Due || after.Rows.Held != before.Rows.Held {
		t.Fatalf("state changed: leased %d→%d due %d→%d", before.Leased, after.Leased, before.Due, after.Due)
	}
	if err := e.sh.core.CheckLease(e.clock.Now(), claimed[0].Key, claimed[0].Lease); err != nil {
		t.Fatalf("lease changed by rejected requests: %v", err)
	}

	// status needs no token; a good request with the token works
	resp, err := http.Get(srv.URL + "/v1/status")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("status: %v %v", resp, err)
	}
	_ = resp.Body.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/claim", strings.NewReader(`{"n":5}`))
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var cr shardapi.ClaimResponse
	if err := json.NewDecoder(resp.Body).Decode(&cr); err != nil || len(cr.Items) != 1 {
		t.Fatalf("claim: %+v %v", cr, err)
	}
	_ = resp.Body.Close()
}

func TestReadyzUntilLoaded(t *testing.T) {
	e := newShardEnv(t, allSlots(time.Hour))
	srv := httptest.NewServer(e.sh.Handler(HandlerOptions{}))
	defer srv.Close()
	get := func() int {
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(); code != http.StatusServiceUnavailable {
		t.Fatalf("before load: %d", code)
	}
	if _, err := e.sh.Claim(e.clock.Now(), 1, 0); err != ErrLoading {
		t.Fatalf("claim before load: %v", err)
	}
	e.sh.Walk(e.ctx, true)
	if code := get(); code != http.StatusOK {
		t.Fatalf("after load: %d", code)
	}
}
