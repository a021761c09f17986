// Package schedule holds the row model shared by the store, the keeper and the operator: one
// schedule row per URL and what a valid row is (valid.go), the ownership hash the database
// computes for it, the slot formula that cuts the hash space into NumSlots equal, contiguous
// slots, and the one slot vocabulary of membership, store and keeper (slots.go: SlotSet, Run and
// their hash ranges).
//
// Nothing here does I/O; the hash itself is never computed in Go (PostgreSQL's
// hashtextextended(key, 0) computes it and it travels with every row and event).
package schedule

import (
	"fmt"
	"time"
)

// NumSlots is the number of hash slots the ownership hash space is cut into.
const NumSlots = 1024

// slotShift is how far a (sign-flipped) 64-bit hash is shifted right to give its slot.
const slotShift = 54

// SlotOf returns the slot of an ownership hash: the hash space in signed order, cut into
// NumSlots equal contiguous ranges.
func SlotOf(keyHash int64) int {
	return int((uint64(keyHash) ^ 1<<63) >> slotShift)
}

// SlotHashRange returns the inclusive range of signed hashes that fall into slot s.
// It panics when s is not a valid slot, which is a programming error.
func SlotHashRange(s int) (lo, hi int64) {
	if s < 0 || s >= NumSlots {
		panic(fmt.Sprintf("schedule: slot %d out of range [0,%d)", s, NumSlots))
	}
	lo = int64(uint64(s)<<slotShift ^ 1<<63)
	hi = lo + (1<<slotShift - 1)
	return lo, hi
}

// Source says how a URL came to be scheduled.
type Source uint8

const (
	// SourceDiscovered rows were found by the crawler.
	SourceDiscovered Source = iota
	// SourceSubmitted rows came from a sitemap; they may be boosted in claim order.
	SourceSubmitted
)

// String returns the source's name as stored in the database and shown in status.
func (s Source) String() string {
	switch s {
	case SourceDiscovered:
		return "discovered"
	case SourceSubmitted:
		return "submitted"
	default:
		return fmt.Sprintf("Source(%d)", uint8(s))
	}
}

// ParseSource parses a source name; anything but "submitted" or "discovered" is an error.
func ParseSource(s string) (Source, error) {
	switch s {
	case "discovered":
		return SourceDiscovered, nil
	case "submitted":
		return SourceSubmitted, nil
	default:
		return 0, fmt.Errorf("unknown source %q (want submitted or discovered)", s)
	}
}

// Row is one schedule row with its scheduling fields, as read from the store or carried by a
// change event.
type Row struct {
	// Key is the canonical URL (at most MaxKeyBytes bytes). What a valid row is: valid.go.
	Key string
	// KeyHash is the ownership hash computed by the database.
	KeyHash int64
	// Due is the next render time; meaningful only when HasDue is true.
	Due time.Time
	// HasDue is false when the row is unscheduled (due_at NULL). An absent due time is never read
	// as any particular instant.
	HasDue bool
	// Cadence is the render interval: whole milliseconds within [MinCadence, MaxCadence].
	Cadence time.Duration
	// Route is the route / template group, for the byRoute summary.
	Route string
	// Source says whether the row came from a sitemap or the crawler.
	Source Source
	// Urgent marks operator intent (admin re-render): urgent rows are claimed first, within a cap.
	Urgent bool
	// Rev orders writes per key: a higher rev is a later write.
	Rev int64
}

// Slot returns the row's slot.
func (r *Row) Slot() int { return SlotOf(r.KeyHash) }
