//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// The end-to-end RenderQueue serves its shards' API over HTTPS (spec.tls OperatorIssued): the
// workers, the operator's poll, the console, kubectl renderqueue (through the Pod proxy) and
// Prometheus all reach the shards over TLS, verifying them with the CA the operator publishes.

// overlay writes a kustomization in a temporary directory over the config directory sub (e.g.
// "samples") with the JSON 6902 patches given as target → patch, and returns the directory.
func overlay(t *testing.T, root, sub string, patches map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, filepath.Join(root, "config", sub))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\npatches:\n", filepath.ToSlash(rel))
	for target, patch := range patches {
		fmt.Fprintf(&b, "  - target: {%s}\n    patch: |-\n", target)
		for _, l := range strings.Split(strings.TrimSpace(patch), "\n") {
			fmt.Fprintf(&b, "      %s\n", l)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// samplesWithTLS is config/samples with spec.tls OperatorIssued on the RenderQueue.
func samplesWithTLS(t *testing.T, root string) string {
	return overlay(t, root, "samples", map[string]string{
		"kind: RenderQueue, name: " + queueName: `- {op: add, path: /spec/tls, value: {mode: OperatorIssued}}`,
	})
}

// workersWithTLS is config/samples/workers with the shard CA mounted and --tls-ca-file, as its
// deployment.yaml's comments say.
func workersWithTLS(t *testing.T, root string) string {
	return overlay(t, root, filepath.Join("samples", "workers"), map[string]string{
		"kind: Deployment, name: " + workers: `
- {op: add, path: /spec/template/spec/containers/0/args/-, value: --tls-ca-file=/var/run/renderqueue-ca/ca.crt}
- {op: add, path: /spec/template/spec/containers/0/volumeMounts/-, value: {name: shard-ca, mountPath: /var/run/renderqueue-ca, readOnly: true}}
- {op: add, path: /spec/template/spec/volumes/-, value: {name: shard-ca, configMap: {name: ` + rqv1.ShardCAConfigMapName(queueName) + `}}}`,
	})
}

// checkShardsServeTLS fails the test unless every shard of the queue is listed with an https://
// URL and status.tls records a certificate.
func (e *env) checkShardsServeTLS(t *testing.T) {
	t.Helper()
	rq := e.queue()
	if rq.Status.TLS == nil || rq.Status.TLS.ServerName != rqv1.ShardServerName(namespace, queueName) {
		t.Fatalf("status.tls = %+v, want a certificate for %s", rq.Status.TLS, rqv1.ShardServerName(namespace, queueName))
	}
	for _, s := range rq.Status.Shards {
		if !strings.HasPrefix(s.URL, "https://") {
			t.Errorf("shard %s has the URL %q, want https://", s.Name, s.URL)
		}
	}
	t.Logf("status.tls: %+v", *rq.Status.TLS)
}

// shardCAFile writes the CA bundle the operator publishes for the queue's clients to a file
// under dir and returns its path (for Prometheus's tls_config).
func (e *env) shardCAFile(t *testing.T, dir string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var cm corev1.ConfigMap
	if err := e.k8s.Get(ctx, client.ObjectKey{Namespace: namespace, Name: rqv1.ShardCAConfigMapName(queueName)}, &cm); err != nil {
		t.Fatalf("reading the shard CA ConfigMap: %v", err)
	}
	path := filepath.Join(dir, "shard-ca.crt")
	if err := os.WriteFile(path, []byte(cm.Data[rqv1.ShardCAKey]), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
