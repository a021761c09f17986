package main

import (
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// startAPIServer starts a real kube-apiserver (envtest) with the RenderQueue CRD for a command's
// test, stopped when t ends (skipping t without KUBEBUILDER_ASSETS), and returns it, its admin
// configuration and a client of it that knows the RenderQueue types.
func startAPIServer(t *testing.T) (*envtest.Environment, *rest.Config, client.Client) {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set: run `make test` or `export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)`")
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := rqv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return env, cfg, admin
}

// writeKubeconfig adds user to env and writes its kubeconfig into a temporary file, whose path it
// returns.
func writeKubeconfig(t *testing.T, env *envtest.Environment, user envtest.User) string {
	t.Helper()
	u, err := env.AddUser(user, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), user.Name+".kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
