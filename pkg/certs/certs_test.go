package certs_test

import (
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/certs"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func mustCA(t *testing.T, now time.Time) map[string][]byte {
	t.Helper()
	ca, why, err := certs.RenewCA(nil, "test-ca", now)
	if err != nil || !strings.Contains(why, "no usable CA") {
		t.Fatalf("RenewCA(nothing) = %q, %v", why, err)
	}
	data, err := certs.CAData(ca)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestRenewCA(t *testing.T) {
	data := mustCA(t, t0)
	other := mustCA(t, t0)
	year := 365 * 24 * time.Hour
	for _, tc := range []struct {
		name    string
		data    map[string][]byte
		now     time.Time
		why     string // "" keeps the CA
		bundled int    // certificates in the new bundle
	}{
		{"fresh", data, t0, "", 1},
		{"nine years on: more than a year left", data, t0.Add(9*year - 24*time.Hour), "", 1},
		{"within a year of its end", data, t0.Add(9*year + 24*time.Hour), "the CA expires", 2},
		{"expired", data, t0.Add(11 * year), "the CA expires", 1},
		{"nothing", nil, t0, "no usable CA", 1},
		{"no key", map[string][]byte{certs.KeyCACert: data[certs.KeyCACert]}, t0, "no usable CA (ca.key: no PEM key)", 2},
		{"another CA's key", map[string][]byte{certs.KeyCACert: data[certs.KeyCACert], certs.KeyCAKey: other[certs.KeyCAKey]}, t0,
			"is not the key of the first certificate", 2},
		{"garbage", map[string][]byte{certs.KeyCACert: []byte("x"), certs.KeyCAKey: []byte("y")}, t0, "no usable CA (ca.crt: no certificate)", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca, why, err := certs.RenewCA(tc.data, "renewed", tc.now)
			if err != nil {
				t.Fatal(err)
			}
			if tc.why == "" {
				if why != "" || string(ca.Bundle) != string(tc.data[certs.KeyCACert]) {
					t.Fatalf("RenewCA = new CA (%q), want the same", why)
				}
				return
			}
			if !strings.Contains(why, tc.why) {
				t.Fatalf("RenewCA why = %q, want %q", why, tc.why)
			}
			if ca.Cert.Subject.CommonName != "renewed" || !ca.Cert.NotAfter.Equal(tc.now.Add(certs.CALifetime)) {
				t.Errorf("new CA %q until %v", ca.Cert.Subject.CommonName, ca.Cert.NotAfter)
			}
			bundle, err := certs.ParseCerts(ca.Bundle)
			if err != nil || len(bundle) != tc.bundled || !bundle[0].Equal(ca.Cert) {
				t.Errorf("bundle of %d certificates (%v), want %d, the new CA first", len(bundle), err, tc.bundled)
			}
			out, err := certs.CAData(ca)
			if err != nil {
				t.Fatal(err)
			}
			if again, why, err := certs.RenewCA(out, "again", tc.now); err != nil || why != "" || !again.Cert.Equal(ca.Cert) {
				t.Errorf("the renewed CA does not load back as current: %q, %v", why, err)
			}
		})
	}
}

func TestNewServing(t *testing.T) {
	ca, _, err := certs.RenewCA(nil, "test-ca", t0)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"web-shards.team-a.svc", "*.web-shards.team-a.svc"}
	s, err := certs.NewServing(ca, names, t0)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.Bundle)
	for _, tc := range []struct {
		name  string
		dns   string
		roots *x509.CertPool
		at    time.Time
		ok    bool
	}{
		{"the server name", "web-shards.team-a.svc", pool, t0, true},
		{"a Pod's host name", "web-shard-0.web-shards.team-a.svc", pool, t0, true},
		{"another queue's name", "api-shards.team-a.svc", pool, t0, false},
		{"after its end", "web-shards.team-a.svc", pool, t0.Add(certs.ServingLifetime + time.Minute), false},
		{"another CA", "web-shards.team-a.svc", x509.NewCertPool(), t0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Cert.Verify(x509.VerifyOptions{DNSName: tc.dns, Roots: tc.roots, CurrentTime: tc.at})
			if (err == nil) != tc.ok {
				t.Errorf("Verify = %v, want ok %v", err, tc.ok)
			}
		})
	}
	key, err := certs.ParseKey(s.KeyPEM)
	if err != nil || !certs.PublicKeysEqual(key.Public(), s.Cert.PublicKey) {
		t.Errorf("the key does not belong to the certificate (%v)", err)
	}
	if _, err := certs.NewServing(ca, nil, t0); err == nil {
		t.Error("a serving certificate without names")
	}
	// a CA with less than a year left: the serving certificate ends with it
	late := t0.Add(certs.CALifetime - 100*24*time.Hour)
	if s, err := certs.NewServing(ca, names, late); err != nil || !s.Cert.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("serving certificate until %v, want the CA's end %v (%v)", s.Cert.NotAfter, ca.Cert.NotAfter, err)
	}
}

func TestServingDue(t *testing.T) {
	notAfter := t0.Add(certs.ServingLifetime)
	for _, tc := range []struct {
		now time.Time
		due bool
	}{
		{t0, false},
		{notAfter.Add(-certs.ServingRenewBefore - time.Second), false},
		{notAfter.Add(-certs.ServingRenewBefore), true},
		{notAfter.Add(time.Hour), true},
	} {
		due, at := certs.ServingDue(notAfter, tc.now)
		if due != tc.due || !at.Equal(notAfter.Add(-30*24*time.Hour)) {
			t.Errorf("ServingDue(%v, %v) = %v, %v; want %v", notAfter, tc.now, due, at, tc.due)
		}
	}
}
