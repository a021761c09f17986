package config_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/client/discovery/kube"
)

// TestWorkerSampleRBAC applies config/samples/workers to a real API server and checks that its
// ServiceAccount can do what the worker does — discover the shards through the RenderQueue "web"
// (pkg/client/discovery/kube's RenderQueue, a field-selected list and watch) — and nothing more: not
// another RenderQueue, not Pods, not Secrets.
func TestWorkerSampleRBAC(t *testing.T) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set: run `make test` or `export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)`")
	}
	out, err := exec.Command(filepath.Join(assets, "kubectl"), "kustomize", filepath.Join("samples", "workers")).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize config/samples/workers: %v\n%s", err, out)
	}
	for _, want := range []string{"kind: Deployment", "kind: HorizontalPodAutoscaler", "name: renderqueue_due", "--renderqueue=web",
		"secretName: web-api-token", "image: ghcr.io/renderqueue/renderqueue:v0.1.0", "serviceAccountName: render-workers"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("config/samples/workers renders without %q", want)
		}
	}

	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("crd", "bases")}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	admin, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubectl, err := admin.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	rendered := filepath.Join(t.TempDir(), "workers.yaml")
	if err := os.WriteFile(rendered, out, 0o600); err != nil {
		t.Fatal(err)
	}
	if stdout, stderr, err := kubectl.Run("apply", "-n", "default", "-f", rendered); err != nil {
		o, _ := io.ReadAll(stdout)
		e, _ := io.ReadAll(stderr)
		t.Fatalf("applying the worker sample: %v\n%s%s", err, o, e)
	}

	scheme := runtime.NewScheme()
	if err := rqv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	k, err := crclient.New(admin.Config(), crclient.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{"web", "other"} {
		rq := &rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: rqv1.RenderQueueSpec{Shards: 1, Store: rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "db"}}}}
		if err := k.Create(ctx, rq); err != nil {
			t.Fatal(err)
		}
		rq.Status.Shards = []rqv1.ShardStatus{{Name: name + "-shard-0", URL: "http://10.244.0.9:8080", Due: 7}}
		if err := k.Status().Update(ctx, rq); err != nil {
			t.Fatal(err)
		}
	}

	sa := rest.CopyConfig(cfg)
	sa.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:default:render-workers"}
	// the worker's discovery works with the sample's rights
	d, err := kube.RenderQueue(sa, "default", "web")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan []client.Shard, 4)
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() { _ = d.Run(dctx, func(s []client.Shard) { got <- s }) }()
	select {
	case s := <-got:
		if len(s) != 1 || s[0].Name != "web-shard-0" || s[0].URL != "http://10.244.0.9:8080" || s[0].Due != 7 {
			t.Fatalf("discovered %+v", s)
		}
	case <-dctx.Done():
		t.Fatal("the worker's ServiceAccount could not discover the shards of renderqueue web")
	}
	// and nothing beyond
	cs, err := kubernetes.NewForConfig(sa)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing Pods as the worker: %v, want forbidden", err)
	}
	if _, err := cs.CoreV1().Secrets("default").Get(ctx, "web-api-token", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("reading the token Secret as the worker: %v, want forbidden", err)
	}
	saClient, err := crclient.New(sa, crclient.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := saClient.Get(ctx, crclient.ObjectKey{Namespace: "default", Name: "other"}, &rqv1.RenderQueue{}); !apierrors.IsForbidden(err) {
		t.Errorf("reading another RenderQueue as the worker: %v, want forbidden", err)
	}
	var list rqv1.RenderQueueList
	if err := saClient.List(ctx, &list, crclient.InNamespace("default")); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "forbidden") {
		t.Errorf("listing every RenderQueue as the worker: %v, want forbidden", err)
	}
}
