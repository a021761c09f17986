// Package controllers holds the RenderQueue reconciler: it turns a RenderQueue into keeper shard
// Pods and their companions, moves hash slots between shards with the two-phase handoff of
// pkg/membership, replaces outdated shard Pods one at a time, and polls every shard's
// GET /v1/status into the RenderQueue's status and conditions.
//
// The reconciler is split by concern, each step a reconcileX method of RenderQueueReconciler.
// What it builds and what it decides are pure functions in two sub-packages: controllers/specs
// (the shard Pod template, the children, their names), controllers/shardtls (the shards'
// certificates: when to issue one, and the operator's CA) and controllers/policy (what stops it —
// an invalid spec, a disallowed image —, the status and conditions computed from the shards'
// reports, the events of a status change).
//
// Up to MaxConcurrentReconciles RenderQueues are reconciled at once (controller-runtime never
// reconciles one twice at once), each again after the poll interval to poll its shards, at a
// priority below that of a change (pollPriority): BenchmarkManyQueues measures the operator with
// 500 RenderQueues (docs/benchmarks.md).
//
//   - renderqueue_controller.go: Reconcile, the steps in order, and a status.membership that
//     does not parse (InvalidMembership);
//   - children.go: creating and updating the shard ServiceAccount/Role/RoleBinding, headless
//     Service and PodDisruptionBudget, and the token Secret (created, never read: the operator may
//     not read Secrets); a child's name held by an object the operator does not manage is a
//     ChildConflict (Reconciled=False);
//   - tls.go: spec.tls OperatorIssued — the CA ConfigMap, the shards' certificate Secret issued
//     and renewed from status.tls without reading it (package shardtls decides and issues;
//     specs/podtemplate_tls.go mounts it into the shard Pods), and the HTTP client that verifies
//     a RenderQueue's TLS shards (ShardHTTPClient, which the console uses too; shardtls.Clients);
//   - pods.go: creating missing shard Pods (and recreating deleted ones; one the API server
//     refuses is ShardPodRefused), deleting surplus ones after their slots moved off, rolling
//     replacement of outdated Pods (policy.RollingUpdate decides which);
//   - membership.go: the first assignment, rebalances on scale up and down, resuming a handoff
//     persisted in status.membership (parsed once per reconcile; one that does not parse is a
//     terminal error and Reconciled=False, InvalidMembership);
//   - poll.go: reading every shard's /v1/status in parallel;
//   - patch.go: writing the status (policy.ComputeStatus's) only when it changed;
//   - events.go: events, emitted once the status write that makes them true succeeded;
//   - cache.go: the manager's cache options — of the child kinds only objects labelled
//     renderqueue.dev/queue are cached (a child's name held by an unlabelled object is a
//     ChildConflict, never taken over), no Secrets, and only the --watch-namespaces when given;
//   - metrics.go: the operator's Prometheus metrics — every RenderQueue's status as
//     renderqueue_queue_* gauges read from the cache at scrape time (QueueCollector), and the
//     handoffs started, committed and rolled back (Metrics), counted once their status write
//     succeeded.
package controllers
