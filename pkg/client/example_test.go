package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/client/clientmetrics"
	"github.com/renderqueue/renderqueue/pkg/client/clienttest"
	"github.com/renderqueue/renderqueue/pkg/client/discovery"
	"github.com/renderqueue/renderqueue/pkg/client/discovery/kube"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// exampleShards starts two real keeper shards holding n overdue rows, for the examples.
func exampleShards(n int) (urls []string, done func() int, stop func()) {
	t := &exampleT{}
	cl := clienttest.NewCluster(t, clienttest.Options{Token: "s3cret"}, "web-shard-0", "web-shard-1")
	rows := make([]schedule.Row, n)
	for i := range rows {
		rows[i] = schedule.Row{Key: fmt.Sprintf("https://shop.example.com/product/%d", i), Due: time.Now().Add(-time.Hour),
			HasDue: true, Cadence: 96 * time.Hour, Route: "product"}
	}
	cl.Upsert(rows...)
	for cl.Due() < n {
		time.Sleep(time.Millisecond)
	}
	return cl.URLs(), func() int { return len(cl.Store().Completions()) }, t.cleanup
}

// exampleT is the clienttest.TB of an example: a failure panics.
type exampleT struct{ cleanups []func() }

func (*exampleT) Helper()                        {}
func (*exampleT) Errorf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }
func (*exampleT) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }
func (e *exampleT) Cleanup(f func())             { e.cleanups = append(e.cleanups, f) }
func (e *exampleT) cleanup() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}

// A render worker: Run keeps up to 8 rows rendering; a nil error completes a row, an error
// releases it (RetryAfter: hands it out again later).
func ExampleClient_Run() {
	urls, completed, stop := exampleShards(50)
	defer stop()

	disc, err := discovery.Static(urls...)
	if err != nil {
		panic(err)
	}
	c, err := client.New(client.Options{Discovery: disc, Token: "s3cret"})
	if err != nil {
		panic(err)
	}
	defer func() { _ = c.Close() }()

	ctx, cancel := context.WithCancel(context.Background())
	var rendered atomic.Int64
	err = c.Run(ctx, 8, func(ctx context.Context, it client.Item) (client.Result, error) {
		if it.Route == "" {
			// an error releases the row; RetryAfter leaves it leased for a while first
			return client.Result{}, client.RetryAfter(errors.New("no template for this route"), time.Minute)
		}
		// ... render it.Key, honouring ctx ...
		if rendered.Add(1) == 50 {
			cancel() // stop: Run completes what was rendered and returns
		}
		return client.Result{}, nil // next render at now + the row's cadence
	})
	fmt.Println("run:", err, "rendered:", rendered.Load(), "completed:", completed())
	// Output: run: <nil> rendered: 50 completed: 50
}

// The low-level calls: claim a batch, then complete, release or extend each row on the shard
// that leased it.
func ExampleClient_Claim() {
	urls, _, stop := exampleShards(3)
	defer stop()
	disc, _ := discovery.Static(urls...)
	c, _ := client.New(client.Options{Discovery: disc, Token: "s3cret"})
	defer func() { _ = c.Close() }()
	ctx := context.Background()

	items, err := c.Claim(ctx, 3)
	if err != nil {
		panic(err)
	}
	// a slow render: keep the first row leased for ten more minutes
	items, errs, err := c.Extend(ctx, items[:1], 10*time.Minute)
	fmt.Println("extended:", err == nil && errs[0] == nil)
	// done: next render in a week instead of the row's cadence
	errs, err = c.Complete(ctx, []client.Completion{{Item: items[0], NextDue: time.Now().Add(7 * 24 * time.Hour)}})
	fmt.Println("completed:", err == nil && errs[0] == nil)
	// completing it again is refused: its lease ended with the first completion
	errs, _ = c.Complete(ctx, []client.Completion{{Item: items[0]}})
	fmt.Println("again:", errors.Is(errs[0], client.ErrLeaseLost))
	// Output:
	// extended: true
	// completed: true
	// again: true
}

// Discovery through the RenderQueue object, with the kubeconfig or the in-cluster config, and
// the worker's metrics on a Prometheus registry.
func Example_renderQueueDiscovery() {
	rules := clientcmd.NewDefaultClientConfigLoadingRules() // $KUBECONFIG, ~/.kube/config; in-cluster without
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		fmt.Println("no Kubernetes configuration:", err != nil)
		return
	}
	disc, err := kube.RenderQueue(cfg, "default", "web")
	if err != nil {
		panic(err)
	}
	metrics, err := clientmetrics.New(prometheus.DefaultRegisterer)
	if err != nil {
		panic(err)
	}
	token, err := os.ReadFile("/var/run/renderqueue/token") // the Secret web-api-token, key "token"
	if err != nil {
		panic(err)
	}
	c, err := client.New(client.Options{Discovery: disc, Token: string(token), Metrics: metrics})
	if err != nil {
		panic(err)
	}
	defer func() { _ = c.Close() }()
	_ = c.Run(context.Background(), 16, func(ctx context.Context, it client.Item) (client.Result, error) {
		return client.Result{}, nil
	})
}
