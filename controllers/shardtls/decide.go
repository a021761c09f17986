package shardtls

import (
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/certs"
)

// DNSNames are the names a shard certificate of rq is issued for: rqv1.ShardServerName first
// (what clients verify), then the headless Service's other names and, as wildcards, the shards'
// host names under it (<pod>.<name>-shards.<namespace>.svc).
func DNSNames(rq *rqv1.RenderQueue) []string {
	svc := rq.Name + "-shards"
	return []string{
		rqv1.ShardServerName(rq.Namespace, rq.Name),
		"*." + svc + "." + rq.Namespace + ".svc",
		svc + "." + rq.Namespace + ".svc.cluster.local",
		"*." + svc + "." + rq.Namespace + ".svc.cluster.local",
		svc + "." + rq.Namespace,
		svc,
	}
}

// Decision says whether rq's shards need a new serving certificate now.
type Decision struct {
	// Issue is true when a certificate must be issued and written now; Why says why.
	Issue bool
	Why   string
	// RenewAt is when the recorded certificate is due (when Issue is false).
	RenewAt time.Time
}

// Decide decides, from rq's spec and status.tls only, whether its shards need a new serving
// certificate at now, with ca the operator's current shard CA (its bundle lists every CA the
// clients trust). Only for spec.tls OperatorIssued (otherwise: no decision to make).
//
// A certificate is issued when none is recorded; when the record names another Secret or
// server name (the names changed); when the CA that signed it is no longer in the bundle (the
// operator's CA Secret was replaced: the clients cannot verify it); and when it is within
// certs.ServingRenewBefore of its end. A CA rolled over in the ordinary way (the old CA stays in
// the bundle until it expires, and no serving certificate outlives its CA) does not reissue at
// once: the shards keep their certificate until it is due, so that workers have read the new
// bundle long before a certificate of the new CA is served.
func Decide(rq *rqv1.RenderQueue, ca *certs.CA, now time.Time) (Decision, error) {
	if rq.Spec.TLS.Mode != rqv1.ShardTLSOperatorIssued {
		return Decision{}, nil
	}
	rec := rq.Status.TLS
	switch {
	case rec == nil:
		return Decision{Issue: true, Why: "no certificate recorded in status.tls"}, nil
	case rec.SecretName != rqv1.ShardTLSSecretName(rq.Name):
		return Decision{Issue: true, Why: fmt.Sprintf("the recorded certificate is in the Secret %s, not %s", rec.SecretName, rqv1.ShardTLSSecretName(rq.Name))}, nil
	case rec.ServerName != rqv1.ShardServerName(rq.Namespace, rq.Name):
		return Decision{Issue: true, Why: fmt.Sprintf("the recorded certificate is for %s, not %s", rec.ServerName, rqv1.ShardServerName(rq.Namespace, rq.Name))}, nil
	}
	trusted, err := bundleFingerprints(ca.Bundle)
	if err != nil {
		return Decision{}, err
	}
	if !slices.Contains(trusted, rec.CAFingerprint) {
		return Decision{Issue: true, Why: "the recorded certificate's CA is not in the shard CA bundle"}, nil
	}
	due, at := certs.ServingDue(rec.NotAfter.Time, now)
	if due {
		return Decision{Issue: true, Why: fmt.Sprintf("the certificate expires at %s", rec.NotAfter.UTC().Format(time.RFC3339))}, nil
	}
	return Decision{RenewAt: at}, nil
}

func bundleFingerprints(bundle []byte) ([]string, error) {
	cas, err := certs.ParseCerts(bundle)
	if err != nil {
		return nil, fmt.Errorf("the shard CA bundle: %w", err)
	}
	out := make([]string, len(cas))
	for i, c := range cas {
		out[i] = certs.Fingerprint(c)
	}
	return out, nil
}

// Issued is a serving certificate issued for a RenderQueue's shards: its Secret (without owner
// reference: the reconciler sets it) and the status.tls that records it.
type Issued struct {
	Secret *corev1.Secret
	Status rqv1.ShardTLSStatus
}

// Secret keys: the kubernetes.io/tls pair, and the CA bundle beside it.
const (
	KeyCert = corev1.TLSCertKey
	KeyKey  = corev1.TLSPrivateKeyKey
	KeyCA   = rqv1.ShardCAKey
)

// Issue issues a serving certificate for rq's shards (DNSNames), signed by ca at now, in the
// Secret rqv1.ShardTLSSecretName with labels.
func Issue(rq *rqv1.RenderQueue, ca *certs.CA, labels map[string]string, now time.Time) (*Issued, error) {
	s, err := certs.NewServing(ca, DNSNames(rq), now)
	if err != nil {
		return nil, fmt.Errorf("issuing the shards' certificate of %s/%s: %w", rq.Namespace, rq.Name, err)
	}
	due, renewAt := certs.ServingDue(s.Cert.NotAfter, now)
	if due {
		// a CA that ends within ServingRenewBefore is replaced before it is used (RenewCA)
		return nil, fmt.Errorf("issuing the shards' certificate of %s/%s: the CA ends at %s, too soon", rq.Namespace, rq.Name, ca.Cert.NotAfter)
	}
	name := rqv1.ShardTLSSecretName(rq.Name)
	return &Issued{
		Secret: &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: rq.Namespace, Labels: labels},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{KeyCert: s.CertPEM, KeyKey: s.KeyPEM, KeyCA: ca.Bundle},
		},
		Status: rqv1.ShardTLSStatus{
			SecretName:      name,
			CAConfigMapName: rqv1.ShardCAConfigMapName(rq.Name),
			ServerName:      rqv1.ShardServerName(rq.Namespace, rq.Name),
			Serial:          s.Cert.SerialNumber.Text(16),
			NotAfter:        metav1.NewTime(s.Cert.NotAfter.UTC().Truncate(time.Second)),
			RenewAfter:      metav1.NewTime(renewAt.UTC().Truncate(time.Second)),
			CAFingerprint:   ca.Fingerprint(),
		},
	}, nil
}

// StatusToKeep is the status.tls to record for rq once its shards are polled, given settled (what
// the reconciler issued or found this time, nil when it did not run) and pods, its shard Pods.
// While spec.tls is on, it is settled, or what was recorded when a blocker kept the reconciler
// from running. Once it is off, shards created with TLS (labelled rqv1.LabelTLS) may still run
// until they are replaced: until none is left, status.tls is kept (and they are polled over HTTPS
// with the shard CA: tlsPods); then it is cleared.
func StatusToKeep(rq *rqv1.RenderQueue, settled *rqv1.ShardTLSStatus, pods map[string]*corev1.Pod) (status *rqv1.ShardTLSStatus, tlsPods bool) {
	for _, p := range pods {
		if p.Labels[rqv1.LabelTLS] == "true" {
			tlsPods = true
		}
	}
	switch {
	case rq.Spec.TLSEnabled() && settled == nil, !rq.Spec.TLSEnabled() && tlsPods:
		return rq.Status.TLS, tlsPods
	case !rq.Spec.TLSEnabled():
		return nil, tlsPods
	}
	return settled, tlsPods
}
