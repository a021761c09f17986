package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

func TestOperatorFlagErrors(t *testing.T) {
	t.Setenv("RENDERQUEUE_IMAGE", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--keeper-image (or RENDERQUEUE_IMAGE) is required"},
		{[]string{"--keeper-image", "img:v1", "--shard-poll-interval", "0s"}, "must be positive"},
		{[]string{"--keeper-image", "img:v1", "--max-concurrent-reconciles", "0"}, "must be positive"},
		{[]string{"--keeper-image", "img:v1", "extra"}, "unexpected arguments"},
		{[]string{"--no-such-flag"}, "flag provided but not defined"},
	} {
		var stderr bytes.Buffer
		err := runOperator(context.Background(), tc.args, &bytes.Buffer{}, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("runOperator(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

// TestOperatorMetricsAPIWritesNothing runs `renderqueue operator --metrics-api` against a real
// kube-apiserver (envtest) the way a Pod with a read-only root file system does: $TMPDIR does not
// exist and the working directory must stay empty. The metrics API delegates with the operator's
// own --kubeconfig (read, never copied) and keeps its self-signed certificate in memory.
func TestOperatorMetricsAPIWritesNothing(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set: run `make test` or `export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)`")
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	if _, err := env.Start(); err != nil {
		t.Fatalf("start envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	user, err := env.AddUser(envtest.User{Name: "operator", Groups: []string{"system:masters"}}, nil)
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
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := lis.Addr().(*net.TCPAddr).Port
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}

	workDir := t.TempDir()
	t.Chdir(workDir)
	t.Setenv("TMPDIR", filepath.Join(workDir, "no-such-dir"))
	t.Setenv("HOME", filepath.Join(workDir, "no-such-home"))
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runOperator(ctx, []string{"--keeper-image", "img:v1", "--kubeconfig", kubeconfigPath,
			"--metrics-bind-address", "0", "--health-probe-bind-address", "0",
			"--metrics-api", "--metrics-api-bind-address", "127.0.0.1", "--metrics-api-secure-port", strconv.Itoa(port)},
			io.Discard, &stderr)
	}()
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	url := fmt.Sprintf("https://127.0.0.1:%d/healthz", port)
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-done:
			t.Fatalf("the operator stopped: %v\n%s", err, stderr.String())
		default:
		}
		resp, err := hc.Get(url)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the metrics API did not answer GET %s within 60s (last: %v)\n%s", url, err, stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("operator: %v\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the operator did not stop within 30s")
	}
	entries, err := os.ReadDir(workDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("the operator wrote %s into its working directory", e.Name())
	}
}

// syncBuffer is a bytes.Buffer safe for the operator's logger and the test to share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestKubeconfigFile(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // not in a Pod, whatever runs the test
	home := t.TempDir()
	t.Setenv("HOME", home)
	for _, tc := range []struct {
		name, explicit, env string
		homeFile            bool
		want, wantErr       string
	}{
		{name: "the flag wins", explicit: "/flag/kc", env: "/env/kc", homeFile: true, want: "/flag/kc"},
		{name: "then $KUBECONFIG", env: "/env/kc", homeFile: true, want: "/env/kc"},
		{name: "$KUBECONFIG with empty entries", env: string(filepath.ListSeparator) + "/env/kc", want: "/env/kc"},
		{name: "$KUBECONFIG listing two files", env: "/a" + string(filepath.ListSeparator) + "/b", wantErr: "lists 2 files"},
		{name: "then ~/.kube/config", homeFile: true, want: filepath.Join(home, ".kube", "config")},
		{name: "nothing", want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBECONFIG", tc.env)
			_ = os.RemoveAll(filepath.Join(home, ".kube"))
			if tc.homeFile {
				if err := os.MkdirAll(filepath.Join(home, ".kube"), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(home, ".kube", "config"), []byte("{}"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := kubeconfigFile(tc.explicit)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("kubeconfigFile = %q, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("kubeconfigFile(%q) = %q, %v; want %q", tc.explicit, got, err, tc.want)
			}
		})
	}
}

// TestMetricsAPINamesInOwnNamespace: --metrics-api-cert-secret and --metrics-api-service given as
// bare names (as config/metrics-api gives them) are the operator's namespace's; namespace/name
// stays; a malformed one is refused naming its flag.
func TestMetricsAPINamesInOwnNamespace(t *testing.T) {
	e := &metricsAPIExtension{}
	e.opts.CertSecret, e.opts.Service = "renderqueue-metrics-api-tls", "other/renderqueue-metrics-api"
	if err := e.inNamespace("platform-rq"); err != nil {
		t.Fatal(err)
	}
	if e.opts.CertSecret != "platform-rq/renderqueue-metrics-api-tls" || e.opts.Service != "other/renderqueue-metrics-api" {
		t.Errorf("got %q and %q", e.opts.CertSecret, e.opts.Service)
	}
	e = &metricsAPIExtension{}
	if err := e.inNamespace("platform-rq"); err != nil || e.opts.CertSecret != "" || e.opts.Service != "" {
		t.Errorf("unset flags: %v, %q, %q; want them left unset", err, e.opts.CertSecret, e.opts.Service)
	}
	e.opts.Service = "a/b/c"
	if err := e.inNamespace("platform-rq"); err == nil || !strings.Contains(err.Error(), "--metrics-api-service") {
		t.Errorf("a/b/c: %v, want an error naming --metrics-api-service", err)
	}
}
