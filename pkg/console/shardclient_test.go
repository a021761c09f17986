package console

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/console/view"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestShardClient: with HandlerOptions.ShardClient, each RenderQueue's shards are asked with the
// client it gives for that queue (the operator's: TLS shards verified with their CA), and a queue
// it has no client for shows that on every shard.
func TestShardClient(t *testing.T) {
	f := newFixture(t)
	var mu sync.Mutex
	var asked []string
	fail := errors.New("no CA for this queue")
	h, err := newHandler(HandlerOptions{
		Reader: k8sClient, ShardURL: f.registry.resolve, ShardTimeout: time.Second,
		History: f.history, SampleInterval: 10 * time.Second, Now: func() time.Time { return f.now },
		ShardClient: func(_ context.Context, rq *rqv1.RenderQueue) (*http.Client, error) {
			mu.Lock()
			asked = append(asked, rq.Name)
			n := len(asked)
			mu.Unlock()
			if n > 1 {
				return nil, fail
			}
			return &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				return nil, errors.New("asked through the queue's client")
			})}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"asked through the queue's client", "no client for the shards: no CA for this queue"} {
		code, _, body := get(t, h, "/api/v1/queues/"+f.ns+"/web")
		if code != http.StatusOK {
			t.Fatalf("GET = %d\n%s", code, body)
		}
		var d view.QueueDetail
		if err := json.Unmarshal([]byte(body), &d); err != nil {
			t.Fatal(err)
		}
		if d.Reachable != 0 || !strings.Contains(d.Shard[0].Error, want) || !strings.Contains(d.Shard[1].Error, want) {
			t.Errorf("reachable %d, shard errors %q, %q; want %q", d.Reachable, d.Shard[0].Error, d.Shard[1].Error, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 2 || asked[0] != "web" {
		t.Errorf("ShardClient asked for %v, want web once per page", asked)
	}
}
