package specs

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/shardtls"
)

// TLSMountPath is where the shards' certificate Secret is mounted in a shard Pod (spec.tls
// OperatorIssued or Provided).
const TLSMountPath = "/var/run/renderqueue/tls"

// withShardTLS makes spec, a shard Pod's spec, serve HTTPS when rq asks for it (spec.tls
// OperatorIssued or Provided): the certificate Secret (<name>-shard-tls, or spec.tls.secretName)
// mounted read-only (mode 0440), the
// keeper given its files (--tls-cert-file, --tls-key-file; it reloads them when the kubelet
// updates the Secret) and the CA bundle it verifies the other shards with when it asks them for
// the leases of slots it took over (--tls-ca-file), and the probes over HTTPS (the kubelet does not verify the certificate).
// Without TLS, spec is left as it is, so the template (and its hash) of existing shards does
// not change.
func withShardTLS(rq *rqv1.RenderQueue, spec *corev1.PodSpec) {
	if !rq.Spec.TLSEnabled() {
		return
	}
	c := &spec.Containers[0]
	c.Args = append(c.Args,
		"--tls-cert-file", TLSMountPath+"/"+shardtls.KeyCert,
		"--tls-key-file", TLSMountPath+"/"+shardtls.KeyKey,
		"--tls-ca-file", TLSMountPath+"/"+shardtls.KeyCA)
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if p != nil && p.HTTPGet != nil {
			p.HTTPGet.Scheme = corev1.URISchemeHTTPS
		}
	}
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "shard-tls", MountPath: TLSMountPath, ReadOnly: true})
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "shard-tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: rq.Spec.ShardTLSSecret(rq.Name),
		Items: []corev1.KeyToPath{{Key: shardtls.KeyCert, Path: shardtls.KeyCert}, {Key: shardtls.KeyKey, Path: shardtls.KeyKey},
			{Key: shardtls.KeyCA, Path: shardtls.KeyCA}},
		DefaultMode: ptr.To[int32](0o440),
	}}})
}
