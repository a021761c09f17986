package keeper

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/keeper/httpserve"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// TestExplainRowOverHTTP asks a loaded shard over a real PostgreSQL, through its HTTP API with
// the token, what it knows of: a waiting row (rank, lateness, score, estimate), a leased one (a
// lease id that is not the token, since, until), one not due yet, one beyond the window, an
// unscheduled one (invalid), one of another shard's slot (owner and URL), one written after the
// load whose event the shard has not applied (not seen), a key no row has (404) and bad keys
// (400); the token may come in the proxied header, and the key escaped in the path or in the
// query.
func TestExplainRowOverHTTP(t *testing.T) {
	e := newShardEnv(t, allSlots(2*time.Hour))
	rows := e.upsert(
		srow("https://shop.example.com/leased", t0.Add(-3*time.Hour), time.Hour),
		srow("https://shop.example.com/a", t0.Add(-time.Hour), time.Hour),
		srow("https://shop.example.com/b", t0.Add(-30*time.Minute), time.Hour),
		srow("https://shop.example.com/soon", t0.Add(time.Hour), time.Hour),
		srow("https://shop.example.com/later", t0.Add(5*time.Hour), 96*time.Hour),
		schedule.Row{Key: "https://shop.example.com/unscheduled", Cadence: time.Hour, Route: "product"},
		srow("https://other.example.com/x", t0.Add(-time.Hour), time.Hour),
	)
	other := rows[6].Slot()
	mine := schedule.AllSlots()
	mine.Remove(other)
	theirs := schedule.SlotSet{}
	theirs.Add(other)
	settings := allSlots(2 * time.Hour)
	settings.Epoch, settings.Owned = 2, mine
	settings.Peers = []Peer{{Name: "test-shard", URL: "http://10.0.0.1:8080", Owned: mine}, {Name: "shard-b", URL: "http://10.0.0.2:8080", Owned: theirs}}
	if err := e.sh.UpdateSettings(e.ctx, settings); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e.sh.Handler(HandlerOptions{Token: "s3cret"}))
	defer srv.Close()
	ctx := context.Background()
	explain := func(key string) (*shardapi.RowExplanation, error) {
		t.Helper()
		return client.ExplainRow(ctx, srv.Client(), srv.URL, "s3cret", key, false)
	}
	if _, err := explain(rows[1].Key); err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "loading") {
		t.Fatalf("before the load: %v", err)
	}
	e.sh.Walk(e.ctx, true)
	// a steady claim rate: one row claimed (the most overdue) 10 s ago, none since; after 10 s of
	// claims the rate is 1 row / 10 s
	e.clock.Set(t0.Add(-10 * time.Second))
	claimed, err := e.sh.Claim(e.clock.Now(), 1, 10*time.Minute)
	if err != nil || len(claimed) != 1 || claimed[0].Key != rows[0].Key {
		t.Fatalf("claim: %+v %v", claimed, err)
	}
	e.clock.Set(t0)
	// written after the load, its event not applied (the test pumps no events)
	unseen := e.upsert(srow("https://shop.example.com/unseen", t0.Add(-time.Minute), time.Hour))[0]

	check := func(key, state string, want func(x *shardapi.RowExplanation) bool) *shardapi.RowExplanation {
		t.Helper()
		x, err := explain(key)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if x.Key != key || x.State != state || x.Shard != "test-shard" || x.Epoch != 2 || x.Reason == "" || !want(x) {
			b, _ := json.MarshalIndent(x, "", "  ")
			t.Errorf("%s: want state %s, got:\n%s", key, state, b)
		}
		return x
	}
	check(rows[1].Key, shardapi.RowWaiting, func(x *shardapi.RowExplanation) bool {
		// b (30 min late) comes after a (60 min late); the leased row does not count
		return x.Held && x.Owner == "test-shard" && x.OwnerURL == "http://10.0.0.1:8080" && x.Slot == rows[1].Slot() &&
			x.Row.Due != nil && x.Row.Due.Equal(t0.Add(-time.Hour)) && x.Row.Cadence == 3600 && x.Row.Rev == rows[1].Rev &&
			*x.LateSeconds == 3600 && *x.LateRelative == 1 && *x.Score == 1 && x.Lease == nil && x.Fence == nil &&
			x.Rank != nil && x.Rank.Ahead == 0 && x.Rank.Due == 2 && x.Rank.Note == RankNote &&
			x.Estimate != nil && x.Estimate.ClaimRate == 0.1 && x.Estimate.ClaimRateSeconds == 10 && x.Estimate.Method == EstimateMethod &&
			x.Estimate.At != nil && x.Estimate.At.Equal(t0.Add(10*time.Second)) && *x.Estimate.InSeconds == 10
	})
	check(rows[2].Key, shardapi.RowWaiting, func(x *shardapi.RowExplanation) bool {
		// a is ahead; the unseen row is not held
		return x.Rank != nil && x.Rank.Ahead == 1 && x.Estimate.At != nil && x.Estimate.At.Equal(t0.Add(20*time.Second))
	})
	leased := check(rows[0].Key, shardapi.RowLeased, func(x *shardapi.RowExplanation) bool {
		return x.Held && x.Lease != nil && x.Lease.ID == LeaseID(claimed[0].Lease) && x.Lease.Since != nil &&
			x.Lease.Since.Equal(t0.Add(-10*time.Second)) && x.Lease.Expires.Equal(claimed[0].LeaseExpires) && !x.Lease.Completing &&
			x.Rank == nil && x.Estimate != nil && x.Estimate.At == nil && x.Estimate.Why != ""
	})
	token := httpserve.FormatLease(claimed[0].Lease)
	if b, _ := json.Marshal(leased); strings.Contains(string(b), token) {
		t.Errorf("the explanation of a leased row carries its lease token %s: %s", token, b)
	}
	check(rows[3].Key, shardapi.RowNotDue, func(x *shardapi.RowExplanation) bool {
		return x.Held && *x.LateSeconds == -3600 && x.Rank == nil && x.Estimate.At == nil
	})
	check(rows[4].Key, shardapi.RowBeyondWindow, func(x *shardapi.RowExplanation) bool {
		return !x.Held && x.Row.Due != nil && x.Row.Due.Equal(t0.Add(5*time.Hour)) && x.Row.Cadence == 96*3600 &&
			x.LateSeconds == nil && x.Rank == nil && x.Estimate == nil && strings.Contains(x.Reason, "beyond the window")
	})
	check(rows[5].Key, shardapi.RowInvalid, func(x *shardapi.RowExplanation) bool {
		return !x.Held && x.Row.Due == nil && strings.Contains(x.Reason, "due time is absent")
	})
	check(rows[6].Key, shardapi.RowNotOwned, func(x *shardapi.RowExplanation) bool {
		return !x.Held && x.Slot == other && x.Owner == "shard-b" && x.OwnerURL == "http://10.0.0.2:8080" && strings.Contains(x.Reason, "shard-b")
	})
	check(unseen.Key, shardapi.RowNotSeen, func(x *shardapi.RowExplanation) bool {
		return !x.Held && x.Row.Rev == unseen.Rev && strings.Contains(x.Reason, "has not applied")
	})
	// once its event is applied, it waits behind a and b
	e.pumpUntil("the unseen row's event", func() bool { _, held := e.sh.core.HeldRev(unseen.Key); return held })
	check(unseen.Key, shardapi.RowWaiting, func(x *shardapi.RowExplanation) bool { return x.Rank.Ahead == 2 && x.Rank.Due == 3 })

	// a key no row has: 404, with its slot and owner
	_, err = explain("https://shop.example.com/none")
	var se *client.StatusError
	if !asStatus(err, &se) || se.Code != http.StatusNotFound || !strings.Contains(se.Message, "no row has this key") || !strings.Contains(se.Message, "slot") {
		t.Errorf("a key no row has: %v", err)
	}

	// raw requests: the key escaped in the path, the proxied header, bad keys, no token
	for _, tc := range []struct {
		name, path string
		header     string
		code       int
		msg        string
	}{
		{"escaped in the path", "/v1/rows/" + url.PathEscape(rows[1].Key), "Authorization", 200, `"state":"waiting"`},
		{"in the query, proxied header", "/v1/rows?key=" + url.QueryEscape(rows[1].Key), shardapi.ProxiedAuthorizationHeader, 200, `"state":"waiting"`},
		{"no token", "/v1/rows?key=" + url.QueryEscape(rows[1].Key), "", 401, "bearer token"},
		{"empty key in the query", "/v1/rows?key=", "Authorization", 400, "empty key"},
		{"empty key in the path", "/v1/rows/", "Authorization", 400, "empty key"},
		{"no key", "/v1/rows", "Authorization", 400, "give one key"},
		{"two keys", "/v1/rows?key=a&key=b", "Authorization", 400, "give one key"},
		{"path and query", "/v1/rows/a?key=b", "Authorization", 400, "not both"},
		{"over-long key", "/v1/rows?key=" + strings.Repeat("k", schedule.MaxKeyBytes+1), "Authorization", 400, "longer than 2048"},
		{"a NUL byte", "/v1/rows/a%00b", "Authorization", 400, "NUL"},
	} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+tc.path, nil)
		if tc.header != "" {
			req.Header.Set(tc.header, "Bearer s3cret")
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != tc.code || !strings.Contains(string(body), tc.msg) {
			t.Errorf("%s: %d %s, want %d with %q", tc.name, resp.StatusCode, body, tc.code, tc.msg)
		}
	}
}

// asStatus is errors.As for a *client.StatusError.
func asStatus(err error, se **client.StatusError) bool {
	for err != nil {
		if s, ok := err.(*client.StatusError); ok {
			*se = s
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}
