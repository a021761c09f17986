package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// TestCompletionFollowsALeaseThatMovedTwice: a lease that moved with its slot twice before its
// worker completed (two handoffs in a row; the first giver names the owner it knows, which has
// given the slot on) is followed from shard to shard until one accepts it — and never back to a
// shard it was sent to, so shards naming each other cannot loop.
func TestCompletionFollowsALeaseThatMovedTwice(t *testing.T) {
	type shard struct {
		srv   *httptest.Server
		next  func() string // where it says the lease went; "" accepts it
		asked atomic.Int32
	}
	serve := func(s *shard) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			s.asked.Add(1)
			var req shardapi.CompleteRequest
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			resp := shardapi.CompleteResponse{}
			for _, it := range req.Items {
				res := shardapi.ItemResult{Key: it.Key}
				if to := s.next(); to != "" {
					res.Error, res.MovedTo = "the lease moved with its slot", to
				} else {
					resp.Completed++
				}
				resp.Results = append(resp.Results, res)
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(resp)
		}
	}
	var a, b, c, x, y shard
	for _, s := range []*shard{&a, &b, &c, &x, &y} {
		s.srv = httptest.NewServer(serve(s))
		t.Cleanup(s.srv.Close)
	}
	a.next = func() string { return b.srv.URL } // a gave the slot to b ...
	b.next = func() string { return c.srv.URL } // ... which gave it on to c
	c.next = func() string { return "" }
	x.next = func() string { return y.srv.URL } // x and y name each other
	y.next = func() string { return x.srv.URL }

	cl := newClient(t, client.Options{Discovery: static(t, a.srv.URL, b.srv.URL, c.srv.URL, x.srv.URL, y.srv.URL), Token: "t0k"})
	errs, err := cl.Complete(context.Background(), []client.Completion{
		{Item: client.Item{Key: "https://shop.example/moved-twice", Lease: "1", Shard: a.srv.URL}},
		{Item: client.Item{Key: "https://shop.example/loop", Lease: "2", Shard: x.srv.URL}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil {
		t.Errorf("a lease that moved twice: %v, want it completed on the third shard", errs[0])
	}
	if c.asked.Load() != 1 {
		t.Errorf("the shard holding the lease was asked %d times, want 1", c.asked.Load())
	}
	var ie *client.ItemError
	if errs[1] == nil || !errors.As(errs[1], &ie) || ie.MovedTo != x.srv.URL {
		t.Errorf("shards naming each other: %v, want the refusal naming the first shard again", errs[1])
	}
	if x.asked.Load() != 1 || y.asked.Load() != 1 {
		t.Errorf("shards naming each other were asked %d and %d times, want once each", x.asked.Load(), y.asked.Load())
	}
}
