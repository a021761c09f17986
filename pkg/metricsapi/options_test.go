package metricsapi

import (
	"flag"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func TestBindFlags(t *testing.T) {
	var o Options
	fs := flag.NewFlagSet("operator", flag.ContinueOnError)
	o.BindFlags(fs)
	if fs.Lookup("metrics-api-secure-port").DefValue != "6443" {
		t.Errorf("default port %s, want 6443", fs.Lookup("metrics-api-secure-port").DefValue)
	}
	if err := fs.Parse([]string{"--metrics-api", "--metrics-api-secure-port=7443", "--metrics-api-bind-address=127.0.0.1",
		"--metrics-api-tls-cert-file=/tls/tls.crt", "--metrics-api-tls-private-key-file=/tls/tls.key",
		"--metrics-api-cert-dir=/certs", "--metrics-api-auth-kubeconfig=/kc"}); err != nil {
		t.Fatal(err)
	}
	want := Options{Enabled: true, SecurePort: 7443, BindAddress: "127.0.0.1", TLSCertFile: "/tls/tls.crt",
		TLSKeyFile: "/tls/tls.key", CertDir: "/certs", AuthKubeconfig: "/kc"}
	if o != want {
		t.Errorf("options %+v, want %+v", o, want)
	}
}

func TestNewServerRejects(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // not in a Pod, whatever runs the test
	reader := fake.NewClientBuilder().Build()
	cfg := &rest.Config{Host: "https://127.0.0.1:1"}
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"no reader", Options{RESTConfig: cfg}, "Reader is required"},
		{"no REST config", Options{Reader: reader}, "RESTConfig is required"},
		{"cert without key", Options{Reader: reader, RESTConfig: cfg, TLSCertFile: "/x.crt"}, "both the TLS certificate and its key"},
		{"bad bind address", Options{Reader: reader, RESTConfig: cfg, BindAddress: "localhost"}, "not an IP address"},
		{"out of cluster without a kubeconfig", Options{Reader: reader, RESTConfig: cfg}, "--metrics-api-auth-kubeconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewServer(tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
