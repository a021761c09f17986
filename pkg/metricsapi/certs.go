package metricsapi

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Lifetimes of the certificates the metrics API keeps in its Secret (Options.CertSecret).
const (
	// caLifetime is how long a generated CA is valid; it is replaced once less than
	// caRenewBefore is left, and kept in the CA bundle beside its successor until it expires.
	caLifetime    = 10 * 365 * 24 * time.Hour
	caRenewBefore = 365 * 24 * time.Hour
	// servingLifetime is how long a serving certificate is valid; it is replaced, signed by the
	// same CA, once less than servingRenewBefore is left.
	servingLifetime    = 365 * 24 * time.Hour
	servingRenewBefore = 30 * 24 * time.Hour
	// DefaultCertRefresh is how often every replica reads the Secret again (a certificate a
	// replica renewed reaches the others within it) and checks the APIService's caBundle.
	DefaultCertRefresh = 10 * time.Minute
	// DefaultAPIService is the APIService whose caBundle the metrics API keeps current.
	DefaultAPIService = "v1beta1.external.metrics.k8s.io"
)

// Keys of the certificate Secret (type kubernetes.io/tls).
const (
	keyCACert = "ca.crt" // PEM: the current CA, then the previous one while it is still valid
	keyCAKey  = "ca.key" // PEM: the current CA's key
	keyCert   = corev1.TLSCertKey
	keyKey    = corev1.TLSPrivateKeyKey
)

var apiServiceGVK = schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"}

// renewCerts checks the certificate Secret's data at now and returns it as it should be: the
// same map when it holds a CA with at least caRenewBefore left and a serving certificate for
// dnsNames, signed by that CA, with at least servingRenewBefore left; otherwise new data (a new
// serving certificate signed by the CA, and a new CA first when the CA is missing, unreadable or
// expiring) and why.
func renewCerts(data map[string][]byte, dnsNames []string, now time.Time) (map[string][]byte, string, error) {
	caCerts, caErr := parseCerts(data[keyCACert])
	var caKey crypto.Signer
	if caErr == nil {
		caKey, caErr = parseKey(data[keyCAKey])
	}
	if caErr == nil && !publicKeysEqual(caCerts[0].PublicKey, caKey.Public()) {
		caErr = errors.New("ca.key is not the key of the first certificate of ca.crt")
	}
	var why string
	switch {
	case caErr != nil:
		why = fmt.Sprintf("no usable CA (%v)", caErr)
	case now.Add(caRenewBefore).After(caCerts[0].NotAfter):
		why = fmt.Sprintf("the CA expires at %s", caCerts[0].NotAfter.UTC().Format(time.RFC3339))
	}
	out := map[string][]byte{}
	if why != "" {
		cert, key, err := newCA(now)
		if err != nil {
			return nil, "", err
		}
		bundle := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
		for _, old := range caCerts {
			if now.Before(old.NotAfter) {
				bundle = append(bundle, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: old.Raw})...)
			}
		}
		keyPEM, err := encodeKey(key)
		if err != nil {
			return nil, "", err
		}
		caCerts, caKey = []*x509.Certificate{cert}, key
		out[keyCACert], out[keyCAKey] = bundle, keyPEM
	} else {
		out[keyCACert], out[keyCAKey] = data[keyCACert], data[keyCAKey]
		why = servingProblem(data, caCerts[0], dnsNames, now)
		if why == "" {
			return data, "", nil
		}
	}
	certPEM, keyPEM, err := newServingCert(caCerts[0], caKey, dnsNames, now)
	if err != nil {
		return nil, "", err
	}
	out[keyCert], out[keyKey] = certPEM, keyPEM
	return out, why, nil
}

// servingProblem says what is wrong with the serving certificate of data, "" when nothing is.
func servingProblem(data map[string][]byte, ca *x509.Certificate, dnsNames []string, now time.Time) string {
	certs, err := parseCerts(data[keyCert])
	if err != nil {
		return fmt.Sprintf("no usable serving certificate (%v)", err)
	}
	key, err := parseKey(data[keyKey])
	if err != nil || !publicKeysEqual(certs[0].PublicKey, key.Public()) {
		return "the serving key does not match the certificate"
	}
	cert := certs[0]
	if err := cert.CheckSignatureFrom(ca); err != nil {
		return "the serving certificate is not signed by the CA"
	}
	if now.Add(servingRenewBefore).After(cert.NotAfter) {
		return fmt.Sprintf("the serving certificate expires at %s", cert.NotAfter.UTC().Format(time.RFC3339))
	}
	if !slices.Equal(cert.DNSNames, dnsNames) {
		return fmt.Sprintf("the serving certificate is for %v, not %v", cert.DNSNames, dnsNames)
	}
	return ""
}

func newCA(now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
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
		Subject:      pkix.Name{CommonName: fmt.Sprintf("%s-ca@%d", serverName, now.Unix())},
		NotBefore:    now.Add(-time.Hour), NotAfter: now.Add(caLifetime),
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

func newServingCert(ca *x509.Certificate, caKey crypto.Signer, dnsNames []string, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating a serving key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: dnsNames[0]},
		DNSNames:     dnsNames,
		NotBefore:    now.Add(-time.Hour), NotAfter: now.Add(servingLifetime),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the serving certificate: %w", err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

func serialNumber() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating a serial number: %w", err)
	}
	return n, nil
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding a key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// parseCerts parses the PEM certificates of data, at least one.
func parseCerts(data []byte) ([]*x509.Certificate, error) {
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

// parseKey parses a PEM private key (PKCS #8, or EC or PKCS #1 for keys written by others).
func parseKey(data []byte) (crypto.Signer, error) {
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

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}

// servingCerts keeps the metrics API's serving certificate in a Secret shared by every replica
// of the operator (Options.CertSecret), serves it (a dynamiccertificates.CertKeyContentProvider
// that the generic API server reloads from when it changes), and writes the CA bundle into the
// APIService that points at the metrics API's Service, so that the aggregator verifies the
// server instead of skipping TLS verification.
type servingCerts struct {
	c          client.Client
	secret     types.NamespacedName
	service    types.NamespacedName
	apiService string
	dnsNames   []string
	log        logr.Logger
	now        func() time.Time

	mu        sync.Mutex
	cert, key []byte
	listeners []dynamiccertificates.Listener
}

var _ dynamiccertificates.CertKeyContentProvider = (*servingCerts)(nil)

// serviceDNSNames are the names a client may reach the Service by, the aggregator's first
// (<service>.<namespace>.svc, its TLS server name).
func serviceDNSNames(svc types.NamespacedName) []string {
	return []string{
		svc.Name + "." + svc.Namespace + ".svc",
		svc.Name + "." + svc.Namespace + ".svc.cluster.local",
		svc.Name + "." + svc.Namespace,
		svc.Name,
	}
}

// Name implements dynamiccertificates.CertKeyContentProvider.
func (s *servingCerts) Name() string { return "secret::" + s.secret.String() }

// CurrentCertKeyContent implements dynamiccertificates.CertKeyContentProvider.
func (s *servingCerts) CurrentCertKeyContent() ([]byte, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cert, s.key
}

// AddListener implements dynamiccertificates.Notifier: listeners are told when the certificate
// changes.
func (s *servingCerts) AddListener(l dynamiccertificates.Listener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listeners = append(s.listeners, l)
}

// syncSecret makes sure the Secret holds a current CA and serving certificate (creating or
// renewing them; when another replica wins the write, its certificate is used) and serves it.
// It returns the CA bundle.
func (s *servingCerts) syncSecret(ctx context.Context) ([]byte, error) {
	for range 2 {
		bundle, err := s.syncSecretOnce(ctx)
		if !errors.Is(err, errLostRace) {
			return bundle, err
		}
	}
	return nil, fmt.Errorf("the metrics API's certificate Secret %s keeps changing under this replica's writes", s.secret)
}

// errLostRace: another replica wrote the certificate Secret first; read it again.
var errLostRace = errors.New("another replica wrote the Secret first")

func (s *servingCerts) syncSecretOnce(ctx context.Context) ([]byte, error) {
	var secret corev1.Secret
	err := s.c.Get(ctx, s.secret, &secret)
	switch {
	case apierrors.IsNotFound(err):
		data, _, rerr := renewCerts(nil, s.dnsNames, s.now())
		if rerr != nil {
			return nil, rerr
		}
		secret = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: s.secret.Namespace, Name: s.secret.Name, Labels: map[string]string{
				"app.kubernetes.io/name": "renderqueue-operator", "app.kubernetes.io/component": "metrics-api"}},
			Type: corev1.SecretTypeTLS,
			Data: data,
		}
		err = s.c.Create(ctx, &secret)
		if apierrors.IsAlreadyExists(err) {
			return nil, errLostRace
		}
		if err != nil {
			return nil, fmt.Errorf("creating the metrics API's certificate Secret %s: %w", s.secret, err)
		}
		s.log.Info("Created the metrics API's CA and serving certificate", "secret", s.secret.String())
	case err != nil:
		return nil, fmt.Errorf("reading the metrics API's certificate Secret %s: %w", s.secret, err)
	default:
		data, why, rerr := renewCerts(secret.Data, s.dnsNames, s.now())
		if rerr != nil {
			return nil, rerr
		}
		if why != "" {
			secret.Data = data
			if err := s.c.Update(ctx, &secret); apierrors.IsConflict(err) {
				return nil, errLostRace
			} else if err != nil {
				return nil, fmt.Errorf("renewing the metrics API's certificate in %s (%s): %w", s.secret, why, err)
			}
			s.log.Info("Renewed the metrics API's certificate", "secret", s.secret.String(), "reason", why)
		}
	}
	s.serve(secret.Data[keyCert], secret.Data[keyKey])
	return secret.Data[keyCACert], nil
}

// serve makes cert and key the served certificate, telling the listeners when it changed.
func (s *servingCerts) serve(cert, key []byte) {
	s.mu.Lock()
	changed := !bytes.Equal(cert, s.cert) || !bytes.Equal(key, s.key)
	s.cert, s.key = cert, key
	listeners := slices.Clone(s.listeners)
	s.mu.Unlock()
	if changed {
		for _, l := range listeners {
			l.Enqueue()
		}
	}
}

// syncAPIService writes caBundle into the APIService when it points at the metrics API's Service
// (an APIService pointing elsewhere, another adapter's, is left alone) and its caBundle differs;
// insecureSkipTLSVerify is turned off with it.
func (s *servingCerts) syncAPIService(ctx context.Context, caBundle []byte) error {
	api := &unstructured.Unstructured{}
	api.SetGroupVersionKind(apiServiceGVK)
	if err := s.c.Get(ctx, client.ObjectKey{Name: s.apiService}, api); err != nil {
		return fmt.Errorf("reading the APIService %s: %w", s.apiService, err)
	}
	ns, _, _ := unstructured.NestedString(api.Object, "spec", "service", "namespace")
	name, _, _ := unstructured.NestedString(api.Object, "spec", "service", "name")
	if ns != s.service.Namespace || name != s.service.Name {
		return fmt.Errorf("the APIService %s points at the Service %s/%s, not %s: its caBundle is left alone",
			s.apiService, ns, name, s.service)
	}
	current, _, _ := unstructured.NestedString(api.Object, "spec", "caBundle")
	skip, _, _ := unstructured.NestedBool(api.Object, "spec", "insecureSkipTLSVerify")
	var have []byte
	if err := json.Unmarshal([]byte(`"`+current+`"`), &have); err != nil {
		have = nil
	}
	if bytes.Equal(have, caBundle) && !skip {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"caBundle": caBundle, "insecureSkipTLSVerify": false}})
	if err != nil {
		return fmt.Errorf("building the APIService patch: %w", err)
	}
	if err := s.c.Patch(ctx, api, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("writing the caBundle of the APIService %s: %w", s.apiService, err)
	}
	s.log.Info("Wrote the metrics API's CA bundle into its APIService", "apiService", s.apiService)
	return nil
}

// sync is one round: the Secret, then the APIService.
func (s *servingCerts) sync(ctx context.Context) error {
	bundle, err := s.syncSecret(ctx)
	if err != nil {
		return err
	}
	return s.syncAPIService(ctx, bundle)
}

// run syncs every interval until ctx is done, logging failures (the certificate served stays the
// last good one).
func (s *servingCerts) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.sync(ctx); err != nil {
			s.log.Error(err, "Syncing the metrics API's serving certificate")
		}
	}
}

// parseNamespacedName parses "namespace/name".
func parseNamespacedName(flag, v string) (types.NamespacedName, error) {
	ns, name, ok := strings.Cut(v, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return types.NamespacedName{}, fmt.Errorf("%s %q is not namespace/name", flag, v)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}
