package statusview

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// fakeShard answers GET /v1/rows as a shard named name would: with reply (or status code with
// an error), counting the requests and checking the token.
func fakeShard(t *testing.T, name string, code int, reply *shardapi.RowExplanation, asked *[]string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*asked = append(*asked, name)
		if r.Header.Get("Authorization") != "Bearer tok" || r.URL.Path != "/v1/rows" || r.URL.Query().Get("key") != "https://a/b?c=1" {
			w.WriteHeader(http.StatusTeapot)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		if code != http.StatusOK {
			_ = json.NewEncoder(w).Encode(shardapi.Error{Error: name + " says no"})
			return
		}
		_ = json.NewEncoder(w).Encode(reply)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestExplainAtFollowsTheOwner: a shard that does not answer is passed over; the first answer
// names the owner of the key's slot, which is asked at its URL; an owner that does not answer
// leaves the first answer, saying so; a 404 stops at once with its message.
func TestExplainAtFollowsTheOwner(t *testing.T) {
	ctx := context.Background()
	var asked []string
	owner := fakeShard(t, "s2", 200, &shardapi.RowExplanation{Shard: "s2", Owner: "s2", Key: "https://a/b?c=1", Slot: 7, Held: true, State: shardapi.RowWaiting}, &asked)
	down := fakeShard(t, "s0", 503, nil, &asked)
	first := fakeShard(t, "s1", 200, &shardapi.RowExplanation{Shard: "s1", Owner: "s2", OwnerURL: owner.URL, Key: "https://a/b?c=1", Slot: 7,
		State: shardapi.RowNotOwned}, &asked)
	ex, err := ExplainAt(ctx, http.DefaultClient, []string{down.URL, first.URL}, "https://a/b?c=1", "tok")
	if err != nil {
		t.Fatal(err)
	}
	if ex.Row.Shard != "s2" || ex.Row.State != shardapi.RowWaiting || strings.Join(asked, ",") != "s0,s1,s2" || len(ex.Hops) != 2 ||
		!strings.Contains(ex.Hops[1], "asked s1 first: slot 7 is s2's") {
		t.Errorf("asked %v, got %+v, hops %q", asked, ex.Row, ex.Hops)
	}

	asked = nil
	owner.Close() // the owner does not answer: the first answer stands, and says so
	ex, err = ExplainAt(ctx, http.DefaultClient, []string{first.URL}, "https://a/b?c=1", "tok")
	if err != nil || ex.Row.Shard != "s1" || len(ex.Hops) != 1 || !strings.Contains(ex.Hops[0], "the owner s2 did not answer") {
		t.Errorf("owner down: %+v, %q, %v", ex.Row, ex.Hops, err)
	}

	asked = nil
	missing := fakeShard(t, "s3", 404, nil, &asked)
	if _, err := ExplainAt(ctx, http.DefaultClient, []string{missing.URL, first.URL}, "https://a/b?c=1", "tok"); err == nil ||
		err.Error() != "s3 says no" || len(asked) != 1 {
		t.Errorf("a 404: %v after asking %v", err, asked)
	}
	if _, err := ExplainAt(ctx, http.DefaultClient, []string{first.URL}, "", "tok"); err == nil || !strings.Contains(err.Error(), "not a valid key: empty key") {
		t.Errorf("an empty key: %v", err)
	}
	if _, err := ExplainAt(ctx, http.DefaultClient, []string{down.URL}, "https://a/b?c=1", "tok"); err == nil || !strings.Contains(err.Error(), "no shard answered") {
		t.Errorf("no shard answering: %v", err)
	}
}

// TestWriteExplained prints a leased row's explanation.
func TestWriteExplained(t *testing.T) {
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	due, since, until := at.Add(-2*time.Hour), at.Add(-30*time.Second), at.Add(4*time.Minute+30*time.Second)
	late, rel, score := 7200.0, 2.0, 4.0
	e := &shardapi.RowExplanation{Shard: "web-shard-1", AsOf: at, Key: "https://shop.example.com/p/1", Slot: 804, Owner: "web-shard-1", Epoch: 3,
		Held: true, State: shardapi.RowLeased, Reason: "leased to a worker 30s ago",
		Row:         shardapi.RowFields{Due: &due, Cadence: 3600, Route: "product", Source: "submitted", Rev: 12},
		LateSeconds: &late, LateRelative: &rel, Score: &score,
		Lease:    &shardapi.RowLease{ID: "sha256:0123456789abcdef", Since: &since, Expires: until},
		Estimate: &shardapi.ClaimEstimate{Why: "leased", ClaimRate: 12.5, ClaimRateSeconds: 60, Method: "rough"}}
	var b strings.Builder
	if err := WriteExplained(&b, Explained{Row: e, Hops: []string{"asked web-shard-0 first: slot 804 is web-shard-1's"}}); err != nil {
		t.Fatal(err)
	}
	want := `key      https://shop.example.com/p/1
shard    web-shard-1, owner of slot 804 (membership epoch 3)
         (asked web-shard-0 first: slot 804 is web-shard-1's)
state    leased, held: leased to a worker 30s ago
row      as held: due 2026-11-29 10:00:00.000Z, cadence 1h, route product, source submitted, rev 12
lateness 2h late (2.00 cadences), score 4.000
lease    sha256:0123456789abcdef, granted 30s ago (2026-11-29 11:59:30.000Z), ends in 4m30s (2026-11-29 12:04:30.000Z)
claim    no estimate: leased (claims: 12.5 rows/s over the last 1m)
         (rough)
as of    2026-11-29 12:00:00.000Z
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}
