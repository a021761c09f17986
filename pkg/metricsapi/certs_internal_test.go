package metricsapi

import (
	"bytes"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/renderqueue/renderqueue/pkg/certs"
)

var testNames = serviceDNSNames(types.NamespacedName{Namespace: "renderqueue-system", Name: "renderqueue-metrics-api"})

// verifyServing checks that data's serving certificate verifies, for the aggregator's server
// name, against data's CA bundle at now, and returns it.
func verifyServing(t *testing.T, data map[string][]byte, now time.Time) *x509.Certificate {
	t.Helper()
	chain, err := certs.ParseCerts(data[keyCert])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data[keyCACert]) {
		t.Fatal("ca.crt holds no certificate")
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{DNSName: "renderqueue-metrics-api.renderqueue-system.svc", Roots: pool,
		CurrentTime: now}); err != nil {
		t.Fatalf("the serving certificate does not verify against the CA bundle: %v", err)
	}
	return chain[0]
}

func TestRenewCerts(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	fresh, why, err := renewCerts(nil, testNames, now)
	if err != nil || !strings.Contains(why, "no usable CA") {
		t.Fatalf("renewCerts(nothing) = %q, %v", why, err)
	}
	cert := verifyServing(t, fresh, now)
	if !cert.NotAfter.Equal(now.Add(certs.ServingLifetime)) || cert.DNSNames[0] != "renderqueue-metrics-api.renderqueue-system.svc" {
		t.Errorf("serving certificate until %v for %v", cert.NotAfter, cert.DNSNames)
	}

	// current: nothing changes
	if same, why, err := renewCerts(fresh, testNames, now.Add(300*24*time.Hour)); err != nil || why != "" || !bytes.Equal(same[keyCert], fresh[keyCert]) {
		t.Errorf("a current certificate was renewed: %q, %v", why, err)
	}

	// the serving certificate within 30 days of its end: a new one, from the same CA
	later := now.Add(certs.ServingLifetime - 29*24*time.Hour)
	renewed, why, err := renewCerts(fresh, testNames, later)
	if err != nil || !strings.Contains(why, "the serving certificate expires") {
		t.Fatalf("renewCerts(expiring) = %q, %v", why, err)
	}
	if !bytes.Equal(renewed[keyCACert], fresh[keyCACert]) || !bytes.Equal(renewed[keyCAKey], fresh[keyCAKey]) {
		t.Error("renewing the serving certificate changed the CA (the APIService's caBundle would have to follow)")
	}
	if c := verifyServing(t, renewed, later); c.SerialNumber.Cmp(cert.SerialNumber) == 0 {
		t.Error("the same serving certificate")
	}

	// other DNS names (another Service): a new serving certificate
	other := serviceDNSNames(types.NamespacedName{Namespace: "monitoring", Name: "metrics"})
	if moved, why, err := renewCerts(fresh, other, now); err != nil || !strings.Contains(why, "not [metrics.monitoring.svc") {
		t.Errorf("renewCerts(other names) = %q, %v", why, err)
	} else if c, _ := certs.ParseCerts(moved[keyCert]); c[0].DNSNames[0] != "metrics.monitoring.svc" {
		t.Errorf("renewed for %v", c[0].DNSNames)
	}

	// the CA within a year of its end: a new CA, the old one still in the bundle
	caEnd := now.Add(certs.CALifetime - 364*24*time.Hour)
	rolled, why, err := renewCerts(renewed, testNames, caEnd)
	if err != nil || !strings.Contains(why, "the CA expires") {
		t.Fatalf("renewCerts(CA expiring) = %q, %v", why, err)
	}
	cas, err := certs.ParseCerts(rolled[keyCACert])
	if err != nil || len(cas) != 2 {
		t.Fatalf("CA bundle of %d certificates (%v), want the new and the old", len(cas), err)
	}
	olds, _ := certs.ParseCerts(fresh[keyCACert])
	if !cas[1].Equal(olds[0]) || cas[0].Equal(olds[0]) {
		t.Error("the bundle is not [new CA, old CA]")
	}
	if c := verifyServing(t, rolled, caEnd); c.CheckSignatureFrom(cas[0]) != nil {
		t.Error("the serving certificate is not signed by the new CA")
	}

	// garbage, a key that is not the CA's, a serving certificate of another CA
	for name, tc := range map[string]struct {
		data map[string][]byte
		at   time.Time
	}{
		"garbage":      {map[string][]byte{keyCACert: []byte("x"), keyCAKey: []byte("y"), keyCert: []byte("z"), keyKey: []byte("w")}, now},
		"swapped keys": {map[string][]byte{keyCACert: fresh[keyCACert], keyCAKey: fresh[keyKey], keyCert: fresh[keyCert], keyKey: fresh[keyKey]}, now},
		"foreign cert": {map[string][]byte{keyCACert: rolled[keyCACert], keyCAKey: rolled[keyCAKey], keyCert: fresh[keyCert], keyKey: fresh[keyKey]}, caEnd},
	} {
		out, why, err := renewCerts(tc.data, testNames, tc.at)
		if err != nil || why == "" {
			t.Errorf("%s: renewCerts = %q, %v; want a renewal", name, why, err)
			continue
		}
		verifyServing(t, out, tc.at)
	}
}
