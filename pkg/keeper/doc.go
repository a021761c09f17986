// Package keeper is the shard service: one keeper process holds the due rows of its slots in the
// pure core (package core) and serves them to render workers.
//
// Shard wraps the core with what it cannot do itself: the store (walks, change events,
// completions), the lock that serialises the core and the goroutines that walk and follow events
// (shard.go); it tells the coverage ledger (package coverage) what happened and asks it what the
// shard vouches for — edge, gaps, complete, exact, the queue state. Claims, completions, releases
// and lease extensions are in leases.go, the status in status.go, what the shard knows of one row
// (GET /v1/rows/{key}: the core's Explain, and the store read by key for a row it does not hold)
// in explain.go. The HTTP API (http.go, the /v1
// contract of pkg/shardapi) sits on top, its plumbing — strict body decoding, in-flight limits,
// server timeouts, the bearer token, the lease token's wire form — in package httpserve. The
// shard records its Prometheus metrics into package shardmetrics; NewStatusCollector (status.go)
// exports its state gauges from its recent status. A shard gets its settings from a
// SettingsSource: flags when standalone (StaticSource), its RenderQueue object when the operator
// runs it (package kubesource).
package keeper
