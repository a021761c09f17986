// Package membership assigns the NumSlots hash slots to keeper shards and hands slots between
// shards without ever counting a slot twice or missing one.
//
// It is pure: no I/O, no goroutines, no clock of its own (time is a parameter), no global
// mutable state. The keeper and the operator wrap it.
//
// # Slots and assignments
//
// Slots are pkg/schedule's (schedule.SlotSet, with its text form "0-255,300,512-600", and
// schedule.Run). An Assignment is one epoch of the membership: the owner of
// every slot and, during a handoff, the receiver of each moving slot ("incoming"). Its
// text form is AssignmentSpec.
//
// # Planning
//
// PlanRebalance takes the current assignment and the target shard list and returns the phases
// to get there: the fewest slots moved for loads within one slot of each other, each shard's
// slots kept in few contiguous runs. The first assignment is contiguous equal ranges.
//
// # The two-phase handoff
//
// Moving a slot between shards takes two published assignments:
//
//  1. Prepare (epoch e+1): the moving slots become incoming to their receivers; owners are
//     unchanged. A receiver walks and holds its incoming slots but neither serves claims for
//     them nor counts them in due; the giver still owns, serves and counts them. Each shard
//     reports preparedEpoch, the highest epoch whose incoming slots it has fully walked.
//  2. Commit (epoch e+2): once every receiver reports preparedEpoch >= e+1, ownership of all
//     moving slots changes in one write. The giver drops them; the receiver serves and counts
//     them.
//
// If a receiver does not report in time, Rollback (epoch e+2) publishes the previous ownership
// again with nothing incoming. The commit and the rollback get their own epoch, above the
// prepare's, so that epochs only grow and every shard can tell which assignment is newest.
// Handoff is the coordinator driving these phases; Apply applies a phase to an assignment.
// Decide is the operator's one call: from the published assignment, the last handoff and what
// the shards and their Pods report, it says what to publish next (the first assignment, a
// prepare, a commit or rollback) or why to wait.
//
// # When a moving slot's count counts
//
// This is the one statement of the rule; the keeper (what it reports) and the operator (how it
// sums) point here. Each shard reports its due rows per owned slot and, per incoming slot, once
// it has walked every incoming slot of the epoch it reports (preparedEpoch >= epoch: the slot is
// "prepared"). The operator sums them with SumDue, taking each slot's count from exactly one
// report:
//
//  1. its owner in the committed assignment, when that owner reports owning it;
//  2. otherwise a shard that still reports owning it (a giver that has not adopted a commit yet:
//     it holds and follows the slot until it does);
//  3. otherwise a shard that reports it prepared (a receiver that has not adopted a commit yet:
//     it has walked the slot and follows its events, but does not count it in its own due).
//
// A slot with no such report makes the sum inexact (a lower bound). So no slot is counted twice
// or missed, and the total stays true through a commit, not only before and after it.
package membership
