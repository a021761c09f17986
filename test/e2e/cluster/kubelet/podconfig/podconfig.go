// Package podconfig resolves, as kubelet does, what a Pod's containers start with — argv with
// $(VAR) expansion, the environment (the kubernetes Service variables, envFrom, env with
// secretKeyRef, configMapKeyRef and fieldRef), user, groups and capabilities from the security
// contexts, and the mounts of its volumes — and materialises those volumes in the Pod's
// directory on this machine: emptyDir, hostPath, and secret, configMap, downwardAPI and
// projected volumes (ServiceAccount tokens from the TokenRequest API included) written as
// kubelet's atomic writer does. What a Pod asks for that is not honoured is reported, once per
// key, to the caller (the Pod's worker logs it and records it as an event of the Pod).
package podconfig

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
)

// Sources are where the configuration of a Node's Pods comes from; the Pods of a Node share them.
type Sources struct {
	// Client requests the ServiceAccount tokens of projected volumes (TokenRequest).
	Client kubernetes.Interface
	// Secrets and ConfigMaps are caches of the cluster's, complete before any Pod is configured
	// (an object missing there is missing).
	Secrets    corelisters.SecretLister
	ConfigMaps corelisters.ConfigMapLister
	// APIHost and APIPort are the API server's address: a container's KUBERNETES_SERVICE_HOST
	// and KUBERNETES_SERVICE_PORT (there is no kube-proxy to make the kubernetes Service's
	// cluster IP reachable).
	APIHost, APIPort string
	// Recorder records the events about a Pod's configuration (InvalidEnvironmentVariableNames).
	Recorder record.EventRecorder
}

// The hosts files WriteHosts writes in the Pod's directory.
const (
	hostsFileName    = "etc-hosts"
	hostnameFileName = "etc-hostname"
)

// Pod is the configuration of one Pod's containers and volumes. It keeps the Pod's
// ServiceAccount tokens between volume updates; its methods may be called concurrently.
type Pod struct {
	src       Sources
	namespace string
	dir       string
	ignored   func(key, format string, args ...any)
	logf      func(format string, args ...any)

	mu     sync.Mutex
	tokens map[string]*projectedToken
}

// New returns the configuration of a Pod of namespace whose directory on this machine is dir (its
// volumes go to dir/volumes/NAME). ignored is told what of the Pod is not honoured, with a key to
// tell each thing once; logf logs about the Pod.
func New(src Sources, namespace, dir string, ignored func(key, format string, args ...any), logf func(format string, args ...any)) *Pod {
	return &Pod{src: src, namespace: namespace, dir: dir, ignored: ignored, logf: logf, tokens: map[string]*projectedToken{}}
}

// WriteHosts writes the Pod's /etc/hosts (kubelet's managed hosts file, ip being the Pod's IP)
// and /etc/hostname into its directory, which must exist; Container mounts them unless the Pod
// uses the host's network.
func (pc *Pod) WriteHosts(pod *corev1.Pod, ip string) error {
	if err := os.WriteFile(filepath.Join(pc.dir, hostsFileName), []byte(hostsFile(pod, ip)), 0o644); err != nil {
		return fmt.Errorf("writing the hosts file: %w", err)
	}
	if err := os.WriteFile(filepath.Join(pc.dir, hostnameFileName), []byte(podHostname(pod)+"\n"), 0o644); err != nil {
		return fmt.Errorf("writing the hostname file: %w", err)
	}
	return nil
}

// podHostname is the container's hostname: spec.hostname or the Pod name (63 characters at
// most), or the FQDN with setHostnameAsFQDN.
func podHostname(pod *corev1.Pod) string {
	h := pod.Spec.Hostname
	if h == "" {
		h = pod.Name
	}
	if len(h) > 63 {
		h = strings.TrimRight(h[:63], "-.")
	}
	if pod.Spec.SetHostnameAsFQDN != nil && *pod.Spec.SetHostnameAsFQDN && pod.Spec.Subdomain != "" {
		return fmt.Sprintf("%s.%s.%s.svc.cluster.local", h, pod.Spec.Subdomain, pod.Namespace)
	}
	return h
}

// hostsFile is kubelet's managed /etc/hosts.
func hostsFile(pod *corev1.Pod, ip string) string {
	var b strings.Builder
	b.WriteString("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n")
	h := podHostname(pod)
	if pod.Spec.Subdomain != "" && !strings.Contains(h, ".") {
		fmt.Fprintf(&b, "%s\t%s.%s.%s.svc.cluster.local\t%s\n", ip, h, pod.Spec.Subdomain, pod.Namespace, h)
	} else {
		fmt.Fprintf(&b, "%s\t%s\n", ip, h)
	}
	if len(pod.Spec.HostAliases) > 0 {
		b.WriteString("\n# Entries added by HostAliases.\n")
		for _, a := range pod.Spec.HostAliases {
			fmt.Fprintf(&b, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
		}
	}
	return b.String()
}
