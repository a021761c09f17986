// Package node runs the local cluster's one Node from real components, as a kubeadm node runs
// them: Debian's containerd with runc and the CNI plugins (bridge, host-local, loopback), the
// kubelet and kube-proxy of the control plane's version (hack/setup-envtest.sh builds them), and
// CoreDNS as a Deployment behind the kube-dns Service. Pods get network, PID, mount, UTS and IPC
// namespaces, cgroups (limits enforced, OOM kills), seccomp and the security context of their
// spec, exactly as on any node; nothing here plays a part of Kubernetes.
//
// A machine runs one such node at a time: Host holds an exclusive lock (a second run refuses
// with a message naming the holder, or waits, as its caller chooses), and everything the node
// puts on the machine has a fixed name or path, so that the next run can sweep up after a run
// that was killed (SIGKILL leaves containerd's shims and the containers running):
//
//   - processes: containerd, the kubelet, kube-proxy and every containerd-shim of the node's
//     containerd; every process in the node's cgroups (CgroupName under each hierarchy);
//   - mounts under StateDir and RunDir (the kubelet's volumes, containerd's overlay roots and
//     shared memory, the Pods' network namespaces, which containerd keeps under RunDir);
//   - iptables: the kubelet's and kube-proxy's KUBE-* chains, the CNI plugins' CNI-* chains and
//     the node's own egress chain (EgressChain), for IPv4 and IPv6;
//   - the bridge (Bridge) and the veths on it; the cgroup directories;
//   - net.ipv4.ip_forward, restored to the value it had before the first run;
//   - what containerd and the kubelet write to fixed host paths (/run/containerd/s,
//     /var/lib/cni/results, /var/log/containers), removed when the node made them.
//
// Traffic stays on this machine. The Pods' addresses (PodCIDR) exist only on the bridge the node
// makes and inside the Pods' network namespaces; the Pods get routes to PodCIDR and ServiceCIDR
// only (no default route, no masquerade), and a FORWARD rule rejects anything from PodCIDR to an
// address outside the node's ranges. CoreDNS is built without the forward plugin and serves
// cluster.local (and the reverse zones) only: any other name is REFUSED without asking anyone.
//
// The node needs root, a kernel with overlayfs, bridges and veths, Debian's containerd, runc,
// containernetworking-plugins and iptables (hack/node.sh installs them), and cgroups (v1, as on
// these machines, for which the kubelet is told failCgroupV1: false; or v2). Root here lacks
// CAP_SYS_RESOURCE, so containerd runs with restrict_oom_score_adj.
package node
