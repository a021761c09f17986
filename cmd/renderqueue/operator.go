package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/homedir"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers"
	"github.com/renderqueue/renderqueue/controllers/policy"
	"github.com/renderqueue/renderqueue/controllers/shardtls"
	"github.com/renderqueue/renderqueue/internal/cli"
	"github.com/renderqueue/renderqueue/pkg/buildinfo"
	"github.com/renderqueue/renderqueue/pkg/metricsapi"
)

// operatorExtension is an optional part of the operator with its own flags, started with the
// manager (as manager Runnables) when its flags turn it on.
type operatorExtension interface {
	// Flags registers the extension's flags (its on/off switch among them).
	Flags(fs *flag.FlagSet)
	// Setup adds the extension's Runnables to mgr, or nothing when it is turned off. kubeconfig
	// is the operator's --kubeconfig flag ("" when not given).
	Setup(mgr ctrl.Manager, log logr.Logger, kubeconfig string) error
}

// operatorExtensions lists the optional parts of `renderqueue operator`: the external metrics
// API (renderqueue_due for the HorizontalPodAutoscaler), off unless --metrics-api is given, and
// the web console (console.go), off unless --console is given.
func operatorExtensions() []operatorExtension {
	return []operatorExtension{&metricsAPIExtension{}, &consoleExtension{}}
}

// metricsAPIExtension serves external.metrics.k8s.io (pkg/metricsapi) from the operator.
type metricsAPIExtension struct {
	opts metricsapi.Options
}

// Flags registers --metrics-api and its serving options.
func (e *metricsAPIExtension) Flags(fs *flag.FlagSet) { e.opts.BindFlags(fs) }

// inNamespace qualifies --metrics-api-cert-secret and --metrics-api-service given as bare names
// with ns, the operator's own namespace (pkg/metricsapi takes namespace/name).
func (e *metricsAPIExtension) inNamespace(ns string) error {
	for _, f := range []struct {
		flag string
		v    *string
	}{{"--metrics-api-cert-secret", &e.opts.CertSecret}, {"--metrics-api-service", &e.opts.Service}} {
		if *f.v == "" {
			continue
		}
		n, err := cli.NamespacedName(f.flag, *f.v, ns)
		if err != nil {
			return err
		}
		*f.v = n.String()
	}
	return nil
}

// Setup adds the metrics API server to mgr when --metrics-api is set. Its delegated
// authentication and authorization use the operator's own credentials: the kubeconfig file the
// operator was started with, or in a Pod the in-cluster configuration (unless
// --metrics-api-auth-kubeconfig names another file).
func (e *metricsAPIExtension) Setup(mgr ctrl.Manager, log logr.Logger, kubeconfig string) error {
	if !e.opts.Enabled {
		return nil
	}
	e.opts.Logger = log.WithName("metrics-api")
	if e.opts.AuthKubeconfig == "" {
		path, err := kubeconfigFile(kubeconfig)
		if err != nil {
			return fmt.Errorf("external metrics API: %w", err)
		}
		e.opts.AuthKubeconfig = path
	}
	if err := metricsapi.AddToManager(mgr, e.opts); err != nil {
		return fmt.Errorf("external metrics API: %w", err)
	}
	return nil
}

// defaultShardCASecret is --shard-ca-secret's default: in the operator's own namespace, the name
// its Role grants (config/rbac/role.yaml).
const defaultShardCASecret = "renderqueue-shard-ca"

// operatorOptions are the flags of `renderqueue operator`.
type operatorOptions struct {
	kubeconfig          string
	keeperImage         string
	metricsAddr         string
	metricsSecure       bool
	metricsCertDir      string
	probeAddr           string
	leaderElect         bool
	leaderElectionNS    string
	pollInterval        time.Duration
	pollTimeout         time.Duration
	rebalanceTimeout    time.Duration
	rebalanceRetryAfter time.Duration
	maxReconciles       int
	logs                cli.LogFlags
	watchNamespaces     []string
	allowedImages       []string
	shardCASecret       string
}

// runOperator is `renderqueue operator`: the controller-runtime manager running the RenderQueue
// reconciler, with leader election, Prometheus metrics and health probes.
func runOperator(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("operator", flag.ContinueOnError)
	var o operatorOptions
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then in-cluster)")
	fs.StringVar(&o.keeperImage, "keeper-image", os.Getenv("RENDERQUEUE_IMAGE"),
		"image of shard Pods whose RenderQueue sets no spec.image (default $RENDERQUEUE_IMAGE: the operator's own)")
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8080",
		"address of the Prometheus metrics and of the scaler endpoint "+metricsapi.ScalerPathPrefix+" (0 = off)")
	fs.BoolVar(&o.metricsSecure, "metrics-secure", false,
		"serve the metrics address over HTTPS (a self-signed certificate unless --metrics-cert-dir holds tls.crt and tls.key), "+
			"and /metrics only to callers the API server authenticates and authorizes to get it (the ClusterRole renderqueue-metrics-reader)")
	fs.StringVar(&o.metricsCertDir, "metrics-cert-dir", "", "directory with tls.crt and tls.key for --metrics-secure")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "elect a leader, so that only one replica reconciles")
	fs.StringVar(&o.leaderElectionNS, "leader-election-namespace", "",
		"namespace of the leader election Lease (default: the operator's own: $POD_NAMESPACE, else its service account's, else "+cli.DefaultOwnNamespace+")")
	fs.DurationVar(&o.pollInterval, "shard-poll-interval", controllers.DefaultPollInterval, "how often every shard's /v1/status is polled")
	fs.DurationVar(&o.pollTimeout, "shard-poll-timeout", controllers.DefaultShardPollTimeout, "timeout of one shard's /v1/status")
	fs.DurationVar(&o.rebalanceTimeout, "rebalance-timeout", controllers.DefaultRebalanceTimeout,
		"how long receivers have to report their incoming slots walked before a rebalance rolls back")
	fs.DurationVar(&o.rebalanceRetryAfter, "rebalance-retry-after", controllers.DefaultRebalanceRetryAfter,
		"pause after a rolled back rebalance before it is tried again")
	fs.IntVar(&o.maxReconciles, "max-concurrent-reconciles", controllers.DefaultMaxConcurrentReconciles,
		"how many RenderQueues are reconciled at once (a reconcile waits for its shards' polls)")
	o.logs.Bind(fs, "log reconcile details")
	fs.Func("watch-namespaces", "comma-separated namespaces whose RenderQueues the operator reconciles and where it reads and "+
		"creates their children; its RBAC is then needed only there (config/namespaced). Default: every namespace",
		func(v string) error { o.watchNamespaces = append(o.watchNamespaces, splitList(v)...); return nil })
	fs.Func("allowed-images", "comma-separated keeper images a RenderQueue's spec.image may name: an image reference, or a "+
		"prefix ending in /*, :* or @*; the operator's own --keeper-image is always allowed. Default: any image",
		func(v string) error { o.allowedImages = append(o.allowedImages, splitList(v)...); return nil })
	fs.StringVar(&o.shardCASecret, "shard-ca-secret", defaultShardCASecret,
		"the Secret holding the CA the shards' certificates are issued from (spec.tls OperatorIssued): a name in the operator's "+
			"own namespace, or namespace/name; created when missing. Empty: RenderQueues asking for OperatorIssued TLS are refused")
	exts := operatorExtensions()
	for _, e := range exts {
		e.Flags(fs)
	}
	if err := cli.ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	// the logger first: what follows may log, and klog is routed through it
	log, err := o.logs.Logger(stderr)
	if err != nil {
		return err
	}
	ctrl.SetLogger(log)
	if o.keeperImage == "" {
		return errors.New("--keeper-image (or RENDERQUEUE_IMAGE) is required: the image shard Pods run by default")
	}
	if o.pollInterval <= 0 || o.pollTimeout <= 0 || o.rebalanceTimeout <= 0 || o.rebalanceRetryAfter <= 0 || o.maxReconciles <= 0 {
		return errors.New("--shard-poll-interval, --shard-poll-timeout, --rebalance-timeout, --rebalance-retry-after and " +
			"--max-concurrent-reconciles must be positive")
	}
	for _, ns := range o.watchNamespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return fmt.Errorf("--watch-namespaces: %q is not a namespace name: %s", ns, strings.Join(errs, "; "))
		}
	}
	allowed, err := policy.ParseImageAllowlist(o.allowedImages)
	if err != nil {
		return fmt.Errorf("--allowed-images: %w", err)
	}
	// the operator's own namespace: where its Secrets, Services and Lease are unless a flag names
	// another (so that config/default installed into any namespace works)
	ownNS, ownNSFrom := cli.OwnNamespace()
	if o.leaderElectionNS == "" {
		o.leaderElectionNS = ownNS
	}
	var caSecret types.NamespacedName
	if o.shardCASecret != "" {
		if caSecret, err = cli.NamespacedName("--shard-ca-secret", o.shardCASecret, ownNS); err != nil {
			return err
		}
	}
	for _, e := range exts {
		if m, ok := e.(*metricsAPIExtension); ok {
			if err := m.inNamespace(ownNS); err != nil {
				return err
			}
		}
	}

	cfg, err := cli.RESTConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("building the scheme: %w", err)
	}
	if err := rqv1.AddToScheme(scheme); err != nil {
		return fmt.Errorf("building the scheme: %w", err)
	}
	metricsOpts := metricsserver.Options{BindAddress: o.metricsAddr, SecureServing: o.metricsSecure, CertDir: o.metricsCertDir}
	if o.metricsSecure {
		metricsOpts.FilterProvider = metricsAuthFilter
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   controllers.CacheOptions(o.watchNamespaces...),
		Metrics:                 metricsOpts,
		HealthProbeBindAddress:  o.probeAddr,
		LeaderElection:          o.leaderElect,
		LeaderElectionID:        "renderqueue-operator.renderqueue.dev",
		LeaderElectionNamespace: o.leaderElectionNS,
		Logger:                  log,
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	handoffs, err := setupOperatorMetrics(mgr, ctrlmetrics.Registry, log)
	if err != nil {
		return err
	}
	rec := &controllers.RenderQueueReconciler{
		Client:                  mgr.GetClient(),
		Scheme:                  mgr.GetScheme(),
		Recorder:                mgr.GetEventRecorder("renderqueue-operator"),
		KeeperImage:             o.keeperImage,
		PollInterval:            o.pollInterval,
		PollTimeout:             o.pollTimeout,
		RebalanceTimeout:        o.rebalanceTimeout,
		RebalanceRetryAfter:     o.rebalanceRetryAfter,
		MaxConcurrentReconciles: o.maxReconciles,
		Metrics:                 handoffs,
		AllowedImages:           allowed,
	}
	if caSecret.Name != "" {
		rec.APIReader = mgr.GetAPIReader()
		rec.ShardCA = &shardtls.CAStore{Reader: mgr.GetAPIReader(), Writer: mgr.GetClient(), Secret: caSecret, Log: log.WithName("shard-ca")}
	}
	for _, e := range exts {
		if c, ok := e.(*consoleExtension); ok {
			c.opts.ShardClient = rec.ShardHTTPClient // the console verifies TLS shards as the reconciler does
		}
	}
	if err := rec.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the RenderQueue controller: %w", err)
	}
	for _, e := range exts {
		if err := e.Setup(mgr, log, o.kubeconfig); err != nil {
			return err
		}
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding the health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("adding the readiness check: %w", err)
	}
	log.Info("Operator starting", "keeperImage", o.keeperImage, "leaderElect", o.leaderElect,
		"shardPollInterval", o.pollInterval, "rebalanceTimeout", o.rebalanceTimeout, "maxConcurrentReconciles", o.maxReconciles,
		"watchNamespaces", o.watchNamespaces, "allowedImages", allowed.String(), "shardCASecret", caSecret.String(),
		"namespace", ownNS, "namespaceFrom", ownNSFrom)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running the manager: %w", err)
	}
	return nil
}

// setupOperatorMetrics registers the operator's metrics with reg (controller-runtime's registry,
// which the manager's metrics server serves): renderqueue_build_info, the
// per-RenderQueue gauges (leader only) and the handoff counters it returns for the reconciler;
// and mounts the scaler endpoint for KEDA (pkg/metricsapi) on the manager's metrics server.
func setupOperatorMetrics(mgr ctrl.Manager, reg prometheus.Registerer, log logr.Logger) (*controllers.Metrics, error) {
	for _, c := range []prometheus.Collector{
		buildinfo.NewCollector("operator", buildinfo.Read(version)),
		controllers.NewQueueCollector(mgr.GetClient(), mgr.Elected()),
	} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering the operator metrics: %w", err)
		}
	}
	handoffs, err := controllers.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	requests, err := metricsapi.NewRequestMetrics(reg)
	if err != nil {
		return nil, err
	}
	authn, authz, err := metricsapi.NewDelegatingAuth(mgr.GetConfig())
	if err != nil {
		return nil, err
	}
	scaler, err := metricsapi.NewScalerHandler(metricsapi.ScalerOptions{
		Reader: mgr.GetClient(), Authenticator: authn, Authorizer: authz, Metrics: requests, Log: log.WithName("scaler"),
	})
	if err != nil {
		return nil, err
	}
	if err := mgr.AddMetricsServerExtraHandler(metricsapi.ScalerPathPrefix, scaler); err != nil {
		return nil, fmt.Errorf("serving the scaler endpoint: %w", err)
	}
	return handoffs, nil
}

// metricsAuthFilter is the metrics server's filter with --metrics-secure, as kubebuilder's scaffold
// sets it up: controller-runtime's filters.WithAuthenticationAndAuthorization serves /metrics only
// to callers whose bearer token the API server authenticates (a TokenReview) and who may get the
// path (a SubjectAccessReview of the non-resource URL: the ClusterRole renderqueue-metrics-reader,
// config/rbac/metrics_reader_role.yaml). The operator's own ClusterRole lets it create both
// reviews (the kubebuilder markers in controllers/metrics.go).
//
// The scaler endpoint on the same port (metricsapi.ScalerPathPrefix) is left out: it
// authenticates its callers itself and authorizes them against the RenderQueue they ask about
// (get renderqueues), which is what KEDA's token may do — not get /metrics.
func metricsAuthFilter(cfg *rest.Config, hc *http.Client) (metricsserver.Filter, error) {
	authorize, err := filters.WithAuthenticationAndAuthorization(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("the metrics server's authentication and authorization: %w", err)
	}
	return func(log logr.Logger, h http.Handler) (http.Handler, error) {
		filtered, err := authorize(log, h)
		if err != nil {
			return nil, err
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// the server's mux routes by path: a request under the prefix reaches the scaler
			// handler only
			if strings.HasPrefix(r.URL.Path, metricsapi.ScalerPathPrefix) {
				h.ServeHTTP(w, r)
				return
			}
			filtered.ServeHTTP(w, r)
		}), nil
	}, nil
}

// splitList splits a comma-separated flag value, dropping empty entries.
func splitList(v string) []string {
	var out []string
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// kubeconfigFile names the kubeconfig file cli.RESTConfig loads for the --kubeconfig value explicit,
// in the same order: explicit, $KUBECONFIG, none in a cluster (""), then ~/.kube/config when it
// exists ("" when it does not). A $KUBECONFIG listing several files is an error: they are merged
// into one configuration that no single file holds.
func kubeconfigFile(explicit string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if env := os.Getenv(clientcmd.RecommendedConfigPathEnvVar); env != "" {
		var files []string
		for _, f := range filepath.SplitList(env) {
			if f != "" {
				files = append(files, f)
			}
		}
		switch len(files) {
		case 0:
		case 1:
			return files[0], nil
		default:
			return "", fmt.Errorf("$KUBECONFIG lists %d files, which the delegated authentication cannot take (one file): "+
				"give --kubeconfig or --metrics-api-auth-kubeconfig", len(files))
		}
	}
	if _, err := rest.InClusterConfig(); err == nil {
		return "", nil
	}
	home := filepath.Join(homedir.HomeDir(), clientcmd.RecommendedHomeDir, clientcmd.RecommendedFileName)
	if _, err := os.Stat(home); err == nil {
		return home, nil
	}
	return "", nil
}
