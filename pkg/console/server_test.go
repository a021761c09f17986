package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/renderqueue/renderqueue/pkg/console/view"
)

// TestAddToManager runs the console as the operator does: added to a controller-runtime manager,
// reading RenderQueues and Pods from the manager's cache, sampling status.due into its history.
func TestAddToManager(t *testing.T) {
	f := newFixture(t)
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme: k8sClient.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Enabled: true, Listener: ln, Refresh: time.Second, SampleInterval: 200 * time.Millisecond, ShardTimeout: time.Second}
	if err := AddToManager(mgr, o, f.registry.resolve, testr.New(t)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	u := fmt.Sprintf("http://%s/api/v1/queues/%s/web", ln.Addr(), f.ns)
	waitFor(t, 30*time.Second, "the console to serve the queue with sampled history", func() (bool, string) {
		resp, err := http.Get(u)
		if err != nil {
			return false, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		var d view.QueueDetail
		if err := json.NewDecoder(resp.Body).Decode(&d); err != nil {
			return false, fmt.Sprintf("HTTP %d: %v", resp.StatusCode, err)
		}
		last := view.Sample{}
		if len(d.History) > 0 {
			last = d.History[len(d.History)-1]
		}
		return resp.StatusCode == http.StatusOK && d.Due == fixtureWebDue && d.Reachable == 2 && len(d.History) >= 2 &&
				last.Due == fixtureWebDue && last.Known,
			fmt.Sprintf("HTTP %d, due %d, reachable %d, %d samples", resp.StatusCode, d.Due, d.Reachable, len(d.History))
	})

	// Disabled, it adds nothing and binds nothing.
	if err := AddToManager(mgr, Options{BindAddress: "not an address"}, f.registry.resolve, testr.New(t)); err != nil {
		t.Errorf("a disabled console was set up: %v", err)
	}
}
