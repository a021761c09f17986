package controllers

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/policy"
	"github.com/renderqueue/renderqueue/controllers/specs"
	rqclient "github.com/renderqueue/renderqueue/pkg/client"
)

// DefaultShardPollTimeout bounds one GET /v1/status of a shard.
const DefaultShardPollTimeout = 2 * time.Second

// ShardURLResolver returns the base URL ("http://10.0.0.7:8080") of the shard served by pod.
// It fails when the shard cannot be asked yet (no Pod IP).
type ShardURLResolver func(pod *corev1.Pod) (string, error)

// PodIPResolver is the default ShardURLResolver: http://<pod IP>:8080, an IPv6 address in
// brackets (http://[fd00::7]:8080); https:// for a Pod labelled renderqueue.dev/tls=true (its
// keeper serves HTTPS: spec.tls OperatorIssued when it was created).
func PodIPResolver(pod *corev1.Pod) (string, error) {
	if pod.Status.PodIP == "" {
		return "", errors.New("the Pod has no IP yet")
	}
	scheme := "http://"
	if pod.Labels[rqv1.LabelTLS] == "true" {
		scheme = "https://"
	}
	return scheme + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(specs.KeeperPort)), nil
}

// pollShards reads every shard's /v1/status in parallel (pkg/client, checked to come from the
// shard asked for), each bounded by timeout. names lists the
// shards in order; pods maps a shard name to its Pod (absent: no Pod). The result is in the order
// of names.
func pollShards(ctx context.Context, hc *http.Client, resolve ShardURLResolver, timeout time.Duration,
	names []string, pods map[string]*corev1.Pod) []policy.ShardReport {
	out := make([]policy.ShardReport, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		out[i] = policy.ShardReport{Name: name, Pod: pods[name]}
		pod := pods[name]
		if pod == nil {
			out[i].Err = errors.New("no Pod")
			continue
		}
		if pod.DeletionTimestamp != nil {
			out[i].Err = errors.New("the Pod is being deleted")
			continue
		}
		base, err := resolve(pod)
		if err != nil {
			out[i].Err = err
			continue
		}
		out[i].Asked, out[i].URL = true, base
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			out[i].Status, out[i].Err = rqclient.GetShardStatus(sctx, hc, base, name)
		})
	}
	wg.Wait()
	return out
}
