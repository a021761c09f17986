package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// The handler, auth and browser tests read RenderQueues and Pods from a real kube-apiserver and
// etcd (envtest), started once for the package when KUBEBUILDER_ASSETS is set. Shards are
// httptest servers answering GET /v1/status with the status a test sets (fakeShard).
var (
	k8sClient client.Client
	restCfg   *rest.Config
)

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return m.Run()
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := rqv1.AddToScheme(scheme); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	cfg, err := env.Start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting envtest: %v\n", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping envtest: %v\n", err)
		}
	}()
	restCfg = cfg
	if k8sClient, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		fmt.Fprintf(os.Stderr, "building a client: %v\n", err)
		return 1
	}
	return m.Run()
}

// needAPIServer skips a test that needs the API server when there is none.
func needAPIServer(t *testing.T) {
	t.Helper()
	if k8sClient == nil {
		t.Skip("KUBEBUILDER_ASSETS is not set, so there is no kube-apiserver/etcd to read RenderQueues from: " +
			"run `make test` (hack/test.sh sets it) or `export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)`")
	}
}

// fakeShard answers GET /v1/status with the status the test sets, or fails as told.
type fakeShard struct {
	srv *httptest.Server

	mu     sync.Mutex
	status shardapi.Status
	fail   int           // HTTP status to fail with; 0: answer
	hang   bool          // never answer (until the request is cancelled)
	raw    string        // answer this body instead of the status
	delay  time.Duration // wait before answering
}

func newFakeShard(t *testing.T, st shardapi.Status) *fakeShard {
	t.Helper()
	f := &fakeShard{status: st}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/status" {
			http.NotFound(w, r)
			return
		}
		f.mu.Lock()
		st, fail, hang, raw, delay := f.status, f.fail, f.hang, f.raw, f.delay
		f.mu.Unlock()
		if hang {
			<-r.Context().Done()
			return
		}
		if delay > 0 {
			time.Sleep(delay)
		}
		if fail != 0 {
			http.Error(w, `{"error":"told to fail"}`, fail)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if raw != "" {
			_, _ = w.Write([]byte(raw))
			return
		}
		_ = json.NewEncoder(w).Encode(st)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeShard) set(fn func(f *fakeShard)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// shardRegistry maps shard Pods to their fake shards: the handler's ShardURLFunc.
type shardRegistry struct {
	mu   sync.Mutex
	urls map[string]string // namespace/pod → base URL
}

func newRegistry() *shardRegistry { return &shardRegistry{urls: map[string]string{}} }

func (r *shardRegistry) add(namespace, pod, url string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.urls[namespace+"/"+pod] = url
}

func (r *shardRegistry) resolve(pod *corev1.Pod) (string, error) {
	if pod.Status.PodIP == "" {
		return "", fmt.Errorf("the Pod has no IP yet")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	u, ok := r.urls[pod.Namespace+"/"+pod.Name]
	if !ok {
		return "", fmt.Errorf("no shard server for %s/%s", pod.Namespace, pod.Name)
	}
	return u, nil
}

// newNamespace creates a namespace of its own for a test.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "prerender-"}}
	if err := k8sClient.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating a namespace: %v", err)
	}
	return ns.Name
}

// createQueue creates a RenderQueue with the given spec.shards and window, then sets its status.
func createQueue(t *testing.T, ns, name string, shards int32, window time.Duration, st rqv1.RenderQueueStatus) *rqv1.RenderQueue {
	t.Helper()
	ctx := context.Background()
	rq := &rqv1.RenderQueue{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: rqv1.RenderQueueSpec{
			Shards: shards, Window: &metav1.Duration{Duration: window},
			Store: rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "renderqueue-db"}},
		},
	}
	if err := k8sClient.Create(ctx, rq); err != nil {
		t.Fatalf("creating RenderQueue %s/%s: %v", ns, name, err)
	}
	setStatus(t, rq, st)
	return rq
}

// setStatus replaces rq's status.
func setStatus(t *testing.T, rq *rqv1.RenderQueue, st rqv1.RenderQueueStatus) {
	t.Helper()
	ctx := context.Background()
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(rq), rq); err != nil {
		t.Fatalf("reading RenderQueue: %v", err)
	}
	st.ObservedGeneration = rq.Generation
	for i := range st.Conditions {
		st.Conditions[i].ObservedGeneration = rq.Generation
	}
	rq.Status = st
	if err := k8sClient.Status().Update(ctx, rq); err != nil {
		t.Fatalf("updating the status of RenderQueue %s: %v", rq.Name, err)
	}
}

// createShardPod creates the Pod of a shard, labelled as the operator labels it, with a Pod IP.
func createShardPod(t *testing.T, ns, queue, name string) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{
			rqv1.LabelQueue: queue, rqv1.LabelShard: name, rqv1.LabelComponent: "keeper"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "keeper", Image: "renderqueue:test"}}},
	}
	if err := k8sClient.Create(ctx, pod); err != nil {
		t.Fatalf("creating Pod %s: %v", name, err)
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP = "10.0.0.7"
	if err := k8sClient.Status().Update(ctx, pod); err != nil {
		t.Fatalf("setting the status of Pod %s: %v", name, err)
	}
}
