package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/internal/cli"
	"github.com/renderqueue/renderqueue/internal/memlimit"
	"github.com/renderqueue/renderqueue/pkg/buildinfo"
	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/keeper"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/keeper/httpserve"
	"github.com/renderqueue/renderqueue/pkg/keeper/kubesource"
	"github.com/renderqueue/renderqueue/pkg/keeper/shardmetrics"
	"github.com/renderqueue/renderqueue/pkg/logkeys"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
)

// apiPolicyDefaults returns the claim policy's defaults as the RenderQueue API gives them (the
// kubebuilder defaults, api/v1alpha1's Default* constants): submitted boost, urgent max share and
// reschedule policy.
func apiPolicyDefaults() (boost, share float64, resched policy.Reschedule, err error) {
	var p rqv1.Priority // empty: every value its default
	if boost, err = p.SubmittedBoostValue(); err != nil {
		return 0, 0, 0, fmt.Errorf("the API's default submittedBoost: %w", err)
	}
	if share, err = p.UrgentMaxShareValue(); err != nil {
		return 0, 0, 0, fmt.Errorf("the API's default urgentMaxShare: %w", err)
	}
	if resched, err = policy.ParseReschedule(p.RescheduleValue()); err != nil {
		return 0, 0, 0, fmt.Errorf("the API's default reschedule: %w", err)
	}
	return boost, share, resched, nil
}

// defaultKeeperProcs is the keeper's GOMAXPROCS unless --procs or $GOMAXPROCS says otherwise.
// A shard's work (claims, completions, change events, walk steps, status) runs under one lock,
// so a second thread running Go code adds little the first could not do, and it makes claims
// wait: a claim that finds the lock held by a goroutine on the other thread waits until that
// thread runs again, and on a machine whose CPUs are shared (PostgreSQL, other pods, a
// hypervisor) it may not for milliseconds. With one, the holder is the thread that runs: at
// 10M rows a claim's p99 during a re-walk falls from 2.3–4.5 ms to 0.5–1.0 ms, with the same
// end-to-end throughput (docs/benchmarks.md, "One thread").
const defaultKeeperProcs = 1

// keeperProcs decides the keeper's GOMAXPROCS from --procs (flagSet says whether it was given)
// and $GOMAXPROCS (env): the flag when given, else the environment when set (the runtime has
// applied it already), else defaultKeeperProcs. It returns the value to set, 0 to leave the
// runtime's, and where the value comes from, for the log.
func keeperProcs(flagSet bool, flagValue int, env string) (set int, from string) {
	switch {
	case flagSet && flagValue == 0:
		return 0, "the Go runtime (--procs 0)"
	case flagSet:
		return flagValue, "--procs"
	case env != "":
		return 0, "$GOMAXPROCS"
	default:
		return defaultKeeperProcs, "the keeper's default"
	}
}

// runKeeper is `renderqueue keeper`: run one keeper shard. Standalone (the default) it owns all
// slots and takes its policy from flags; with --renderqueue it takes both from its RenderQueue
// object and follows its changes (the operator starts shards that way).
func runKeeper(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("keeper", flag.ContinueOnError)
	dsn := fs.String("dsn", os.Getenv("RENDERQUEUE_DSN"), "PostgreSQL connection string (default $RENDERQUEUE_DSN)")
	listen := fs.String("listen", ":8080", "HTTP listen address")
	name := fs.String("name", "standalone", "shard name, reported in status")
	window := fs.Duration("window", 0, "hold rows due before now + window (0 = all rows)")
	// the defaults are the RenderQueue API's, so a standalone keeper runs as a managed one does
	defBoost, defShare, defResched, err := apiPolicyDefaults()
	if err != nil {
		return err
	}
	verify := fs.Duration("verify-interval", rqv1.DefaultVerifyInterval, "time between verification walks (clamped to window/3)")
	lease := fs.Duration("lease", rqv1.DefaultLeaseDuration, "default lease of a claim")
	maxLease := fs.Duration("max-lease", 0, "longest lease a claim or an extension gets, and how long rows whose leases are unknown (a keeper process that died) are held back (0 = --lease)")
	walkRate := fs.Int("verify-walk-rate", rqv1.DefaultVerifyWalkRate, "most rows a second a verification walk reads, so it leaves CPU to claims and spreads its reads on PostgreSQL (0 = unpaced); the load and walks that repair a gap or prepare slots are never paced")
	boost := fs.Float64("submitted-boost", defBoost, "score multiplier for rows from a sitemap")
	urgentShare := fs.Float64("urgent-max-share", defShare, "most of a claim batch urgent rows may take while other rows are due")
	var floors cli.FloorFlags
	fs.Var(&floors, "floor", "a class's reserved share of every claim, CADENCE/SOURCE=SHARE (e.g. 96h/discovered=0.05); repeat or comma-separate; shares sum to at most 1 (docs/priority.md)")
	resched := cli.RescheduleFlag{Policy: defResched}
	fs.Var(&resched, "reschedule", "next due time of a rendered row: Adaptive (KeepPhase while the shard keeps up or drains a backlog, AfterRender while overloaded), KeepPhase (its own schedule, no drain echo) or AfterRender (completion + cadence)")
	tokenFile := fs.String("token-file", "", "file holding the API bearer token (default $RENDERQUEUE_TOKEN)")
	insecure := fs.Bool("insecure-no-auth", false, "serve the mutating API without authentication")
	tlsCert := fs.String("tls-cert-file", "", "serve HTTPS with the PEM certificate (chain) of this file, reloaded when it changes (with --tls-key-file)")
	tlsKey := fs.String("tls-key-file", "", "the PEM key of --tls-cert-file")
	stateFile := fs.String("state-file", "", "the keeper's Pod-local state file: when every lease it granted ends, for a process restarted in the same Pod (default with --renderqueue: "+keeper.StateFileIn(os.TempDir())+", on the Pod's emptyDir; standalone: none)")
	drainTimeout := fs.Duration("drain-timeout", 20*time.Second, "on SIGTERM, how long the keeper hands out no more rows and waits for the leases it has out to end before it stops (under the Pod's termination grace period)")
	tlsCA := fs.String("tls-ca-file", "", "PEM CA bundle the other shards of the queue are verified with when this shard asks them for the leases of slots it took over (their URLs are https://); reloaded when it changes")
	var logs cli.LogFlags
	logs.Bind(fs, "log walks and other details")
	procs := fs.Int("procs", defaultKeeperProcs, "most threads running the keeper's Go code at once (GOMAXPROCS; default 1 unless $GOMAXPROCS is set; 0 = the Go runtime's choice: $GOMAXPROCS, else the CPUs or the container's CPU limit). A shard's work runs under one lock: with more, claims wait for holders whose thread is not running (docs/benchmarks.md, \"One thread\")")
	rqName := fs.String("renderqueue", "", "take settings and slots from this RenderQueue (in Kubernetes; default: standalone, all slots)")
	namespace := fs.String("namespace", os.Getenv("POD_NAMESPACE"), "namespace of --renderqueue (default $POD_NAMESPACE)")
	var limits httpserve.Limits
	fs.DurationVar(&limits.ReadTimeout, "http-read-timeout", httpserve.DefaultReadTimeout, "longest a request (headers and body) may take to arrive; a stalled body is answered 408 and its connection closed")
	fs.DurationVar(&limits.WriteTimeout, "http-write-timeout", httpserve.DefaultWriteTimeout, "longest from a request's headers to the end of its reply (more than a completion's commit may take)")
	fs.DurationVar(&limits.IdleTimeout, "http-idle-timeout", httpserve.DefaultIdleTimeout, "how long an idle keep-alive connection is kept")
	fs.DurationVar(&limits.MaxConnectionAge, "http-max-connection-age", httpserve.DefaultMaxConnectionAge, "retire connections open this long: the next reply says Connection: close (HTTP/2: GOAWAY) and the client opens another")
	fs.IntVar(&limits.MaxConnections, "http-max-connections", httpserve.DefaultMaxConnections, "open connections at most; one more is answered 503 with Retry-After and closed")
	fs.DurationVar(&limits.BodyTimeout, "http-body-timeout", httpserve.DefaultBodyTimeout, "longest the body of a claim, complete, release or extend request may take to arrive once its headers have (at most --http-read-timeout); a stalled body is answered 408 and its connection closed")
	fs.IntVar(&limits.MaxInFlightClaims, "max-in-flight-claims", httpserve.DefaultMaxInFlightClaims, "claims handled at once (their bodies, at most 1 KiB, read first); more are answered 503 with Retry-After. Complete, release and extend requests cannot take this room")
	fs.IntVar(&limits.MaxInFlight, "max-in-flight", httpserve.DefaultMaxInFlight, "complete, release and extend requests (and GET /v1/rows) read and handled at once; more are answered 503 with Retry-After before their bodies are read")
	fs.Int64Var(&limits.MaxInFlightBytes, "max-in-flight-bytes", httpserve.DefaultMaxInFlightBytes, "body bytes (by Content-Length) of the complete, release and extend requests read and handled at once; more are answered 503 with Retry-After before their bodies are read")
	if err := cli.ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	log, err := logs.Logger(stderr)
	if err != nil {
		return err
	}
	if *rqName != "" {
		// every line of a managed shard names its RenderQueue (the keeper adds the shard)
		log = log.WithValues(logkeys.RenderQueue, *rqName, logkeys.Namespace, *namespace)
	}
	if err := limits.Validate(); err != nil {
		return fmt.Errorf("HTTP limits: %w", err)
	}
	if *walkRate < 0 {
		return fmt.Errorf("--verify-walk-rate %d is negative", *walkRate)
	}
	if *procs < 0 {
		return fmt.Errorf("--procs %d is negative", *procs)
	}
	if *maxLease < 0 || (*maxLease > 0 && *maxLease < *lease) {
		return fmt.Errorf("--max-lease %v must be 0 (= --lease) or at least --lease %v", *maxLease, *lease)
	}
	if strings.TrimSpace(*dsn) == "" {
		return errors.New("--dsn (or RENDERQUEUE_DSN) is required")
	}
	token, err := cli.ReadToken(*tokenFile)
	if err != nil {
		return err
	}
	if token == "" && !*insecure {
		return errors.New("no API token: give --token-file or RENDERQUEUE_TOKEN, or --insecure-no-auth for a local run")
	}
	var certs *httpserve.CertFiles
	switch {
	case (*tlsCert == "") != (*tlsKey == ""):
		return errors.New("--tls-cert-file and --tls-key-file go together")
	case *tlsCert != "":
		if certs, err = httpserve.LoadCertFiles(*tlsCert, *tlsKey, log.WithName("tls")); err != nil {
			return err
		}
	}

	var src keeper.SettingsSource
	if *rqName != "" {
		if *namespace == "" {
			return errors.New("--renderqueue needs --namespace (or POD_NAMESPACE)")
		}
		cfg, err := ctrlconfig.GetConfig()
		if err != nil {
			return fmt.Errorf("kubernetes client config: %w", err)
		}
		w, err := kubesource.New(cfg, *namespace, *rqName, *name, log.WithName("kubesource"))
		if err != nil {
			return err
		}
		src = w
	} else {
		settings := keeper.Settings{
			Window: *window, VerifyInterval: *verify, VerifyWalkRate: *walkRate, LeaseDuration: *lease, MaxLease: *maxLease,
			SubmittedBoost: *boost, UrgentMaxShare: *urgentShare, Floors: floors, Reschedule: resched.Policy,
			Owned: schedule.AllSlots(),
		}
		if err := settings.Validate(); err != nil {
			return err
		}
		src = keeper.StaticSource{Settings: settings}
	}
	procsSet := false
	fs.Visit(func(f *flag.Flag) { procsSet = procsSet || f.Name == "procs" })
	n, from := keeperProcs(procsSet, *procs, os.Getenv("GOMAXPROCS"))
	if n > 0 {
		runtime.GOMAXPROCS(n)
	}
	log.Info("Running Go code on at most this many threads at once", "gomaxprocs", runtime.GOMAXPROCS(0), "from", from)
	if *stateFile == "" && *rqName != "" {
		*stateFile = keeper.StateFileIn(os.TempDir())
	}
	if *drainTimeout < 0 {
		return fmt.Errorf("--drain-timeout %v is negative", *drainTimeout)
	}
	peers := &client.Peers{HTTP: &http.Client{Timeout: 10 * time.Second}, Token: token}
	if *tlsCA != "" {
		serverName := ""
		if *rqName != "" {
			serverName = rqv1.ShardServerName(*namespace, *rqName)
		}
		hc, err := client.NewHTTPClient(client.TLSOptions{CAFile: *tlsCA, ServerName: serverName})
		if err != nil {
			return fmt.Errorf("--tls-ca-file: %w", err)
		}
		hc.Timeout = 10 * time.Second
		peers.HTTP = hc
	}
	return serveShard(ctx, log, *dsn, *name, *listen, token, limits, certs, src, shardExtras{peers: peers, stateFile: *stateFile, drain: *drainTimeout})
}

// shardExtras are serveShard's parts for leases across handoffs and restarts: the client that
// asks other shards for handovers, the Pod-local state file, and how long a stopping keeper
// drains.
type shardExtras struct {
	peers     keeper.PeerClient
	stateFile string
	drain     time.Duration
}

// storeConnectTimeout bounds one attempt to open the store (a host that drops packets would
// otherwise hold it for minutes).
const storeConnectTimeout = 15 * time.Second

// serveShard runs a shard with its HTTP API until ctx ends. The API serves at once: while the
// database cannot be reached (or the DSN is wrong) the shard retries with back-off and serves
// /healthz, and /v1/status as unready with the error; /readyz waits for the load. With certs it
// serves HTTPS with their certificate.
func serveShard(ctx context.Context, log logr.Logger, dsn, name, listen, token string, limits httpserve.Limits,
	certs *httpserve.CertFiles, src keeper.SettingsSource, x shardExtras) error {
	settings, err := src.Initial(ctx)
	if err != nil {
		return fmt.Errorf("reading the shard's settings: %w", err)
	}
	var (
		mu     sync.Mutex
		opened *postgres.Store
	)
	open := func(ctx context.Context) (store.Store, error) {
		ctx, cancel := context.WithTimeout(ctx, storeConnectTimeout)
		defer cancel()
		st, err := postgres.Open(ctx, dsn, postgres.Options{Logger: log.WithName("store"), QuietCompletions: true})
		if err != nil {
			return nil, errors.New(databaseError(err, dsn))
		}
		mu.Lock()
		opened = st
		mu.Unlock()
		return st, nil
	}

	reg := prometheus.NewRegistry()
	// process_resident_memory_bytes against renderqueue_keeper_memory_limit_bytes (the container's
	// memory limit, from its cgroup): RenderQueueKeeperMemoryNearLimit, without cAdvisor
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildinfo.NewCollector("keeper", buildinfo.Read(version)), memlimit.NewCollector(memlimit.KeeperMetric, memlimit.Reader{}))
	metrics := shardmetrics.New(reg)
	shard, err := keeper.NewShard(keeper.Options{
		Name: name, Open: open, Log: log.WithName("keeper"), Metrics: metrics, Peers: x.peers, StateFile: x.stateFile,
	}, settings)
	if err != nil {
		return err
	}
	reg.MustRegister(keeper.NewStatusCollector(shard))

	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", listen, err)
	}
	srv := httpserve.NewServer(shard.Handler(keeper.HandlerOptions{Token: token, Gatherer: reg, Limits: limits}), limits)
	// the server's own complaints (a refused TLS handshake, say) as structured log lines
	srv.ErrorLog = slog.NewLogLogger(logr.ToSlogHandler(log.WithName("http")), slog.LevelInfo)
	// at most --http-max-connections open (over TLS, refusals are sent after the handshake)
	var tlsConfig *tls.Config
	if certs != nil {
		tlsConfig = certs.TLSConfig()
	}
	served := httpserve.Listen(ln, tlsConfig, limits, metrics)
	serve := func() error { return srv.Serve(served) }
	log.Info("Keeper serving", "shard", name, "listen", ln.Addr().String(), "window", settings.Window,
		"walkInterval", settings.WalkInterval(), "verifyWalkRate", settings.VerifyWalkRate, "auth", token != "", "tls", certs != nil)

	// the shard runs on until it has drained (SIGTERM: ctx ends), or until a part fails
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 3)
	updates := make(chan keeper.Settings, 1)
	ran := make(chan struct{})
	go func() { errs <- serve() }()
	go func() {
		defer close(ran)
		errs <- shard.Run(runCtx, updates)
	}()
	go func() { errs <- src.Watch(runCtx, updates) }()
	select {
	case err = <-errs:
	case <-ctx.Done():
		log.Info("Stopping: handing out no more rows, waiting for the leases out to end", "shard", name, "drainTimeout", x.drain)
		dctx, done := context.WithTimeout(context.Background(), x.drain)
		shard.Drain(dctx)
		done()
		err = ctx.Err()
	}
	cancel()
	shutdownCtx, done := context.WithTimeout(context.Background(), 5*time.Second)
	defer done()
	_ = srv.Shutdown(shutdownCtx)
	<-ran
	mu.Lock()
	if opened != nil {
		_ = opened.Close()
	}
	mu.Unlock()
	if errors.Is(err, context.Canceled) || errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// databaseError is err (from opening the store with dsn) for the shard's status and log: on one
// line, repeated lines dropped (pgx reports each connection attempt), and the DSN's password
// masked wherever it appears (pgx masks it in what it quotes, best effort; this makes sure).
// Host, port, user and database stay: they are what one needs to find the problem.
func databaseError(err error, dsn string) string {
	var lines []string
	seen := map[string]bool{}
	for _, l := range strings.Split(err.Error(), "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !seen[l] {
			seen[l] = true
			lines = append(lines, l)
		}
	}
	msg := strings.Join(lines, " ")
	for _, pw := range dsnPasswords(dsn) {
		msg = strings.ReplaceAll(msg, pw, "xxxxx")
	}
	msg = urlPassword.ReplaceAllString(msg, "${1}xxxxx@")
	return kvPassword.ReplaceAllString(msg, "${1}xxxxx")
}

var (
	// urlPassword matches the password of a URL's user information ("://user:PASSWORD@").
	urlPassword = regexp.MustCompile(`(://[^:/@\s]*:)[^@\s]*@`)
	// kvPassword matches a keyword/value password ("password=PASSWORD", quoted or not).
	kvPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s]+)`)
)

// dsnPasswords returns the forms the password of dsn may take in a message: as written and
// URL-decoded (at least 3 characters long; shorter strings are too common to mask).
func dsnPasswords(dsn string) []string {
	var out []string
	add := func(pw string) {
		if len(pw) >= 3 && !slices.Contains(out, pw) {
			out = append(out, pw)
		}
	}
	if cfg, err := pgconn.ParseConfig(dsn); err == nil {
		add(cfg.Password)
	}
	if m := urlPassword.FindStringSubmatch(dsn); m != nil {
		pw := strings.TrimSuffix(strings.TrimPrefix(m[0], m[1]), "@")
		add(pw)
		if dec, err := url.PathUnescape(pw); err == nil {
			add(dec)
		}
	}
	if m := kvPassword.FindStringSubmatch(dsn); m != nil {
		add(m[2])
		add(strings.Trim(m[2], "'"))
	}
	return out
}
