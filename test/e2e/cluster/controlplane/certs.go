package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// PKI is the set of certificates and keys of the local cluster, written to files in a directory:
// one cluster CA signs the API server's and the kubelet's serving certificates and a client
// certificate for every component, each with the identity a real cluster gives it (the node's in
// group system:nodes, so that the Node authorizer and NodeRestriction apply to it).
type PKI struct {
	dir string

	CACert, CAKey                   string // cluster CA: signs the serving and client certificates
	ServingCert, ServingKey         string // kube-apiserver serving certificate
	AdminCert, AdminKey             string // client certificate of user "admin" in group system:masters
	FrontProxyCACert                string // request-header CA of the aggregation layer
	ProxyClientCert, ProxyClientKey string // the aggregator's client certificate (front-proxy-client)
	SAKey, SAPub                    string // service account token signing key pair
	KubeletCert, KubeletKey         string // the kubelet's serving certificate (the node's name and IP)
	KubeletClientCert               string // the API server's client certificate for the kubelet API
	KubeletClientKey                string
	NodeCert, NodeKey               string // the kubelet's client certificate: system:node:<node> in system:nodes
	ProxyCert, ProxyKey             string // kube-proxy's client certificate: system:kube-proxy
	SchedulerCert, SchedulerKey     string // kube-scheduler's: system:kube-scheduler
	ControllerManagerCert           string // kube-controller-manager's: system:kube-controller-manager
	ControllerManagerKey            string

	caPEM []byte
}

// CAPEM is the cluster CA's certificate, PEM-encoded.
func (p *PKI) CAPEM() []byte { return p.caPEM }

type keyPair struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

var serialLimit = new(big.Int).Lsh(big.NewInt(1), 62)

func newKey() (*ecdsa.PrivateKey, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating a key: %w", err)
	}
	return k, nil
}

// sign issues a certificate from tmpl, signed by parent (self-signed when parent is nil).
func sign(tmpl *x509.Certificate, parent *keyPair) (*keyPair, []byte, error) {
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, serialLimit)
	if err != nil {
		return nil, nil, fmt.Errorf("generating a serial number: %w", err)
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(7 * 24 * time.Hour)
	signerCert, signerKey := tmpl, key
	if parent != nil {
		signerCert, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signerCert, &key.PublicKey, signerKey)
	if err != nil {
		return nil, nil, fmt.Errorf("signing certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	return &keyPair{cert: cert, key: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

func caTemplate(cn string) *x509.Certificate {
	return &x509.Certificate{
		Subject:               pkix.Name{CommonName: cn},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
}

func leafTemplate(cn string, orgs []string, usage x509.ExtKeyUsage) *x509.Certificate {
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: orgs},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
}

func keyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("encoding a key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// newPKI generates every certificate and key the cluster needs into dir: serving certificates
// for the API server (loopback, nodeIP, the first address of serviceCIDR and the kubernetes
// Service's names) and for the kubelet of nodeName (nodeIP), and client certificates.
func newPKI(dir, nodeName string, nodeIP, apiServiceIP net.IP) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	p := &PKI{dir: dir}
	files := map[string][]byte{}
	put := func(name string, data []byte) string {
		files[name] = data
		return filepath.Join(dir, name)
	}
	putKey := func(name string, k *ecdsa.PrivateKey) (string, error) {
		b, err := keyPEM(k)
		if err != nil {
			return "", err
		}
		return put(name, b), nil
	}
	var err error

	ca, caPEM, err := sign(caTemplate("renderqueue-e2e-ca"), nil)
	if err != nil {
		return nil, err
	}
	p.caPEM = caPEM
	p.CACert = put("ca.crt", caPEM)
	if p.CAKey, err = putKey("ca.key", ca.key); err != nil {
		return nil, err
	}

	serving := leafTemplate("kube-apiserver", nil, x509.ExtKeyUsageServerAuth)
	serving.DNSNames = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	serving.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), nodeIP, apiServiceIP}
	sv, svPEM, err := sign(serving, ca)
	if err != nil {
		return nil, err
	}
	p.ServingCert = put("apiserver.crt", svPEM)
	if p.ServingKey, err = putKey("apiserver.key", sv.key); err != nil {
		return nil, err
	}

	admin, adminPEM, err := sign(leafTemplate("admin", []string{"system:masters"}, x509.ExtKeyUsageClientAuth), ca)
	if err != nil {
		return nil, err
	}
	p.AdminCert = put("admin.crt", adminPEM)
	if p.AdminKey, err = putKey("admin.key", admin.key); err != nil {
		return nil, err
	}

	kubelet := leafTemplate("system:node:"+nodeName, []string{"system:nodes"}, x509.ExtKeyUsageServerAuth)
	kubelet.DNSNames = []string{"localhost", nodeName}
	kubelet.IPAddresses = []net.IP{net.ParseIP("127.0.0.1"), nodeIP}
	kl, klPEM, err := sign(kubelet, ca)
	if err != nil {
		return nil, err
	}
	p.KubeletCert = put("kubelet.crt", klPEM)
	if p.KubeletKey, err = putKey("kubelet.key", kl.key); err != nil {
		return nil, err
	}
	kc, kcPEM, err := sign(leafTemplate("kube-apiserver-kubelet-client", nil, x509.ExtKeyUsageClientAuth), ca)
	if err != nil {
		return nil, err
	}
	p.KubeletClientCert = put("apiserver-kubelet-client.crt", kcPEM)
	if p.KubeletClientKey, err = putKey("apiserver-kubelet-client.key", kc.key); err != nil {
		return nil, err
	}

	for _, c := range []struct {
		cn        string
		orgs      []string
		name      string
		cert, key *string
	}{
		{"system:node:" + nodeName, []string{"system:nodes"}, "node", &p.NodeCert, &p.NodeKey},
		{"system:kube-proxy", nil, "kube-proxy", &p.ProxyCert, &p.ProxyKey},
		{"system:kube-scheduler", nil, "kube-scheduler", &p.SchedulerCert, &p.SchedulerKey},
		{"system:kube-controller-manager", nil, "kube-controller-manager", &p.ControllerManagerCert, &p.ControllerManagerKey},
	} {
		kp, kpPEM, err := sign(leafTemplate(c.cn, c.orgs, x509.ExtKeyUsageClientAuth), ca)
		if err != nil {
			return nil, err
		}
		*c.cert = put(c.name+".crt", kpPEM)
		if *c.key, err = putKey(c.name+".key", kp.key); err != nil {
			return nil, err
		}
	}

	fpCA, fpCAPEM, err := sign(caTemplate("renderqueue-e2e-front-proxy-ca"), nil)
	if err != nil {
		return nil, err
	}
	p.FrontProxyCACert = put("front-proxy-ca.crt", fpCAPEM)
	proxy, proxyPEM, err := sign(leafTemplate("front-proxy-client", nil, x509.ExtKeyUsageClientAuth), fpCA)
	if err != nil {
		return nil, err
	}
	p.ProxyClientCert = put("front-proxy-client.crt", proxyPEM)
	if p.ProxyClientKey, err = putKey("front-proxy-client.key", proxy.key); err != nil {
		return nil, err
	}

	sa, err := newKey()
	if err != nil {
		return nil, err
	}
	if p.SAKey, err = putKey("sa.key", sa); err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("encoding the service account public key: %w", err)
	}
	p.SAPub = put("sa.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}))

	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, fmt.Errorf("writing %s: %w", name, err)
		}
	}
	return p, nil
}
