package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/logkeys"
)

// jsonLines parses every line of out as a JSON object, failing the test on any that is not one.
func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil || m == nil {
			t.Errorf("line %d is not a JSON object: %q", n, sc.Text())
			continue
		}
		for _, k := range []string{"time", "level", "msg"} {
			if _, ok := m[k]; !ok {
				t.Errorf("line %d has no %q: %q", n, k, sc.Text())
			}
		}
		lines = append(lines, m)
	}
	return lines
}

// TestOperatorJSONLogs runs `renderqueue operator --log-format=json --leader-elect --metrics-api`
// against a real kube-apiserver (envtest) until it holds the leader Lease, has reconciled a
// RenderQueue and serves the metrics API, then stops it: every line it wrote to stderr is a JSON
// object — the API server library's klog.Infof lines, client-go's leader election and the
// shutdown included — and the reconciler's lines name the RenderQueue under the keys
// of pkg/logkeys. A command that fails reports its error as a JSON line too.
func TestOperatorJSONLogs(t *testing.T) {
	env, _, admin := startAPIServer(t)
	kubeconfig := writeKubeconfig(t, env, envtest.User{Name: "operator", Groups: []string{"system:masters"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "render"
	rq := &rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns}, Spec: rqv1.RenderQueueSpec{
		Shards: 1, Store: rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "pg", Key: "dsn"}}}}
	for _, obj := range []client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, rq} {
		if err := admin.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := lis.Addr().(*net.TCPAddr).Port
	_ = lis.Close()
	// with the metrics API: the generic API server underneath logs through klog's global functions
	logs := &syncBuffer{}
	op := execSelf(t, ctx, logs, "operator", "--log-format=json", "--kubeconfig", kubeconfig, "--keeper-image", "renderqueue:test",
		"--leader-elect", "--leader-election-namespace", "default", "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--shard-ca-secret", "", "--metrics-api", "--metrics-api-bind-address", "127.0.0.1", "--metrics-api-secure-port", strconv.Itoa(port))
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	serving := func() bool {
		resp, err := hc.Get(fmt.Sprintf("https://127.0.0.1:%d/healthz", port))
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var lease coordinationv1.Lease
		leaderErr := admin.Get(ctx, client.ObjectKey{Namespace: "default", Name: "renderqueue-operator.renderqueue.dev"}, &lease)
		var got rqv1.RenderQueue
		if err := admin.Get(ctx, client.ObjectKeyFromObject(rq), &got); err != nil {
			t.Fatal(err)
		}
		if leaderErr == nil && lease.Spec.HolderIdentity != nil && meta.FindStatusCondition(got.Status.Conditions, rqv1.ConditionReady) != nil &&
			serving() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader Lease, reconciled RenderQueue and serving metrics API within 60 s (lease: %v)\n%s", leaderErr, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel() // SIGTERM
	if err := op.Wait(); op.ProcessState == nil || !op.ProcessState.Success() {
		t.Fatalf("the operator did not stop cleanly: %v\n%s", err, logs.String())
	}

	lines := jsonLines(t, logs.String())
	var klogLine, reconcileLine map[string]any
	for _, l := range lines {
		msg, _ := l["msg"].(string)
		if strings.HasPrefix(msg, "Serving securely on ") {
			klogLine = l
		}
		if l["controller"] == "renderqueue" && l[logkeys.RenderQueue] == rq.Name && l[logkeys.Namespace] == ns && reconcileLine == nil {
			reconcileLine = l
		}
	}
	if klogLine == nil {
		t.Errorf("no JSON line of the API server library's klog.Infof(\"Serving securely on ...\") among %d lines:\n%s", len(lines), logs.String())
	}
	if reconcileLine == nil {
		t.Errorf("no reconciler line with renderqueue=%s namespace=%s:\n%s", rq.Name, ns, logs.String())
	} else if _, dup := reconcileLine["RenderQueue"]; dup {
		t.Errorf("a reconciler line still carries controller-runtime's RenderQueue key: %v", reconcileLine)
	}
	if t.Failed() {
		return
	}

	// a command that fails: its error is a JSON line as well
	cmd := exec.CommandContext(context.Background(), os.Args[0])
	cmd.Env = append(os.Environ(), envExec+`=["operator","--log-format=json","--kubeconfig","`+kubeconfig+`"]`, "RENDERQUEUE_IMAGE=")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil {
		t.Fatal("the operator without --keeper-image ran")
	}
	failed := jsonLines(t, stderr.String())
	if len(failed) == 0 || !strings.Contains(failed[len(failed)-1]["msg"].(string), "--keeper-image") || failed[len(failed)-1]["level"] != "ERROR" {
		t.Errorf("the error of a failing operator: %q", stderr.String())
	}
}

// TestKeeperJSONLogs runs `renderqueue keeper --log-format=json` (a process of its own: the
// logger is the process's) with a DSN it cannot use until it reports the error in /v1/status,
// then stops it: every line it wrote is a JSON object, and its lines about the shard name it under
// the key shard.
func TestKeeperJSONLogs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	logs := &syncBuffer{}
	keeper := execSelf(t, ctx, logs, "keeper", "--log-format=json", "--log-level=debug", "--name", "web-shard-0",
		"--dsn", "postgres://u:pw@db:notaport/x", "--listen", listen, "--insecure-no-auth")
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + listen + "/v1/status")
		if err == nil {
			var st struct {
				Error string `json:"error"`
			}
			ok := json.NewDecoder(resp.Body).Decode(&st) == nil && st.Error != ""
			_ = resp.Body.Close()
			if ok {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no DSN error in /v1/status within 30 s\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if err := keeper.Wait(); keeper.ProcessState == nil || !keeper.ProcessState.Success() {
		t.Fatalf("the keeper did not stop cleanly: %v\n%s", err, logs.String())
	}
	lines := jsonLines(t, logs.String())
	named := false
	for _, l := range lines {
		if l[logkeys.Shard] == "web-shard-0" {
			named = true
		}
	}
	if len(lines) == 0 || !named {
		t.Errorf("no JSON line names the shard under %q:\n%s", logkeys.Shard, logs.String())
	}
}
