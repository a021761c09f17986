//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// stepPlugin runs `kubectl renderqueue web -n default` — the renderqueue binary linked as the
// kubectl plugin kubectl-renderqueue, found by real kubectl on PATH — with the admin kubeconfig.
// The plugin reads the RenderQueue and every shard's /v1/status through the API server's Pod proxy
// (the API server reaches the shard Pods' IPs), so every shard listed in the status must show a
// state, an exactness and a due count read from the shard itself, and the coming-due chart must
// be drawn. The output is logged for `make demo`'s readers. Call it once the queue is Ready.
func (e *env) stepPlugin(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(e.bin, filepath.Join(dir, "kubectl-renderqueue")); err != nil {
		t.Fatalf("linking the plugin: %v", err)
	}
	want := e.queue().Status.Shards
	if len(want) == 0 {
		t.Fatal("the RenderQueue's status lists no shards")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(assets(t), "kubectl"), "renderqueue", queueName, "-n", namespace)
	// the later PATH wins: the plugin's directory first
	cmd.Env = e.c.Env("PATH=" + dir + string(os.PathListSeparator) + os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	t.Logf("kubectl renderqueue %s -n %s:\n%s", queueName, namespace, out)
	if err != nil {
		t.Fatalf("kubectl renderqueue: %v", err)
	}
	text := string(out)
	if !strings.Contains(text, "renderqueue "+namespace+"/"+queueName+":") || !strings.Contains(text, "coming due by hour") {
		t.Fatalf("kubectl renderqueue printed no queue summary or no coming-due chart")
	}
	if strings.Contains(text, " of "+strconv.Itoa(len(want))+" shards") {
		t.Errorf("the chart counts only some shards: a shard could not be read through the Pod proxy")
	}
	for _, s := range want {
		var row []string
		for _, line := range strings.Split(text, "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == s.Name {
				row = f
			}
		}
		switch {
		case row == nil:
			t.Errorf("shard %s is missing from the table", s.Name)
		case len(row) < 4 || row[2] == "-" || row[3] == "-":
			t.Errorf("shard %s was not read through the Pod proxy: %q", s.Name, strings.Join(row, " "))
		case row[1] != "queued" && row[1] != "empty" && row[1] != "unready":
			t.Errorf("shard %s has state %q", s.Name, row[1])
		}
	}
}
