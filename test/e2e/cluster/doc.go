// Package cluster runs a local Kubernetes cluster for renderqueue's end-to-end test and
// `make demo` (through test/e2e/cmd/localcluster): Start brings up a throwaway PostgreSQL
// (hack/postgres.sh) that can be paused and resumed on the same port, the control plane, the pod
// network and a kubelet.Runner that plays scheduler and kubelet for one Node; Stop takes it all
// down again.
//
// The Runner runs every Pod of the cluster — Deployment Pods from kube-controller-manager, the
// operator's Deployment Pod, the operator's shard Pods — as a kubelet would, with the real
// programs as the containers' processes: every image named .../renderqueue runs the renderqueue
// binary (Options.Binary). Each Pod gets an address of the pod network (10.244.N.0/24, made
// local to this machine with `ip route add local ... dev lo`; valid in EndpointSlices, so
// Services get real endpoints and the aggregator reaches an APIService through its Service).
// What the Runner honours of a Pod, and where the cluster differs from a real one, is in
// docs/local-cluster.md.
//
// The parts, each a package of its own:
//
//   - controlplane: etcd, kube-apiserver (with the aggregation layer, aggregator routing to
//     EndpointSlice addresses) and kube-controller-manager (Deployments, ReplicaSets, HPAs,
//     EndpointSlices, garbage collection, ...) from a KUBEBUILDER_ASSETS directory
//     (hack/setup-envtest.sh), with their certificates and an admin kubeconfig.
//   - kubelet: the Runner (the Node, the scheduler's binding, a worker per Pod) and the kubelet
//     API that `kubectl logs` reaches through the API server. Under it: kubelet/podworker (one
//     Pod: sandbox, volumes, container ordering, status), kubelet/containerworker (one
//     container: instances, probes, restarts with crash-loop back-off) and kubelet/podconfig
//     (what a container starts with: environment, argv, security context, mounts, volumes).
//   - runtime: the container runtime: image mappings, starting a container in new mount, UTS
//     and IPC namespaces on an overlay of this machine's root with setpriv applying the security
//     context, and the pod network.
//   - process: child processes in their own process group, dying with this process.
//   - wait: Poll and Sleep.
//
// Every process is started in its own process group, dies with this process (parent-death
// signal) and is stopped (SIGTERM, then SIGKILL) by Stop, which also removes the pod network's
// route. The Runner needs root, Linux with overlayfs, util-linux (mount, umount, pivot_root,
// setpriv), coreutils and iproute2.
package cluster
