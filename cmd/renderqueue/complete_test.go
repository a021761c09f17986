package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// TestPluginCompletion runs real kubectl's shell completion (`kubectl __complete renderqueue
// ...`, what bash, zsh and fish ask) with this binary on PATH as kubectl-renderqueue and
// kubectl_complete-renderqueue, against a real API server holding RenderQueues in two
// namespaces: kubectl finds the completion executable and passes its answers on.
func TestPluginCompletion(t *testing.T) {
	env, _, k8s := startAPIServer(t)
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	ctx := context.Background()
	for ns, names := range map[string][]string{"shop": {"web", "webhooks", "batch"}, "mail": {"inbox"}} {
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			rq := &rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: ns},
				Spec: rqv1.RenderQueueSpec{Shards: 1, Store: rqv1.Store{SecretRef: rqv1.SecretKeyRef{Name: "pg", Key: "dsn"}}}}
			if err := k8s.Create(ctx, rq); err != nil {
				t.Fatal(err)
			}
		}
	}
	kubeconfig := writeKubeconfig(t, env, envtest.User{Name: "admin", Groups: []string{"system:masters"}})
	dir := t.TempDir()
	bin := filepath.Join(dir, "renderqueue")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, link := range []string{pluginName, completeName} {
		if err := os.Symlink(bin, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}

	for _, tc := range []struct {
		// args are the words after `kubectl renderqueue`, the last the one being completed.
		args []string
		want []string
	}{
		{[]string{"-n", "shop", ""}, []string{"explain", "batch", "web", "webhooks"}},
		{[]string{"-n", "shop", "we"}, []string{"web", "webhooks"}},
		{[]string{"--namespace", "mail", "explain", ""}, []string{"inbox"}},
		{[]string{"explain", "-n", "mail", "i"}, []string{"inbox"}},
		{[]string{"-n", "m"}, []string{"mail"}},
		{[]string{"-n", "shop", "web", "--js"}, []string{"--json"}},
		{[]string{"-n", "shop", "explain", "web", ""}, nil}, // a KEY: nothing to offer
		{[]string{"-n", "nowhere", ""}, []string{"explain"}},
	} {
		cmd := exec.Command(filepath.Join(assets, "kubectl"), append([]string{"__complete", "renderqueue"}, tc.args...)...)
		cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+kubeconfig)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("kubectl __complete renderqueue %q: %v\n%s", tc.args, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) == 0 || lines[len(lines)-1] != ":4" {
			t.Errorf("kubectl renderqueue %q<TAB>: %q, want the no-file-completion directive :4 last", tc.args, lines)
			continue
		}
		var got []string
		for _, l := range lines[:len(lines)-1] {
			if l != "" && !strings.HasPrefix(l, "Completion ended") {
				got = append(got, strings.SplitN(l, "\t", 2)[0])
			}
		}
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("kubectl renderqueue %q<TAB> offers %q, want %q", tc.args, got, tc.want)
		}
	}
}
