package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/internal/cli"
	"github.com/renderqueue/renderqueue/pkg/certs"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

// TestKeeperServesTLS: with --tls-cert-file and --tls-key-file the keeper serves HTTPS only,
// with the files' certificate (a client that trusts the CA and expects the server name gets
// through; plain HTTP does not), before its database is reachable.
func TestKeeperServesTLS(t *testing.T) {
	ca, _, err := certs.RenewCA(nil, "shard-ca", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	const serverName = "web-shards.team-a.svc"
	s, err := certs.NewServing(ca, []string{serverName}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, s.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, s.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	done := make(chan error, 1)
	var stderr syncBuffer
	go func() {
		done <- runKeeper(ctx, []string{"--dsn", "host=/nonexistent", "--listen", listen, "--insecure-no-auth",
			"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--procs", "0"}, io.Discard, &stderr)
	}()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.Bundle)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: serverName, MinVersion: tls.VersionTLS12}}}
	healthz := func(c *http.Client, scheme string) int {
		resp, err := c.Get(scheme + "://" + listen + "/healthz")
		if err != nil {
			return 0
		}
		defer func() { _ = resp.Body.Close() }()
		return resp.StatusCode
	}
	waitFor(t, done, &stderr, "/healthz over HTTPS", func() bool { return healthz(hc, "https") == http.StatusOK })
	if code := healthz(http.DefaultClient, "http"); code == http.StatusOK {
		t.Error("the keeper answered plain HTTP too")
	}
	if !strings.Contains(stderr.String(), "tls=true") {
		t.Errorf("the keeper's log does not say it serves TLS:\n%s", stderr.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("keeper: %v", err)
	}
}

// TestKeeperTLSFlags: the TLS flags go together, and a certificate that does not load stops the
// keeper before it serves.
func TestKeeperTLSFlags(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pem")
	if err := os.WriteFile(bad, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"keeper", "--dsn", "host=/nonexistent", "--insecure-no-auth"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-cert-file", bad}, "--tls-cert-file and --tls-key-file go together"},
		{[]string{"--tls-key-file", bad}, "--tls-cert-file and --tls-key-file go together"},
		{[]string{"--tls-cert-file", bad, "--tls-key-file", bad}, "loading the TLS certificate"},
		{[]string{"--tls-cert-file", filepath.Join(dir, "missing"), "--tls-key-file", bad}, "reading the TLS certificate"},
	} {
		var out, errb bytes.Buffer
		if code := run(append(append([]string{}, base...), c.args...), &out, &errb); code == 0 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("keeper %v: code %d, stderr %q, want %q", c.args, code, errb.String(), c.want)
		}
	}
}

// TestWorkerSimOverTLS: worker-sim verifies a TLS keeper with the CA file and the server name
// and drains its due rows over HTTPS; with another CA it completes nothing.
func TestWorkerSimOverTLS(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	const rows = 20
	if _, err := st.Pool().Exec(ctx, `INSERT INTO render_schedule (key, due_at, cadence_ms)
		SELECT 'https://a/' || i, now() - interval '1 minute', 86400000 FROM generate_series(1, $1) i`, rows); err != nil {
		t.Fatal(err)
	}
	due := func() int {
		var n int
		if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM render_schedule WHERE due_at <= now()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ca, _, err := certs.RenewCA(nil, "shard-ca", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := certs.RenewCA(nil, "other-ca", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	const serverName = "web-shards.team-a.svc"
	s, err := certs.NewServing(ca, []string{serverName}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := write("tls.crt", s.CertPEM), write("tls.key", s.KeyPEM)
	caFile, otherFile, tokenFile := write("ca.crt", ca.Bundle), write("other.crt", other.Bundle), write("token", []byte("s3cret-token"))
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	done := make(chan error, 1)
	var keeperLog syncBuffer
	go func() {
		done <- runKeeper(ctx, []string{"--dsn", dsn, "--listen", listen, "--token-file", tokenFile,
			"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--procs", "0"}, io.Discard, &keeperLog)
	}()

	workerSim := func(ca string, stop func(progress string) bool) (string, string) {
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		var out, errb syncBuffer
		wdone := make(chan error, 1)
		go func() {
			wdone <- cli.WorkerSim(wctx, []string{"--shard", "https://" + listen, "--token-file", tokenFile, "--tls-ca-file", ca,
				"--tls-server-name", serverName, "--render-time", "0", "--progress", "50ms", "--backoff", "10ms"}, &out, &errb)
		}()
		waitFor(t, done, &keeperLog, "worker-sim's progress", func() bool { return stop(errb.String()) })
		wcancel()
		if err := <-wdone; err != nil {
			t.Fatalf("worker-sim: %v\n%s", err, errb.String())
		}
		return out.String(), errb.String()
	}

	// another CA: the keeper is refused, nothing completed
	out, _ := workerSim(otherFile, func(p string) bool { return strings.Contains(p, "certificate signed by unknown authority") })
	if !strings.Contains(out, "completed 0 ") || due() != rows {
		t.Errorf("worker-sim trusting another CA completed rows: %s", out)
	}

	// the keeper's CA and server name: every due row completed over HTTPS
	out, errs := workerSim(caFile, func(string) bool { return due() == 0 })
	if !strings.Contains(out, fmt.Sprintf("completed %d ", rows)) {
		t.Errorf("worker-sim over TLS: %s\n%s", out, errs)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("keeper: %v", err)
	}
}
