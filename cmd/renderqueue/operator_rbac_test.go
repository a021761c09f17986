package main

import (
	"context"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// TestOperatorWatchNamespaces runs `renderqueue operator --watch-namespaces watched
// --allowed-images ...` against a real kube-apiserver (envtest) as a user holding the operator's
// ClusterRole (config/rbac/role.yaml) through a RoleBinding in the namespace watched only, as
// config/namespaced installs it: a RenderQueue there is reconciled, one whose image is not
// allowed gets a condition and no Pods, and one in another namespace is not touched.
func TestOperatorWatchNamespaces(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set: run `make test` or `export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)`")
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := rqv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	create := func(obj client.Object) {
		t.Helper()
		if err := admin.Create(ctx, obj); err != nil {
			t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
		}
	}
	for _, ns := range []string{"watched", "unwatched", "renderqueue-system"} {
		create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(data), "\n---") {
		if strings.TrimSpace(strings.Trim(doc, "-")) == "" {
			continue
		}
		var u unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatal(err)
		}
		create(&u)
	}
	create(&rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "renderqueue-operator", Namespace: "watched"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "renderqueue-operator"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "operator"}},
	})
	user, err := env.AddUser(envtest.User{Name: "operator"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfigPath := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}

	queue := func(ns, name, image string) *rqv1.RenderQueue {
		return &rqv1.RenderQueue{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: rqv1.RenderQueueSpec{Shards: 1, Image: image,
				Store: rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "pg", Key: "dsn"}}},
		}
	}
	ours, pinned, denied, theirs := queue("watched", "ours", ""), queue("watched", "pinned", "registry.example/renderqueue:v2"),
		queue("watched", "denied", "evil.example/miner:latest"), queue("unwatched", "theirs", "")
	for _, rq := range []*rqv1.RenderQueue{ours, pinned, denied, theirs} {
		create(rq)
	}

	// the operator runs in a process of its own: runOperator registers its metrics with
	// controller-runtime's global registry, once per process
	var stderr syncBuffer
	op := exec.Command(os.Args[0], "-test.run=^TestOperatorProcess$")
	op.Env = append(os.Environ(), "KUBECONFIG=", "KUBERNETES_SERVICE_HOST=", operatorProcessEnv+"="+strings.Join([]string{
		"--keeper-image", "registry.example/renderqueue:v1", "--kubeconfig", kubeconfigPath,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--shard-poll-interval", "1s",
		"--watch-namespaces", "watched", "--allowed-images", "registry.example/renderqueue:*,mirror.example/*"}, "\n"))
	op.Stdout, op.Stderr = io.Discard, &stderr
	if err := op.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- op.Wait() }()
	defer func() { _ = op.Process.Kill() }()

	reconciled := func(rq *rqv1.RenderQueue) *metav1.Condition {
		var got rqv1.RenderQueue
		if err := admin.Get(ctx, client.ObjectKeyFromObject(rq), &got); err != nil {
			t.Fatal(err)
		}
		return meta.FindStatusCondition(got.Status.Conditions, rqv1.ConditionReconciled)
	}
	pods := func(rq *rqv1.RenderQueue) int {
		var list corev1.PodList
		if err := admin.List(ctx, &list, client.InNamespace(rq.Namespace), client.MatchingLabels{rqv1.LabelQueue: rq.Name}); err != nil {
			t.Fatal(err)
		}
		return len(list.Items)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-done:
			t.Fatalf("the operator stopped: %v\n%s", err, stderr.String())
		default:
		}
		c, d := reconciled(pinned), reconciled(denied)
		if c != nil && c.Status == metav1.ConditionTrue && pods(ours) == 1 && pods(pinned) == 1 && d != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("within 60s: pinned Reconciled %+v with %d Pods, ours %d Pods, denied Reconciled %+v\n%s",
				c, pods(pinned), pods(ours), d, stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}

	if d := reconciled(denied); d.Status != metav1.ConditionFalse || d.Reason != rqv1.ReasonImageNotAllowed ||
		!strings.Contains(d.Message, `spec.image "evil.example/miner:latest" is not among the images the operator runs`) {
		t.Errorf("denied: Reconciled = %+v", d)
	}
	if n := pods(denied); n != 0 {
		t.Errorf("denied has %d shard Pods", n)
	}
	var token corev1.Secret
	if err := admin.Get(ctx, client.ObjectKey{Namespace: "watched", Name: "ours-api-token"}, &token); err != nil {
		t.Errorf("the token Secret of ours: %v", err)
	}
	// the operator reconciled its namespace; the other one it does not even see
	if c := reconciled(theirs); c != nil {
		t.Errorf("theirs, in a namespace the operator does not watch, has a Reconciled condition: %+v", c)
	}
	if n := pods(theirs); n != 0 {
		t.Errorf("theirs, in a namespace the operator does not watch, has %d shard Pods", n)
	}

	if err := op.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("operator: %v\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the operator did not stop within 30s")
	}
}

// operatorProcessEnv carries the arguments of TestOperatorProcess, one a line.
const operatorProcessEnv = "RENDERQUEUE_TEST_OPERATOR_ARGS"

// TestOperatorProcess is `renderqueue operator` in a process of its own, for the tests that run
// one (it does nothing unless operatorProcessEnv is set); SIGTERM stops it.
func TestOperatorProcess(t *testing.T) {
	args := os.Getenv(operatorProcessEnv)
	if args == "" {
		t.Skip("runs only as the operator process of another test")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := runOperator(ctx, strings.Split(args, "\n"), os.Stdout, os.Stderr); err != nil {
		t.Fatal(err)
	}
}

func TestOperatorFlagErrorsHardening(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--keeper-image", "img:v1", "--watch-namespaces", "ok,Not_A_Namespace"}, `--watch-namespaces: "Not_A_Namespace" is not a namespace name`},
		{[]string{"--keeper-image", "img:v1", "--allowed-images", "registry.example/render*"}, `--allowed-images: allowed image "registry.example/render*"`},
	} {
		err := runOperator(context.Background(), tc.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("runOperator(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}
