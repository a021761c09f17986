package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/renderqueue/renderqueue/pkg/buildinfo"
	"github.com/renderqueue/renderqueue/pkg/keeper"
	"github.com/renderqueue/renderqueue/pkg/membership"
	"github.com/renderqueue/renderqueue/pkg/rqwatch"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
)

// runKeeper is `renderqueue keeper`: run one keeper shard. Standalone (the default) it owns all
// slots and takes its policy from flags; with --renderqueue it takes both from its RenderQueue
// object and follows its changes (the operator starts shards that way).
func runKeeper(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("keeper", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsn := fs.String("dsn", os.Getenv("RENDERQUEUE_DSN"), "PostgreSQL connection string (default $RENDERQUEUE_DSN)")
	listen := fs.String("listen", ":8080", "HTTP listen address")
	name := fs.String("name", "standalone", "shard name, reported in status")
	window := fs.Duration("window", 0, "hold rows due before now + window (0 = all rows)")
	verify := fs.Duration("verify-interval", time.Hour, "time between verification walks (clamped to window/3)")
	lease := fs.Duration("lease", 5*time.Minute, "default lease of a claim")
	boost := fs.Float64("submitted-boost", 2, "score multiplier for rows from a sitemap")
	urgentShare := fs.Float64("urgent-max-share", 0.2, "most of a claim batch urgent rows may take while other rows are due")
	var floors floorFlags
	fs.Var(&floors, "floor", "a class's reserved share of every claim, CADENCE/SOURCE=SHARE (e.g. 96h/discovered=0.05); repeat or comma-separate; shares sum to at most 1 (docs/priority.md)")
	resched := rescheduleFlag{p: keeper.KeepPhase}
	fs.Var(&resched, "reschedule", "next due time of a rendered row: KeepPhase (its own schedule, no drain echo) or AfterRender (completion + cadence)")
	tokenFile := fs.String("token-file", "", "file holding the API bearer token (default $RENDERQUEUE_TOKEN)")
	insecure := fs.Bool("insecure-no-auth", false, "serve the mutating API without authentication")
	verbose := fs.Bool("v", false, "log walks and other details")
	rqName := fs.String("renderqueue", "", "take settings and slots from this RenderQueue (in Kubernetes; default: standalone, all slots)")
	namespace := fs.String("namespace", os.Getenv("POD_NAMESPACE"), "namespace of --renderqueue (default $POD_NAMESPACE)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if strings.TrimSpace(*dsn) == "" {
		return errors.New("--dsn (or RENDERQUEUE_DSN) is required")
	}
	token, err := readToken(*tokenFile)
	if err != nil {
		return err
	}
	if token == "" && !*insecure {
		return errors.New("no API token: give --token-file or RENDERQUEUE_TOKEN, or --insecure-no-auth for a local run")
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug - 1 // logr V(1)
	}
	log := logr.FromSlogHandler(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	var src keeper.SettingsSource
	if *rqName != "" {
		if *namespace == "" {
			return errors.New("--renderqueue needs --namespace (or POD_NAMESPACE)")
		}
		cfg, err := ctrlconfig.GetConfig()
		if err != nil {
			return fmt.Errorf("kubernetes client config: %w", err)
		}
		w, err := rqwatch.New(cfg, *namespace, *rqName, *name, log.WithName("rqwatch"))
		if err != nil {
			return err
		}
		src = w
	} else {
		settings := keeper.Settings{
			Window: *window, VerifyInterval: *verify, LeaseDuration: *lease,
			SubmittedBoost: *boost, UrgentMaxShare: *urgentShare, Floors: floors, Reschedule: resched.p,
			Owned: membership.AllSlots(),
		}
		if err := settings.Validate(); err != nil {
			return err
		}
		src = keeper.StaticSource{Settings: settings}
	}
	return serveShard(ctx, log, *dsn, *name, *listen, token, src)
}

// serveShard runs a shard with its HTTP API until ctx ends.
func serveShard(ctx context.Context, log logr.Logger, dsn, name, listen, token string, src keeper.SettingsSource) error {
	settings, err := src.Initial(ctx)
	if err != nil {
		return fmt.Errorf("reading the shard's settings: %w", err)
	}
	st, err := postgres.Open(ctx, dsn, postgres.Options{Logger: log.WithName("store")})
	if err != nil {
		return fmt.Errorf("opening the store: %w", err)
	}
	defer func() { _ = st.Close() }()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildinfo.NewCollector("keeper", buildinfo.Read(version)))
	shard, err := keeper.NewShard(keeper.Options{
		Name: name, Store: st, Log: log.WithName("keeper"), Metrics: keeper.NewMetrics(reg),
	}, settings)
	if err != nil {
		return err
	}
	reg.MustRegister(keeper.NewStatusCollector(shard))

	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", listen, err)
	}
	srv := &http.Server{
		Handler:           shard.Handler(keeper.HandlerOptions{Token: token, Gatherer: reg}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	log.Info("Keeper serving", "shard", name, "listen", ln.Addr().String(), "window", settings.Window,
		"walkInterval", settings.WalkInterval(), "auth", token != "")

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 3)
	updates := make(chan keeper.Settings, 1)
	go func() { errs <- srv.Serve(ln) }()
	go func() { errs <- shard.Run(ctx, updates) }()
	go func() { errs <- src.Watch(ctx, updates) }()
	err = <-errs
	cancel()
	shutdownCtx, done := context.WithTimeout(context.Background(), 5*time.Second)
	defer done()
	_ = srv.Shutdown(shutdownCtx)
	if errors.Is(err, context.Canceled) || errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// readToken reads the bearer token from a file, or from RENDERQUEUE_TOKEN when no file is given.
func readToken(file string) (string, error) {
	if file == "" {
		return strings.TrimSpace(os.Getenv("RENDERQUEUE_TOKEN")), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("reading the API token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", file)
	}
	return tok, nil
}
