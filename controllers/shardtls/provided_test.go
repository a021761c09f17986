package shardtls_test

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/shardtls"
	"github.com/renderqueue/renderqueue/pkg/certs"
)

// testCA is a CA named cn signed by parent (nil: self-signed), without a path length limit: a
// root and an intermediate of cert-manager's issuers, say.
func testCA(t *testing.T, cn string, parent *certs.CA, now time.Time) *certs.CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: cn},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(2 * 365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	signer, signerKey := tmpl, crypto.Signer(key)
	if parent != nil {
		signer, signerKey = parent.Cert, parent.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &certs.CA{Cert: cert, Key: key, Bundle: certs.EncodeCert(cert)}
}

func providedQueue() *rqv1.RenderQueue {
	rq := &rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team-a"}}
	rq.Spec.TLS = rqv1.ShardTLS{Mode: rqv1.ShardTLSProvided, SecretName: "web-cert"}
	return rq
}

// TestCheckProvided: a Secret as cert-manager writes it (tls.crt, tls.key, ca.crt) for the shards'
// server name passes, with or without an intermediate in tls.crt, and is recorded as found; each
// way of being unusable is refused with a sentence that says which.
func TestCheckProvided(t *testing.T) {
	rq := providedQueue()
	root, other := testCA(t, "root", nil, t0), newCA(t, t0)
	inter := testCA(t, "intermediate", root, t0)
	serving := func(ca *certs.CA, names ...string) *certs.Serving {
		s, err := certs.NewServing(ca, names, t0)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	good := serving(root, shardtls.DNSNames(rq)...)
	viaInter := serving(inter, "web-shards.team-a.svc")
	wrongName := serving(root, "web-shards.team-b.svc")
	otherKey := serving(root, shardtls.DNSNames(rq)...)
	byOther := serving(other, shardtls.DNSNames(rq)...)
	secret := func(cert, key, ca []byte) *corev1.Secret {
		data := map[string][]byte{}
		for k, v := range map[string][]byte{"tls.crt": cert, "tls.key": key, "ca.crt": ca} {
			if v != nil {
				data[k] = v
			}
		}
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "web-cert", Namespace: "team-a"}, Type: corev1.SecretTypeTLS, Data: data}
	}
	for _, tc := range []struct {
		name string
		// sec is the Secret spec.tls.secretName names.
		sec *corev1.Secret
		// now is when it is checked (zero: t0).
		now time.Time
		// problem: a refusal containing each of these is expected; none: it passes.
		problem []string
		// leaf and ca: what a passing Secret is recorded as (the serving certificate, and the
		// CA of ca.crt its chain ends at).
		leaf *certs.Serving
		ca   *certs.CA
	}{
		{name: "as cert-manager writes it", sec: secret(good.CertPEM, good.KeyPEM, root.Bundle), leaf: good, ca: root},
		{name: "an intermediate after the certificate", sec: secret(append(bytes.Clone(viaInter.CertPEM), inter.Bundle...), viaInter.KeyPEM, root.Bundle),
			leaf: viaInter, ca: root},
		{name: "a ca.crt of two CAs", sec: secret(good.CertPEM, good.KeyPEM, append(bytes.Clone(other.Bundle), root.Bundle...)), leaf: good, ca: root},
		{name: "no ca.crt", sec: secret(good.CertPEM, good.KeyPEM, nil), problem: []string{"has no ca.crt", "cert-manager"}},
		{name: "no tls.key", sec: secret(good.CertPEM, nil, root.Bundle), problem: []string{"has no tls.key"}},
		{name: "the key of another certificate", sec: secret(good.CertPEM, otherKey.KeyPEM, root.Bundle),
			problem: []string{"tls.crt and tls.key are not a certificate and its key"}},
		{name: "ca.crt not PEM", sec: secret(good.CertPEM, good.KeyPEM, []byte("not a certificate")), problem: []string{"ca.crt:"}},
		{name: "for another namespace's name", sec: secret(wrongName.CertPEM, wrongName.KeyPEM, root.Bundle),
			problem: []string{"does not verify", "server name web-shards.team-a.svc", "web-shards.team-b.svc"}},
		{name: "signed by a CA not in ca.crt", sec: secret(byOther.CertPEM, byOther.KeyPEM, root.Bundle),
			problem: []string{"does not verify", "unknown authority"}},
		{name: "the intermediate missing", sec: secret(viaInter.CertPEM, viaInter.KeyPEM, root.Bundle),
			problem: []string{"does not verify", "unknown authority"}},
		{name: "expired", sec: secret(good.CertPEM, good.KeyPEM, root.Bundle), now: good.Cert.NotAfter.Add(time.Second),
			problem: []string{"does not verify", "expired"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := tc.now
			if now.IsZero() {
				now = t0
			}
			got, problem := shardtls.CheckProvided(rq, tc.sec, now)
			if len(tc.problem) > 0 {
				for _, want := range tc.problem {
					if !strings.Contains(problem, want) {
						t.Errorf("problem %q does not say %q", problem, want)
					}
				}
				if !strings.Contains(problem, "web-cert") {
					t.Errorf("problem %q does not name the Secret", problem)
				}
				return
			}
			if problem != "" {
				t.Fatalf("refused: %s", problem)
			}
			want := rqv1.ShardTLSStatus{
				SecretName: "web-cert", CAConfigMapName: "web-shard-ca", ServerName: "web-shards.team-a.svc",
				Serial: tc.leaf.Cert.SerialNumber.Text(16), NotAfter: metav1.NewTime(tc.leaf.Cert.NotAfter.UTC().Truncate(time.Second)),
				CAFingerprint: tc.ca.Fingerprint(),
			}
			if got.Status != want {
				t.Errorf("status.tls = %+v\nwant %+v", got.Status, want)
			}
			if !bytes.Equal(got.Bundle, tc.sec.Data["ca.crt"]) {
				t.Error("the bundle to publish is not the Secret's ca.crt")
			}
		})
	}
}
