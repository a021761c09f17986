package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// writeConfigs writes containerd's, the CNI's, the kubelet's and kube-proxy's configuration and
// the kubeconfigs of the kubelet (system:node:Name) and kube-proxy (system:kube-proxy).
func (n *Node) writeConfigs() error {
	var err error
	if n.kubeletP, err = freePort(NodeIP); err != nil {
		return err
	}
	if n.healthzP, err = freePort("127.0.0.1"); err != nil {
		return err
	}
	proxyHealthz, err := freePort("127.0.0.1")
	if err != nil {
		return err
	}
	proxyMetrics, err := freePort("127.0.0.1")
	if err != nil {
		return err
	}
	cp := n.o.ControlPlane
	kubeletKubeconfig := filepath.Join(n.confDir, "kubelet.kubeconfig")
	proxyKubeconfig := filepath.Join(n.confDir, "kube-proxy.kubeconfig")
	if err := cp.WriteKubeconfig(kubeletKubeconfig, cp.PKI.NodeCert, cp.PKI.NodeKey); err != nil {
		return err
	}
	if err := cp.WriteKubeconfig(proxyKubeconfig, cp.PKI.ProxyCert, cp.PKI.ProxyKey); err != nil {
		return err
	}
	// The Pods' DNS is the cluster's: the kubelet gives Pods of dnsPolicy Default (CoreDNS's own)
	// an empty resolver configuration rather than this machine's, whose resolvers are outside.
	resolv := filepath.Join(n.confDir, "resolv.conf")
	files := map[string]string{
		"containerd.toml":     containerdConfig(n.o.SandboxImage),
		"kubelet.yaml":        kubeletConfig(n.kubeletP, n.healthzP, cp.PKI.CACert, cp.PKI.KubeletCert, cp.PKI.KubeletKey, resolv, n.o.MaxRestartBackOff.String()),
		"kube-proxy.yaml":     proxyConfig(proxyKubeconfig, proxyHealthz, proxyMetrics),
		"resolv.conf":         "",
		"10-rq-node.conflist": cniConfig(),
	}
	for name, content := range files {
		dir := n.confDir
		if strings.HasSuffix(name, ".conflist") {
			dir = cniConfDir
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return fmt.Errorf("node: writing %s: %w", name, err)
		}
	}
	return nil
}

// containerdConfig is containerd's configuration: everything under StateDir and RunDir, the CRI
// plugin with runc (cgroupfs), the CNI configuration of cniConfDir with Debian's plugins, the
// network namespaces under the state directory, and restrict_oom_score_adj (root here lacks
// CAP_SYS_RESOURCE: runc could not give the sandbox its -998 and every sandbox would fail).
func containerdConfig(sandboxImage string) string {
	return `version = 2
root = "` + StateDir + `/containerd"
state = "` + RunDir + `/containerd"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "` + containerdSocket + `"

[ttrpc]
  address = "` + RunDir + `/containerd-ttrpc.sock"

[debug]
  level = "warn"

[plugins."io.containerd.internal.v1.opt"]
  path = "` + StateDir + `/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "` + sandboxImage + `"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_unprivileged_ports = false
  enable_unprivileged_icmp = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "` + runcRoot + `"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "` + cniConfDir + `"
    max_conf_num = 1
`
}

// cniConfig is the Pods' network: the bridge (its address is the gateway and the node's), an
// address from PodCIDR, and routes to PodCIDR (on the link) and ServiceCIDR only — no default
// route and no masquerade, so nothing a Pod sends can leave this machine.
func cniConfig() string {
	return `{
  "cniVersion": "1.0.0",
  "name": "` + cniNetwork + `",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "` + Bridge + `",
      "isGateway": true,
      "isDefaultGateway": false,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "` + PodCIDR + `", "gateway": "` + NodeIP + `"}]],
        "routes": [{"dst": "` + ServiceCIDR + `"}],
        "dataDir": "` + StateDir + `/cni/ipam"
      }
    }
  ]
}
`
}

// kubeletConfig is the kubelet's configuration: the kubelet API on NodeIP with x509 and webhook
// authentication and webhook authorization, cgroupfs under CgroupName, cgroup v1 allowed, the
// cluster's DNS, logs under StateDir, eviction and image garbage collection relaxed (a test
// machine's disk is not the node's to manage), and a short crash-loop back-off.
func kubeletConfig(port, healthz int, ca, cert, key, resolv, maxBackOff string) string {
	return `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: ` + NodeIP + `
port: ` + strconv.Itoa(port) + `
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ` + strconv.Itoa(healthz) + `
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: ` + ca + `
authorization:
  mode: Webhook
tlsCertFile: ` + cert + `
tlsPrivateKeyFile: ` + key + `
containerRuntimeEndpoint: unix://` + containerdSocket + `
cgroupDriver: cgroupfs
cgroupRoot: /` + CgroupName + `
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
clusterDNS:
- ` + DNSServiceIP + `
clusterDomain: ` + ClusterDomain + `
resolvConf: ` + resolv + `
podLogsDir: ` + podLogsDir + `
syncFrequency: 10s
serializeImagePulls: false
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
crashLoopBackOff:
  maxContainerRestartPeriod: ` + maxBackOff + `
`
}

// proxyConfig is kube-proxy's configuration: iptables mode, the cluster's Pod range, health and
// metrics on loopback, NodePorts only on the node's address, and no conntrack sysctl writes.
func proxyConfig(kubeconfig string, healthz, metrics int) string {
	return `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: ` + kubeconfig + `
mode: iptables
hostnameOverride: ` + Name + `
clusterCIDR: ` + PodCIDR + `
healthzBindAddress: 127.0.0.1:` + strconv.Itoa(healthz) + `
metricsBindAddress: 127.0.0.1:` + strconv.Itoa(metrics) + `
nodePortAddresses:
- ` + PodCIDR + `
iptables:
  localhostNodePorts: false
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`
}
