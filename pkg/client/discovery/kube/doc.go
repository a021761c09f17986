// Package kube finds the shards of a RenderQueue through the Kubernetes API: RenderQueue watches
// the object and follows status.shards[].url and each shard's due count (a client.Discovery).
// It is apart from package discovery (static URLs, DNS), which links no Kubernetes package, so
// that only a worker that watches the Kubernetes API links client-go.
package kube
