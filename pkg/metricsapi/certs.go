package metricsapi

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
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

	"github.com/renderqueue/renderqueue/pkg/certs"
)

// Settings of the metrics API's certificates (kept in its Secret, Options.CertSecret; the CA and
// serving certificate lifetimes are pkg/certs').
const (
	// DefaultCertRefresh is how often every replica reads the Secret again (a certificate a
	// replica renewed reaches the others within it) and checks the APIService's caBundle.
	DefaultCertRefresh = 10 * time.Minute
	// DefaultAPIService is the APIService whose caBundle the metrics API keeps current.
	DefaultAPIService = "v1beta1.external.metrics.k8s.io"
)

// Keys of the certificate Secret (type kubernetes.io/tls).
const (
	keyCACert = certs.KeyCACert // PEM: the current CA, then the previous one while it is still valid
	keyCAKey  = certs.KeyCAKey  // PEM: the current CA's key
	keyCert   = corev1.TLSCertKey
	keyKey    = corev1.TLSPrivateKeyKey
)

var apiServiceGVK = schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"}

// renewCerts checks the certificate Secret's data at now and returns it as it should be: the
// same map when it holds a CA with at least certs.CARenewBefore left and a serving certificate
// for dnsNames, signed by that CA, with at least certs.ServingRenewBefore left; otherwise new
// data (a new serving certificate signed by the CA, and a new CA first when the CA is missing,
// unreadable or expiring) and why.
func renewCerts(data map[string][]byte, dnsNames []string, now time.Time) (map[string][]byte, string, error) {
	ca, why, err := certs.RenewCA(data, fmt.Sprintf("%s-ca@%d", serverName, now.Unix()), now)
	if err != nil {
		return nil, "", err
	}
	out := map[string][]byte{}
	if why != "" {
		if out, err = certs.CAData(ca); err != nil {
			return nil, "", err
		}
	} else {
		out[keyCACert], out[keyCAKey] = data[keyCACert], data[keyCAKey]
		why = servingProblem(data, ca.Cert, dnsNames, now)
		if why == "" {
			return data, "", nil
		}
	}
	serving, err := certs.NewServing(ca, dnsNames, now)
	if err != nil {
		return nil, "", err
	}
	out[keyCert], out[keyKey] = serving.CertPEM, serving.KeyPEM
	return out, why, nil
}

// servingProblem says what is wrong with the serving certificate of data, "" when nothing is.
func servingProblem(data map[string][]byte, ca *x509.Certificate, dnsNames []string, now time.Time) string {
	chain, err := certs.ParseCerts(data[keyCert])
	if err != nil {
		return fmt.Sprintf("no usable serving certificate (%v)", err)
	}
	key, err := certs.ParseKey(data[keyKey])
	if err != nil || !certs.PublicKeysEqual(chain[0].PublicKey, key.Public()) {
		return "the serving key does not match the certificate"
	}
	cert := chain[0]
	if err := cert.CheckSignatureFrom(ca); err != nil {
		return "the serving certificate is not signed by the CA"
	}
	if due, _ := certs.ServingDue(cert.NotAfter, now); due {
		return fmt.Sprintf("the serving certificate expires at %s", cert.NotAfter.UTC().Format(time.RFC3339))
	}
	if !slices.Equal(cert.DNSNames, dnsNames) {
		return fmt.Sprintf("the serving certificate is for %v, not %v", cert.DNSNames, dnsNames)
	}
	return ""
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
