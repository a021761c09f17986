// Package cli holds the subcommands of cmd/renderqueue that are tools rather than services —
// `bench` (a keeper process it starts against a SKIP LOCKED queue, pkg/bench), `simulate` (the
// keeper core on virtual time, pkg/simulate) and `worker-sim` (simulated render workers,
// pkg/workersim) — and the flag values and settings the binary's subcommands share: the keeper's
// --floor and --reschedule flags, the API token (--token-file, $RENDERQUEUE_TOKEN) and the
// Kubernetes client configuration (--kubeconfig). Each subcommand is a func(ctx, args, stdout,
// stderr) error that parses its flags and wires the library packages together; cmd/renderqueue
// dispatches to it. Flags, output and errors are the binary's: README.md and docs quote them.
package cli
