package metricsapi

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	openapicommon "k8s.io/kube-openapi/pkg/common"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	cmapiserver "sigs.k8s.io/custom-metrics-apiserver/pkg/apiserver"
	cmoptions "sigs.k8s.io/custom-metrics-apiserver/pkg/cmd/options"
	generatedcore "sigs.k8s.io/custom-metrics-apiserver/pkg/generated/openapi/core"
	generatedexternal "sigs.k8s.io/custom-metrics-apiserver/pkg/generated/openapi/externalmetrics"
)

// DefaultSecurePort is the port the metrics API serves HTTPS on unless told otherwise; the
// Service of config/metrics-api targets it.
const DefaultSecurePort = 6443

// serverName names the API server in its logs and OpenAPI document.
const serverName = "renderqueue-metrics-api"

// Options configure the metrics API server. The zero value plus a Reader and a RESTConfig is a
// working configuration in a Pod: HTTPS on 0.0.0.0:6443 with an in-memory self-signed
// certificate, delegating to the API server with the Pod's ServiceAccount. The server writes no
// file unless CertDir is set (so it runs under a read-only root file system).
type Options struct {
	// Enabled is set by the --metrics-api flag. NewServer and Run ignore it; AddToManager adds
	// nothing when it is false.
	Enabled bool

	// Reader lists RenderQueues; its scheme must know api/v1alpha1. Required (AddToManager
	// defaults it to the manager's client, which reads from the manager's cache).
	Reader client.Reader

	// RESTConfig is the generic API server's own client of the Kubernetes API server. Required
	// (AddToManager defaults it to the manager's config). Delegated authentication and
	// authorization use AuthKubeconfig instead: the generic API server's delegating options
	// take a file or the in-cluster configuration, not a rest.Config.
	RESTConfig *rest.Config

	// AuthKubeconfig is the kubeconfig file the delegating authenticator and authorizer use
	// (TokenReview, SubjectAccessReview, the extension-apiserver-authentication ConfigMap). Empty
	// means the in-cluster configuration (rest.InClusterConfig: the Pod's ServiceAccount token
	// and CA), which is what a Pod uses; out of a cluster it must be set (the operator passes its
	// own --kubeconfig or $KUBECONFIG). The file is read as it is: nothing is written anywhere.
	AuthKubeconfig string

	// BindAddress is the IP to listen on; empty means all interfaces.
	BindAddress string
	// SecurePort is the HTTPS port; 0 means DefaultSecurePort.
	SecurePort int
	// Listener, if set, is used instead of BindAddress and SecurePort (tests and embedding).
	Listener net.Listener

	// TLSCertFile and TLSKeyFile are the serving certificate and key (PEM), e.g. from
	// cert-manager (whose cainjector then fills in the APIService's caBundle). Both or neither.
	// When neither is set: the certificate of CertSecret when that is set; otherwise a
	// self-signed certificate, read from CertDir (apiserver.crt, apiserver.key) when there,
	// generated and written there when not, and kept in memory when CertDir is empty — the
	// APIService must then skip TLS verification (insecureSkipTLSVerify), since no CA vouches
	// for it.
	TLSCertFile, TLSKeyFile string
	// CertDir is where the self-signed certificate is kept; see TLSCertFile.
	CertDir string

	// CertSecret ("namespace/name") is a Secret holding a CA and a serving certificate it
	// signed for Service, shared by every replica: created by the first, renewed by any that
	// finds it expiring (the serving certificate a year, renewed 30 days before its end; the CA
	// ten years, renewed a year before, the old one kept in the bundle until it expires), read
	// by all every CertRefresh, and served without a restart. Its CA bundle is written into the
	// APIService (its spec.caBundle, insecureSkipTLSVerify off) when that points at Service.
	// Needs RBAC to create Secrets in its namespace, get and update that one, and get and patch
	// that APIService (config/metrics-api).
	CertSecret string
	// Service ("namespace/name") is the Service in front of the server: the serving
	// certificate's DNS names, and the only Service whose APIService gets the CA bundle.
	// Required with CertSecret.
	Service string
	// APIService is the APIService whose caBundle is kept current; DefaultAPIService when empty.
	APIService string
	// CertRefresh is how often CertSecret and the APIService are checked; DefaultCertRefresh
	// when zero.
	CertRefresh time.Duration

	// Logger receives the provider's request errors (V(1)) and the server's lifecycle. The
	// generic API server underneath logs through klog.
	Logger logr.Logger
}

// BindFlags registers the metrics API flags on fs, all named --metrics-api*, with o's current
// values as defaults.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.Enabled, "metrics-api", o.Enabled,
		"serve the external metrics API (external.metrics.k8s.io: renderqueue_due, renderqueue_due_lower_bound, renderqueue_due_forecast) for HPAs; "+
			"needs the config/metrics-api component (APIService, auth-delegator and authentication-reader bindings)")
	fs.StringVar(&o.BindAddress, "metrics-api-bind-address", o.BindAddress, "IP address the metrics API listens on (empty: all interfaces)")
	port := o.SecurePort
	if port == 0 {
		port = DefaultSecurePort
	}
	fs.IntVar(&o.SecurePort, "metrics-api-secure-port", port, "HTTPS port of the metrics API")
	fs.StringVar(&o.TLSCertFile, "metrics-api-tls-cert-file", o.TLSCertFile, "serving certificate of the metrics API (PEM); self-signed when unset")
	fs.StringVar(&o.TLSKeyFile, "metrics-api-tls-private-key-file", o.TLSKeyFile, "private key of --metrics-api-tls-cert-file (PEM)")
	fs.StringVar(&o.CertDir, "metrics-api-cert-dir", o.CertDir,
		"directory for the self-signed certificate (apiserver.crt/.key) when no --metrics-api-tls-cert-file is given; empty: in memory")
	fs.StringVar(&o.CertSecret, "metrics-api-cert-secret", o.CertSecret,
		"a Secret keeping the metrics API's CA and serving certificate, shared by every replica (a name in the operator's "+
			"namespace, or namespace/name); its CA bundle is written into the APIService (no insecureSkipTLSVerify). Needs --metrics-api-service")
	fs.StringVar(&o.Service, "metrics-api-service", o.Service,
		"the Service in front of the metrics API (the certificate's DNS names): a name in the operator's namespace, or namespace/name")
	fs.StringVar(&o.APIService, "metrics-api-apiservice", o.APIService,
		"the APIService whose caBundle --metrics-api-cert-secret keeps current (default "+DefaultAPIService+")")
	fs.StringVar(&o.AuthKubeconfig, "metrics-api-auth-kubeconfig", o.AuthKubeconfig,
		"kubeconfig for delegated authentication/authorization (TokenReview, SubjectAccessReview); empty: the operator's own credentials")
}

// Server is the external metrics API server. It implements manager.Runnable and runs on every
// replica of the operator, leader or not (each serves from its own cache).
type Server struct {
	server *cmapiserver.CustomMetricsAdapterServer
	log    logr.Logger
	// certs keeps the certificate of Options.CertSecret current; nil without it.
	certs       *servingCerts
	certRefresh time.Duration
}

var (
	_ manager.Runnable               = (*Server)(nil)
	_ manager.LeaderElectionRunnable = (*Server)(nil)
)

// NewServer builds the metrics API server: it binds the listening socket (unless a Listener is
// given), loads or generates the serving certificate and builds the delegating authenticator and
// authorizer, which reads the kube-system/extension-apiserver-authentication ConfigMap — so the
// API server must be reachable and the grant to read kube-system/extension-apiserver-authentication in place.
func NewServer(opts Options) (*Server, error) {
	if opts.Reader == nil {
		return nil, errors.New("metrics API: Options.Reader is required")
	}
	if opts.RESTConfig == nil {
		return nil, errors.New("metrics API: Options.RESTConfig is required")
	}
	if (opts.TLSCertFile == "") != (opts.TLSKeyFile == "") {
		return nil, fmt.Errorf("metrics API: give both the TLS certificate and its key, or neither (cert %q, key %q)", opts.TLSCertFile, opts.TLSKeyFile)
	}
	var certs *servingCerts
	if opts.CertSecret != "" && opts.TLSCertFile == "" {
		var err error
		if certs, err = newServingCerts(opts); err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// the Secret must be there to serve at all; the APIService is retried every CertRefresh
		bundle, err := certs.syncSecret(ctx)
		if err != nil {
			return nil, fmt.Errorf("metrics API: %w", err)
		}
		if err := certs.syncAPIService(ctx, bundle); err != nil {
			opts.Logger.Error(err, "Not writing the metrics API's CA bundle into its APIService now; retrying", "every", certs.refresh(opts))
		}
	}

	o := cmoptions.NewCustomMetricsAdapterServerOptions()
	ss := o.SecureServing
	if opts.Listener != nil {
		ss.Listener = opts.Listener
		ss.BindPort = 0
	} else {
		ss.BindPort = opts.SecurePort
		if ss.BindPort == 0 {
			ss.BindPort = DefaultSecurePort
		}
		if opts.BindAddress != "" {
			ip := net.ParseIP(opts.BindAddress)
			if ip == nil {
				return nil, fmt.Errorf("metrics API: bind address %q is not an IP address", opts.BindAddress)
			}
			ss.BindAddress = ip
		}
	}
	ss.ServerCert.CertKey.CertFile, ss.ServerCert.CertKey.KeyFile = opts.TLSCertFile, opts.TLSKeyFile
	ss.ServerCert.CertDirectory = opts.CertDir // "" keeps a generated certificate in memory

	if opts.AuthKubeconfig == "" {
		// the generic API server's delegating options fall back to rest.InClusterConfig; check
		// it here to name the way out
		if _, err := rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("metrics API: delegated authentication needs the in-cluster configuration or a kubeconfig "+
				"(the operator's --kubeconfig or $KUBECONFIG, or --metrics-api-auth-kubeconfig): %w", err)
		}
	}
	o.Authentication.RemoteKubeConfigFile = opts.AuthKubeconfig // "": rest.InClusterConfig
	o.Authorization.RemoteKubeConfigFile = opts.AuthKubeconfig
	getDefs := func(ref openapicommon.ReferenceCallback) map[string]openapicommon.OpenAPIDefinition {
		defs := generatedcore.GetOpenAPIDefinitions(ref)
		for k, v := range generatedexternal.GetOpenAPIDefinitions(ref) {
			defs[k] = v
		}
		return defs
	}
	namer := openapinamer.NewDefinitionNamer(cmapiserver.Scheme)
	o.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(getDefs, namer)
	o.OpenAPIConfig.Info.Title, o.OpenAPIConfig.Info.Version = serverName, "v1beta1"
	o.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(getDefs, namer)
	o.OpenAPIV3Config.Info.Title, o.OpenAPIV3Config.Info.Version = serverName, "v1beta1"
	if errs := o.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("metrics API options: %w", errors.Join(errs...))
	}

	restConfig := rest.CopyConfig(opts.RESTConfig)
	kube, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("metrics API: kubernetes client: %w", err)
	}
	informerFactory := informers.NewSharedInformerFactory(kube, 0)
	serverConfig := genericapiserver.NewRecommendedConfig(cmapiserver.Codecs)
	serverConfig.ClientConfig = restConfig
	serverConfig.SharedInformerFactory = informerFactory
	if err := o.ApplyTo(serverConfig); err != nil {
		return nil, fmt.Errorf("metrics API: configure server: %w", err)
	}
	if certs != nil {
		serverConfig.SecureServing.Cert = certs
	}
	config := &cmapiserver.Config{GenericConfig: &serverConfig.Config}
	srv, err := config.Complete(informerFactory).New(serverName, nil, NewProvider(opts.Reader, opts.Logger))
	if err != nil {
		return nil, fmt.Errorf("metrics API: build server: %w", err)
	}
	s := &Server{server: srv, log: opts.Logger, certs: certs}
	if certs != nil {
		s.certRefresh = certs.refresh(opts)
	}
	return s, nil
}

// newServingCerts builds the keeper of Options.CertSecret's certificate (not synced yet).
func newServingCerts(opts Options) (*servingCerts, error) {
	secret, err := parseNamespacedName("metrics API: --metrics-api-cert-secret", opts.CertSecret)
	if err != nil {
		return nil, err
	}
	if opts.Service == "" {
		return nil, errors.New("metrics API: --metrics-api-cert-secret needs --metrics-api-service (the certificate's DNS names)")
	}
	svc, err := parseNamespacedName("metrics API: --metrics-api-service", opts.Service)
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("metrics API: %w", err)
	}
	// a direct client: the Secret and the APIService are read by name (RBAC grants no list)
	c, err := client.New(opts.RESTConfig, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("metrics API: client for the certificate Secret: %w", err)
	}
	api := opts.APIService
	if api == "" {
		api = DefaultAPIService
	}
	return &servingCerts{c: c, secret: secret, service: svc, apiService: api, dnsNames: serviceDNSNames(svc),
		log: opts.Logger, now: time.Now}, nil
}

// refresh is opts.CertRefresh or its default.
func (s *servingCerts) refresh(opts Options) time.Duration {
	if opts.CertRefresh > 0 {
		return opts.CertRefresh
	}
	return DefaultCertRefresh
}

// Start serves until ctx is done, then shuts down gracefully. It implements manager.Runnable.
func (s *Server) Start(ctx context.Context) error {
	s.log.Info("serving the external metrics API", "metrics", Metrics())
	if s.certs != nil {
		go s.certs.run(ctx, s.certRefresh)
	}
	if err := s.server.GenericAPIServer.PrepareRun().RunWithContext(ctx); err != nil {
		return fmt.Errorf("metrics API server: %w", err)
	}
	return nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every replica serves.
func (s *Server) NeedLeaderElection() bool { return false }

// Run builds the server with NewServer and serves until ctx is done.
func Run(ctx context.Context, opts Options) error {
	s, err := NewServer(opts)
	if err != nil {
		return err
	}
	return s.Start(ctx)
}

// AddToManager adds the metrics API server to mgr when opts.Enabled, defaulting opts.Reader to
// mgr.GetClient() and opts.RESTConfig to mgr.GetConfig(). The server is built now (so
// misconfiguration fails the operator's start-up) and serves once mgr starts.
func AddToManager(mgr manager.Manager, opts Options) error {
	if !opts.Enabled {
		return nil
	}
	if opts.Reader == nil {
		opts.Reader = mgr.GetClient()
	}
	if opts.RESTConfig == nil {
		opts.RESTConfig = mgr.GetConfig()
	}
	s, err := NewServer(opts)
	if err != nil {
		return err
	}
	if err := mgr.Add(s); err != nil {
		return fmt.Errorf("metrics API: add to manager: %w", err)
	}
	return nil
}
