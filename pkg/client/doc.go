// Package client is the Go client of renderqueue's keeper shards, for render workers: it finds the
// shards, spreads claims over them by where the work is, backs off when there is none, and sends
// each completion, release and lease extension to the shard that leased the row. The wire
// contract it speaks is pkg/shardapi (documented for other languages in shardapi's openapi.yaml).
//
// # Discovery
//
// A Client follows a Discovery for the set of shards; there are three, in two packages so that a
// worker that does not watch the Kubernetes API links no Kubernetes package (this package links
// none):
//
//   - discovery.Static: a fixed list of base URLs (http://10.0.0.7:8080).
//   - discovery.DNS: the addresses of the headless Service <name>-shards, re-resolved periodically.
//   - kube.RenderQueue (pkg/client/discovery/kube): the RenderQueue object itself, watched through the Kubernetes API:
//     status.shards[].url and each shard's due count. A rebalance that adds or removes shards is
//     followed as it happens; the worker needs read access to that one object only (a Role with
//     get, list and watch on renderqueues, resourceNames [<name>]).
//
// # Claims and back-off
//
// Claim tries the shards in a weighted random order (weight: the shard's due count when the
// discovery knows it) and takes the better of the first two, then falls through to the others
// until one hands out rows, so a worker never idles on an empty shard while another has due
// rows. A shard that answered with no rows, a 503 (still loading) or an error is left alone for a
// jittered, exponentially growing time (Options.Backoff, a Backoff), and at
// least for the Retry-After of a 503 (a shard over its request limits), reset by its next
// non-empty answer; when every shard is backing off, Run waits for the first to be tried again,
// or for the discovery to change the shard set. An answer retrying cannot change (400, 401, 403,
// 404, 405, 413: StatusError.Fatal) is returned at once.
//
// # Workers
//
// Run is the worker API, in the style of River or Oban: it keeps up to concurrency rows
// rendering with a Handler. A nil error completes the row (at Result.NextDue when set, else by the
// RenderQueue's reschedule policy); an error releases it at once, or, wrapped with RetryAfter, leaves it leased so
// that it is handed out again after the given time. Leases of rows still rendering are extended
// before they lapse (POST /v1/extend); when an extension is refused the row was handed to
// someone else, and the handler's context is cancelled with ErrLeaseLost. When Run's context is
// cancelled it stops claiming, lets the rows in progress finish (Options.DrainTimeout), completes
// or releases them, releases every row claimed but never started, and returns.
//
// A completion or release the shard did not answer (a network error, a 5xx: the shard
// restarting, its database away) is retried with back-off, no sooner than its Retry-After, for
// as long as the rows' leases last: the shard still accepts it then, and answers a completion it
// had already written as written. Items the shard refuses (a lease no longer current, a row
// changed since it was claimed) are not retried.
//
// Metrics (package clientmetrics: clientmetrics.New) exports claims, completions, releases, extensions, errors and render
// times to Prometheus. GetStatus reads one shard's GET /v1/status (no token needed);
// ExplainRow what one shard knows of one row (GET /v1/rows/{key}, with the token).
package client
