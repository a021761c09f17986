// Package rowstore is the memory layout of the keeper core's held rows: fixed-size records (Rec,
// 24 bytes) in chunks with a free list, keys in a byte arena (compacted when half of it is
// garbage), and an open-addressing index from key to record id. Together with the core's claim
// trees (package duetree) a row costs about 24 (record) + key length + 1 (length prefix) + ~7
// (index) + ~11 (tree) bytes, with no per-row heap object for the garbage collector to trace.
//
// A record keeps the row's due time (ms, in 32-bit seconds until 2106 plus 10 bits of
// milliseconds), the store's Held flag and UserFlags flags of the user's, and the user's fields
// (Rev, Route, Group, Slot). Record ids are stable while the row is held and below MaxRows.
//
// The package is pure: no I/O, no clock, no goroutines (TestCoreIsPure in package core).
package rowstore
