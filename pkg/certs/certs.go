package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// Lifetimes of the certificates.
const (
	// CALifetime is how long a generated CA is valid; it is replaced once less than
	// CARenewBefore is left, and kept in the CA bundle beside its successor until it expires.
	CALifetime    = 10 * 365 * 24 * time.Hour
	CARenewBefore = 365 * 24 * time.Hour
	// ServingLifetime is how long a serving certificate is valid; it is replaced, signed by the
	// current CA, once less than ServingRenewBefore is left.
	ServingLifetime    = 365 * 24 * time.Hour
	ServingRenewBefore = 30 * 24 * time.Hour
	// backdate is how far before now certificates start, for clocks a little behind.
	backdate = time.Hour
)

// Keys of the CA in a Secret's data (RenewCA): the CA bundle, then the current CA's key.
const (
	KeyCACert = "ca.crt" // PEM: the current CA, then the previous ones while they are valid
	KeyCAKey  = "ca.key" // PEM: the current CA's key
)

// CA is a certificate authority: its certificate and key, and the PEM bundle clients trust (the
// current CA first, then its predecessors while they are still valid).
type CA struct {
	Cert   *x509.Certificate
	Key    crypto.Signer
	Bundle []byte
}

// Fingerprint is the CA certificate's SHA-256 fingerprint (Fingerprint).
func (ca *CA) Fingerprint() string { return Fingerprint(ca.Cert) }

// LoadCA reads the CA of data (KeyCACert, KeyCAKey): the first certificate of the bundle with
// its key.
func LoadCA(data map[string][]byte) (*CA, error) {
	certs, err := ParseCerts(data[KeyCACert])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KeyCACert, err)
	}
	key, err := ParseKey(data[KeyCAKey])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", KeyCAKey, err)
	}
	if !PublicKeysEqual(certs[0].PublicKey, key.Public()) {
		return nil, fmt.Errorf("%s is not the key of the first certificate of %s", KeyCAKey, KeyCACert)
	}
	if !certs[0].IsCA {
		return nil, fmt.Errorf("the first certificate of %s is not a CA", KeyCACert)
	}
	return &CA{Cert: certs[0], Key: key, Bundle: data[KeyCACert]}, nil
}

// RenewCA checks the CA of data at now. It returns the CA and why it is new: "" when data
// holds a usable CA with at least CARenewBefore left (then the CA is data's); otherwise a new
// CA named commonName, whose bundle keeps the still valid certificates of the old one. The CA's
// Secret data is then {KeyCACert: ca.Bundle, KeyCAKey: EncodeKey(ca.Key)} (CAData).
func RenewCA(data map[string][]byte, commonName string, now time.Time) (*CA, string, error) {
	old, err := LoadCA(data)
	var why string
	switch {
	case err != nil:
		why = fmt.Sprintf("no usable CA (%v)", err)
	case now.Add(CARenewBefore).After(old.Cert.NotAfter):
		why = fmt.Sprintf("the CA expires at %s", old.Cert.NotAfter.UTC().Format(time.RFC3339))
	default:
		return old, "", nil
	}
	cert, key, err := NewCA(commonName, now)
	if err != nil {
		return nil, "", err
	}
	bundle := EncodeCert(cert)
	if prev, perr := ParseCerts(data[KeyCACert]); perr == nil {
		for _, c := range prev {
			if c.IsCA && now.Before(c.NotAfter) {
				bundle = append(bundle, EncodeCert(c)...)
			}
		}
	}
	return &CA{Cert: cert, Key: key, Bundle: bundle}, why, nil
}

// CAData is the Secret data of ca (KeyCACert, KeyCAKey).
func CAData(ca *CA) (map[string][]byte, error) {
	key, err := EncodeKey(ca.Key)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{KeyCACert: ca.Bundle, KeyCAKey: key}, nil
}

// NewCA generates a CA certificate and key valid from now for CALifetime.
func NewCA(commonName string, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating a CA key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    now.Add(-backdate), NotAfter: now.Add(CALifetime),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, IsCA: true, BasicConstraintsValid: true,
		MaxPathLenZero: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing the CA certificate: %w", err)
	}
	return cert, key, nil
}

// Serving is a serving certificate and its key, PEM-encoded, and the certificate parsed.
type Serving struct {
	CertPEM, KeyPEM []byte
	Cert            *x509.Certificate
}

// NewServing generates a serving certificate (server authentication) for dnsNames, the first
// its common name, signed by ca and valid from now for ServingLifetime, or less if the CA ends
// sooner.
func NewServing(ca *CA, dnsNames []string, now time.Time) (*Serving, error) {
	if len(dnsNames) == 0 {
		return nil, errors.New("a serving certificate needs a DNS name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating a serving key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(ServingLifetime)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: dnsNames[0]},
		DNSNames:     dnsNames,
		NotBefore:    now.Add(-backdate), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("creating the serving certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing the serving certificate: %w", err)
	}
	keyPEM, err := EncodeKey(key)
	if err != nil {
		return nil, err
	}
	return &Serving{CertPEM: EncodeCert(cert), KeyPEM: keyPEM, Cert: cert}, nil
}

// ServingDue says whether a serving certificate valid until notAfter is due for renewal at now
// (less than ServingRenewBefore left), and when it will be otherwise.
func ServingDue(notAfter, now time.Time) (due bool, at time.Time) {
	at = notAfter.Add(-ServingRenewBefore)
	return !now.Before(at), at
}

// Fingerprint is the SHA-256 of the certificate's DER, in hex.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

func serialNumber() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating a serial number: %w", err)
	}
	return n, nil
}

// EncodeCert is the certificate in PEM.
func EncodeCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// EncodeKey is the key in PEM (PKCS #8).
func EncodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding a key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseCerts parses the PEM certificates of data, at least one; other PEM blocks are skipped.
func ParseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing a certificate: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no certificate")
	}
	return out, nil
}

// ParseKey parses a PEM private key (PKCS #8, or EC or PKCS #1 for keys written by others).
func ParseKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM key")
	}
	var key any
	var err error
	switch block.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	}
	if err != nil {
		return nil, fmt.Errorf("parsing a key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("a %T key cannot sign", key)
	}
	return signer, nil
}

// PublicKeysEqual reports whether a and b are the same public key.
func PublicKeysEqual(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}
