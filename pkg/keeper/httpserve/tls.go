package httpserve

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"

	"github.com/go-logr/logr"
)

// CertFiles serves the certificate and key of two PEM files (the operator's Secret
// <name>-shard-tls mounted into the shard Pod) and loads them again when either file changes,
// so that a renewed certificate is served without a restart: every TLS handshake stats both
// files (two stat calls) and reloads them when one is another file (the kubelet swaps a Secret
// volume's files by renaming), or has another size or modification time. A pair that does not
// load (a half-written update: a new certificate with the old key) keeps the last good one
// served and is tried again when a file changes next.
type CertFiles struct {
	certFile, keyFile string
	log               logr.Logger

	mu        sync.Mutex
	cert      *tls.Certificate
	stampCert os.FileInfo
	stampKey  os.FileInfo
	lastErr   error
	reloads   int
}

// LoadCertFiles loads certFile and keyFile, which must hold a certificate (chain) and its key.
// Reloads are logged to log.
func LoadCertFiles(certFile, keyFile string, log logr.Logger) (*CertFiles, error) {
	c := &CertFiles{certFile: certFile, keyFile: keyFile, log: log}
	if err := c.reload(); err != nil {
		return nil, err
	}
	c.reloads = 0
	return c, nil
}

// TLSConfig is a server configuration serving the files' certificate (TLS 1.2 and newer).
func (c *CertFiles) TLSConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: c.GetCertificate}
}

// GetCertificate implements tls.Config.GetCertificate: the files' certificate, reloaded first
// when a file changed.
func (c *CertFiles) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.changed() {
		c.lastErr = c.reload()
		if c.lastErr != nil {
			c.log.Error(c.lastErr, "Loading the changed TLS certificate; serving the previous one")
		} else {
			c.log.Info("Serving a changed TLS certificate", "notAfter", c.cert.Leaf.NotAfter)
		}
	}
	return c.cert, nil
}

// Reloads returns how many times the files were loaded again after LoadCertFiles, and the last
// failure to load them (nil when the last attempt worked).
func (c *CertFiles) Reloads() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reloads, c.lastErr
}

// changed reports whether a file differs from the one last loaded (or tried).
func (c *CertFiles) changed() bool {
	for _, f := range []struct {
		name  string
		stamp os.FileInfo
	}{{c.certFile, c.stampCert}, {c.keyFile, c.stampKey}} {
		fi, err := os.Stat(f.name)
		if err != nil {
			return false // gone for a moment (being replaced): serve what we have
		}
		if f.stamp == nil || !os.SameFile(fi, f.stamp) || fi.Size() != f.stamp.Size() || !fi.ModTime().Equal(f.stamp.ModTime()) {
			return true
		}
	}
	return false
}

// reload loads both files; the stamps are taken first, so a change made while loading is seen
// at the next handshake.
func (c *CertFiles) reload() error {
	ci, err := os.Stat(c.certFile)
	if err != nil {
		return fmt.Errorf("reading the TLS certificate: %w", err)
	}
	ki, err := os.Stat(c.keyFile)
	if err != nil {
		return fmt.Errorf("reading the TLS key: %w", err)
	}
	c.stampCert, c.stampKey = ci, ki
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("loading the TLS certificate %s and key %s: %w", c.certFile, c.keyFile, err)
	}
	c.cert = &cert
	c.reloads++
	return nil
}
