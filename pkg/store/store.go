// Package store defines the schedule store the keeper shard service reads and writes: walks of a
// set of slots (streamed in segments, each reporting success or failure), subscriptions to the
// change events of a set of slots (with gap and resumed signals), writes (batch upsert,
// group-committed completion, delete) and schema migration.
//
// Rows are schedule.Row values: the store never computes the ownership hash, it reads it from the
// database with every row and event. Every write gives the row a fresh revision (Row.Rev), greater
// than every earlier revision of the same key, deletes included, so a reader that applies a row
// only when its rev is newer than what it holds may interleave walks and events in any order.
//
// Implementations: pkg/store/postgres (the real one) and pkg/store/memstore (in memory, for
// deterministic tests). Both pass the conformance suite in pkg/store/storetest.
package store

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// Store is the schedule store. All methods are safe for concurrent use.
type Store interface {
	// Migrate brings the store's schema up to date. It is idempotent and safe to run concurrently
	// from several processes.
	Migrate(ctx context.Context) error

	// Walk reads every row whose slot is in slots and hands the rows to fn, segment by segment
	// (a segment is a run of adjacent slots read as one keyset-paginated range). fn is never called
	// concurrently. For every segment, fn receives zero or more WalkItems with rows, in
	// (key_hash, key) order, then exactly one WalkItem with End set, whose Err is nil when every row
	// of the segment's slots was delivered, or says why the segment failed. Items of different
	// segments may interleave. A failed segment does not stop the walk: the other segments are
	// still read and the result lists which segments failed.
	//
	// Each page is read in its own snapshot, so rows written during the walk may or may not be
	// seen, but every row that exists from the start to the end of the walk is delivered exactly
	// once (keys never change). Subscribe before walking to cover the writes the walk misses.
	//
	// Walk returns an error (and stops early) only when ctx is done, slots is invalid, the store
	// is closed or fn returns an error (then Walk returns that error); segment failures are
	// reported in the result, never as Walk's error.
	Walk(ctx context.Context, slots []int, fn WalkFunc) (WalkResult, error)

	// Subscribe starts delivering the change events of the given slots. It returns once the
	// subscription is active: every write committed after Subscribe returns is delivered, until a
	// gap is signalled — with one exception a store may be configured for: the completions it
	// writes itself while this is its only subscription, when no other subscription (of any store)
	// holds their slots (pkg/store/postgres, Options.QuietCompletions). Its user applies those from
	// Complete's results, as a keeper does.
	Subscribe(ctx context.Context, slots []int) (Subscription, error)

	// Upsert inserts or replaces rows (all scheduling fields; KeyHash and Rev of the input are
	// ignored: the store computes them) in one transaction, and returns the stored rows in input
	// order, with their hash and new rev. Input is validated first (see ValidateRows): a batch with
	// any bad row is refused whole with a *ValidationError naming every bad row, and nothing is
	// written.
	Upsert(ctx context.Context, rows []schedule.Row) ([]schedule.Row, error)

	// Complete records finished renders: for each item it sets the row's due time to item.Due and
	// clears urgent. An item with a Rev is written only while the row is still at that rev (the
	// version the render was for): a row changed since (by a producer: urgent set, due moved,
	// cadence changed) is left as it is, and its result says Changed, with the row as stored.
	// Concurrent calls are group-committed (many completions per transaction);
	// Complete returns once the transaction holding its items committed, with one result per item
	// in input order: the row as stored after the write (with its new rev), or Found false when no
	// row has the key. When the same key is completed more than once in one group, the writes are
	// applied in arrival order, each with its own rev (and each checks its Rev against the row as
	// the writes before it left it). Bad input (a key or due time a row may not
	// have, pkg/schedule) refuses the whole call with a *ValidationError and writes
	// nothing. Once its items joined a group, Complete waits for that group's outcome even if
	// ctx ends, so the caller always learns whether they were written.
	Complete(ctx context.Context, items []Completion) ([]CompleteResult, error)

	// Delete removes the rows with the given keys in one transaction and returns one result per
	// key, in input order. A deleted row's result carries its hash and a fresh rev, greater than
	// every earlier rev of the key (its change event carries its own fresh rev).
	Delete(ctx context.Context, keys []string) ([]DeleteResult, error)

	// Close releases the store's resources and closes its subscriptions. Later calls fail with
	// ErrClosed.
	Close() error
}

// WalkFunc receives the output of a walk, one item at a time. Rows in the item are valid only
// during the call (the store reuses the slice); copy what you keep. Returning an error stops the
// walk and Walk returns that error.
type WalkFunc func(item WalkItem) error

// WalkItem is one call of a WalkFunc: a batch of rows of a segment, or the end of a segment.
type WalkItem struct {
	// Segment is the segment the rows belong to: a run of adjacent slots, walked as one key
	// range (schedule.Run.HashRange).
	Segment schedule.Run
	// Rows are rows of the segment's slots in (key_hash, key) order. Empty when End is set. A
	// store may carve the rows' keys from memory shared by many keys: a caller that keeps a key
	// on its own for long should keep a copy (strings.Clone), or it keeps the others' memory too.
	Rows []schedule.Row
	// End marks the last item of the segment.
	End bool
	// Err, with End, is nil when the segment was read completely and otherwise says why it failed
	// (rows delivered before the failure are real rows, but the segment may be missing others).
	Err error
}

// SegmentResult is the outcome of one segment of a walk.
type SegmentResult struct {
	Segment schedule.Run
	// Rows is how many rows of the segment were delivered.
	Rows int
	// Err is nil when the segment was read completely.
	Err error
}

// WalkResult summarises a walk.
type WalkResult struct {
	// Segments lists every segment of the walk in slot order.
	Segments []SegmentResult
	// Rows is the number of rows delivered.
	Rows int
}

// Failed returns the number of segments that were not read completely.
func (r WalkResult) Failed() int {
	n := 0
	for _, s := range r.Segments {
		if s.Err != nil {
			n++
		}
	}
	return n
}

// Partial reports whether some segment failed.
func (r WalkResult) Partial() bool { return r.Failed() > 0 }

// Subscription delivers change events of a set of slots. Next and SetSlots may be called from
// different goroutines; Next must not be called concurrently with itself.
type Subscription interface {
	// Next blocks until something is available and returns it: a batch of events in commit
	// order, or a gap or resumed signal. It returns ErrClosed once the subscription is closed
	// (or the context given to Subscribe is done), or ctx's error.
	Next(ctx context.Context) (Batch, error)

	// SetSlots changes the subscribed slots and returns once the subscription is active on exactly
	// the new set: writes committed after it returns to the added slots are delivered, and no
	// event of a removed slot is returned by a later Next. If the subscription is reconnecting,
	// SetSlots waits until it is back (the new set takes effect even if ctx ends first).
	SetSlots(ctx context.Context, slots []int) error

	// Close ends the subscription. Pending and later Next calls return ErrClosed.
	Close() error
}

// BatchKind says what a Batch carries.
type BatchKind uint8

const (
	// KindEvents batches carry change events.
	KindEvents BatchKind = iota
	// KindGap says continuity is lost: changes committed from now on (and possibly some before)
	// may never be delivered, until a KindResumed batch. Err says why.
	KindGap
	// KindResumed says the subscription is active again on all its slots: every write committed
	// after this point is delivered. A walk started after receiving it, together with the events
	// that follow, sees every change.
	KindResumed
)

// String names the kind.
func (k BatchKind) String() string {
	switch k {
	case KindEvents:
		return "events"
	case KindGap:
		return "gap"
	case KindResumed:
		return "resumed"
	default:
		return fmt.Sprintf("BatchKind(%d)", uint8(k))
	}
}

// Batch is what Subscription.Next returns.
type Batch struct {
	Kind BatchKind
	// Events, for KindEvents, in commit order (writes of one key in increasing rev order).
	Events []Event
	// Err, for KindGap, says why continuity was lost.
	Err error
}

// Event is one committed change of a row.
type Event struct {
	// Row is the row after the change; for a delete, the row as it was, with the delete's fresh
	// Rev.
	Row schedule.Row
	// Deleted is true when the row was deleted.
	Deleted bool
}

// Completion is one finished render: the row's next due time. Completing clears urgent.
type Completion struct {
	Key string
	Due time.Time
	// Rev, when not 0, is the rev of the row the render was for: the completion is written only
	// if the row is still at that rev. 0 writes whatever the row's rev.
	Rev int64
	// Known says that Cadence, Route and Source are the row's values at Rev, as this store gave
	// them (a walk, a change event, a write). Every write gives a row a fresh rev, so a completion
	// written over Rev leaves those columns as they were at Rev, and a store may build the written
	// row from them rather than read them back (the PostgreSQL store then returns only the key's
	// hash and the new rev from the database: about half the bytes of a completion's answer).
	// Known needs a Rev, and valid values.
	Known   bool
	Cadence time.Duration
	Route   string
	Source  schedule.Source
}

// CompleteResult is the outcome of one Completion.
type CompleteResult struct {
	// Row is the row as stored after the completion (valid when Found): the written row, or,
	// when Changed, the row as it was found.
	Row schedule.Row
	// Found is false when no row has the key (nothing was written for it).
	Found bool
	// Changed is true when the row's rev was no longer the completion's Rev: nothing was written.
	Changed bool
}

// DeleteResult is the outcome of deleting one key.
type DeleteResult struct {
	Key string
	// KeyHash and Rev are valid when Found: the deleted row's hash and a fresh revision.
	KeyHash int64
	Rev     int64
	// Found is false when no row had the key.
	Found bool
}

// ErrClosed is returned by a closed subscription or store.
var ErrClosed = errors.New("store: closed")

// ErrUnavailable marks an error (a walk segment's, a ping's) that says the store did not answer:
// it could not be reached, or the connection was lost. A reader that saw it may try again as soon
// as the store is seen to answer (Pinger) rather than after a back-off: the cause is not in what
// it asked.
var ErrUnavailable = errors.New("the store did not answer")

// Pinger is implemented by stores that can check they answer (one round trip). A keeper pings a
// store whose walks failed with ErrUnavailable, to walk again as soon as it answers.
type Pinger interface {
	// Ping returns nil when the store answers, and an error wrapping ErrUnavailable when it does
	// not.
	Ping(ctx context.Context) error
}

// RowReader is implemented by stores that read one row by its key (pkg/store/postgres,
// pkg/store/memstore): a keeper explaining a key it does not hold (GET /v1/rows/{key}) reads
// what the store has of it.
type RowReader interface {
	// ReadRow returns the row with key as stored now, and found false when there is none. Either
	// way the returned row's Key and KeyHash are set: the hash is the store's own (the
	// database's hashtextextended(key, 0)), computed for a key no row has too, so that its slot
	// is known. key must be valid (schedule.KeyProblem).
	ReadRow(ctx context.Context, key string) (row schedule.Row, found bool, err error)
}

// Session is the record of one keeper process of a shard (Sessions).
type Session struct {
	// Shard is the shard's name; Instance is random per keeper process, Pod per Pod (the id in
	// the keeper's Pod-local state file), so that a process can tell a predecessor in its own
	// Pod from one in another.
	Shard, Instance, Pod string
	// StartedAt is when the process began its session.
	StartedAt time.Time
	// EndedAt is when the process ended cleanly (EndSession); zero while it runs, or when it
	// died.
	EndedAt time.Time
	// LeasesUntil is, after a clean end, when the last lease the process granted ends (zero: no
	// lease outlived it).
	LeasesUntil time.Time
}

// Sessions records the processes of each keeper shard, so that a process that starts knows
// whether one before it may still have leases out (docs/design.md, "A keeper that dies"). It is
// implemented by stores that can (pkg/store/postgres from schema version 9, pkg/store/memstore).
type Sessions interface {
	// BeginSession records s as shard s.Shard's running process (its StartedAt is the store's
	// time) and returns the shard's previous session (found false when there was none).
	BeginSession(ctx context.Context, s Session) (prev Session, found bool, err error)
	// EndSession records a clean end of the session (shard, instance) with leasesUntil (zero:
	// none). It reports false when that session is not the shard's latest any more.
	EndSession(ctx context.Context, shard, instance string, leasesUntil time.Time) (bool, error)
}

// ErrNoSessions: the store cannot record keeper sessions (a PostgreSQL schema before version 9).
var ErrNoSessions = errors.New("the store does not record keeper sessions (schema before version 9: run `renderqueue schema migrate`)")

// ValidationError refuses a whole write because some of its input is bad. Nothing was written.
type ValidationError struct {
	// Problems lists every bad input item, in input order.
	Problems []Problem
}

// Problem is one bad input item of a write.
type Problem struct {
	// Index is the item's position in the input.
	Index int
	// Key is the item's key (possibly truncated for display).
	Key string
	// Reason says what is wrong.
	Reason string
}

func (e *ValidationError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "invalid input, nothing written: %d bad item(s): ", len(e.Problems))
	for i, p := range e.Problems {
		if i == 10 {
			fmt.Fprintf(&b, "; and %d more", len(e.Problems)-10)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "item %d (key %q): %s", p.Index, p.Key, p.Reason)
	}
	return b.String()
}

func displayKey(k string) string {
	if len(k) > 80 {
		return k[:80] + "..."
	}
	return k
}

// ValidateRows checks an Upsert batch: every row storable (schedule.Row.Problems: key, cadence,
// route, source and due time within the limits of pkg/schedule) and no key twice. It returns nil
// or a *ValidationError naming every bad row.
func ValidateRows(rows []schedule.Row) error {
	var probs []Problem
	seen := make(map[string]int, len(rows))
	for i := range rows {
		r := &rows[i]
		reasons := r.Problems()
		if j, dup := seen[r.Key]; dup {
			reasons = append(reasons, fmt.Sprintf("same key as item %d", j))
		} else {
			seen[r.Key] = i
		}
		if len(reasons) > 0 {
			probs = append(probs, Problem{Index: i, Key: displayKey(r.Key), Reason: strings.Join(reasons, ", ")})
		}
	}
	if len(probs) > 0 {
		return &ValidationError{Problems: probs}
	}
	return nil
}

// ValidateCompletions checks a Complete call: every key and due time valid (schedule.KeyProblem,
// schedule.DueProblem). The same key may appear more than once.
func ValidateCompletions(items []Completion) error {
	var probs []Problem
	for i, c := range items {
		var reasons []string
		if why := schedule.KeyProblem(c.Key); why != "" {
			reasons = append(reasons, why)
		}
		if why := schedule.DueProblem(c.Due); why != "" {
			reasons = append(reasons, why)
		}
		if c.Known {
			if c.Rev == 0 {
				reasons = append(reasons, "known values without the rev they are of")
			}
			for _, why := range []string{schedule.CadenceProblem(c.Cadence), schedule.RouteProblem(c.Route), schedule.SourceProblem(c.Source)} {
				if why != "" {
					reasons = append(reasons, "known "+why)
				}
			}
		}
		if len(reasons) > 0 {
			probs = append(probs, Problem{Index: i, Key: displayKey(c.Key), Reason: strings.Join(reasons, ", ")})
		}
	}
	if len(probs) > 0 {
		return &ValidationError{Problems: probs}
	}
	return nil
}

// NormalizeSlots validates a slot list and returns it sorted without duplicates.
func NormalizeSlots(slots []int) ([]int, error) {
	out := make([]int, 0, len(slots))
	for _, s := range slots {
		if s < 0 || s >= schedule.NumSlots {
			return nil, fmt.Errorf("slot %d out of range [0,%d)", s, schedule.NumSlots)
		}
		out = append(out, s)
	}
	sort.Ints(out)
	n := 0
	for i, s := range out {
		if i > 0 && s == out[n-1] {
			continue
		}
		out[n] = s
		n++
	}
	return out[:n], nil
}

// Segments cuts a sorted, duplicate-free slot list into segments: runs of adjacent slots, each at
// most maxLen slots long (maxLen <= 0 means unbounded).
func Segments(slots []int, maxLen int) []schedule.Run {
	var segs []schedule.Run
	for _, s := range slots {
		if n := len(segs); n > 0 && segs[n-1].Last == s-1 && (maxLen <= 0 || segs[n-1].Len() < maxLen) {
			segs[n-1].Last = s
			continue
		}
		segs = append(segs, schedule.Run{First: s, Last: s})
	}
	return segs
}
