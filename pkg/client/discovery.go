package client

import "context"

// Discovery finds the shards of a RenderQueue. Package discovery has the implementations.
type Discovery interface {
	// Run calls update with the complete shard set as soon as it knows it and again every time it
	// changes, until ctx is done (then it returns nil) or it cannot go on (then it returns why).
	// update is never called concurrently.
	Run(ctx context.Context, update func([]Shard)) error
}
