// Package kubelet plays scheduler and kubelet for the local cluster's one Node: a Runner
// registers the Node, binds every unscheduled Pod to it (Binding subresource) and runs every Pod
// bound to it — Deployment Pods from kube-controller-manager, the operator's Deployment Pod, the
// operator's shard Pods — as a kubelet would, with the real programs as the containers'
// processes, started by package runtime. A Server is the kubelet API the API server proxies
// `kubectl logs` to.
//
// Env, volumes (emptyDir, hostPath, secret, configMap, downwardAPI, projected with
// ServiceAccount tokens from the TokenRequest API), readOnlyRootFilesystem, runAsNonRoot, the
// security context, probes, restart policies with kubelet's crash-loop back-off, termination
// messages, init and sidecar containers, activeDeadlineSeconds, graceful deletion and a
// kubelet-like Pod status are honoured. What is not — no network or PID namespace per Pod, no
// cgroups, no kube-proxy or cluster DNS, no seccomp/AppArmor/SELinux, no scheduling constraints,
// ... — is listed in docs/local-cluster.md; GeneralDeviations are logged once when the Runner
// starts, and every field a Pod sets that the Runner does not honour is logged once per Pod and
// recorded as a LocalRunner event of the Pod.
//
// The Runner keeps the Node, the binding and which Pods run; each Pod is run by a
// kubelet/podworker.Worker (sandbox, volumes, container ordering, Pod status), each of its
// containers by a kubelet/containerworker.Worker (instances, probes, restarts), with what a
// container starts with resolved by kubelet/podconfig.
package kubelet
