package metricsapi

import (
	"flag"
	"os"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
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
		{"exec plugin", Options{Reader: reader, RESTConfig: &rest.Config{Host: "https://h", ExecProvider: &clientcmdapi.ExecConfig{Command: "x"}}},
			"--metrics-api-auth-kubeconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewServer(tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestWriteKubeconfig(t *testing.T) {
	tokenFile := t.TempDir() + "/token" // a file, so that rotated tokens are re-read
	if err := os.WriteFile(tokenFile, []byte("tok"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := &rest.Config{
		Host:            "https://10.0.0.1:6443",
		BearerTokenFile: tokenFile,
		TLSClientConfig: rest.TLSClientConfig{CAData: []byte("ca"), CertData: []byte("cert"), KeyData: []byte("key"), ServerName: "kubernetes"},
		Impersonate:     rest.ImpersonationConfig{UserName: "someone", Groups: []string{"g"}},
	}
	path, cleanup, err := writeKubeconfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("kubeconfig mode %v is readable by others", fi.Mode().Perm())
	}
	got, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Host != cfg.Host || got.BearerTokenFile != cfg.BearerTokenFile || string(got.CAData) != "ca" ||
		string(got.CertData) != "cert" || string(got.KeyData) != "key" || got.ServerName != "kubernetes" ||
		got.Impersonate.UserName != "someone" || len(got.Impersonate.Groups) != 1 {
		t.Errorf("round trip lost something: %+v", got)
	}
	cleanup()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("cleanup left %s: %v", path, err)
	}
}
