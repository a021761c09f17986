// Package policy is what the keeper core is configured with (Config): the admission window, the
// claim order — the submitted boost of Score, the urgent share, the starvation bound, the floors
// reserved for classes of rows (Floor) — and how a completion picks a rendered row's next due time
// (Reschedule, NextDue, Resolve), with their text forms, parsing and validation. Its values are
// plain data; the core (pkg/keeper/core) applies them. docs/priority.md has the guarantees and
// trade-offs.
//
// The package is pure: no I/O, no clock, no goroutines (TestCoreIsPure in package core).
package policy
