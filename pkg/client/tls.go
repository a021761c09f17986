package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"
)

// TLSOptions say how a client verifies shards that serve their API over HTTPS (spec.tls
// OperatorIssued): against the CA bundle of CAFile or CAPEM, for ServerName. URLs with http://
// are unaffected.
type TLSOptions struct {
	// CAFile is a PEM file of the CA bundle to trust: the ConfigMap <name>-shard-ca (key ca.crt)
	// mounted into the worker's Pod. It is read again when it changes (every TLS handshake
	// stats it), so a CA the operator rolls over is picked up without a restart.
	CAFile string
	// CAPEM is the CA bundle itself, when there is no file (CAFile wins when both are set).
	CAPEM []byte
	// ServerName is the name the shards' certificate is verified for, whatever address is
	// dialled: rqv1.ShardServerName (<name>-shards.<namespace>.svc) for the operator's
	// certificates, which name no IP address. Empty: the URL's host, as usual (and CAFile is
	// then read once).
	ServerName string
}

// NewHTTPClient returns an HTTP client for shard URLs with a 30 s timeout: https:// URLs are
// verified as o says.
func NewHTTPClient(o TLSOptions) (*http.Client, error) {
	cfg, err := o.Config()
	if err != nil {
		return nil, err
	}
	tr, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return nil, errors.New("client: http.DefaultTransport is not an *http.Transport")
	}
	tr = tr.Clone()
	tr.TLSClientConfig = cfg
	return &http.Client{Timeout: 30 * time.Second, Transport: tr}, nil
}

// Config is a client TLS configuration that verifies a server's certificate chain against the
// current CA bundle (read again when CAFile changed) and for ServerName. Without ServerName it is
// the standard verification, for the URL's host, against the bundle as it is now.
func (o TLSOptions) Config() (*tls.Config, error) {
	if o.CAFile == "" && len(o.CAPEM) == 0 {
		return nil, errors.New("client: TLS needs a CA bundle (a file or PEM)")
	}
	roots := &caBundle{file: o.CAFile, pem: o.CAPEM}
	first, err := roots.pool()
	if err != nil {
		return nil, err
	}
	serverName := o.ServerName
	if serverName == "" {
		// the standard verification, for the URL's host (VerifyConnection does not learn the
		// address dialled, so it could not check an IP address)
		return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: first}, nil
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		// The chain is verified below, against the CA bundle as it is at the handshake (the
		// standard verification would fix the roots when the configuration is made); nothing
		// is accepted unverified.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			pool, err := roots.pool()
			if err != nil {
				return err
			}
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the shard sent no certificate")
			}
			name := serverName
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err = cs.PeerCertificates[0].Verify(x509.VerifyOptions{
				DNSName: name, Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			})
			if err != nil {
				return fmt.Errorf("verifying the shard's certificate for %s: %w", name, err)
			}
			return nil
		},
	}, nil
}

// caBundle is a CA pool read from a file (again whenever the file changed) or fixed PEM.
type caBundle struct {
	file string
	pem  []byte

	mu    sync.Mutex
	stamp os.FileInfo
	cur   *x509.CertPool
}

// pool returns the current pool. A file that cannot be read or holds no certificate keeps the
// last good pool (an error only when there never was one).
func (b *caBundle) pool() (*x509.CertPool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.file == "" {
		if b.cur == nil {
			p := x509.NewCertPool()
			if !p.AppendCertsFromPEM(b.pem) {
				return nil, errors.New("client: the TLS CA PEM holds no certificate")
			}
			b.cur = p
		}
		return b.cur, nil
	}
	fi, err := os.Stat(b.file)
	if err == nil && b.stamp != nil && os.SameFile(fi, b.stamp) && fi.Size() == b.stamp.Size() && fi.ModTime().Equal(b.stamp.ModTime()) {
		return b.cur, nil
	}
	var data []byte
	if err == nil {
		data, err = os.ReadFile(b.file)
	}
	p := x509.NewCertPool()
	if err == nil && !p.AppendCertsFromPEM(data) {
		err = errors.New("no PEM certificate in it")
	}
	if err != nil {
		if b.cur != nil {
			return b.cur, nil
		}
		return nil, fmt.Errorf("client: reading the TLS CA file %s: %w", b.file, err)
	}
	b.stamp, b.cur = fi, p
	return p, nil
}
