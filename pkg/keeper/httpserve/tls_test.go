package httpserve_test

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/renderqueue/renderqueue/pkg/certs"
	"github.com/renderqueue/renderqueue/pkg/keeper/httpserve"
)

// writeServing issues a serving certificate for names from ca and writes it to dir/tls.crt and
// dir/tls.key the way the kubelet updates a Secret volume: new files renamed over the old ones.
func writeServing(t *testing.T, ca *certs.CA, dir string, names ...string) *x509.Certificate {
	t.Helper()
	s, err := certs.NewServing(ca, names, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"tls.crt": s.CertPEM, "tls.key": s.KeyPEM} {
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return s.Cert
}

// tlsGet fetches url on a new connection, verifying the server for serverName with roots, and
// returns the serving certificate.
func tlsGet(t *testing.T, url, serverName string, roots *x509.CertPool) (*x509.Certificate, error) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: serverName, MinVersion: tls.VersionTLS12}}}
	resp, err := hc.Get(url)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.TLS.PeerCertificates[0], nil
}

func TestCertFilesServeAndReload(t *testing.T) {
	ca, _, err := certs.RenewCA(nil, "shard-ca", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.Bundle)
	dir := t.TempDir()
	const name = "web-shards.team-a.svc"
	first := writeServing(t, ca, dir, name)
	cf, err := httpserve.LoadCertFiles(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	srv.TLS = cf.TLSConfig()
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes below
	srv.StartTLS()
	defer srv.Close()

	got, err := tlsGet(t, srv.URL, name, roots)
	if err != nil || got.SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Fatalf("first certificate: %v (%v)", got, err)
	}
	// a client that trusts another CA refuses it
	other, _, _ := certs.RenewCA(nil, "other-ca", time.Now())
	otherRoots := x509.NewCertPool()
	otherRoots.AppendCertsFromPEM(other.Bundle)
	if _, err := tlsGet(t, srv.URL, name, otherRoots); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("a client trusting another CA: %v, want unknown authority", err)
	}
	// ... and so does one expecting another server name
	if _, err := tlsGet(t, srv.URL, "api-shards.team-a.svc", roots); err == nil || !strings.Contains(err.Error(), "not api-shards.team-a.svc") {
		t.Errorf("a client expecting another name: %v", err)
	}

	// renewed: the next connection gets the new certificate, without a restart
	second := writeServing(t, ca, dir, name)
	got, err = tlsGet(t, srv.URL, name, roots)
	if err != nil || got.SerialNumber.Cmp(second.SerialNumber) != 0 {
		t.Fatalf("after the renewal: serial %v (%v), want %v", got.SerialNumber, err, second.SerialNumber)
	}
	if n, err := cf.Reloads(); n != 1 || err != nil {
		t.Errorf("Reloads = %d, %v; want 1, nil", n, err)
	}

	// a broken update (a key of another certificate): the last good certificate stays
	s3, _ := certs.NewServing(ca, []string{name}, time.Now())
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), s3.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err = tlsGet(t, srv.URL, name, roots)
	if err != nil || got.SerialNumber.Cmp(second.SerialNumber) != 0 {
		t.Fatalf("after a broken update: %v (%v), want the last good certificate", got, err)
	}
	if _, err := cf.Reloads(); err == nil {
		t.Error("a broken update reported no error")
	}
	// and it recovers once the pair is whole again
	third := writeServing(t, ca, dir, name)
	if got, err = tlsGet(t, srv.URL, name, roots); err != nil || got.SerialNumber.Cmp(third.SerialNumber) != 0 {
		t.Fatalf("after the repair: %v (%v)", got, err)
	}
}

func TestLoadCertFilesRefusesAMismatch(t *testing.T) {
	ca, _, err := certs.RenewCA(nil, "shard-ca", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeServing(t, ca, dir, "a.svc")
	s, _ := certs.NewServing(ca, []string{"b.svc"}, time.Now())
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), s.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := httpserve.LoadCertFiles(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), logr.Discard()); err == nil {
		t.Error("a certificate with another's key loaded")
	}
	if _, err := httpserve.LoadCertFiles(filepath.Join(dir, "missing.crt"), filepath.Join(dir, "tls.key"), logr.Discard()); err == nil {
		t.Error("a missing file loaded")
	}
}
