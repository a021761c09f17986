package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

// hostIP returns an IPv4 address of this host that the kube-apiserver's Pod proxy dials (a
// global unicast address: not loopback, not link-local), or "" when it has none.
func hostIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}

// TestKubectlExplain runs `kubectl renderqueue explain NAME KEY` (the binary as the kubectl
// plugin) against a real kube-apiserver (envtest) and two real keeper shards of a RenderQueue
// (`renderqueue keeper --renderqueue`, taking their slots from its status) over a real
// PostgreSQL. The shards listen on an address of this host that the API server's Pod proxy
// reaches (their Pods' status.podIP; envtest runs no kubelet, the Pods are objects only), so the
// command goes the way it goes in a cluster: the RenderQueue, the token from its Secret, the
// shards through the Pod proxy with the token in X-Renderqueue-Authorization and the key in the
// query. It answers for a held row in the other shard's slot (one hop to its owner), a leased
// row, a row beyond the window, a key no row has and an invalid key.
func TestKubectlExplain(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set: run `make test` or `export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)`")
	}
	ip := hostIP(t)
	if ip == "" {
		t.Skip("this host has no global unicast IPv4 address for the Pod proxy to dial")
	}
	dsn := pgtest.NewDatabase(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// rows: one of each kind, chosen by the slot the database gives their keys
	st, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var rows []schedule.Row
	for i := range 40 {
		rows = append(rows, schedule.Row{Key: fmt.Sprintf("https://shop.example.com/p/%d", i), Due: now.Add(-time.Hour), HasDue: true,
			Cadence: time.Hour, Route: "product"})
	}
	stored, err := st.Upsert(ctx, rows)
	if err != nil {
		t.Fatal(err)
	}
	const split = 512 // web-shard-0 owns 0-511, web-shard-1 512-1023
	var held, leased, beyond string
	for _, r := range stored {
		switch {
		case r.Slot() >= split && held == "":
			held = r.Key // due an hour ago, in web-shard-1's slot
		case r.Slot() >= split && leased == "":
			leased = r.Key
		case r.Slot() < split && beyond == "":
			beyond = r.Key
		}
	}
	if held == "" || leased == "" || beyond == "" {
		t.Fatalf("40 keys did not cover both shards' slots: %v %v %v", held, leased, beyond)
	}
	if _, err := st.Upsert(ctx, []schedule.Row{
		{Key: leased, Due: now.Add(-5 * time.Hour), HasDue: true, Cadence: time.Hour, Route: "product"}, // web-shard-1's most overdue
		{Key: beyond, Due: now.Add(5 * time.Hour), HasDue: true, Cadence: 96 * time.Hour, Route: "product"},
	}); err != nil {
		t.Fatal(err)
	}

	// the API server, the RenderQueue, its token Secret and its shards' Pods
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "..", "config", "crd", "bases")}, ErrorIfCRDPathMissing: true}
	if _, err := env.Start(); err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	user, err := env.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeconfigPath := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kubeconfigPath) // for the keepers' settings source and the command
	scheme := runtime.NewScheme()
	if err := rqv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	k, err := crclient.New(user.Config(), crclient.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	const token = "explain-test-token-0123456789"
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := k.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "web-api-token", Namespace: "default"},
		Data: map[string][]byte{"token": []byte(token)}}); err != nil {
		t.Fatal(err)
	}
	window := metav1.Duration{Duration: 2 * time.Hour}
	rq := &rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: rqv1.RenderQueueSpec{Shards: 2, Window: &window, Store: rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "db"}}}}
	if err := k.Create(ctx, rq); err != nil {
		t.Fatal(err)
	}
	names := []string{"web-shard-0", "web-shard-1"}
	ports := []int{freePortOn(t, ip), freePortOn(t, ip)}
	for i, name := range names {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "keeper", Image: "renderqueue:test"}}}}
		if err := k.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
		if err := k.Status().Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
		rq.Status.Shards = append(rq.Status.Shards, rqv1.ShardStatus{Name: name, URL: fmt.Sprintf("http://%s:%d", ip, ports[i]), State: "queued", Ready: true})
	}
	rq.Status.Membership = rqv1.MembershipStatus{Epoch: 1, Assignment: []rqv1.ShardSlots{
		{Shard: names[0], Slots: fmt.Sprintf("0-%d", split-1)}, {Shard: names[1], Slots: fmt.Sprintf("%d-1023", split)}}}
	if err := k.Status().Update(ctx, rq); err != nil {
		t.Fatal(err)
	}

	// the two keepers, as the operator starts them (settings and slots from the RenderQueue)
	var logs [2]syncBuffer
	done := make(chan error, 2)
	for i, name := range names {
		args := []string{"--dsn", dsn, "--listen", fmt.Sprintf("%s:%d", ip, ports[i]), "--token-file", tokenFile, "--name", name,
			"--renderqueue", "web", "--namespace", "default", "--state-file", filepath.Join(dir, name+".state"), "--procs", "0"}
		go func() { done <- runKeeper(ctx, args, io.Discard, &logs[i]) }()
	}
	for i := range names {
		waitFor(t, done, &logs[i], names[i]+" ready", func() bool {
			resp, err := http.Get(fmt.Sprintf("http://%s:%d/readyz", ip, ports[i]))
			if err != nil {
				return false
			}
			_ = resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
	// a worker leases web-shard-1's most overdue row
	req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("http://%s:%d/v1/claim", ip, ports[1]), strings.NewReader(`{"n":1,"leaseSeconds":600}`))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var claim shardapi.ClaimResponse
	if err := json.NewDecoder(resp.Body).Decode(&claim); err != nil || len(claim.Items) != 1 || claim.Items[0].Key != leased {
		t.Fatalf("claim: %+v %v", claim, err)
	}
	_ = resp.Body.Close()

	kubectl := func(args ...string) (int, string, string) {
		t.Helper()
		var out, errb bytes.Buffer
		code := run(pluginArgs(append([]string{"/usr/local/bin/kubectl-renderqueue", "explain"}, args...)), &out, &errb)
		return code, out.String(), errb.String()
	}
	// the claim rate counts whole seconds: the estimate comes once the claim's second has passed
	waitFor(t, done, &logs[1], "an estimate of the held row's claim", func() bool {
		_, out, _ := kubectl("web", held, "-n", "default", "--json")
		var x shardapi.RowExplanation
		return json.Unmarshal([]byte(out), &x) == nil && x.Estimate != nil && x.Estimate.At != nil
	})
	for _, tc := range []struct {
		key  string
		want []string
	}{
		{held, []string{"key      " + held, "shard    web-shard-1, owner of slot", "(asked web-shard-0 first: slot", "state    waiting, held: due 1h",
			"rank     ", "claimable due rows", "claim    in about ", "rows/s over the last ", "rough: now + (rows ahead + 1)"}},
		{leased, []string{"shard    web-shard-1, owner of slot", "state    leased, held: leased to a worker", "lease    sha256:", ", granted ", ", ends in ",
			"claim    no estimate: leased"}},
		{beyond, []string{"shard    web-shard-0, owner of slot", "state    beyondWindow, not held: due in 5h", "row      in PostgreSQL: due "}},
	} {
		code, out, errOut := kubectl("web", tc.key, "-n", "default")
		t.Logf("kubectl renderqueue explain web %s:\n%s", tc.key, out)
		if code != 0 {
			t.Errorf("explain %s: exit %d\n%s%s", tc.key, code, out, errOut)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("explain %s: missing %q in:\n%s", tc.key, w, out)
			}
		}
		if strings.Contains(out, claim.Items[0].Lease) {
			t.Errorf("explain %s shows the lease token:\n%s", tc.key, out)
		}
	}
	// --json is the owner's answer as the API has it
	code, out, errOut := kubectl("web", held, "-n", "default", "--json")
	var x shardapi.RowExplanation
	if code != 0 || json.Unmarshal([]byte(out), &x) != nil || x.Shard != "web-shard-1" || x.Owner != "web-shard-1" || x.State != shardapi.RowWaiting ||
		x.Rank == nil || x.Estimate == nil {
		t.Errorf("--json: exit %d\n%s%s", code, out, errOut)
	}
	// a key no row has, and keys that cannot be
	for _, tc := range []struct{ key, want string }{
		{"https://shop.example.com/none", "no row has this key in PostgreSQL (its slot would be"},
		{"", "not a valid key: empty key"},
		{strings.Repeat("k", schedule.MaxKeyBytes+1), "not a valid key: key is 2049 bytes"},
	} {
		code, out, errOut := kubectl("web", tc.key, "-n", "default")
		if code != 1 || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("explain %.40q: exit %d, stdout %q, stderr %q; want exit 1 saying %q", tc.key, code, out, errOut, tc.want)
		}
	}
	// a user with only config/samples/explain-rbac.yaml's Role (get on the RenderQueue, on its
	// token Secret and on pods/proxy) may explain; one without it may not
	for _, obj := range readSampleObjects(t, filepath.Join("..", "..", "config", "samples", "explain-rbac.yaml")) {
		if err := k.Create(ctx, obj); err != nil {
			t.Fatalf("applying the sample %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
	for _, u := range []struct {
		name, group string
		allowed     bool
	}{{"oncall", "prerender-oncall", true}, {"someone", "others", false}} {
		au, err := env.AddUser(envtest.User{Name: u.name, Groups: []string{u.group}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		kc, err := au.KubeConfig()
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, u.name+".kubeconfig")
		if err := os.WriteFile(path, kc, 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := kubectl("web", held, "-n", "default", "--kubeconfig", path)
		switch {
		case u.allowed && (code != 0 || !strings.Contains(out, "state    waiting")):
			t.Errorf("%s, bound to the sample's Role: exit %d\n%s%s", u.name, code, out, errOut)
		case !u.allowed && (code == 0 || !strings.Contains(errOut, "forbidden")):
			t.Errorf("%s, not bound: exit %d\n%s%s", u.name, code, out, errOut)
		}
	}

	// the same through --url, with the token from a file: the owner found by its URL
	var stdout, stderr bytes.Buffer
	if code := run([]string{"explain", "--url", fmt.Sprintf("http://%s:%d", ip, ports[0]), "--token-file", tokenFile, held}, &stdout, &stderr); code != 0 ||
		!strings.Contains(stdout.String(), "shard    web-shard-1, owner of slot") || !strings.Contains(stdout.String(), "state    waiting") {
		t.Errorf("explain --url: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	cancel()
	for range names {
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("keeper: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a keeper did not stop")
		}
	}
}

// readSampleObjects decodes the Kubernetes objects of a YAML file of several documents.
func readSampleObjects(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	dec := yamlutil.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if err == io.EOF {
				return out
			}
			t.Fatalf("%s: %v", path, err)
		}
		if len(u.Object) > 0 {
			out = append(out, &u)
		}
	}
}

// freePortOn returns a TCP port on ip that nothing listens on (just now).
func freePortOn(t *testing.T, ip string) int {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}
