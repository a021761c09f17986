package v1alpha1_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// The suite runs the generated CRD in a real kube-apiserver and etcd (envtest), so the defaults,
// CEL rules, printer columns and subresources are checked by the API server itself.
var (
	testEnv   *envtest.Environment
	k8sClient client.Client
	ctx       context.Context
	cancel    context.CancelFunc
)

func TestAPI(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set, so there is no kube-apiserver/etcd to validate the CRD " +
			"against: run `make test` (hack/test.sh sets it) or " +
			"`export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)`")
	}
	RegisterFailHandler(Fail)
	RunSpecs(t, "api/v1alpha1 CRD suite (envtest)")
}

var _ = BeforeSuite(func() {
	ctx, cancel = context.WithCancel(context.Background())

	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(rqv1.AddToScheme(scheme)).To(Succeed())

	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	cfg, err := testEnv.Start()
	// registered before the start is checked: a start that fails half way (a CRD the API server
	// refuses) leaves etcd and kube-apiserver running otherwise
	DeferCleanup(func() {
		cancel()
		Expect(testEnv.Stop()).To(Succeed())
	})
	Expect(err).NotTo(HaveOccurred())

	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
})
