// Package cluster runs a local Kubernetes cluster for renderqueue's end-to-end test and
// `make demo`: etcd, kube-apiserver (with the aggregation layer, aggregator routing to
// EndpointSlice addresses) and kube-controller-manager (Deployments, ReplicaSets, HPAs,
// EndpointSlices, garbage collection, ...) from a KUBEBUILDER_ASSETS directory
// (hack/setup-envtest.sh); a throwaway PostgreSQL (hack/postgres.sh) that can be paused and
// resumed on the same port; and a Runner that plays scheduler and kubelet for one Node.
//
// The Runner runs every Pod of the cluster — Deployment Pods from kube-controller-manager, the
// operator's Deployment Pod, the operator's shard Pods — as a kubelet would, with the real
// programs as the containers' processes. It binds unscheduled Pods to its Node (Binding
// subresource), gives each Pod an address of the pod network (10.244.N.0/24, made local to this
// machine with `ip route add local ... dev lo`; valid in EndpointSlices, so Services get real
// endpoints and the aggregator reaches an APIService through its Service), and starts each
// container in new mount, UTS and IPC namespaces: the root filesystem is an overlay of this
// machine's root (read-only lower layer, a tmpfs as the container's writable layer), the image's
// program (RunnerOptions.Images: every image named .../renderqueue maps to the renderqueue
// binary) is mounted at the image's entrypoint path, volumes are bind-mounted at their
// mountPaths, and setpriv applies the security context (user, groups, no_new_privs, capability
// bounding set) before the exec. Env, volumes (emptyDir, hostPath, secret, configMap,
// downwardAPI, projected with ServiceAccount tokens from the TokenRequest API),
// readOnlyRootFilesystem, runAsNonRoot, probes, restart policies with kubelet's crash-loop
// back-off, termination messages, init and sidecar containers, graceful deletion and a
// kubelet-like Pod status are honoured. What is not — no network or PID namespace per Pod, no
// cgroups, no kube-proxy or cluster DNS, no seccomp/AppArmor/SELinux, no scheduling
// constraints, ... — is listed in docs/local-cluster.md, and every field a Pod sets that the
// Runner does not honour is logged once per Pod and recorded as a LocalRunner event of the Pod.
// `kubectl logs` works through a minimal kubelet API (KubeletServer).
//
// Every process is started in its own process group, dies with this process (parent-death
// signal) and is stopped (SIGTERM, then SIGKILL) by Stop, which also removes the pod network's
// route. The Runner needs root, Linux with overlayfs, util-linux (mount, umount, pivot_root,
// setpriv), coreutils and iproute2.
package cluster
