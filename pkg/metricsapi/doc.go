// Package metricsapi serves RenderQueue figures through the Kubernetes external metrics API
// (external.metrics.k8s.io/v1beta1), so that a HorizontalPodAutoscaler can scale render workers
// on the number of due rows.
//
// Three namespaced external metrics are served, one value per selected RenderQueue:
//
//   - renderqueue_due: status.due, but only while status.dueExact is true. While any selected
//     RenderQueue's count is inexact (an unreachable shard, a gap, a partial walk, a handoff) the
//     request fails with an error naming it, so the HPA holds its replica count rather than
//     scale on a lower bound.
//   - renderqueue_due_lower_bound: status.due whatever status.dueExact says.
//   - renderqueue_due_forecast: the rows due now plus those coming due within a horizon the
//     selector names with the label horizon (15m, 1h or 24h; status.forecast), under the same
//     rule as renderqueue_due: while the figure is inexact for any selected RenderQueue the request
//     fails. The horizon label selects no RenderQueue; without one the request fails (400).
//
// The metric selector of the HPA selects RenderQueues by label: each RenderQueue carries its own
// labels plus the synthetic label renderqueue.dev/name=<name> (which wins over an own label of the
// same key). An empty selector selects every RenderQueue in the namespace. Selecting none is an
// error, never a silent 0. Every value carries status.dueAsOf as its timestamp; a RenderQueue
// without status.dueAsOf has never had its status computed, and both metrics fail for it.
//
// The pure core is [Values]; [Provider] reads RenderQueues through a controller-runtime
// client.Reader and implements the custom-metrics-apiserver ExternalMetricsProvider; [Server]
// runs the aggregated API server (delegated authentication and authorization; TLS with the
// certificate of a Secret shared by the replicas, whose CA it writes into its APIService's
// caBundle (certs.go), with given certificate files, or self-signed) and is a controller-runtime
// manager.Runnable.
//
// For clusters where another adapter (KEDA) owns external.metrics.k8s.io, [NewScalerHandler]
// serves the same figure, under the same rule, as plain JSON for KEDA's metrics-api trigger
// (GET /scaler/v1/namespaces/<ns>/renderqueues/<name>, the value at "due", a Kubernetes bearer
// token allowed to get the RenderQueue); the operator mounts it on its metrics port.
// [RequestMetrics] counts the requests of both and their errors by reason.
package metricsapi
