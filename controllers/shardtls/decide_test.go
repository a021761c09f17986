package shardtls_test

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/shardtls"
	"github.com/renderqueue/renderqueue/pkg/certs"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func newCA(t *testing.T, now time.Time) *certs.CA {
	t.Helper()
	ca, _, err := certs.RenewCA(nil, "shard-ca", now)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func tlsQueue() *rqv1.RenderQueue {
	rq := &rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team-a"}}
	rq.Spec.TLS.Mode = rqv1.ShardTLSOperatorIssued
	return rq
}

func TestIssue(t *testing.T) {
	ca := newCA(t, t0)
	rq := tlsQueue()
	got, err := shardtls.Issue(rq, ca, map[string]string{"renderqueue.dev/queue": "web"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	sec := got.Secret
	if sec.Name != "web-shard-tls" || sec.Namespace != "team-a" || sec.Type != "kubernetes.io/tls" || sec.Labels["renderqueue.dev/queue"] != "web" {
		t.Errorf("Secret %s/%s of type %s, labels %v", sec.Namespace, sec.Name, sec.Type, sec.Labels)
	}
	chain, err := certs.ParseCerts(sec.Data["tls.crt"])
	if err != nil {
		t.Fatal(err)
	}
	key, err := certs.ParseKey(sec.Data["tls.key"])
	if err != nil || !certs.PublicKeysEqual(key.Public(), chain[0].PublicKey) {
		t.Fatalf("tls.key is not the certificate's key (%v)", err)
	}
	if string(sec.Data["ca.crt"]) != string(ca.Bundle) {
		t.Error("ca.crt is not the CA bundle")
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.Bundle)
	for _, name := range []string{"web-shards.team-a.svc", "web-shard-3.web-shards.team-a.svc", "web-shards.team-a.svc.cluster.local", "web-shards"} {
		if _, err := chain[0].Verify(x509.VerifyOptions{DNSName: name, Roots: pool, CurrentTime: t0}); err != nil {
			t.Errorf("the certificate does not verify for %s: %v", name, err)
		}
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{DNSName: "web-shards.team-b.svc", Roots: pool, CurrentTime: t0}); err == nil {
		t.Error("the certificate verifies for another namespace's queue")
	}
	want := rqv1.ShardTLSStatus{
		SecretName: "web-shard-tls", CAConfigMapName: "web-shard-ca", ServerName: "web-shards.team-a.svc",
		Serial: chain[0].SerialNumber.Text(16), NotAfter: metav1.NewTime(t0.Add(certs.ServingLifetime)),
		RenewAfter: metav1.NewTime(t0.Add(certs.ServingLifetime - certs.ServingRenewBefore)), CAFingerprint: ca.Fingerprint(),
	}
	if !got.Status.NotAfter.Equal(&want.NotAfter) || !got.Status.RenewAfter.Equal(&want.RenewAfter) {
		t.Errorf("status until %v, renew after %v; want %v, %v", got.Status.NotAfter, got.Status.RenewAfter, want.NotAfter, want.RenewAfter)
	}
	got.Status.NotAfter, got.Status.RenewAfter = want.NotAfter, want.RenewAfter
	if got.Status != want {
		t.Errorf("status %+v, want %+v", got.Status, want)
	}
}

func TestDecide(t *testing.T) {
	ca := newCA(t, t0)
	issued, err := shardtls.Issue(tlsQueue(), ca, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	rec := issued.Status
	renewAt := t0.Add(certs.ServingLifetime - certs.ServingRenewBefore)
	// the CA rolled over a year before its end: the old one stays in the bundle
	rolled, why, err := certs.RenewCA(mustCAData(t, ca), "next", t0.Add(certs.CALifetime-300*24*time.Hour))
	if err != nil || why == "" {
		t.Fatalf("rolling the CA over: %q, %v", why, err)
	}
	replaced := newCA(t, t0) // the CA Secret deleted and made anew: the old CA is gone
	for _, tc := range []struct {
		name  string
		edit  func(rq *rqv1.RenderQueue)
		ca    *certs.CA
		now   time.Time
		issue string // "" = no
	}{
		{"TLS disabled", func(rq *rqv1.RenderQueue) { rq.Spec.TLS.Mode = rqv1.ShardTLSDisabled }, ca, t0, ""},
		{"TLS disabled by default", func(rq *rqv1.RenderQueue) { rq.Spec.TLS.Mode = "" }, ca, t0, ""},
		{"nothing recorded", func(rq *rqv1.RenderQueue) { rq.Status.TLS = nil }, ca, t0, "no certificate recorded"},
		{"current", nil, ca, t0, ""},
		{"a second before it is due", nil, ca, renewAt.Add(-time.Second), ""},
		{"due", nil, ca, renewAt, "the certificate expires at"},
		{"expired", nil, ca, t0.Add(2 * certs.ServingLifetime), "the certificate expires at"},
		{"another Secret recorded", func(rq *rqv1.RenderQueue) { rq.Status.TLS.SecretName = "old-tls" }, ca, t0, "in the Secret old-tls, not web-shard-tls"},
		{"another server name recorded", func(rq *rqv1.RenderQueue) { rq.Status.TLS.ServerName = "x.svc" }, ca, t0, "for x.svc, not web-shards.team-a.svc"},
		{"the CA rolled over: the old one still trusted", nil, rolled, t0, ""},
		{"the CA replaced", nil, replaced, t0, "CA is not in the shard CA bundle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rq := tlsQueue()
			r := rec
			rq.Status.TLS = &r
			if tc.edit != nil {
				tc.edit(rq)
			}
			d, err := shardtls.Decide(rq, tc.ca, tc.now)
			if err != nil {
				t.Fatal(err)
			}
			if d.Issue != (tc.issue != "") || !strings.Contains(d.Why, tc.issue) {
				t.Fatalf("Decide = %+v, want issue %q", d, tc.issue)
			}
			if !d.Issue && rq.Spec.TLSEnabled() && !d.RenewAt.Equal(renewAt) {
				t.Errorf("RenewAt %v, want %v", d.RenewAt, renewAt)
			}
		})
	}
}

func mustCAData(t *testing.T, ca *certs.CA) map[string][]byte {
	t.Helper()
	d, err := certs.CAData(ca)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestStatusToKeep(t *testing.T) {
	recorded := &rqv1.ShardTLSStatus{Serial: "1"}
	settled := &rqv1.ShardTLSStatus{Serial: "2"}
	tlsPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{rqv1.LabelTLS: "true"}}}
	plainPod := &corev1.Pod{}
	for _, c := range []struct {
		name    string
		on      bool
		settled *rqv1.ShardTLSStatus
		pods    map[string]*corev1.Pod
		want    *rqv1.ShardTLSStatus
		tlsPods bool
	}{
		{"on, issued", true, settled, map[string]*corev1.Pod{"a": tlsPod}, settled, true},
		{"on, blocked", true, nil, nil, recorded, false},
		{"off, TLS shards left", false, nil, map[string]*corev1.Pod{"a": tlsPod, "b": plainPod}, recorded, true},
		{"off, none left", false, nil, map[string]*corev1.Pod{"b": plainPod}, nil, false},
	} {
		rq := tlsQueue()
		if !c.on {
			rq.Spec.TLS.Mode = rqv1.ShardTLSDisabled
		}
		rq.Status.TLS = recorded
		got, tlsPods := shardtls.StatusToKeep(rq, c.settled, c.pods)
		if got != c.want || tlsPods != c.tlsPods {
			t.Errorf("%s: %v, %v; want %v, %v", c.name, got, tlsPods, c.want, c.tlsPods)
		}
	}
}
