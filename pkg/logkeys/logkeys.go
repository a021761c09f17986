// Package logkeys names the keys every renderqueue process logs its subjects under, so that a log
// pipeline can follow one RenderQueue or shard across the operator, the keepers, the metrics API,
// the console and the render workers: a RenderQueue is `renderqueue` (its name) and `namespace`,
// a shard `shard` (its name, <renderqueue>-shard-<i>, also its Pod's), and slots `slots`.
// docs/monitoring.md ("Logs") lists them; this package's test keeps other spellings
// (queue, rq, ns, pod for a shard) out of the code's log calls.
package logkeys

// The keys.
const (
	// RenderQueue is the name of the RenderQueue a line is about.
	RenderQueue = "renderqueue"
	// Namespace is the namespace of the RenderQueue (or object) a line is about.
	Namespace = "namespace"
	// Shard is the name of the shard a line is about (its Pod's name).
	Shard = "shard"
	// Slots is the slots a line is about (a count or a slot set's text form).
	Slots = "slots"
)
