package specs

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// Fixed parts of a shard Pod.
const (
	// KeeperContainerName is the name of the keeper container in a shard Pod.
	KeeperContainerName = "keeper"
	// KeeperPort is the port a keeper shard serves its HTTP API on.
	KeeperPort = 8080
	// TokenMountPath is where the API token Secret is mounted in a shard Pod.
	TokenMountPath = "/var/run/renderqueue/token"
	// TokenKey is the key of the API token in the token Secret.
	TokenKey = "token"
	// DSNEnv is the environment variable carrying the PostgreSQL DSN into the keeper.
	DSNEnv = "RENDERQUEUE_DSN"
	// ComponentKeeper is the app.kubernetes.io/component label value of shard Pods.
	ComponentKeeper = "keeper"
	// shardUID is the non-root user (and group) the keeper runs as.
	shardUID = 65532
)

// KeeperImage is the image shard Pods run: spec.image, or the operator's own.
func KeeperImage(rq *rqv1.RenderQueue, operatorImage string) string {
	if rq.Spec.Image != "" {
		return rq.Spec.Image
	}
	return operatorImage
}

// keeperArgs are the keeper's arguments in the Pod named podName. --procs is passed only when
// spec.procs is set, and --log-format and --log-level only when spec.logging sets them, so that
// shards of a RenderQueue without them keep their template hash (and their Pods) across the
// operator upgrade that added the fields.
func keeperArgs(rq *rqv1.RenderQueue, podName string) []string {
	args := []string{
		"keeper",
		"--renderqueue", rq.Name,
		"--namespace", rq.Namespace,
		"--name", podName,
		"--listen", fmt.Sprintf(":%d", KeeperPort),
		"--token-file", TokenMountPath + "/" + TokenKey,
	}
	if p := rq.Spec.Procs; p != nil {
		args = append(args, "--procs", strconv.Itoa(int(*p)))
	}
	// only when set, for the same reason
	if l := rq.Spec.Logging; l != nil {
		if l.Format != "" {
			args = append(args, "--log-format", l.Format)
		}
		if l.Level != "" {
			args = append(args, "--log-level", l.Level)
		}
	}
	return args
}

// shardPodSpec is the PodSpec of the shard Pod named podName.
func shardPodSpec(rq *rqv1.RenderQueue, operatorImage, podName string) corev1.PodSpec {
	dsnKey := rq.Spec.Store.SecretRef.Key
	if dsnKey == "" {
		dsnKey = rqv1.DefaultSecretKey
	}
	probe := func(path string, period int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: path, Port: intstr.FromString("http"), Scheme: corev1.URISchemeHTTP,
			}},
			PeriodSeconds:    period,
			TimeoutSeconds:   2,
			FailureThreshold: 3,
		}
	}
	spec := corev1.PodSpec{
		ServiceAccountName:            ShardServiceAccountName(rq),
		AutomountServiceAccountToken:  ptr.To(true),
		TerminationGracePeriodSeconds: ptr.To[int64](30),
		NodeSelector:                  rq.Spec.NodeSelector,
		Tolerations:                   rq.Spec.Tolerations,
		Affinity:                      rq.Spec.Affinity,
		ImagePullSecrets:              imagePullSecrets(rq),
		PriorityClassName:             rq.Spec.PriorityClassName,
		TopologySpreadConstraints:     topologySpreadConstraints(rq),
		SecurityContext: &corev1.PodSecurityContext{
			RunAsNonRoot:   ptr.To(true),
			RunAsUser:      ptr.To[int64](shardUID),
			RunAsGroup:     ptr.To[int64](shardUID),
			FSGroup:        ptr.To[int64](shardUID),
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		Containers: []corev1.Container{{
			Name:            KeeperContainerName,
			Image:           KeeperImage(rq, operatorImage),
			ImagePullPolicy: rq.Spec.ImagePullPolicy,
			Args:            keeperArgs(rq, podName),
			Ports:           []corev1.ContainerPort{{Name: "http", ContainerPort: KeeperPort, Protocol: corev1.ProtocolTCP}},
			Env: []corev1.EnvVar{{
				Name: DSNEnv,
				ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: rq.Spec.Store.SecretRef.Name},
					Key:                  dsnKey,
				}},
			}},
			Resources:      rq.Spec.Resources,
			ReadinessProbe: probe("/readyz", 5),
			LivenessProbe:  probe("/healthz", 10),
			VolumeMounts: []corev1.VolumeMount{
				{Name: "api-token", MountPath: TokenMountPath, ReadOnly: true},
				{Name: "tmp", MountPath: "/tmp"},
			},
			SecurityContext: &corev1.SecurityContext{
				RunAsNonRoot:             ptr.To(true),
				RunAsUser:                ptr.To[int64](shardUID),
				AllowPrivilegeEscalation: ptr.To(false),
				ReadOnlyRootFilesystem:   ptr.To(true),
				Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
		}},
		Volumes: []corev1.Volume{
			{Name: "api-token", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName:  TokenSecretName(rq),
				DefaultMode: ptr.To[int32](0o440),
			}}},
			{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		},
	}
	withShardTLS(rq, &spec)
	return spec
}

// imagePullSecrets is spec.imagePullSecrets as the PodSpec field; nil when none.
func imagePullSecrets(rq *rqv1.RenderQueue) []corev1.LocalObjectReference {
	var out []corev1.LocalObjectReference
	for _, s := range rq.Spec.ImagePullSecrets {
		out = append(out, corev1.LocalObjectReference{Name: s.Name})
	}
	return out
}

// topologySpreadConstraints is spec.topologySpreadConstraints as the PodSpec field, each with
// the shard Pods' selector as its labelSelector; nil when none.
func topologySpreadConstraints(rq *rqv1.RenderQueue) []corev1.TopologySpreadConstraint {
	var out []corev1.TopologySpreadConstraint
	for _, c := range rq.Spec.TopologySpreadConstraints {
		c = *c.DeepCopy()
		out = append(out, corev1.TopologySpreadConstraint{
			MaxSkew:            c.MaxSkew,
			TopologyKey:        c.TopologyKey,
			WhenUnsatisfiable:  c.WhenUnsatisfiable,
			LabelSelector:      &metav1.LabelSelector{MatchLabels: ShardSelector(rq)},
			MinDomains:         c.MinDomains,
			NodeAffinityPolicy: c.NodeAffinityPolicy,
			NodeTaintsPolicy:   c.NodeTaintsPolicy,
			MatchLabelKeys:     c.MatchLabelKeys,
		})
	}
	return out
}

// podLabels is spec.podLabels as plain strings; nil when none.
func podLabels(rq *rqv1.RenderQueue) map[string]string {
	if len(rq.Spec.PodLabels) == 0 {
		return nil
	}
	out := make(map[string]string, len(rq.Spec.PodLabels))
	for k, v := range rq.Spec.PodLabels {
		out[k] = string(v)
	}
	return out
}

// PodTemplateHash is the hash of everything a shard Pod is built from except its name: when it
// changes (image, resources, scheduling, pull secrets, the DSN Secret, spec.podLabels,
// spec.podAnnotations, ...) the shards are replaced one at a time.
//
// It hashes the PodSpec alone while spec.podLabels and spec.podAnnotations are empty, so that
// adding those fields to the API did not change the hash of (and so replace) existing shards;
// new PodSpec fields are omitted from the JSON while unset, for the same reason.
func PodTemplateHash(rq *rqv1.RenderQueue, operatorImage string) string {
	var in any = shardPodSpec(rq, operatorImage, "")
	if len(rq.Spec.PodLabels) > 0 || len(rq.Spec.PodAnnotations) > 0 {
		in = struct {
			Labels      map[string]string `json:"labels,omitempty"`
			Annotations map[string]string `json:"annotations,omitempty"`
			Spec        any               `json:"spec"`
		}{podLabels(rq), rq.Spec.PodAnnotations, in}
	}
	b, err := json.Marshal(in)
	if err != nil {
		// A PodSpec and string maps always marshal; keep the hash total anyway.
		b = []byte(err.Error())
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}

// ShardPod is the shard Pod named podName, owner reference not yet set. It carries
// spec.podLabels and spec.podAnnotations, with the operator's own labels and annotation set over
// them (the API refuses spec keys that would collide).
func ShardPod(rq *rqv1.RenderQueue, operatorImage, podName, hash string) *corev1.Pod {
	labels := map[string]string{}
	maps.Copy(labels, podLabels(rq))
	maps.Copy(labels, queueLabels(rq))
	maps.Copy(labels, ShardSelector(rq))
	labels[rqv1.LabelShard] = podName
	if rq.Spec.TLSEnabled() {
		labels[rqv1.LabelTLS] = "true"
	}
	annotations := map[string]string{}
	maps.Copy(annotations, rq.Spec.PodAnnotations)
	annotations[rqv1.AnnotationPodTemplateHash] = hash
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        podName,
			Namespace:   rq.Namespace,
			Labels:      labels,
			Annotations: annotations,
		},
		Spec: func() corev1.PodSpec {
			s := shardPodSpec(rq, operatorImage, podName)
			s.Hostname = podName
			s.Subdomain = ServiceName(rq)
			return s
		}(),
	}
}
