// Package summary is the exact summary of a keeper shard's held rows (Summary: due, leased,
// lateness, classes, what comes due, the oldest row) and how its figures about due rows are
// counted from the core's due-ordered trees (package duetree) without visiting the rows (Count):
// class counts and the coming-due bins by rank at a few times, the oldest row and the maximum
// lateness from each tree's first entry, each lateness bucket by one rank, and each percentile by
// a binary search over the value with counts from the trees — relative lateness over the float's
// ordered bit patterns, so the figure is the same float a sort would give — until a few hundred
// rows are left to read.
//
// The keeper core (pkg/keeper/core) keeps the counts per slot and per route and fills in the rest.
//
// The package is pure: no I/O, no clock, no goroutines (TestCoreIsPure in package core).
package summary
