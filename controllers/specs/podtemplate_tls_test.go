package specs

import (
	"slices"
	"testing"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// TestPodTemplateTLS: spec.tls Disabled (or unset) leaves the template and its hash as they were;
// OperatorIssued changes the hash (the shards are replaced) and the template.
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
	plainPod := ShardPod(templateQueue(), img, "web-shard-0", plain)
	if _, ok := plainPod.Labels[rqv1.LabelTLS]; ok || plainPod.Spec.Containers[0].ReadinessProbe.HTTPGet.Scheme != "HTTP" {
		t.Error("a plain shard Pod is labelled for TLS or probed over HTTPS")
	}
}
