package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

func TestDatabaseError(t *testing.T) {
	for _, tc := range []struct {
		name, dsn, err string
		want           string
	}{
		{"pgx's two attempts on one line", "postgres://u:s3cret@127.0.0.1:5999/db",
			"connecting to the database: failed to connect to `user=u database=db`:\n\t127.0.0.1:5999 (127.0.0.1): dial error: connection refused\n\t127.0.0.1:5999 (127.0.0.1): dial error: connection refused",
			"connecting to the database: failed to connect to `user=u database=db`: 127.0.0.1:5999 (127.0.0.1): dial error: connection refused"},
		{"a URL password quoted anywhere", "postgres://u:s3cret@h/db", "oops: s3cret in postgres://u:s3cret@h/db",
			"oops: xxxxx in postgres://u:xxxxx@h/db"},
		{"a URL-encoded password, decoded", "postgres://u:p%40ss%20word@h/db", "saw p@ss word and p%40ss%20word",
			"saw xxxxx and xxxxx"},
		{"a keyword/value password", "host=h user=u password='se cret' dbname=db", "cannot parse `host=h password='se cret'`: x; also se cret",
			"cannot parse `host=h password=xxxxx`: x; also xxxxx"},
		{"an unparsable DSN", "postgres://u:s3cret@[::1/db", "parsing the database DSN: cannot parse `postgres://u:s3cret@[::1/db`: failed",
			"parsing the database DSN: cannot parse `postgres://u:xxxxx@[::1/db`: failed"},
		{"no password", "host=h user=u dbname=db", "connecting: user=u host=h refused", "connecting: user=u host=h refused"},
	} {
		if got := databaseError(errors.New(tc.err), tc.dsn); got != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}

// TestKeeperWithoutItsDatabase runs `renderqueue keeper` with a DSN pointing at a closed port on
// which a real PostgreSQL appears later (a TCP proxy to the test server): it serves /healthz and
// /v1/status (unready, inexact, the connection error without the password) at once, /readyz stays
// 503, and once the database is reachable it loads and is ready and exact.
func TestKeeperWithoutItsDatabase(t *testing.T) {
	real := pgtest.NewDatabase(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := postgres.Open(ctx, real, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `INSERT INTO render_schedule (key, due_at, cadence_ms) VALUES ('https://a/', now() - interval '1 minute', 3600000)`); err != nil {
		t.Fatal(err)
	}
	_ = st.Close()
	cfg, err := pgconn.ParseConfig(real)
	if err != nil {
		t.Fatal(err)
	}
	dbPort := freePort(t)
	const password = "s3cret-pw" // the test server trusts local connections and never asks for it
	dsn := fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable", cfg.User, password, dbPort, cfg.Database)
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	base := "http://" + listen

	done := make(chan error, 1)
	var stderr syncBuffer
	// the keeper runs Go code on one thread unless told otherwise (defaultKeeperProcs); the
	// test binary gets its own setting back (read before the keeper changes it)
	prevProcs := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(prevProcs) })
	go func() {
		done <- runKeeper(ctx, []string{"--dsn", dsn, "--listen", listen, "--insecure-no-auth", "--name", "s0"}, io.Discard, &stderr)
	}()
	get := func(path string) (int, []byte) {
		resp, err := http.Get(base + path)
		if err != nil {
			return 0, nil
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	status := func() shardapi.Status {
		code, body := get("/v1/status")
		var st shardapi.Status
		if code == http.StatusOK {
			if err := json.Unmarshal(body, &st); err != nil {
				t.Fatalf("bad /v1/status: %v: %s", err, body)
			}
		}
		return st
	}
	waitFor(t, done, &stderr, "the connection error in /v1/status", func() bool { return status().Error != "" })
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Errorf("GOMAXPROCS = %d while the keeper runs, want 1", got)
	}
	if want := `gomaxprocs=1 from="the keeper's default"`; !strings.Contains(stderr.String(), want) {
		t.Errorf("the keeper's log does not say %s:\n%s", want, stderr.String())
	}
	st0 := status()
	if st0.Status != shardapi.StatusUnready || st0.Exact || st0.Complete || st0.Shard != "s0" {
		t.Errorf("status without a database: %+v", st0)
	}
	for _, part := range []string{"connecting to the database", fmt.Sprintf("127.0.0.1:%d", dbPort), "connection refused", "user=" + cfg.User} {
		if !strings.Contains(st0.Error, part) {
			t.Errorf("status error %q does not name %q", st0.Error, part)
		}
	}
	if strings.Contains(st0.Error, password) || strings.Contains(stderr.String(), password) {
		t.Errorf("the password leaked: status error %q; log:\n%s", st0.Error, stderr.String())
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d while the database is unreachable, want 200 (the process is alive)", code)
	}
	if code, _ := get("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz = %d while the database is unreachable, want 503", code)
	}

	// the database appears on the DSN's port
	proxyTo(t, ctx, dbPort, cfg)
	waitFor(t, done, &stderr, "/readyz 200 once the database is reachable", func() bool {
		code, _ := get("/readyz")
		return code == http.StatusOK
	})
	waitFor(t, done, &stderr, "an exact status", func() bool { s := status(); return s.Exact && s.Due == 1 && s.Error == "" })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("keeper: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the keeper did not stop")
	}
}

// TestKeeperWithABadDSN: an unparsable DSN is reported the same way, and the keeper stays up.
func TestKeeperWithABadDSN(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	done := make(chan error, 1)
	var stderr syncBuffer
	go func() {
		done <- runKeeper(ctx, []string{"--dsn", "postgres://u:s3cret-pw@db:notaport/x", "--listen", listen, "--insecure-no-auth", "--procs", "0"}, io.Discard, &stderr)
	}()
	var st shardapi.Status
	waitFor(t, done, &stderr, "the DSN error in /v1/status", func() bool {
		resp, err := http.Get("http://" + listen + "/v1/status")
		if err != nil {
			return false
		}
		defer func() { _ = resp.Body.Close() }()
		return json.NewDecoder(resp.Body).Decode(&st) == nil && st.Error != ""
	})
	if st.Status != shardapi.StatusUnready || st.Exact || !strings.Contains(st.Error, "parsing the database DSN") ||
		!strings.Contains(st.Error, "invalid port") || strings.Contains(st.Error, "s3cret-pw") || strings.Contains(stderr.String(), "s3cret-pw") {
		t.Errorf("status %+v; log:\n%s", st, stderr.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("keeper: %v", err)
	}
}

// waitFor polls cond until it holds, failing the test after 30s or when the keeper (done) stops.
func waitFor(t *testing.T, done <-chan error, log *syncBuffer, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		select {
		case err := <-done:
			t.Fatalf("the keeper stopped (%v) while waiting for %s; log:\n%s", err, what, log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; log:\n%s", what, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freePort returns a TCP port on 127.0.0.1 that nothing listens on (just now).
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

// proxyTo listens on 127.0.0.1:port and forwards every connection to the PostgreSQL server of
// cfg (its Unix socket or TCP address) until ctx ends.
func proxyTo(t *testing.T, ctx context.Context, port int, cfg *pgconn.Config) {
	t.Helper()
	network, addr := "tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if strings.HasPrefix(cfg.Host, "/") {
		network, addr = "unix", fmt.Sprintf("%s/.s.PGSQL.%d", cfg.Host, cfg.Port)
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("proxy: %v", err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer func() { _ = c.Close() }()
				up, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err != nil {
					return
				}
				defer func() { _ = up.Close() }()
				go func() {
					<-ctx.Done()
					_ = c.Close()
					_ = up.Close()
				}()
				go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
				_, _ = io.Copy(c, up)
			})
		}
	})
}
