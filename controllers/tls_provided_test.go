package controllers

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/shardtls"
	"github.com/renderqueue/renderqueue/pkg/certs"
)

// grantSampleSecretRBAC applies config/samples/shard-tls-secret-rbac.yaml as a user would, in ns
// and for the Secret secret, with the test's operator user as the subject (the sample binds the
// operator's ServiceAccount, which the reconciler here does not run as).
func grantSampleSecretRBAC(ns, secret string) {
	GinkgoHelper()
	data, err := os.ReadFile(filepath.Join("..", "config", "samples", "shard-tls-secret-rbac.yaml"))
	Expect(err).NotTo(HaveOccurred())
	for _, doc := range strings.Split(string(data), "\n---") {
		var u unstructured.Unstructured
		Expect(yaml.Unmarshal([]byte(doc), &u.Object)).To(Succeed())
		u.SetNamespace(ns)
		switch u.GetKind() {
		case "Role":
			rules, _, _ := unstructured.NestedSlice(u.Object, "rules")
			Expect(rules).To(HaveLen(1), "the sample's Role grants more than the one Secret")
			Expect(unstructured.SetNestedStringSlice(rules[0].(map[string]any), []string{secret}, "resourceNames")).To(Succeed())
			Expect(unstructured.SetNestedSlice(u.Object, rules, "rules")).To(Succeed())
		case "RoleBinding":
			Expect(unstructured.SetNestedSlice(u.Object, []any{map[string]any{
				"kind": rbacv1.UserKind, "apiGroup": rbacv1.GroupName, "name": operatorUserName}}, "subjects")).To(Succeed())
		default:
			Fail("unexpected kind in the sample: " + u.GetKind())
		}
		Expect(k8sClient.Create(suiteCtx, &u)).To(Succeed())
	}
}

var _ = Describe("Shard TLS from a Secret you provide", func() {
	It("waits for the Secret and the grant to read it, checks it, mounts it, publishes its CA and follows its renewal", func() {
		const secretName = "own-cert"
		rq, fs := newQueue("own", 1, 1, func(rq *rqv1.RenderQueue) {
			rq.Spec.TLS = rqv1.ShardTLS{Mode: rqv1.ShardTLSProvided, SecretName: secretName}
		})
		key := func(name string) types.NamespacedName {
			return types.NamespacedName{Namespace: rq.Namespace, Name: name}
		}
		serverName := "own-shards." + rq.Namespace + ".svc"
		ca, _, err := certs.RenewCA(nil, "team-ca", time.Now())
		Expect(err).NotTo(HaveOccurred())
		serving := func(names ...string) *certs.Serving {
			GinkgoHelper()
			s, err := certs.NewServing(ca, names, time.Now())
			Expect(err).NotTo(HaveOccurred())
			return s
		}
		writeSecret := func(s *certs.Serving) {
			GinkgoHelper()
			sec := &corev1.Secret{Type: corev1.SecretTypeTLS,
				Data: map[string][]byte{"tls.crt": s.CertPEM, "tls.key": s.KeyPEM, "ca.crt": ca.Bundle}}
			sec.Name, sec.Namespace = secretName, rq.Namespace
			if err := k8sClient.Create(suiteCtx, sec); err != nil {
				Expect(k8sClient.Update(suiteCtx, sec)).To(Succeed())
			}
		}

		By("no grant to read the Secret: blocked, saying what to grant; no shard Pod")
		expectBlocked(rq, rqv1.ReasonShardTLSSecretInvalid, "the operator may not read the Secret own-cert (spec.tls.secretName): grant it get on that Secret")

		By("the grant of config/samples/shard-tls-secret-rbac.yaml, no Secret yet: blocked, saying so")
		grantSampleSecretRBAC(rq.Namespace, secretName)
		expectReconciledFalse(rq, rqv1.ReasonShardTLSSecretInvalid, "the Secret own-cert (spec.tls.secretName) does not exist in namespace "+rq.Namespace)
		var none corev1.PodList
		Expect(k8sClient.List(suiteCtx, &none, client.InNamespace(rq.Namespace), client.MatchingLabels{rqv1.LabelQueue: rq.Name})).To(Succeed())
		Expect(none.Items).To(BeEmpty())

		By("the Secret: the shard Pod mounts it")
		first := serving(shardtls.DNSNames(rq)...)
		writeSecret(first)
		var pod corev1.Pod
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(suiteCtx, key("own-shard-0"), &pod)).To(Succeed())
		}).WithTimeout(15 * time.Second).Should(Succeed())
		Expect(pod.Labels).To(HaveKeyWithValue(rqv1.LabelTLS, "true"))
		c := pod.Spec.Containers[0]
		Expect(c.Args).To(ContainElements("--tls-cert-file", "/var/run/renderqueue/tls/tls.crt", "--tls-ca-file", "/var/run/renderqueue/tls/ca.crt"))
		Expect(c.ReadinessProbe.HTTPGet.Scheme).To(Equal(corev1.URISchemeHTTPS))
		Expect(pod.Spec.Volumes).To(ContainElement(HaveField("VolumeSource.Secret.SecretName", secretName)))

		By("polled over HTTPS with the Secret's CA: the queue settles")
		fakes.serveTLS(fs[0], first.CertPEM, first.KeyPEM)
		rq = settled(rq, 1)
		Expect(rq.Status.Shards[0].URL).To(HavePrefix("https://"))

		By("its ca.crt published, the certificate recorded as found, no certificate issued")
		var cm corev1.ConfigMap
		Expect(k8sClient.Get(suiteCtx, key("own-shard-ca"), &cm)).To(Succeed())
		Expect(ownedBy(&cm, rq)).To(BeTrue())
		Expect(cm.Data).To(HaveKeyWithValue("ca.crt", string(ca.Bundle)))
		Expect(rq.Status.TLS).NotTo(BeNil())
		Expect(*rq.Status.TLS).To(And(
			HaveField("SecretName", secretName), HaveField("CAConfigMapName", "own-shard-ca"), HaveField("ServerName", serverName),
			HaveField("Serial", first.Cert.SerialNumber.Text(16)), HaveField("CAFingerprint", ca.Fingerprint()),
			HaveField("RenewAfter.Time", BeZero())))
		Expect(rq.Status.TLS.NotAfter.Time).To(BeTemporally("==", first.Cert.NotAfter.Truncate(time.Second)))
		var own corev1.Secret
		Expect(k8sClient.Get(suiteCtx, key(secretName), &own)).To(Succeed())
		Expect(own.Data["tls.crt"]).To(Equal(first.CertPEM), "the operator wrote the Secret it was given")
		Expect(own.OwnerReferences).To(BeEmpty())
		Expect(eventReasons(Default, rq)).NotTo(ContainElement(EventShardCertificateIssued))

		By("renewed by its owner: the status follows, the shards keep their Pods")
		renewed := serving(shardtls.DNSNames(rq)...)
		writeSecret(renewed)
		fakes.serveTLS(fs[0], renewed.CertPEM, renewed.KeyPEM)
		Eventually(func(g Gomega) {
			out := getQueue(g, rq)
			g.Expect(out.Status.TLS.Serial).To(Equal(renewed.Cert.SerialNumber.Text(16)))
			g.Expect(out.Status.Shards[0].State).To(Equal("queued"))
		}).WithTimeout(15 * time.Second).Should(Succeed())
		var same corev1.Pod
		Expect(k8sClient.Get(suiteCtx, key("own-shard-0"), &same)).To(Succeed())
		Expect(same.UID).To(Equal(pod.UID))

		By("replaced by a certificate for another name: blocked, the last good one kept in the status")
		wrong := serving("own-shards.elsewhere.svc")
		writeSecret(wrong)
		expectReconciledFalse(rq, rqv1.ReasonShardTLSSecretInvalid, "does not verify as the shards' (server name "+serverName)
		Expect(getQueue(Default, rq).Status.TLS.Serial).To(Equal(renewed.Cert.SerialNumber.Text(16)))
	})
})

// expectReconciledFalse waits for rq's Reconciled condition to be False with reason and a
// message containing text, for its current generation. (expectBlocked also wants the event,
// which is emitted when the condition turns False, not when only its message changes.)
func expectReconciledFalse(rq *rqv1.RenderQueue, reason, text string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		got := getQueue(g, rq)
		c := condOf(got, rqv1.ConditionReconciled)
		g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
		g.Expect(c.Reason).To(Equal(reason))
		g.Expect(c.Message).To(ContainSubstring(text))
		g.Expect(c.ObservedGeneration).To(Equal(got.Generation))
	}).WithTimeout(15 * time.Second).Should(Succeed())
}
