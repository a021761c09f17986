// Package membership assigns the NumSlots hash slots to keeper shards and hands slots between
// shards without ever counting a slot twice or missing one.
//
// It is pure: no I/O, no goroutines, no clock of its own (time is a parameter), no global
// mutable state. The keeper and the operator wrap it.
//
// # Slots and assignments
//
// A SlotSet is a bitset of slots with a canonical text form for status ("0-255,300,512-600",
// see FormatSlots and ParseSlots). An Assignment is one epoch of the membership: the owner of
// every slot and, during a handoff, the receiver of each moving slot ("incoming"). Its
// serialisable form is AssignmentSpec.
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
//
// Each shard reports due per owned slot; the operator sums them by the committed assignment
// (SumDue): every slot's count comes from its one owner, so no slot is counted twice or missed,
// and the sum is marked inexact while an owner has not yet adopted the assignment.
package membership
