// Package cluster runs a local Kubernetes control plane for renderqueue's end-to-end test and
// `make demo`: etcd, kube-apiserver (with the aggregation layer configured, so an APIService
// can serve external.metrics.k8s.io) and kube-controller-manager (Deployment, ReplicaSet,
// HorizontalPodAutoscaler, garbage collector, ... controllers), taken from a KUBEBUILDER_ASSETS
// directory (hack/setup-envtest.sh); a throwaway PostgreSQL (hack/postgres.sh) that can be paused
// and resumed on the same port; and a Runner that plays kubelet for the operator's shard Pods.
//
// There is no container runtime: the Runner starts the real renderqueue binary as each shard
// Pod's process, on the Pod's own loopback address 127.0.0.<n>. See [Runner] for exactly what it
// does with a Pod's args, env and volumes.
//
// Every process is started in its own process group and stopped (SIGTERM, then SIGKILL) by
// Stop; only loopback addresses are used.
package cluster
