package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	rqclient "github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/console/view"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// DefaultShardTimeout bounds one shard's GET /v1/status made by the console.
const DefaultShardTimeout = 2 * time.Second

// ShardURLFunc returns the base URL ("http://10.0.0.7:8080") of the shard API served by pod, or
// an error saying why the shard cannot be asked (no IP yet).
type ShardURLFunc func(pod *corev1.Pod) (string, error)

// errQueueNotFound is returned by source.queue for a RenderQueue that does not exist.
var errQueueNotFound = errors.New("no such RenderQueue")

// source reads what the console shows: RenderQueues and shard Pods through a controller-runtime
// reader (the operator's cache), and each shard's /v1/status over HTTP.
type source struct {
	reader      client.Reader
	shardURL    ShardURLFunc
	hc          *http.Client
	shardClient ShardClientFunc
	shardToken  ShardTokenFunc
	timeout     time.Duration
}

// ShardClientFunc gives the HTTP client to ask the shards of a RenderQueue with.
type ShardClientFunc func(ctx context.Context, rq *rqv1.RenderQueue) (*http.Client, error)

// queues lists every RenderQueue, sorted by namespace and name.
func (s *source) queues(ctx context.Context) ([]rqv1.RenderQueue, error) {
	var list rqv1.RenderQueueList
	if err := s.reader.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing RenderQueues: %w", err)
	}
	sort.Slice(list.Items, func(i, j int) bool {
		a, b := list.Items[i], list.Items[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	return list.Items, nil
}

// queue reads one RenderQueue; errQueueNotFound when there is none.
func (s *source) queue(ctx context.Context, namespace, name string) (*rqv1.RenderQueue, error) {
	var rq rqv1.RenderQueue
	if err := s.reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &rq); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, errQueueNotFound
		}
		return nil, fmt.Errorf("reading RenderQueue %s/%s: %w", namespace, name, err)
	}
	return &rq, nil
}

// shardNames lists the shards of rq in order: those in its status, then any shard of
// spec.shards the status does not list yet.
func shardNames(rq *rqv1.RenderQueue) []string {
	var names []string
	seen := map[string]bool{}
	for _, sh := range rq.Status.Shards {
		if !seen[sh.Name] {
			seen[sh.Name] = true
			names = append(names, sh.Name)
		}
	}
	for i := 0; i < int(rq.Spec.Shards); i++ {
		if n := rq.ShardName(i); !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	return names
}

// shards asks every shard of rq for its /v1/status, in parallel, each bounded by the timeout. A
// shard that cannot be asked or does not answer gets an error, never a failed page.
func (s *source) shards(ctx context.Context, rq *rqv1.RenderQueue) []view.ShardReport {
	names := shardNames(rq)
	out := make([]view.ShardReport, len(names))
	var pods corev1.PodList
	podErr := s.reader.List(ctx, &pods, client.InNamespace(rq.Namespace), client.MatchingLabels{rqv1.LabelQueue: rq.Name})
	byName := map[string]*corev1.Pod{}
	for i := range pods.Items {
		byName[pods.Items[i].Name] = &pods.Items[i]
	}
	hc, hcErr := s.hc, error(nil)
	if s.shardClient != nil {
		hc, hcErr = s.shardClient(ctx, rq)
	}
	var wg sync.WaitGroup
	for i, name := range names {
		out[i].Name = name
		if hcErr != nil {
			out[i].Err = fmt.Errorf("no client for the shards: %w", hcErr)
			continue
		}
		if podErr != nil {
			out[i].Err = fmt.Errorf("listing the shard Pods: %w", podErr)
			continue
		}
		pod := byName[name]
		switch {
		case pod == nil:
			out[i].Err = errors.New("no Pod")
			continue
		case pod.DeletionTimestamp != nil:
			out[i].Err = errors.New("the Pod is being deleted")
			continue
		}
		base, err := s.shardURL(pod)
		if err != nil {
			out[i].Err = err
			continue
		}
		wg.Go(func() {
			out[i].Status, out[i].Err = fetchShardStatus(ctx, hc, base, name, s.timeout)
		})
	}
	wg.Wait()
	return out
}

// fetchShardStatus is the one place the console asks a shard: GET base/v1/status within timeout,
// checked to come from the shard named name.
func fetchShardStatus(ctx context.Context, hc *http.Client, base, name string, timeout time.Duration) (*shardapi.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return rqclient.GetShardStatus(ctx, hc, base, name)
}
