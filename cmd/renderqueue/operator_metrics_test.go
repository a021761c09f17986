package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// envExec names the variable that makes the test binary run renderqueue with the arguments it
// holds (JSON) instead of the tests.
const envExec = "RENDERQUEUE_TEST_EXEC"

func TestMain(m *testing.M) {
	if args := os.Getenv(envExec); args != "" {
		var argv []string
		if err := json.Unmarshal([]byte(args), &argv); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", envExec, err)
			os.Exit(2)
		}
		os.Exit(run(argv, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// execSelf starts this test binary as `renderqueue args...`; cancelling ctx sends it SIGTERM
// (run stops gracefully on it).
func execSelf(t *testing.T, ctx context.Context, stderr io.Writer, args ...string) *exec.Cmd {
	t.Helper()
	argv, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), envExec+"="+string(argv))
	cmd.Stdout, cmd.Stderr = io.Discard, stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// TestOperatorMetricsPort runs `renderqueue operator` against a real kube-apiserver (envtest)
// and reads its metrics port as Prometheus and KEDA do: /metrics carries the build info and a
// RenderQueue's series, and /scaler/... answers a ServiceAccount token that may get the
// RenderQueue (503 here: no shard runs, so the count is never exact) and refuses one that may not.
func TestOperatorMetricsPort(t *testing.T) {
	env, admin, k8s := startAPIServer(t)
	kubeconfig := writeKubeconfig(t, env, envtest.User{Name: "operator", Groups: []string{"system:masters"}})
	ctx, cancel := context.WithCancel(context.Background())
	const ns = "render"
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns}, Spec: rqv1.RenderQueueSpec{
			Shards: 2, Store: rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "pg", Key: "dsn"}}}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "scaler", Namespace: ns}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "stranger", Namespace: ns}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "scaler", Namespace: ns}, Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{rqv1.Group}, Resources: []string{"renderqueues"}, ResourceNames: []string{"web"}, Verbs: []string{"get"}}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "scaler", Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "scaler"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "scaler", Namespace: ns}}},
	} {
		if err := k8s.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	kube, err := kubernetes.NewForConfig(admin)
	if err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		tr, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	// The operator runs in a process of its own (this test binary re-executed as renderqueue, see
	// TestMain): controller-runtime allows one controller of a name per process, and other tests
	// of this package run the operator too.
	logs := &syncBuffer{}
	op := execSelf(t, ctx, logs, "operator", "--kubeconfig", kubeconfig, "--keeper-image", "renderqueue:test",
		"--metrics-bind-address", addr, "--health-probe-bind-address", "0", "--shard-poll-interval", "200ms")
	t.Cleanup(func() {
		cancel()
		err := op.Wait() // reports the cancellation itself: judge by the exit status
		if op.ProcessState == nil || !op.ProcessState.Success() {
			t.Errorf("the operator did not stop cleanly on SIGTERM: %v\n%s", err, logs.String())
		}
	})

	get := func(path, bearer string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitFor := func(what string, cond func() (bool, string)) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			ok, last := cond()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 60 s; last: %s\noperator log:\n%s", what, last, logs.String())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	waitFor("/metrics with the RenderQueue's series", func() (bool, string) {
		code, body := get("/metrics", "")
		for _, want := range []string{
			`renderqueue_build_info{component="operator"`,
			fmt.Sprintf(`renderqueue_queue_shards_desired{namespace=%q,renderqueue="web"} 2`, ns),
			fmt.Sprintf(`renderqueue_queue_handoffs_started_total{namespace=%q,renderqueue="web"} 0`, ns),
			fmt.Sprintf(`renderqueue_queue_due_exact{namespace=%q,renderqueue="web"} 0`, ns),
			`renderqueue_metrics_api_requests_total{api="scaler"}`,
		} {
			if code != http.StatusOK || !strings.Contains(body, want) {
				return false, fmt.Sprintf("HTTP %d, no %s", code, want)
			}
		}
		return true, ""
	})

	scaler := "/scaler/v1/namespaces/" + ns + "/renderqueues/web"
	waitFor("the scaler endpoint answering 503 while no shard runs", func() (bool, string) {
		code, body := get(scaler, token("scaler"))
		return code == http.StatusServiceUnavailable && strings.Contains(body, `"exact":false`) &&
			!strings.Contains(body, `"due":`), fmt.Sprintf("HTTP %d %s", code, body)
	})
	if code, body := get(scaler, token("stranger")); code != http.StatusForbidden {
		t.Errorf("a token that may not get the RenderQueue: HTTP %d %s", code, body)
	}
	if code, body := get(scaler, ""); code != http.StatusUnauthorized {
		t.Errorf("no token: HTTP %d %s", code, body)
	}
	waitFor("the refusals counted", func() (bool, string) {
		_, body := get("/metrics", "")
		return strings.Contains(body, `renderqueue_metrics_api_request_errors_total{api="scaler",namespace="",reason="forbidden"} 1`) &&
			strings.Contains(body, `renderqueue_metrics_api_request_errors_total{api="scaler",namespace="",reason="unauthenticated"} 1`), body
	})
}
