// Package console is the operator's read-only web console: what `kubectl describe renderqueue`
// says, as pictures that answer at a glance whether the due count is exact, which shard's edge
// lags, what comes due in the next hours and how the slots are spread.
//
// Pages (server-rendered HTML with inline SVG charts; every asset is embedded, nothing is
// fetched from anywhere but the console itself):
//
//   - / — every RenderQueue: due, exact or a lower bound, shards ready, membership phase, the
//     conditions as coloured badges;
//   - /queues/{namespace}/{name} — one queue: status.due, the conditions, a per-shard table
//     (state, exact and why not, due, edge ahead, last walk, partial walks, p99 relative
//     lateness, rows held / owned not held), rows coming due by hour, status.due over the last
//     hour, due and held rows by class, the slot assignment and the latest handoff as a timeline.
//     An unknown queue is a 404 page; a shard that does not answer is marked unreachable on the
//     page (its figures are then the operator's last poll, marked as such), never a failed page;
//   - /queues/{namespace}/{name}/rows?key= — the queue page's search box: what the queue's
//     shards know of one row (GET /v1/rows/{key} of its owner, as `kubectl renderqueue explain`
//     asks it), when the console has the shards' token (HandlerOptions.ShardToken: the
//     operator's --console-explain, SecretToken);
//   - /api/v1/queues and /api/v1/queues/{namespace}/{name} — the same figures as JSON (and
//     /api/v1/queues/{namespace}/{name}/rows?key= an explained row).
//
// A page refreshes itself every few seconds without reloading: a few lines of script fetch the
// page's fragments (?format=fragments, JSON) and swap them in.
//
// Data: RenderQueues and shard Pods through a controller-runtime client.Reader (the operator's
// cache, read only), and each shard's GET /v1/status, asked by the console when a page is built
// (one function, fetchShardStatus, with a short timeout). "Due over the last hour" is sampled
// from status.due by a [Sampler] into a bounded in-memory [History]. What the pages show — the
// summaries, the per-shard rows, the charts' geometry — is computed from these by the pure
// package pkg/console/view; this package reads, serves (the templates and static files are
// embedded here) and guards.
//
// Access: by default the console listens on 127.0.0.1 only and asks for no token — reaching it
// takes `kubectl port-forward`, so the Kubernetes permission pods/portforward in the operator's
// namespace is the gate. Listening on any other address requires a static bearer token read from
// a file (a mounted Secret, --console-token-file): clients send `Authorization: Bearer <token>`,
// browsers sign in once with the token and get an HttpOnly cookie derived from it (the API
// server's service proxy does not pass the Authorization header on). See docs/console.md.
package console
