package controllers

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/certs"
)

// serveTLS restarts f's server over HTTPS with the certificate of certPEM and keyPEM: the
// registry then resolves its shard to https://127.0.0.1:<port>, and the operator must verify it.
func (r *fakeRegistry) serveTLS(f *fakeShard, certPEM, keyPEM []byte) {
	GinkgoHelper()
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	Expect(err).NotTo(HaveOccurred())
	srv := httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	srv.StartTLS()
	r.mu.Lock()
	old := f.srv
	f.srv = srv
	r.mu.Unlock()
	old.Close()
}

// secretCert is the serving certificate of the shards' TLS Secret, read as the test's admin.
func secretCert(g Gomega, key types.NamespacedName) (*corev1.Secret, *x509.Certificate) {
	var sec corev1.Secret
	g.Expect(k8sClient.Get(suiteCtx, key, &sec)).To(Succeed())
	chain, err := certs.ParseCerts(sec.Data[corev1.TLSCertKey])
	g.Expect(err).NotTo(HaveOccurred())
	return &sec, chain[0]
}

// editTLSStatus changes status.tls as the test's admin (a renewal due, a status lost).
func editTLSStatus(rq *rqv1.RenderQueue, edit func(s *rqv1.RenderQueueStatus)) {
	GinkgoHelper()
	Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var cur rqv1.RenderQueue
		if err := k8sClient.Get(suiteCtx, client.ObjectKeyFromObject(rq), &cur); err != nil {
			return err
		}
		edit(&cur.Status)
		return k8sClient.Status().Update(suiteCtx, &cur)
	})).To(Succeed())
}

var _ = Describe("Shard TLS", func() {
	It("issues the shards a certificate of the shard CA, publishes the CA, polls over HTTPS, and renews without reading the Secret", func() {
		rq, fs := newQueue("tls", 1, 1, func(rq *rqv1.RenderQueue) { rq.Spec.TLS.Mode = rqv1.ShardTLSOperatorIssued })
		key := func(name string) types.NamespacedName {
			return types.NamespacedName{Namespace: rq.Namespace, Name: name}
		}
		rq = settled(rq, 1)
		serverName := "tls-shards." + rq.Namespace + ".svc"

		By("the shard CA, in the operator's namespace")
		var caSecret corev1.Secret
		Expect(k8sClient.Get(suiteCtx, shardCASecret, &caSecret)).To(Succeed())
		ca, err := certs.LoadCA(caSecret.Data)
		Expect(err).NotTo(HaveOccurred())

		By("the CA ConfigMap and the certificate Secret, owned by the RenderQueue")
		var cm corev1.ConfigMap
		Expect(k8sClient.Get(suiteCtx, key("tls-shard-ca"), &cm)).To(Succeed())
		Expect(ownedBy(&cm, rq)).To(BeTrue())
		Expect(cm.Labels).To(HaveKeyWithValue(rqv1.LabelQueue, "tls"))
		Expect(cm.Data).To(HaveKeyWithValue("ca.crt", string(ca.Bundle)))
		sec, cert := secretCert(Default, key("tls-shard-tls"))
		Expect(ownedBy(sec, rq)).To(BeTrue())
		Expect(sec.Type).To(Equal(corev1.SecretTypeTLS))
		Expect(sec.Data).To(HaveKey("tls.key"))
		pool := x509.NewCertPool()
		Expect(pool.AppendCertsFromPEM([]byte(cm.Data["ca.crt"]))).To(BeTrue())
		_, err = cert.Verify(x509.VerifyOptions{DNSName: serverName, Roots: pool})
		Expect(err).NotTo(HaveOccurred(), "the shards' certificate does not verify for %s against the published CA", serverName)

		By("status.tls records it")
		Expect(rq.Status.TLS).NotTo(BeNil())
		got := *rq.Status.TLS
		Expect(got.NotAfter.Time).To(BeTemporally("==", cert.NotAfter))
		Expect(got.RenewAfter.Time).To(BeTemporally("==", cert.NotAfter.Add(-certs.ServingRenewBefore)))
		got.NotAfter, got.RenewAfter = metav1.Time{}, metav1.Time{}
		Expect(got).To(Equal(rqv1.ShardTLSStatus{
			SecretName: "tls-shard-tls", CAConfigMapName: "tls-shard-ca", ServerName: serverName,
			Serial: cert.SerialNumber.Text(16), CAFingerprint: ca.Fingerprint(),
		}))
		Eventually(func(g Gomega) []string { return eventReasons(g, rq) }).Should(ContainElement(EventShardCertificateIssued))

		By("the shard Pod mounts it, serves HTTPS and is probed over HTTPS")
		var pod corev1.Pod
		Expect(k8sClient.Get(suiteCtx, key("tls-shard-0"), &pod)).To(Succeed())
		Expect(pod.Labels).To(HaveKeyWithValue(rqv1.LabelTLS, "true"))
		c := pod.Spec.Containers[0]
		Expect(c.Args).To(ContainElements("--tls-cert-file", "/var/run/renderqueue/tls/tls.crt", "--tls-key-file", "/var/run/renderqueue/tls/tls.key"))
		Expect(c.ReadinessProbe.HTTPGet.Scheme).To(Equal(corev1.URISchemeHTTPS))
		Expect(c.LivenessProbe.HTTPGet.Scheme).To(Equal(corev1.URISchemeHTTPS))
		Expect(c.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "shard-tls", MountPath: "/var/run/renderqueue/tls", ReadOnly: true}))
		Expect(pod.Spec.Volumes).To(ContainElement(HaveField("VolumeSource.Secret.SecretName", "tls-shard-tls")))

		By("the operator polls the shard over HTTPS, verifying it with the CA and the server name")
		fakes.serveTLS(fs[0], sec.Data["tls.crt"], sec.Data["tls.key"])
		Eventually(func(g Gomega) {
			out := getQueue(g, rq)
			g.Expect(out.Status.Shards).To(HaveLen(1))
			g.Expect(out.Status.Shards[0].URL).To(HavePrefix("https://"))
			g.Expect(out.Status.Shards[0].State).To(Equal("queued"))
			g.Expect(out.Status.Shards[0].Error).To(BeEmpty())
		}).WithTimeout(15 * time.Second).Should(Succeed())

		By("a shard whose certificate another CA signed is unreachable")
		other, _, err := certs.RenewCA(nil, "impostor", time.Now())
		Expect(err).NotTo(HaveOccurred())
		impostor, err := certs.NewServing(other, []string{serverName}, time.Now())
		Expect(err).NotTo(HaveOccurred())
		fakes.serveTLS(fs[0], impostor.CertPEM, impostor.KeyPEM)
		Eventually(func(g Gomega) {
			out := getQueue(g, rq)
			g.Expect(out.Status.Shards[0].State).To(Equal("Unreachable"))
			g.Expect(out.Status.Shards[0].Error).To(ContainSubstring("certificate signed by unknown authority"))
		}).WithTimeout(15 * time.Second).Should(Succeed())
		fakes.serveTLS(fs[0], sec.Data["tls.crt"], sec.Data["tls.key"])

		By("the operator cannot read the Secret it renews")
		operator, err := client.New(operatorCfg, client.Options{Scheme: k8sClient.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		Expect(apierrors.IsForbidden(operator.Get(suiteCtx, key("tls-shard-tls"), &corev1.Secret{}))).To(BeTrue(),
			"the operator's RBAC lets it read the shards' certificate Secret")

		By("a renewal due: the Secret is overwritten with a new certificate, recorded in the status")
		oldSerial := rq.Status.TLS.Serial
		editTLSStatus(rq, func(s *rqv1.RenderQueueStatus) {
			s.TLS.NotAfter = metav1.NewTime(time.Now().Add(24 * time.Hour).Truncate(time.Second))
			s.TLS.RenewAfter = metav1.NewTime(time.Now().Add(-24 * time.Hour).Truncate(time.Second))
		})
		var renewed *rqv1.RenderQueue
		Eventually(func(g Gomega) {
			renewed = getQueue(g, rq)
			g.Expect(renewed.Status.TLS).NotTo(BeNil())
			g.Expect(renewed.Status.TLS.Serial).NotTo(Equal(oldSerial))
			_, cert := secretCert(g, key("tls-shard-tls"))
			g.Expect(cert.SerialNumber.Text(16)).To(Equal(renewed.Status.TLS.Serial))
		}).WithTimeout(15 * time.Second).Should(Succeed())
		Expect(renewed.Status.TLS.NotAfter.Time).To(BeTemporally(">", time.Now().Add(300*24*time.Hour)))
		sec, _ = secretCert(Default, key("tls-shard-tls"))
		Expect(ownedBy(sec, rq)).To(BeTrue())
		Expect(eventMessage(Default, rq, EventShardCertificateIssued)).To(ContainSubstring("in the Secret tls-shard-tls"))

		By("the status lost: a new certificate overwrites the Secret")
		lostSerial := renewed.Status.TLS.Serial
		editTLSStatus(rq, func(s *rqv1.RenderQueueStatus) { s.TLS = nil })
		Eventually(func(g Gomega) {
			out := getQueue(g, rq)
			g.Expect(out.Status.TLS).NotTo(BeNil())
			g.Expect(out.Status.TLS.Serial).NotTo(Equal(lostSerial))
			_, cert := secretCert(g, key("tls-shard-tls"))
			g.Expect(cert.SerialNumber.Text(16)).To(Equal(out.Status.TLS.Serial))
		}).WithTimeout(15 * time.Second).Should(Succeed())
	})

	It("creates nothing for TLS while spec.tls is Disabled", func() {
		rq, _ := newQueue("plain", 1, 1, func(rq *rqv1.RenderQueue) { rq.Spec.TLS.Mode = rqv1.ShardTLSDisabled })
		rq = settled(rq, 1)
		Expect(rq.Status.TLS).To(BeNil())
		key := func(name string) types.NamespacedName {
			return types.NamespacedName{Namespace: rq.Namespace, Name: name}
		}
		Expect(apierrors.IsNotFound(k8sClient.Get(suiteCtx, key("plain-shard-tls"), &corev1.Secret{}))).To(BeTrue())
		Expect(apierrors.IsNotFound(k8sClient.Get(suiteCtx, key("plain-shard-ca"), &corev1.ConfigMap{}))).To(BeTrue())
		var pod corev1.Pod
		Expect(k8sClient.Get(suiteCtx, key("plain-shard-0"), &pod)).To(Succeed())
		Expect(pod.Labels).NotTo(HaveKey(rqv1.LabelTLS))
		c := pod.Spec.Containers[0]
		Expect(c.Args).NotTo(ContainElement("--tls-cert-file"))
		Expect(c.ReadinessProbe.HTTPGet.Scheme).To(Equal(corev1.URISchemeHTTP))
		Expect(pod.Spec.Volumes).NotTo(ContainElement(HaveField("Name", "shard-tls")))
	})
})
