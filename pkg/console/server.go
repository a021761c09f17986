package console

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/renderqueue/renderqueue/pkg/console/view"
)

// DefaultBindAddress is where the console listens unless told otherwise: loopback only, reached
// with `kubectl port-forward` (which needs the pods/portforward permission in the operator's
// namespace); no token is asked there.
const DefaultBindAddress = "127.0.0.1:8090"

// Options configure the console (the operator's --console* flags).
type Options struct {
	// Enabled is set by --console; AddToManager adds nothing when it is false.
	Enabled bool
	// BindAddress is host:port to listen on. On anything but a loopback address TokenFile is
	// required.
	BindAddress string
	// TokenFile holds the bearer token (a mounted Secret). When set, every request must carry
	// it, whatever the address.
	TokenFile string
	// Refresh is how often an open page refreshes its data.
	Refresh time.Duration
	// SampleInterval is how often status.due is sampled for "due over the last hour".
	SampleInterval time.Duration
	// ShardTimeout bounds one shard's /v1/status.
	ShardTimeout time.Duration
	// Listener, if set, is used instead of listening on BindAddress (tests).
	Listener net.Listener
	// ShardClient, if set, gives the HTTP client to ask a RenderQueue's shards with (one that
	// verifies shards serving HTTPS: the operator's RenderQueueReconciler.ShardHTTPClient).
	ShardClient ShardClientFunc
	// Explain is set by --console-explain: the search box explains rows (GET /v1/rows/{key}),
	// with each queue's shard API token, read from its Secret <name>-api-token when asked
	// (AddToManager: through the manager's uncached API reader, so the operator needs get on
	// those Secrets, which its role does not grant: docs/console.md).
	Explain bool
}

// BindFlags registers the --console* flags on fs, with o's current values (or the defaults) as
// defaults.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	if o.BindAddress == "" {
		o.BindAddress = DefaultBindAddress
	}
	if o.Refresh == 0 {
		o.Refresh = DefaultRefresh
	}
	if o.SampleInterval == 0 {
		o.SampleInterval = DefaultSampleInterval
	}
	if o.ShardTimeout == 0 {
		o.ShardTimeout = DefaultShardTimeout
	}
	fs.BoolVar(&o.Enabled, "console", o.Enabled,
		"serve the read-only web console (queues, shards, charts); see docs/console.md")
	fs.StringVar(&o.BindAddress, "console-bind-address", o.BindAddress,
		"host:port of the console; on anything but loopback --console-token-file is required")
	fs.StringVar(&o.TokenFile, "console-token-file", o.TokenFile,
		"file holding the console's bearer token (a mounted Secret, at least 16 bytes); when set every request needs it")
	fs.DurationVar(&o.Refresh, "console-refresh", o.Refresh, "how often an open console page refreshes its figures")
	fs.DurationVar(&o.SampleInterval, "console-sample-interval", o.SampleInterval,
		"how often the console samples status.due for its last-hour chart (kept in memory)")
	fs.DurationVar(&o.ShardTimeout, "console-shard-timeout", o.ShardTimeout, "timeout of one shard's /v1/status asked by the console")
	fs.BoolVar(&o.Explain, "console-explain", o.Explain,
		"let the console's search box explain rows with each queue's shard API token, read from the Secret <name>-api-token when asked "+
			"(the operator then needs get on those Secrets: docs/console.md)")
}

// isLoopback reports whether a listen address only accepts connections from this host (its
// network namespace): 127.0.0.0/8, ::1 or localhost. An empty host listens everywhere.
func isLoopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("console bind address %q: %w", addr, err)
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}

// Validate checks the options: positive durations, a valid address, and a token file wherever
// the console listens beyond loopback.
func (o *Options) Validate() error {
	if o.Refresh <= 0 || o.SampleInterval <= 0 || o.ShardTimeout <= 0 {
		return errors.New("--console-refresh, --console-sample-interval and --console-shard-timeout must be positive")
	}
	if o.SampleInterval > view.HistorySpan {
		return fmt.Errorf("--console-sample-interval %s is longer than the %s the console shows", o.SampleInterval, view.HistorySpan)
	}
	if o.Listener != nil {
		return nil
	}
	loop, err := isLoopback(o.BindAddress)
	if err != nil {
		return err
	}
	if !loop && o.TokenFile == "" {
		return fmt.Errorf("the console would listen on %q, which is not a loopback address, without a token: "+
			"give --console-token-file (a bearer token from a Secret) or bind it to 127.0.0.1 and use kubectl port-forward", o.BindAddress)
	}
	return nil
}

// Server serves the console over HTTP. It is a manager.Runnable that runs on every operator
// replica, leader or not (each reads its own cache).
type Server struct {
	ln  net.Listener
	srv *http.Server
	log logr.Logger
	// Authenticated is true when a token is required.
	authenticated bool
}

var (
	_ manager.Runnable               = (*Server)(nil)
	_ manager.LeaderElectionRunnable = (*Server)(nil)
)

// NewServer checks o, builds the handler from ho (Refresh and ShardTimeout taken from o), reads
// the token file, and binds the listening socket, so that a bad flag or a taken port fails the
// operator at start.
func NewServer(o Options, ho HandlerOptions) (*Server, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var tf *tokenFile
	if o.TokenFile != "" {
		var err error
		if tf, err = newTokenFile(o.TokenFile); err != nil {
			return nil, err
		}
	}
	ho.Refresh, ho.ShardTimeout = o.Refresh, o.ShardTimeout
	if ho.SampleInterval == 0 {
		ho.SampleInterval = o.SampleInterval
	}
	hd, err := newHandler(ho)
	if err != nil {
		return nil, err
	}
	var h http.Handler = hd
	s := &Server{log: ho.Logger}
	if tf != nil {
		h = hd.withToken(tf, hd)
		s.authenticated = true
	}
	s.ln = o.Listener
	if s.ln == nil {
		if s.ln, err = net.Listen("tcp", o.BindAddress); err != nil {
			return nil, fmt.Errorf("console: %w", err)
		}
	}
	s.srv = &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      time.Minute,
		IdleTimeout:       2 * time.Minute,
	}
	return s, nil
}

// Addr is the address the console listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// NeedLeaderElection reports false: every replica serves the console.
func (s *Server) NeedLeaderElection() bool { return false }

// Start serves until ctx is done, then shuts down within five seconds.
func (s *Server) Start(ctx context.Context) error {
	s.log.Info("Serving the console", "address", s.ln.Addr().String(), "tokenRequired", s.authenticated)
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("console server: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("console server shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("console server: %w", err)
	}
	return nil
}

// AddToManager adds the console (the history Sampler and the Server) to mgr when o.Enabled:
// RenderQueues and Pods are read through the manager's cached client, shards are found with
// shardURL.
func AddToManager(mgr manager.Manager, o Options, shardURL ShardURLFunc, log logr.Logger) error {
	if !o.Enabled {
		return nil
	}
	if err := o.Validate(); err != nil {
		return err
	}
	hist, err := NewHistory(o.SampleInterval)
	if err != nil {
		return fmt.Errorf("console: %w", err)
	}
	var token ShardTokenFunc
	if o.Explain {
		token = SecretToken(mgr.GetAPIReader())
	}
	srv, err := NewServer(o, HandlerOptions{
		Reader: mgr.GetClient(), ShardURL: shardURL, ShardClient: o.ShardClient, ShardToken: token, History: hist,
		SampleInterval: o.SampleInterval, Logger: log,
	})
	if err != nil {
		return err
	}
	if err := mgr.Add(&Sampler{Reader: mgr.GetClient(), History: hist, Interval: o.SampleInterval, Logger: log}); err != nil {
		return fmt.Errorf("console: adding the due sampler: %w", err)
	}
	if err := mgr.Add(srv); err != nil {
		return fmt.Errorf("console: adding the server: %w", err)
	}
	return nil
}
