package client_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/client/clienttest"
	"github.com/renderqueue/renderqueue/pkg/client/discovery/kube"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// startAPIServer starts a real kube-apiserver and etcd (envtest) with the RenderQueue CRD.
func startAPIServer(t *testing.T) (*rest.Config, crclient.Client) {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set, so there is no kube-apiserver to watch a RenderQueue on: run `make test` " +
			"or `export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)`")
	}
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "..", "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	if err := rqv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	k, err := crclient.New(cfg, crclient.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cfg, k
}

// publishStatus writes the cluster's running shards into the RenderQueue's status as the
// operator does: name, url and due of each.
func publishStatus(t *testing.T, k crclient.Client, rq *rqv1.RenderQueue, cl *clienttest.Cluster) {
	t.Helper()
	ctx := context.Background()
	if err := k.Get(ctx, crclient.ObjectKeyFromObject(rq), rq); err != nil {
		t.Fatal(err)
	}
	rq.Status.Shards = nil
	for _, s := range cl.Shards() {
		st := s.Keeper.Status(time.Now())
		rq.Status.Shards = append(rq.Status.Shards, rqv1.ShardStatus{Name: s.Name, URL: s.URL, Due: int64(st.Due), State: st.Status})
	}
	rq.Status.CurrentShards = int32(len(rq.Status.Shards))
	if err := k.Status().Update(ctx, rq); err != nil {
		t.Fatal(err)
	}
}

func shardNames(c *client.Client) []string {
	var out []string
	for _, s := range c.Shards() {
		out = append(out, s.Name)
	}
	sort.Strings(out)
	return out
}

// TestDiscoveryRenderQueueFollowsRebalance runs a worker that discovers the shards through a
// RenderQueue on a real API server while the slots are rebalanced from one shard to three and
// then onto one of the new shards alone, its first shard stopped. The status is written as the
// operator writes it. Every due row must be completed exactly once, and the worker must follow
// the shard set without a restart.
func TestDiscoveryRenderQueueFollowsRebalance(t *testing.T) {
	cfg, k := startAPIServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rq := &rqv1.RenderQueue{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec:       rqv1.RenderQueueSpec{Shards: 1, Store: rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "db"}}},
	}
	if err := k.Create(ctx, rq); err != nil {
		t.Fatal(err)
	}

	cl := clienttest.NewCluster(t, clienttest.Options{Token: "t0k"}, "web-shard-0")
	first := overdue("product", 400)
	cl.Upsert(first...)
	clienttest.Eventually(t, "the first rows held", func() bool { return cl.Due() == len(first) })
	publishStatus(t, k, rq, cl)

	d, err := kube.RenderQueue(cfg, "default", "web")
	if err != nil {
		t.Fatal(err)
	}
	// Leases of 5 s: a completion sent to web-shard-0 once it has stopped (below) cannot reach
	// anyone, and its row is rendered again only after its lease ended (the receiver holds the
	// handed-over lease until then) — with the default minute, past the test's waits under load.
	c := newClient(t, client.Options{Discovery: d, Token: "t0k", Batch: 5, Lease: 5 * time.Second})
	var inRender atomic.Int64
	runErr := make(chan error, 1)
	// renders are slow enough that leases are held on the givers while slots move
	go func() {
		runErr <- c.Run(ctx, 6, func(ctx context.Context, it client.Item) (client.Result, error) {
			inRender.Add(1)
			defer inRender.Add(-1)
			select {
			case <-time.After(2 * time.Millisecond):
			case <-ctx.Done():
				return client.Result{}, ctx.Err()
			}
			return client.Result{}, nil
		})
	}()
	clienttest.Eventually(t, "the worker to discover web-shard-0", func() bool { return slices.Equal(shardNames(c), []string{"web-shard-0"}) })
	clienttest.Eventually(t, "the worker to start completing", func() bool { return len(cl.Store().Completions()) > 20 })

	// scale to three: the new shards appear in the status as the operator creates them
	cl.Rebalance(func(phase string) { publishStatus(t, k, rq, cl) }, "web-shard-0", "web-shard-1", "web-shard-2")
	clienttest.Eventually(t, "the worker to discover three shards", func() bool {
		return slices.Equal(shardNames(c), []string{"web-shard-0", "web-shard-1", "web-shard-2"})
	})
	// more work, spread over the three
	second := overdue("category", 400)
	cl.Upsert(second...)
	clienttest.Eventually(t, "rows completed on the new shards", func() bool {
		done := cl.Store().Completions()
		n := 0
		for _, r := range second {
			n += done[r.Key]
		}
		return n > 50
	})
	// down to web-shard-1 alone: web-shard-0 is stopped as soon as its slots moved
	cl.Rebalance(func(phase string) { publishStatus(t, k, rq, cl) }, "web-shard-1")
	publishStatus(t, k, rq, cl)
	clienttest.Eventually(t, "the worker to drop the removed shards", func() bool { return slices.Equal(shardNames(c), []string{"web-shard-1"}) })

	all := append(append([]schedule.Row(nil), first...), second...)
	clienttest.Eventually(t, "every row completed", func() bool {
		done := cl.Store().Completions()
		for _, r := range all {
			if done[r.Key] == 0 {
				return false
			}
		}
		return true
	})
	cancel()
	if err := <-runErr; err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkOnce(t, cl.Store(), all)
	if st := cl.Status(); len(st) != 1 || st[0].Due != 0 || st[0].Leased != 0 {
		t.Fatalf("after the run: %+v", st)
	}
	t.Logf("worker stats: %+v", c.Stats())
}
