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

	"github.com/renderqueue/renderqueue/pkg/certs"
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
			"--tls-cert-file", certFile, "--tls-key-file", keyFile}, io.Discard, &stderr)
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

func TestWorkerServerName(t *testing.T) {
	for _, c := range []struct {
		flag, dns, rq, ns, want string
	}{
		{"given.example", "web-shards.team-a.svc:8080", "web", "team-a", "given.example"},
		{"", "", "web", "team-a", "web-shards.team-a.svc"},
		{"", "web-shards.team-a.svc.cluster.local.:8080", "", "", "web-shards.team-a.svc.cluster.local"},
		{"", "", "", "", ""},
	} {
		if got := workerServerName(c.flag, c.dns, c.rq, c.ns); got != c.want {
			t.Errorf("workerServerName(%q, %q, %q, %q) = %q, want %q", c.flag, c.dns, c.rq, c.ns, got, c.want)
		}
	}
}
