package controllers

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/policy"
	"github.com/renderqueue/renderqueue/controllers/shardtls"
)

// The suite runs the reconciler in a manager against a real kube-apiserver and etcd (envtest).
// No kubelet runs: a test-side stand-in marks shard Pods Running and Ready with an IP, and
// fakeShards (httptest servers) answer each shard's /v1/status.
const (
	testPollInterval     = 250 * time.Millisecond
	testRebalanceTimeout = 10 * time.Second
	testRetryAfter       = time.Minute
	testImage            = "registry.example/renderqueue:v1"
	// testAllowedImages is the reconciler's --allowed-images.
	testAllowedImages = "registry.example/renderqueue:*"
	// operatorUserName is the user the reconciler runs as.
	operatorUserName = "renderqueue-operator"
)

// shardCASecret is the reconciler's --shard-ca-secret, the name its Role grants.
var shardCASecret = client.ObjectKey{Namespace: "renderqueue-system", Name: "renderqueue-shard-ca"}

var (
	testEnv *envtest.Environment
	cfg     *rest.Config
	// operatorCfg is the reconciler's: the user operatorUserName, with the operator's RBAC.
	operatorCfg *rest.Config
	k8sClient   client.Client
	suiteCtx    context.Context
	fakes       *fakeRegistry
	kubelet     *fakeKubelet
	// mgrCache is the reconciler's cache (what it reads through its client).
	mgrCache cache.Cache
	// testMetrics holds the reconciler's metrics (NewMetrics, NewQueueCollector).
	testMetrics *prometheus.Registry
)

func TestControllers(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set, so there is no kube-apiserver/etcd to run the reconciler " +
			"against: run `make test` (hack/test.sh sets it) or " +
			"`export KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)`")
	}
	RegisterFailHandler(Fail)
	// An Eventually without a timeout of its own waits this long, not Gomega's 1 s: on a loaded
	// 2-core CI machine the API server's answers and the event recorder's client-side throttling
	// (events are sent at a limited rate) take seconds.
	SetDefaultEventuallyTimeout(15 * time.Second)
	RunSpecs(t, "controllers suite (envtest)")
}

// fakeRegistry maps shard Pods to their fake shards; it is the reconciler's ShardURLResolver.
type fakeRegistry struct {
	mu     sync.Mutex
	shards map[string]*fakeShard // namespace/name
}

func (r *fakeRegistry) add(f *fakeShard) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.shards[f.namespace+"/"+f.name] = f
}

func (r *fakeRegistry) resolve(pod *corev1.Pod) (string, error) {
	if pod.Status.PodIP == "" {
		return "", fmt.Errorf("the Pod has no IP yet")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.shards[pod.Namespace+"/"+pod.Name]
	if !ok {
		return "", fmt.Errorf("no fake shard for %s/%s", pod.Namespace, pod.Name)
	}
	return f.srv.URL, nil
}

func (r *fakeRegistry) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range r.shards {
		f.srv.Close()
	}
}

// fakeKubelet marks shard Pods Running and Ready with an IP, as a kubelet would once their
// readiness probe passes, except the Pods a test holds (whose status the test writes).
type fakeKubelet struct {
	c client.Client
	// every is how often it looks at the Pods; 50 ms when zero.
	every time.Duration

	mu   sync.Mutex
	held map[string]bool // namespace/name
}

// hold stops the kubelet from touching the Pod namespace/name (present or future).
func (k *fakeKubelet) hold(namespace, name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.held == nil {
		k.held = map[string]bool{}
	}
	k.held[namespace+"/"+name] = true
}

// release undoes hold.
func (k *fakeKubelet) release(namespace, name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.held, namespace+"/"+name)
}

func (k *fakeKubelet) isHeld(p *corev1.Pod) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.held[p.Namespace+"/"+p.Name]
}

func (k *fakeKubelet) run(ctx context.Context) {
	every := k.every
	if every <= 0 {
		every = 50 * time.Millisecond
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var pods corev1.PodList
		if err := k.c.List(ctx, &pods, client.HasLabels{rqv1.LabelQueue}); err != nil {
			continue
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			if policy.PodReady(p) || p.DeletionTimestamp != nil || k.isHeld(p) {
				continue
			}
			n++
			p.Status.Phase = corev1.PodRunning
			p.Status.PodIP = fmt.Sprintf("10.0.%d.%d", n/250, n%250+1)
			p.Status.Conditions = []corev1.PodCondition{{
				Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now(),
			}}
			_ = k.c.Status().Update(ctx, p) // a conflict is retried on the next tick
		}
	}
}

var _ = BeforeSuite(func() {
	logf.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(GinkgoWriter, nil)))
	var cancel context.CancelFunc
	suiteCtx, cancel = context.WithCancel(context.Background())

	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(rqv1.AddToScheme(scheme)).To(Succeed())

	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	var err error
	cfg, err = testEnv.Start()
	// registered first, so it runs last, and before any check that could fail and leave etcd and
	// kube-apiserver running
	DeferCleanup(func() { Expect(testEnv.Stop()).To(Succeed()) })
	Expect(err).NotTo(HaveOccurred())

	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	fakes = &fakeRegistry{shards: map[string]*fakeShard{}}
	kubelet = &fakeKubelet{c: k8sClient}

	// The reconciler runs as a user holding exactly the operator's RBAC (config/rbac/role.yaml,
	// bound cluster-wide as config/rbac does), so every test also shows that RBAC is enough.
	operatorCfg = operatorUser(filepath.Join("..", "config", "rbac", "role.yaml"))
	mgr, err := ctrl.NewManager(operatorCfg, ctrl.Options{
		Scheme:  scheme,
		Cache:   CacheOptions(), // as the operator runs it
		Metrics: metricsserver.Options{BindAddress: "0"},
	})
	Expect(err).NotTo(HaveOccurred())
	mgrCache = mgr.GetCache()
	rec := &RenderQueueReconciler{
		Client:              mgr.GetClient(),
		Scheme:              mgr.GetScheme(),
		Recorder:            mgr.GetEventRecorder("renderqueue-operator"),
		KeeperImage:         testImage,
		PollInterval:        testPollInterval,
		PollTimeout:         time.Second,
		RebalanceTimeout:    testRebalanceTimeout,
		RebalanceRetryAfter: testRetryAfter,
		ResolveShardURL:     fakes.resolve,
		APIReader:           mgr.GetAPIReader(),
		ShardCA: &shardtls.CAStore{Reader: mgr.GetAPIReader(), Writer: mgr.GetClient(), Secret: shardCASecret,
			Log: logf.Log.WithName("shard-ca")},
	}
	rec.AllowedImages, err = policy.ParseImageAllowlist([]string{testAllowedImages})
	Expect(err).NotTo(HaveOccurred())
	testMetrics = prometheus.NewPedanticRegistry()
	rec.Metrics, err = NewMetrics(testMetrics)
	Expect(err).NotTo(HaveOccurred())
	testMetrics.MustRegister(NewQueueCollector(mgr.GetClient(), mgr.Elected()))
	Expect(rec.SetupWithManager(mgr)).To(Succeed())

	var wg sync.WaitGroup
	wg.Go(func() {
		defer GinkgoRecover()
		Expect(mgr.Start(suiteCtx)).To(Succeed())
	})
	wg.Go(func() { kubelet.run(suiteCtx) })

	DeferCleanup(func() {
		cancel()
		wg.Wait()
		fakes.closeAll()
	})
})

// operatorUser creates the objects of the RBAC manifest rolePath (the operator's ClusterRole and
// its leader-election Role), binds the ClusterRole cluster-wide to the user operatorUserName
// (and the Role in its namespace) and returns that user's client configuration.
func operatorUser(rolePath string) *rest.Config {
	GinkgoHelper()
	user, err := bindOperatorUser(suiteCtx, testEnv, k8sClient, rolePath)
	Expect(err).NotTo(HaveOccurred())
	return user
}

// bindOperatorUser is operatorUser against env, creating the objects with c (an admin's client);
// it is shared with the benchmarks, which run outside the Ginkgo suite.
func bindOperatorUser(ctx context.Context, env *envtest.Environment, c client.Client, rolePath string) (*rest.Config, error) {
	data, err := os.ReadFile(rolePath)
	if err != nil {
		return nil, fmt.Errorf("reading the operator's RBAC: %w", err)
	}
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: operatorUserName}}
	for _, doc := range strings.Split(string(data), "\n---") {
		if strings.TrimSpace(strings.Trim(doc, "-")) == "" {
			continue
		}
		var u unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", rolePath, err)
		}
		if ns := u.GetNamespace(); ns != "" {
			if err := client.IgnoreAlreadyExists(c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})); err != nil {
				return nil, fmt.Errorf("creating the namespace %s: %w", ns, err)
			}
		}
		if err := c.Create(ctx, &u); err != nil {
			return nil, fmt.Errorf("creating the %s %s: %w", u.GetKind(), u.GetName(), err)
		}
		ref := rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: u.GetKind(), Name: u.GetName()}
		meta := metav1.ObjectMeta{Name: u.GetName(), Namespace: u.GetNamespace()}
		var binding client.Object
		switch u.GetKind() {
		case "ClusterRole":
			binding = &rbacv1.ClusterRoleBinding{ObjectMeta: meta, RoleRef: ref, Subjects: subjects}
		case "Role":
			binding = &rbacv1.RoleBinding{ObjectMeta: meta, RoleRef: ref, Subjects: subjects}
		default:
			return nil, fmt.Errorf("%s holds a %s", rolePath, u.GetKind())
		}
		if err := c.Create(ctx, binding); err != nil {
			return nil, fmt.Errorf("binding the %s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	user, err := env.AddUser(envtest.User{Name: operatorUserName}, nil)
	if err != nil {
		return nil, fmt.Errorf("adding the user %s: %w", operatorUserName, err)
	}
	return user.Config(), nil
}

func readAll(r io.Reader) string {
	b, err := io.ReadAll(r)
	Expect(err).NotTo(HaveOccurred())
	return string(b)
}
