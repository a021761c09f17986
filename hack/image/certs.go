package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"

	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// caBundle returns the image's /etc/ssl/certs/ca-certificates.crt: the roots of Mozilla's NSS
// trust store as packaged by golang.org/x/crypto/x509roots/fallback (pinned in go.mod), PEM
// encoded in the bundle's order. The same module version gives the same bytes on every machine,
// which the host's /etc/ssl (whatever version of Debian's ca-certificates is installed) would
// not. Roots that NSS constrains (a distrust-after date) are left out: a PEM file cannot carry
// the constraint, and trusting them without it would trust more than NSS does.
func caBundle() ([]byte, error) {
	var buf bytes.Buffer
	n := 0
	for root := range bundle.Roots() {
		if root.Constraint != nil {
			continue
		}
		if _, err := x509.ParseCertificate(root.Certificate); err != nil {
			return nil, fmt.Errorf("parsing a root of the x509roots bundle: %w", err)
		}
		if err := pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: root.Certificate}); err != nil {
			return nil, fmt.Errorf("encoding a root of the x509roots bundle: %w", err)
		}
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("the x509roots bundle holds no unconstrained root")
	}
	return buf.Bytes(), nil
}
