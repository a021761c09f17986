package client_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoKubernetesDependencies: a worker that finds its shards by static URLs or DNS links no
// Kubernetes package — pkg/client and pkg/client/discovery import none, directly or not
// (pkg/client/discovery/kube is where client-go comes in).
func TestNoKubernetesDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs go list")
	}
	for _, pkg := range []string{"github.com/renderqueue/renderqueue/pkg/client", "github.com/renderqueue/renderqueue/pkg/client/discovery"} {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		var k8s []string
		deps := strings.Fields(string(out))
		for _, d := range deps {
			if strings.HasPrefix(d, "k8s.io/") || strings.HasPrefix(d, "sigs.k8s.io/") || strings.Contains(d, "/api/v1alpha1") {
				k8s = append(k8s, d)
			}
		}
		if len(k8s) > 0 {
			t.Errorf("%s links %d Kubernetes packages, e.g. %v", pkg, len(k8s), k8s[:min(5, len(k8s))])
		}
		t.Logf("%s: %d packages (go list -deps)", pkg, len(deps))
	}
}
