package shardtls

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/certs"
)

// Provided is what CheckProvided found in the Secret of spec.tls Provided: the status.tls that
// records it and the CA bundle (its ca.crt) that clients verify the shards with.
type Provided struct {
	Status rqv1.ShardTLSStatus
	Bundle []byte
}

// CheckProvided checks sec, the Secret spec.tls.secretName of rq (mode Provided), at now: it must
// hold tls.crt (the serving certificate, then any intermediates), the matching tls.key and ca.crt
// (one or more CA certificates), and the certificate must be valid at now for the shards' server
// name (rqv1.ShardServerName) and verify with ca.crt — what a client of the shards checks. A
// Secret that fails returns a problem: one sentence saying what is wrong, for the RenderQueue's
// Reconciled condition (ShardTLSSecretInvalid).
func CheckProvided(rq *rqv1.RenderQueue, sec *corev1.Secret, now time.Time) (p Provided, problem string) {
	name := sec.Name
	for _, k := range []string{KeyCert, KeyKey, KeyCA} {
		if len(sec.Data[k]) == 0 {
			return Provided{}, fmt.Sprintf("the Secret %s (spec.tls.secretName) has no %s: it needs %s, %s and %s, as cert-manager writes them", name, k, KeyCert, KeyKey, KeyCA)
		}
	}
	pair, err := tls.X509KeyPair(sec.Data[KeyCert], sec.Data[KeyKey])
	if err != nil {
		return Provided{}, fmt.Sprintf("the Secret %s (spec.tls.secretName): %s and %s are not a certificate and its key: %v", name, KeyCert, KeyKey, err)
	}
	chain := make([]*x509.Certificate, len(pair.Certificate))
	for i, der := range pair.Certificate {
		if chain[i], err = x509.ParseCertificate(der); err != nil {
			return Provided{}, fmt.Sprintf("the Secret %s (spec.tls.secretName): certificate %d of %s: %v", name, i+1, KeyCert, err)
		}
	}
	cas, err := certs.ParseCerts(sec.Data[KeyCA])
	if err != nil {
		return Provided{}, fmt.Sprintf("the Secret %s (spec.tls.secretName): %s: %v", name, KeyCA, err)
	}
	roots, intermediates := x509.NewCertPool(), x509.NewCertPool()
	for _, c := range cas {
		roots.AddCert(c)
	}
	for _, c := range chain[1:] {
		intermediates.AddCert(c)
	}
	server := rqv1.ShardServerName(rq.Namespace, rq.Name)
	leaf := chain[0]
	chains, err := leaf.Verify(x509.VerifyOptions{DNSName: server, Roots: roots, Intermediates: intermediates, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err != nil {
		return Provided{}, fmt.Sprintf("the certificate of the Secret %s (spec.tls.secretName) does not verify as the shards' (server name %s, with its %s, at %s): %v",
			name, server, KeyCA, now.UTC().Format(time.RFC3339), err)
	}
	root := chains[0][len(chains[0])-1]
	return Provided{
		Status: rqv1.ShardTLSStatus{
			SecretName:      name,
			CAConfigMapName: rqv1.ShardCAConfigMapName(rq.Name),
			ServerName:      server,
			Serial:          leaf.SerialNumber.Text(16),
			NotAfter:        metav1.NewTime(leaf.NotAfter.UTC().Truncate(time.Second)),
			CAFingerprint:   certs.Fingerprint(root),
		},
		Bundle: sec.Data[KeyCA],
	}, ""
}
