package specs

import (
	"slices"
	"testing"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// TestPodTemplateTLS: spec.tls Disabled (or unset) leaves the template and its hash as they were;
// OperatorIssued and Provided change the hash (the shards are replaced) and the template.
func TestPodTemplateTLS(t *testing.T) {
	const img = "registry.example/renderqueue:v1"
	plain := PodTemplateHash(templateQueue(), img)
	disabled := templateQueue()
	disabled.Spec.TLS.Mode = rqv1.ShardTLSDisabled
	if got := PodTemplateHash(disabled, img); got != plain {
		t.Errorf("spec.tls Disabled changed the hash: %s, want %s", got, plain)
	}
	on := templateQueue()
	on.Spec.TLS.Mode = rqv1.ShardTLSOperatorIssued
	hash := PodTemplateHash(on, img)
	if hash == plain {
		t.Fatal("spec.tls OperatorIssued did not change the hash: the shards would keep serving plain HTTP")
	}
	pod := ShardPod(on, img, "web-shard-0", hash)
	if pod.Labels[rqv1.LabelTLS] != "true" {
		t.Errorf("labels %v lack %s=true", pod.Labels, rqv1.LabelTLS)
	}
	c := pod.Spec.Containers[0]
	args := c.Args[len(c.Args)-6:]
	if want := []string{"--tls-cert-file", "/var/run/renderqueue/tls/tls.crt", "--tls-key-file", "/var/run/renderqueue/tls/tls.key",
		"--tls-ca-file", "/var/run/renderqueue/tls/ca.crt"}; !slices.Equal(args, want) {
		t.Errorf("args end with %v, want %v", args, want)
	}
	if c.ReadinessProbe.HTTPGet.Scheme != "HTTPS" || c.LivenessProbe.HTTPGet.Scheme != "HTTPS" {
		t.Errorf("probe schemes %s, %s; want HTTPS", c.ReadinessProbe.HTTPGet.Scheme, c.LivenessProbe.HTTPGet.Scheme)
	}
	v := pod.Spec.Volumes[len(pod.Spec.Volumes)-1]
	if v.Secret == nil || v.Secret.SecretName != "web-shard-tls" || *v.Secret.DefaultMode != 0o440 || len(v.Secret.Items) != 3 {
		t.Errorf("volume %+v, want the Secret web-shard-tls (tls.crt, tls.key, ca.crt, mode 0440)", v)
	}

	// Provided: the same, from the Secret it names; another Secret is another template.
	provided := templateQueue()
	provided.Spec.TLS = rqv1.ShardTLS{Mode: rqv1.ShardTLSProvided, SecretName: "web-cert-manager"}
	providedHash := PodTemplateHash(provided, img)
	if providedHash == plain || providedHash == hash {
		t.Errorf("spec.tls Provided has the hash %s of plain HTTP (%s) or OperatorIssued (%s)", providedHash, plain, hash)
	}
	renamed := templateQueue()
	renamed.Spec.TLS = rqv1.ShardTLS{Mode: rqv1.ShardTLSProvided, SecretName: "web-cert-2"}
	if PodTemplateHash(renamed, img) == providedHash {
		t.Error("another spec.tls.secretName did not change the hash: the shards would keep the old Secret")
	}
	pp := ShardPod(provided, img, "web-shard-0", providedHash)
	pc := pp.Spec.Containers[0]
	if pp.Labels[rqv1.LabelTLS] != "true" || !slices.Equal(pc.Args[len(pc.Args)-6:], args) || pc.ReadinessProbe.HTTPGet.Scheme != "HTTPS" {
		t.Errorf("Provided: labels %v, args %v, readiness scheme %s; want those of OperatorIssued", pp.Labels, pc.Args, pc.ReadinessProbe.HTTPGet.Scheme)
	}
	if v := pp.Spec.Volumes[len(pp.Spec.Volumes)-1]; v.Secret == nil || v.Secret.SecretName != "web-cert-manager" || len(v.Secret.Items) != 3 {
		t.Errorf("Provided: volume %+v, want the Secret web-cert-manager (tls.crt, tls.key, ca.crt)", v)
	}

	plainPod := ShardPod(templateQueue(), img, "web-shard-0", plain)
	if _, ok := plainPod.Labels[rqv1.LabelTLS]; ok || plainPod.Spec.Containers[0].ReadinessProbe.HTTPGet.Scheme != "HTTP" {
		t.Error("a plain shard Pod is labelled for TLS or probed over HTTPS")
	}
}
