// Package discovery holds the ways a client.Client finds the shards of a RenderQueue without the
// Kubernetes API (its client.Discovery): Static, a fixed list of base URLs; DNS and DNSHTTPS,
// the addresses of the headless Service <name>-shards, re-resolved periodically. It links no
// Kubernetes package; the RenderQueue object watched through the Kubernetes API (status.shards[]
// with each shard's due count) is package discovery/kube's RenderQueue.
package discovery
