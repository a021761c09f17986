// Package discovery holds the ways a client.Client finds the shards of a RenderQueue (its
// client.Discovery): Static, a fixed list of base URLs; DNS, the addresses of the headless
// Service <name>-shards, re-resolved periodically; RenderQueue, the RenderQueue object watched
// through the Kubernetes API (status.shards[].url and each shard's due count). It is apart from
// package client so that a worker that does not watch the Kubernetes API does not link client-go.
package discovery
