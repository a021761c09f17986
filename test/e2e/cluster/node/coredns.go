package node

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/wait"
)

// corefile is CoreDNS's configuration: the cluster's zone and the reverse zones only, from the
// kubernetes plugin. A query for any other name matches no server block and is REFUSED; the
// binary has no forward plugin, so nothing is ever asked of a resolver outside this machine.
const corefile = `cluster.local:1053 in-addr.arpa:1053 ip6.arpa:1053 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        ttl 5
    }
    prometheus :9153
    cache 5
    loadbalance
}
`

// deployCoreDNS creates the cluster's DNS as kubeadm does (ServiceAccount, ClusterRole and
// binding, ConfigMap, Deployment, the kube-dns Service at DNSServiceIP), listening on 1053 as a
// non-root user (port 53 of the Service maps to it).
func deployCoreDNS(ctx context.Context, cs kubernetes.Interface, image string) error {
	const ns, name = "kube-system", "coredns"
	labels := map[string]string{"k8s-app": "kube-dns"}
	yes, no := true, false
	uid := int64(65532)
	objs := []func() error{
		func() error {
			_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
				Rules: []rbacv1.PolicyRule{
					{APIGroups: []string{""}, Resources: []string{"endpoints", "services", "pods", "namespaces"}, Verbs: []string{"list", "watch"}},
					{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
				},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "system:coredns"},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:coredns"},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
				Data:       map[string]string{"Corefile": corefile},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			replicas := int32(1)
			_, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
				Spec: appsv1.DeploymentSpec{
					Replicas: &replicas,
					Selector: &metav1.LabelSelector{MatchLabels: labels},
					Template: corev1.PodTemplateSpec{
						ObjectMeta: metav1.ObjectMeta{Labels: labels},
						Spec: corev1.PodSpec{
							ServiceAccountName: name,
							PriorityClassName:  "system-cluster-critical",
							DNSPolicy:          corev1.DNSDefault,
							SecurityContext: &corev1.PodSecurityContext{
								RunAsUser: &uid, RunAsGroup: &uid, RunAsNonRoot: &yes,
								SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
							},
							Containers: []corev1.Container{{
								Name:            name,
								Image:           image,
								ImagePullPolicy: corev1.PullIfNotPresent,
								Args:            []string{"-conf", "/etc/coredns/Corefile"},
								Ports: []corev1.ContainerPort{
									{Name: "dns", ContainerPort: 1053, Protocol: corev1.ProtocolUDP},
									{Name: "dns-tcp", ContainerPort: 1053, Protocol: corev1.ProtocolTCP},
									{Name: "metrics", ContainerPort: 9153, Protocol: corev1.ProtocolTCP},
								},
								Resources: corev1.ResourceRequirements{
									Requests: corev1.ResourceList{corev1.ResourceCPU: mustQuantity("50m"), corev1.ResourceMemory: mustQuantity("32Mi")},
									Limits:   corev1.ResourceList{corev1.ResourceMemory: mustQuantity("128Mi")},
								},
								VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/coredns", ReadOnly: true}},
								ReadinessProbe: &corev1.Probe{
									ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(8181)}},
									PeriodSeconds: 1,
								},
								LivenessProbe: &corev1.Probe{
									ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstr.FromInt32(8080)}},
									PeriodSeconds:    10,
									FailureThreshold: 5,
								},
								SecurityContext: &corev1.SecurityContext{
									AllowPrivilegeEscalation: &no,
									ReadOnlyRootFilesystem:   &yes,
									Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
								},
							}},
							Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{
								ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}},
							}}},
						},
					},
				},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: "kube-dns", Namespace: ns, Labels: labels},
				Spec: corev1.ServiceSpec{
					ClusterIP: DNSServiceIP,
					Selector:  labels,
					Ports: []corev1.ServicePort{
						{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(1053), Protocol: corev1.ProtocolUDP},
						{Name: "dns-tcp", Port: 53, TargetPort: intstr.FromInt32(1053), Protocol: corev1.ProtocolTCP},
					},
				},
			}, metav1.CreateOptions{})
			return err
		},
	}
	for i, create := range objs {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("node: creating CoreDNS's object %d: %w", i, err)
		}
	}
	return nil
}

// waitCoreDNS waits for CoreDNS's Deployment to be available.
func waitCoreDNS(ctx context.Context, cs kubernetes.Interface) error {
	return wait.Poll(ctx, 120*time.Second, 250*time.Millisecond, "CoreDNS to be available", func(ctx context.Context) (bool, string, error) {
		d, err := cs.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return d.Status.AvailableReplicas >= 1, fmt.Sprintf("%d available", d.Status.AvailableReplicas), nil
	})
}

// mustQuantity parses a resource quantity written in this file.
func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }
