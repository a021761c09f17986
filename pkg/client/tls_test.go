package client_test

import (
	"context"
	"crypto/tls"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/certs"
	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/client/discovery"
)

// tlsShard is a shard stand-in serving /v1/status over HTTPS with a certificate of ca for names.
func tlsShard(t *testing.T, ca *certs.CA, names ...string) *httptest.Server {
	t.Helper()
	s, err := certs.NewServing(ca, names, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"shard":"web-shard-0","status":"queued"}`)
	}))
	cert, err := tlsKeyPair(s)
	if err != nil {
		t.Fatal(err)
	}
	srv.TLS = cert
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func newCA(t *testing.T) *certs.CA {
	t.Helper()
	ca, _, err := certs.RenewCA(nil, "shard-ca", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func TestTLSVerifiesCAAndServerName(t *testing.T) {
	const name = "web-shards.team-a.svc"
	ca, other := newCA(t), newCA(t)
	shard := tlsShard(t, ca, name, "*."+name) // dialled at 127.0.0.1: only the server name can match
	for _, tc := range []struct {
		name string
		opts client.TLSOptions
		want string // "" succeeds
	}{
		{"the CA and the server name", client.TLSOptions{CAPEM: ca.Bundle, ServerName: name}, ""},
		{"a Pod's host name", client.TLSOptions{CAPEM: ca.Bundle, ServerName: "web-shard-0." + name}, ""},
		{"both CAs in the bundle", client.TLSOptions{CAPEM: append(append([]byte{}, other.Bundle...), ca.Bundle...), ServerName: name}, ""},
		{"another CA", client.TLSOptions{CAPEM: other.Bundle, ServerName: name}, "certificate signed by unknown authority"},
		{"another queue's name", client.TLSOptions{CAPEM: ca.Bundle, ServerName: "api-shards.team-a.svc"}, "not api-shards.team-a.svc"},
		{"no server name: the address dialled", client.TLSOptions{CAPEM: ca.Bundle}, "doesn't contain any IP SANs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hc, err := client.NewHTTPClient(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			st, err := client.GetShardStatus(context.Background(), hc, shard.URL, "web-shard-0")
			switch {
			case tc.want == "" && (err != nil || st.Shard != "web-shard-0"):
				t.Errorf("GetShardStatus = %v, %v; want the status", st, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("GetShardStatus error = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestTLSCAFileReloaded: a CA bundle file is read again when it changes (the ConfigMap volume
// updated after the operator rolled its CA over), without a new client.
func TestTLSCAFileReloaded(t *testing.T) {
	const name = "web-shards.team-a.svc"
	oldCA, newCA := newCA(t), newCA(t)
	shard := tlsShard(t, newCA, name)
	file := filepath.Join(t.TempDir(), "ca.crt")
	write := func(pem []byte) {
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, pem, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write(oldCA.Bundle)
	c, err := client.New(client.Options{Discovery: mustStatic(t, shard.URL), TLS: &client.TLSOptions{CAFile: file, ServerName: name}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	hc, err := client.NewHTTPClient(client.TLSOptions{CAFile: file, ServerName: name})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.GetStatus(context.Background(), hc, shard.URL); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("a shard of a CA not in the file: %v", err)
	}
	write(append(append([]byte{}, newCA.Bundle...), oldCA.Bundle...))
	if _, err := client.GetStatus(context.Background(), hc, shard.URL); err != nil {
		t.Fatalf("after the CA file was updated: %v", err)
	}
	// a file that turns unreadable keeps the last good bundle
	write([]byte("garbage"))
	if _, err := client.GetStatus(context.Background(), hc, shard.URL); err != nil {
		t.Fatalf("after the CA file turned to garbage: %v", err)
	}
}

func TestTLSOptionsNeedACA(t *testing.T) {
	if _, err := client.NewHTTPClient(client.TLSOptions{ServerName: "x"}); err == nil {
		t.Error("TLS without a CA")
	}
	if _, err := client.NewHTTPClient(client.TLSOptions{CAPEM: []byte("not PEM")}); err == nil {
		t.Error("TLS with a CA PEM of no certificate")
	}
	if _, err := client.NewHTTPClient(client.TLSOptions{CAFile: filepath.Join(t.TempDir(), "missing")}); err == nil {
		t.Error("TLS with a missing CA file")
	}
	if _, err := client.New(client.Options{Discovery: mustStatic(t, "https://10.0.0.1:8080"), TLS: &client.TLSOptions{}}); err == nil {
		t.Error("client.New with TLS options without a CA")
	}
}

func mustStatic(t *testing.T, urls ...string) client.Discovery {
	t.Helper()
	d, err := discovery.Static(urls...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func tlsKeyPair(s *certs.Serving) (*tls.Config, error) {
	cert, err := tls.X509KeyPair(s.CertPEM, s.KeyPEM)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}
