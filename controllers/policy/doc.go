// Package policy holds the RenderQueue operator's decisions as pure functions of what it read
// (the RenderQueue, its shard Pods, the shards' reports, now): no client, no I/O. The reconciler
// in package controllers reads, calls these and writes what they return, as cert-manager keeps
// its certificate policies apart from its controllers.
//
//   - conditions.go: the shard states the operator reports itself (StatePending,
//     StateUnreachable, StateFailing), why a shard's Pod cannot run its keeper, and the
//     conditions Ready, Exact, EdgeHealthy, WalksComplete and Progressing, each a small function
//     returning (status, reason, message);
//   - classes.go: the ClassesServed condition (ClassStarving: a class on some shard has had due
//     rows and no render for longer than its cadence);
//   - blocked.go: what stops the operator from acting on a spec (SpecBlocker: InvalidSpec,
//     ImageNotAllowed; the reconciler adds ChildConflict and ShardPodRefused) and the Reconciled
//     condition; the --allowed-images allowlist (ImageAllowlist); which API errors are refusals
//     (RefusedByAPIServer);
//   - report.go: what one poll learnt about a shard (ShardReport), whether its Pod is ready and
//     whether it has loaded (ShardLoaded, the rolling update's gate);
//   - status.go: the status from the reports and the committed assignment (ComputeStatus):
//     every shard's status, the due sum and the conditions;
//   - pods.go: which shards must have a Pod (ShardsToKeep, MissingPod) and the rolling
//     replacement of outdated shard Pods, one at a time (RollingUpdate);
//   - events.go: the events a status change must emit (TransitionEvents), on transitions only;
//   - membership.go: status.membership to and from pkg/membership's assignment and handoff.
package policy
