package keeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/renderqueue/renderqueue/pkg/keeper/core"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/store"
)

// gatedStore holds each Complete until the test lets it go on: entered receives one value when
// a Complete has been called, and the error sent on proceed decides it (nil: the real write).
type gatedStore struct {
	store.Store
	entered chan struct{}
	proceed chan error
}

func newGatedStore(st store.Store) *gatedStore {
	return &gatedStore{Store: st, entered: make(chan struct{}, 1), proceed: make(chan error)}
}

func (g *gatedStore) Complete(ctx context.Context, items []store.Completion) ([]store.CompleteResult, error) {
	g.entered <- struct{}{}
	if err := <-g.proceed; err != nil {
		return nil, err
	}
	return g.Store.Complete(ctx, items)
}

// storedRev reads key's rev and due time from the database.
func storedRev(t *testing.T, e *shardEnv, key string) (rev int64, due time.Time) {
	t.Helper()
	if err := e.st.Pool().QueryRow(e.ctx, `SELECT rev, due_at FROM render_schedule WHERE key = $1`, key).Scan(&rev, &due); err != nil {
		t.Fatal(err)
	}
	return rev, due.UTC()
}

// TestNoHandOutWhileCompletionInFlight: a completion accepted 1 ms before its lease ends, whose
// group commit is held across the lease's end, keeps the row from every other worker — a claim
// after the lease's end does not get it, and a release of the lease is refused — until the write
// resolves; then the answer matches SQL: written and acknowledged (the row is due again later),
// or refused and not written (the row is claimable again at once, its lease having lapsed).
func TestNoHandOutWhileCompletionInFlight(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fail  error // what the held group commit ends with (nil: written)
		write bool
	}{
		{"written", nil, true},
		{"refused", errors.New("injected: the group commit failed"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newShardEnv(t, allSlots(24*time.Hour))
			row := e.upsert(srow("https://example.com/inflight", t0.Add(-time.Hour), time.Hour))[0]
			gate := newGatedStore(e.st)
			sh, err := NewShard(Options{Name: "inflight", Store: gate, Clock: e.clock.Now, Log: logr.Discard()}, allSlots(24*time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			if rep := sh.Walk(e.ctx, true); rep.Failed {
				t.Fatal(rep.Err)
			}
			claimed, err := sh.Claim(e.clock.Now(), 1, time.Minute)
			if err != nil || len(claimed) != 1 {
				t.Fatal(claimed, err)
			}
			lease := claimed[0].Lease
			e.clock.Set(t0.Add(time.Minute - time.Millisecond))
			type outcome struct {
				errs []error
				err  error
			}
			done := make(chan outcome, 1)
			go func() {
				errs, err := sh.Complete(e.ctx, []CompleteItem{{Key: row.Key, Lease: lease}})
				done <- outcome{errs, err}
			}()
			<-gate.entered
			// the lease ends while the write is in flight
			after := t0.Add(2 * time.Minute)
			e.clock.Set(after)
			if got, err := sh.Claim(after, 10, time.Minute); err != nil || len(got) != 0 {
				t.Fatalf("claimed %d rows (%v) after the lease's end, while its completion is written", len(got), err)
			}
			if errs, _ := sh.Release(after, []CompleteItem{{Key: row.Key, Lease: lease}}); !errors.Is(errs[0], core.ErrCompletionInFlight) {
				t.Fatalf("releasing the lease during its completion: %v, want ErrCompletionInFlight", errs[0])
			}
			if errs, err := sh.Complete(e.ctx, []CompleteItem{{Key: row.Key, Lease: lease}}); err != nil || !errors.Is(errs[0], core.ErrCompletionInFlight) {
				t.Fatalf("completing again during the completion: %v %v, want ErrCompletionInFlight", errs, err)
			}
			if st := sh.Status(after); st.Leased != 1 {
				t.Fatalf("leased during the write: %d, want 1", st.Leased)
			}
			gate.proceed <- tc.fail
			out := <-done
			rev, due := storedRev(t, e, row.Key)
			if tc.write {
				if out.err != nil || out.errs[0] != nil {
					t.Fatalf("the held completion: %v %v", out.errs, out.err)
				}
				if rev == row.Rev || !due.After(after) {
					t.Fatalf("acknowledged, but SQL has rev %d (claimed %d) due %v", rev, row.Rev, due)
				}
				if got, _ := sh.Claim(after, 10, time.Minute); len(got) != 0 {
					t.Fatalf("claimed %q after its completion was written (due %v)", got[0].Key, due)
				}
			} else {
				if out.err == nil {
					t.Fatalf("the failed completion was answered %v", out.errs)
				}
				if rev != row.Rev || !due.Equal(row.Due) {
					t.Fatalf("refused, but SQL has rev %d (claimed %d) due %v (was %v)", rev, row.Rev, due, row.Due)
				}
				got, _ := sh.Claim(after, 10, time.Minute)
				if len(got) != 1 || got[0].Key != row.Key {
					t.Fatalf("after the refused completion (lease lapsed): claimed %v, want the row", got)
				}
			}
		})
	}
}

// TestNoHandOutThroughPostgreSQLStall is TestNoHandOutWhileCompletionInFlight through the HTTP
// API and a real stall: the row's lock is held by another transaction, so the group commit's
// UPDATE waits in PostgreSQL across the lease's end. Claims get nothing and a release is refused
// per item; when the lock goes, the completion is acknowledged and written; when instead the
// write's connections are killed (its first attempt and the store's one retry), it is answered
// 503, nothing is written, and the row is claimable again.
func TestNoHandOutThroughPostgreSQLStall(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write bool
	}{{"written", true}, {"refused", false}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newShardEnv(t, allSlots(24*time.Hour))
			row := e.upsert(srow("https://example.com/stall", t0.Add(-time.Hour), time.Hour))[0]
			sh, err := NewShard(Options{Name: "stall", Store: e.st, Clock: e.clock.Now, Log: logr.Discard()}, allSlots(24*time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			if rep := sh.Walk(e.ctx, true); rep.Failed {
				t.Fatal(rep.Err)
			}
			srv := httptest.NewServer(sh.Handler(HandlerOptions{Token: "t"}))
			t.Cleanup(srv.Close) // after the row lock goes (a failure leaves the completion waiting on it)
			code, b := postJSON(t, srv.URL, "/v1/claim", `{"n":1,"leaseSeconds":60}`)
			var cr shardapi.ClaimResponse
			if code != 200 || json.Unmarshal(b, &cr) != nil || len(cr.Items) != 1 {
				t.Fatalf("claim: %d %s", code, b)
			}
			item := fmt.Sprintf(`{"items":[{"key":%q,"lease":%q}]}`, row.Key, cr.Items[0].Lease)
			e.clock.Set(t0.Add(time.Minute - time.Millisecond))

			release := lockRow(t, e, row.Key)
			defer release()
			type reply struct {
				code int
				body []byte
			}
			done := make(chan reply, 1)
			go func() {
				code, b := postJSON(t, srv.URL, "/v1/complete", item)
				done <- reply{code, b}
			}()
			eventually(t, "the completion's UPDATE to wait on the row lock", 20*time.Second, func() bool {
				var n int
				if err := e.st.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
					AND wait_event_type = 'Lock' AND query LIKE 'UPDATE render_schedule AS r SET due_at%'`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n > 0
			})
			e.clock.Set(t0.Add(2 * time.Minute)) // the lease has ended; its completion waits in PostgreSQL
			code, b = postJSON(t, srv.URL, "/v1/claim", `{"n":10}`)
			if code != 200 || json.Unmarshal(b, &cr) != nil || len(cr.Items) != 0 {
				t.Fatalf("claim during the stalled completion, after the lease's end: %d %s", code, b)
			}
			code, b = postJSON(t, srv.URL, "/v1/release", item)
			var rr shardapi.ReleaseResponse
			if code != 200 || json.Unmarshal(b, &rr) != nil || rr.Released != 0 || !strings.Contains(rr.Results[0].Error, "being written") {
				t.Fatalf("release during the stalled completion: %d %s", code, b)
			}
			if tc.write {
				release()
			} else {
				killBlockedWrite(t, e) // the first attempt
				killBlockedWrite(t, e) // the store's retry
				release()
			}
			r := <-done
			rev, due := storedRev(t, e, row.Key)
			code, b = postJSON(t, srv.URL, "/v1/claim", `{"n":10}`)
			if code != 200 || json.Unmarshal(b, &cr) != nil {
				t.Fatalf("claim after the completion: %d %s", code, b)
			}
			if tc.write {
				var res shardapi.CompleteResponse
				if r.code != 200 || json.Unmarshal(r.body, &res) != nil || res.Completed != 1 {
					t.Fatalf("the stalled completion: %d %s", r.code, r.body)
				}
				if rev == row.Rev || !due.After(t0.Add(2*time.Minute)) || len(cr.Items) != 0 {
					t.Fatalf("acknowledged: SQL rev %d (claimed %d) due %v; claimed after it: %+v", rev, row.Rev, due, cr.Items)
				}
			} else {
				if r.code != 503 {
					t.Fatalf("the killed completion: %d %s", r.code, r.body)
				}
				if rev != row.Rev || !due.Equal(row.Due) || len(cr.Items) != 1 || cr.Items[0].Key != row.Key {
					t.Fatalf("refused: SQL rev %d (claimed %d) due %v; claimed after it: %+v", rev, row.Rev, due, cr.Items)
				}
			}
		})
	}
}
