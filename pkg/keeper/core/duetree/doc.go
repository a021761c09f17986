// Package duetree holds records in order-statistic B+trees ordered by due time: the keeper core
// keeps each group's held rows in two of them, one for the rows of owned slots (claimed and
// counted) and one for the rows of incoming slots (held only).
//
// A tree orders its entries by due time, then by a tie-break the records give (Records.Compare;
// the core's is the key) — within one (cadence, source, urgent) group of the core that is exactly
// claim order, highest score first — and every inner node knows, for each child, how many entries
// its subtree holds and how many of them are claimable (not leased). One structure so serves both
// claims and status:
//
//   - the first claimable entry (Head) is found in O(height) by skipping subtrees without
//     claimable entries, so leased entries stay in place (counted as due) without slowing claims;
//   - rank (Rank: how many entries are due at or before t) and select (Select: the k-th entry by
//     due time) take O(height), so the core's status counts, coming-due bins and lateness
//     percentiles are exact without visiting every row.
//
// An Entry is (due time in 16 ms steps << 26 | leased bit << 25 | record id). Entries compare by
// that step, then (asking the Records, only for entries due within the same 16 ms) by due
// millisecond, then the tie-break, so most comparisons touch only the tree. Separators in inner
// nodes are the exact first entry of each child, so they always name a live record (their leased
// bits mean nothing). The nodes of all the trees of a Forest live in chunked pools without
// pointers (nothing for the garbage collector to trace); leaves hold up to 64 entries (≈ 0.7 full
// on random inserts: ≈ 11 bytes per entry).
//
// Entries can also be added in bulk (AddPending): appended to a list and built into the tree,
// sorted and with leaves packed, when the tree is next read.
//
// The package is pure: no I/O, no clock, no goroutines (TestCoreIsPure in package core).
package duetree
