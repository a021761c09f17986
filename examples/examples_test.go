// Package examples holds the example render workers (go-worker, a module of its own, and
// python-worker) and this test, which runs each against real keeper shards.
package examples_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/client/clienttest"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// site serves the pages the rows' keys name and counts the fetches; one page fails its first
// fetch (HTTP 500), so a worker must release it and render it again.
type site struct {
	srv   *httptest.Server
	mu    sync.Mutex
	seen  map[string]int
	flaky string
}

func newSite(t *testing.T) *site {
	s := &site{seen: map[string]int{}, flaky: "/p/3"}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.seen[r.URL.Path]++
		n := s.seen[r.URL.Path]
		s.mu.Unlock()
		if r.URL.Path == s.flaky && n == 1 {
			http.Error(w, "try again", http.StatusInternalServerError)
			return
		}
		_, _ = fmt.Fprintf(w, "<html>%s</html>", r.URL.Path)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *site) fetches(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[path]
}

// drain runs a worker process (cmd, its environment still to complete) against two real shards
// holding 40 overdue rows whose keys are pages of a local site, and checks that it renders every
// page and completes every row (the flaky page after a release), and that SIGTERM stops it
// cleanly.
func drain(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	st := newSite(t)
	cl := clienttest.NewCluster(t, clienttest.Options{Token: "s3cret"}, "web-shard-0", "web-shard-1")
	const n = 40
	var rows []schedule.Row
	for i := range n {
		rows = append(rows, schedule.Row{Key: fmt.Sprintf("%s/p/%d", st.srv.URL, i), Due: time.Now().Add(-time.Duration(i+1) * time.Minute),
			HasDue: true, Cadence: time.Hour, Route: "product"})
	}
	cl.Upsert(rows...)
	for deadline := time.Now().Add(10 * time.Second); cl.Due() != n; {
		if time.Now().After(deadline) {
			t.Fatalf("the shards hold %d due rows, want %d", cl.Due(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd.Env = append(os.Environ(), "RENDERQUEUE_SHARDS="+strings.Join(cl.URLs(), ","), "RENDERQUEUE_TOKEN_FILE="+token,
		"CONCURRENCY=4", "METRICS_ADDR=127.0.0.1:0")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			if err := <-exited; err != nil {
				t.Logf("the worker, killed: %v", err)
			}
		}
		if t.Failed() {
			t.Logf("worker output:\n%s", logs.String())
		}
	}()

	for deadline := time.Now().Add(60 * time.Second); cl.Due() != 0; {
		select {
		case err := <-exited:
			t.Fatalf("the worker exited with %d rows due: %v", cl.Due(), err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still due after 60 s", cl.Due())
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := range n {
		path := fmt.Sprintf("/p/%d", i)
		want := 1
		if path == st.flaky {
			want = 2 // failed, released, rendered again
		}
		if got := st.fetches(path); got != want {
			t.Errorf("%s fetched %d times, want %d", path, got, want)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("after SIGTERM the worker exited with %v, want 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the worker did not stop within 30 s of SIGTERM")
	}
}

// TestGoWorker builds examples/go-worker (its own module, the renderqueue module replaced by
// this checkout) and drains a queue with it.
func TestGoWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds a module")
	}
	bin := filepath.Join(t.TempDir(), "go-worker")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = "go-worker"
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build examples/go-worker: %v\n%s", err, out)
	}
	vet := exec.Command("go", "vet", ".")
	vet.Dir = "go-worker"
	if out, err := vet.CombinedOutput(); err != nil {
		t.Errorf("go vet examples/go-worker: %v\n%s", err, out)
	}
	drain(t, exec.Command(bin))
}

// TestPythonWorker drains a queue with examples/python-worker/worker.py (python3, the standard
// library only).
func TestPythonWorker(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on PATH (apt-get install python3-minimal)")
	}
	drain(t, exec.Command(py, filepath.Join("python-worker", "worker.py")))
}
