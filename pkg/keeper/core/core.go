// Package core is the keeper's pure core: it holds a shard's due rows in memory and hands render
// workers the most overdue work first.
//
// The core (Core) is pure: every method takes the clock as a parameter and does no I/O and starts
// no goroutines; this package and its parts import nothing that could (pkg/schedule and
// pkg/shardapi's types only, TestCoreIsPure). It holds the rows of the shard's slots that are due
// before now + window, orders them for claiming by relative lateness × source boost, tracks
// leases, walks, and summarises what is due exactly. The shard service (package keeper) wraps it
// with the store, walks, the event subscription and the HTTP API.
//
// The core is built from parts of its own, each a package below this one:
//   - policy: what it is configured with (Config, Floor, Reschedule) and the claim score;
//   - pace: the claim rate against the demand, and the Adaptive policy's decision;
//   - rowstore: where the held rows live (records, keys, the key index);
//   - duetree: each group's rows ordered by due time, with the counts claims and summaries use;
//   - lease: the lease table (tokens, expiries);
//   - summary: the Summary, and its due figures counted from the trees.
//
// This package applies rows and deletes (core.go), claims (claim.go), walks (walk.go), keeps the
// due counts per slot and route (summary.go), removes the rows of slots that left in steps
// (drain.go) and tells the trees about its records (trees.go).
//
// Semantics (docs/design.md, section 2):
//   - Last writer wins by rev: a row is applied only if its rev is newer than what the core knows
//     of the key. While a walk runs, keys that events dropped, deleted or kept out of the window
//     leave a tombstone (their rev), so an older walked copy cannot bring them back.
//   - Admission: a valid row is held iff window is 0 or due < now + window when it is applied. A
//     held row leaves only when an event moves it out of the window, deletes it, or its slot leaves.
//   - Invalid rows (schedule.Row.HoldProblem: absent due, cadence or due time outside the limits
//     of pkg/schedule, a bad key or route, unknown source) are never held and never coerced;
//     they are counted.
//   - Claim order (policy.Config): urgent rows first (at most UrgentMaxShare of a batch while other
//     rows are due), then one row of each class past its StarvationBound, then each class's
//     floor (Floors), then by score (now − due) / cadence × boost(source), ties by due then key.
//     Due times are held at millisecond precision.
//   - Completion: the next due time of a rendered row follows the Reschedule policy (Completing);
//     Adaptive resolves to KeepPhase or AfterRender by what the claims have seen (package pace,
//     Core.Pace).
package core

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/duetree"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/lease"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/pace"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/rowstore"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// What a valid row may carry is pkg/schedule's (valid.go: a row is held only when
// Row.HoldProblem is ""); records and claim trees keep due seconds in 32 bits, which is where its
// due-time bound comes from.
const (
	// maxRoutes and maxGroups bound the interned routes and (cadence, source, urgent) groups.
	maxRoutes = math.MaxUint16
	maxGroups = math.MaxUint16
)

// MaxRows is the most rows one core can hold (its store's limit).
const MaxRows = rowstore.MaxRows

// The core's flags of a held record (rowstore.UserFlag and up).
const (
	flagLeased rowstore.Flag = rowstore.UserFlag << iota // the row is leased to a worker
	flagUrgent                                           // the row is urgent
	// flagSeen is the walk mark: a row of slot s counts as seen by the running walk when this
	// bit equals Core.parity[s] (see walk.go), so starting a walk unmarks a slot's rows at once.
	flagSeen
	// flagPending: the row's entry waits in its tree's pending list (bulk mode,
	// duetree.Forest.AddPending).
	flagPending
	// flagDecided: the event of the row's due time is decided for its objective (objectives.go).
	flagDecided
	coreFlags = iota
)

// the core's flags fit the store's user flags
const _ uint = rowstore.UserFlags - coreFlags

// noRecord is no record id.
const noRecord = ^uint32(0)

// SlotState says what the shard does with a slot's rows.
type SlotState uint8

const (
	// SlotNone: not the shard's; rows are ignored and any held ones are dropped.
	SlotNone SlotState = iota
	// SlotIncoming: being handed to this shard; rows are held but neither claimed nor counted.
	SlotIncoming
	// SlotOwned: the shard's; rows are held, claimed and counted.
	SlotOwned
)

// Result says what applying a row or a delete did.
type Result uint8

const (
	// Ignored: the core already knows an equal or newer rev of the key.
	Ignored Result = iota
	// NotOwned: the row's slot is neither owned nor incoming.
	NotOwned
	// Held: the row is held (newly, or updated in place).
	Held
	// NotHeld: the row is valid but due beyond the window, and was not held.
	NotHeld
	// Dropped: the row was held and moved beyond the window.
	Dropped
	// Removed: the row was deleted (it may or may not have been held).
	Removed
	// Invalid: the row is invalid; it is not held and is counted.
	Invalid
)

var resultNames = [...]string{"ignored", "not-owned", "held", "not-held", "dropped", "removed", "invalid"}

func (r Result) String() string {
	if int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("Result(%d)", uint8(r))
}

// Outcome is what Apply or Delete did.
type Outcome struct {
	Result Result
	// WasHeld says whether the key was held before.
	WasHeld bool
	// Reason explains an Invalid result.
	Reason string
}

// group is one (cadence, source, urgent) class of rows with its trees (package duetree): owned
// holds the rows of owned slots (claimed and counted), incoming those of incoming slots.
type group struct {
	cadenceMs int64
	source    schedule.Source
	urgent    bool
	owned     duetree.Tree
	incoming  duetree.Tree
	// floor is the index of the group's floor in policy.Config.Floors, or -1.
	floor int
	// lastClaimMs is when a row of the group was last claimed; math.MinInt64 before the first.
	lastClaimMs int64
	// obj is the index of the group's objective in Core.objs, or -1 (objectives.go).
	obj int
	// perMs is the demand of one of its rows: 1 / cadence, in renders per millisecond.
	perMs float64
}

type groupKey struct {
	cadenceMs int64
	source    schedule.Source
	urgent    bool
}

// known is what the core remembers of a key it does not hold: its rev (and slot, to forget it
// when the slot leaves).
type known struct {
	rev  int64
	slot uint16
}

// Core is the pure keeper core. It is not safe for concurrent use: the service serialises calls.
type Core struct {
	cfg policy.Config

	rows  *rowstore.Store // the held rows: records, keys, key index
	trees *duetree.Forest // the groups' trees
	// prefetched keeps Prefetch's reads from being optimised away; its value means nothing.
	prefetched uint32

	groups   []*group
	groupIdx map[groupKey]uint16
	routes   []string
	routeIdx map[string]uint16

	slots [schedule.NumSlots]SlotState
	// walked marks the slots a finished walk has read since they joined the shard.
	walked [schedule.NumSlots]bool
	// slotHeld counts the held rows of each slot.
	slotHeld [schedule.NumSlots]int32
	// parity is the value of flagSeen that marks a row of the slot seen (walk.go).
	parity [schedule.NumSlots]bool
	// fence is, per slot, until when (Unix ms) the slot hands out none of its rows: fenceLifted
	// until Fence ends it, 0 (or a past time) when it is not fenced (fence.go).
	fence [schedule.NumSlots]int64

	// due counts the rows due at or before a cursor time (summary.go).
	due dueCounts

	// invalid holds the keys whose latest known version is invalid.
	invalid map[string]known
	// tombstones holds, while a walk runs, keys whose latest known version is not held.
	tombstones map[string]known
	// (Both keep copies of the keys they are given: a walked row's key may share its memory
	// with thousands of others, which a map entry would keep alive.)

	leases *lease.Table
	// allFenced: every owned slot holding rows is fenced, as the claim or summary in progress
	// found (everyOwnedRowFenced); false outside them
	allFenced bool
	// awaitingRow holds leases taken over with their slot (ImportLeases) whose row is not held
	// here yet: the giver had read the row, this shard has not (an event it has not applied yet,
	// a walk not done). The row is leased under its lease the moment it is admitted (apply), so
	// it is handed to nobody else before the lease ends (fence.go).
	awaitingRow map[string]Lease

	// floors is the claim state of policy.Config.Floors, by index.
	floors []floorState

	// pace measures the claims for the Adaptive reschedule policy; paced is its decision at the
	// last claim.
	pace  pace.Meter
	paced pace.Decision
	// recent counts the rows claims handed out over the last minute (ClaimRate, Explain).
	recent pace.Recent
	// beyond is, per slot, the demand (renders per millisecond, Σ 1 / cadence) of the slot's
	// valid rows beyond the window, as the last walk that read the slot found them, plus the
	// rows dropped beyond the window since; beyondOwned sums it over the owned slots.
	beyond      [schedule.NumSlots]float64
	beyondOwned float64

	// bulk: rows are placed into their trees' pending lists (BeginBulk).
	bulk bool

	// unleasing is the record whose lease ApplyCompleted ended while its tree entry still carries
	// the leased bit (noRecord when none).
	unleasing uint32

	walk *walkState

	// objs are the freshness objectives counted (objectives.go); opNowMs is the time of the last
	// Apply, ApplyCompleted or Delete, for the rows a slot change removes.
	objs    []objState
	opNowMs int64

	// The rows of slots that left (departed rows, drain.go): no longer held, claimed, counted or
	// reported, but their records, keys and tree entries stay until Drain removes them.
	// departedFrom is, per slot with departed rows, the state the slot left from (their trees and
	// counts are that state's until they go); SlotNone for every other slot. departed counts them,
	// drainNext is the next record id Drain looks at, and departedOwned and departedDemand are
	// how many of them are still in owned trees and their demand (renders per ms, Σ 1 / cadence),
	// which demand takes off the trees'.
	departedFrom   [schedule.NumSlots]SlotState
	departed       int
	drainNext      uint32
	departedOwned  int
	departedDemand float64
	// drainTree is the tree Drain walks (group drainTree/2, its owned tree when even, incoming
	// when odd; past the last one, Drain looks at the records from drainNext), and drainDue and
	// drainKey the last entry it read there, when drainAt.
	drainTree int
	drainAt   bool
	drainDue  int64
	drainKey  string
	// slotDemand is, per slot, the demand (Σ 1 / cadence, renders per ms) of its held rows.
	slotDemand [schedule.NumSlots]float64
}

// New returns an empty core with no slots.
func New(cfg policy.Config) (*Core, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("keeper config: %w", err)
	}
	c := &Core{
		cfg:       cfg,
		groupIdx:  map[groupKey]uint16{},
		routeIdx:  map[string]uint16{},
		invalid:   map[string]known{},
		leases:    lease.NewTable(cfg.FirstLease),
		unleasing: noRecord,
	}
	c.rows = rowstore.New()
	c.trees = duetree.NewForest((*treeRecords)(c))
	c.floors = make([]floorState, len(cfg.Floors))
	return c, nil
}

// SetConfig changes the policy. A new window applies to rows applied from now on; rows already
// held stay held (the service walks again after a window change).
func (c *Core) SetConfig(cfg policy.Config) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("keeper config: %w", err)
	}
	cfg.FirstLease = c.cfg.FirstLease
	if !slices.Equal(cfg.Floors, c.cfg.Floors) {
		c.floors = make([]floorState, len(cfg.Floors))
	}
	c.cfg = cfg
	for _, g := range c.groups {
		g.floor = c.floorOf(g)
	}
	return nil
}

// floorOf returns the index of g's floor, or -1.
func (c *Core) floorOf(g *group) int {
	if g.urgent {
		return -1
	}
	for i, f := range c.cfg.Floors {
		if f.Cadence.Milliseconds() == g.cadenceMs && f.Source == g.source {
			return i
		}
	}
	return -1
}

// Reserve sizes the key index for n held rows, so that a load of up to n rows does not grow
// (rebuild) it on the way. It never shrinks anything.
func (c *Core) Reserve(n int) {
	c.rows.Reserve(n)
}

// Held returns the number of held rows (owned and incoming slots).
func (c *Core) Held() int { return c.rows.Len() - c.departed }

// HeldRev returns the rev of key's held row, and whether the core holds key.
func (c *Core) HeldRev(key string) (rev int64, held bool) {
	_, held, rev, _ = c.lookup(key)
	if !held {
		return 0, false
	}
	return rev, true
}

// IndexSize returns the key index's capacity (0 before the first row or Reserve) and how many
// times it has been built or rebuilt.
func (c *Core) IndexSize() (slots, builds int) { return c.rows.IndexSize() }

// InvalidCount returns the number of keys whose latest known version is invalid.
func (c *Core) InvalidCount() int { return len(c.invalid) }

// SlotState returns the state of slot s.
func (c *Core) SlotState(s int) SlotState { return c.slots[s] }

// SetSlot changes a slot's state. Leaving (SlotNone) drops the slot's held rows and what the core
// remembers of its keys; becoming owned makes incoming rows claimable and counted. Rows that leave
// are gone at once as far as anything reports, and their memory is given back by Drain, in steps
// (drain.go); a change of slots that hold rows between owned and incoming visits every held row.
// SetSlots changes many slots at once.
func (c *Core) SetSlot(s int, st SlotState) {
	states := c.slots
	states[s] = st
	c.SetSlots(&states)
}

// SetSlots sets every slot's state (as SetSlot does for one). It takes time in the slots, the
// leases and what the core remembers of the leaving slots' keys, not in the rows held: the rows of
// slots that leave become departed rows, which Drain removes in steps (drain.go); only rows moving
// between owned and incoming make it visit every held row (and a commit that makes every incoming
// slot owned does not: commitIncoming).
func (c *Core) SetSlots(states *[schedule.NumSlots]SlotState) {
	old := c.slots
	if old == *states {
		return
	}
	// departed rows go first when a slot they left is back (its keys would meet them), or when
	// commitIncoming would move them with the incoming trees they are in
	for s, n := range states {
		if from := c.departedFrom[s]; from != SlotNone && (n != SlotNone || from == SlotIncoming) {
			c.Drain(math.MaxInt)
			break
		}
	}
	if c.commitIncoming(states) {
		return
	}
	leaving := func(slot uint16) bool { return old[slot] != SlotNone && states[slot] == SlotNone }
	departing, moving := false, false
	for s := range c.slots {
		switch {
		case c.slotHeld[s] == 0 || old[s] == states[s]:
		case leaving(uint16(s)):
			departing = true
		default:
			moving = true // between owned and incoming (a slot arriving holds no rows)
		}
	}
	if departing {
		c.depart(states)
	}
	// rows of slots moving between owned and incoming change trees: out of the old one now (under
	// the old states), into the new one below
	var movingIDs []uint32
	if moving {
		c.rows.Each(func(id uint32, r *rowstore.Rec) {
			if o, n := old[r.Slot], states[r.Slot]; o != n && n != SlotNone && o != SlotNone {
				c.unplace(id, r)
				movingIDs = append(movingIDs, id)
			}
		})
	}
	c.slots = *states
	for _, id := range movingIDs {
		c.place(id, c.rows.At(id))
	}
	for s := range c.slots {
		if leaving(uint16(s)) {
			c.fence[s] = 0
			c.walked[s] = false
			c.beyond[s] = 0
			c.walk.leave(s)
		}
	}
	c.sumBeyond()
	for k, v := range c.invalid {
		if leaving(v.slot) {
			delete(c.invalid, k)
		}
	}
	for k, v := range c.tombstones {
		if leaving(v.slot) {
			delete(c.tombstones, k)
		}
	}
	for k, l := range c.awaitingRow {
		if leaving(uint16(l.Slot)) {
			delete(c.awaitingRow, k)
		}
	}
}

// commitIncoming is SetSlots for a commit that only makes incoming slots owned, all of them (a
// handoff's receivers, at its end), in time linear in the rows at worst instead of one tree
// descent per row: each group's incoming tree is merged into its owned tree in one pass (and
// when the owned tree is empty, as on a new shard, the two simply change places), and the due
// rows' routes count as owned in one addition per route. A claim waits for SetSlots, and a
// receiver holds hundreds of thousands of incoming rows at the commit of a rebalance. It reports
// whether it applied; when it did not, nothing changed.
func (c *Core) commitIncoming(states *[schedule.NumSlots]SlotState) bool {
	for s, n := range states {
		if o := c.slots[s]; n == SlotIncoming || (o != n && (o != SlotIncoming || n != SlotOwned)) {
			return false
		}
	}
	for _, g := range c.groups {
		// under the old states: Absorb builds pending entries (a load's) into their trees first
		c.trees.Absorb(&g.owned, &g.incoming)
	}
	c.slots = *states
	for i, n := range c.due.routeIncoming {
		c.due.route[i] += n
		c.due.routeIncoming[i] = 0
	}
	c.sumBeyond()
	return true
}

// treeOf returns the tree that holds r: its group's owned or incoming tree.
func (c *Core) treeOf(r *rowstore.Rec) *duetree.Tree {
	g := c.groups[r.Group]
	st := c.slots[r.Slot]
	if st == SlotNone {
		st = c.departedFrom[r.Slot] // a departed row: in the tree it was in when its slot left
	}
	if st == SlotOwned {
		return &g.owned
	}
	return &g.incoming
}

// place puts held record id into its tree (in bulk mode: its pending list) and counts it.
func (c *Core) place(id uint32, r *rowstore.Rec) {
	t := c.treeOf(r)
	if c.bulk {
		r.Set(flagPending)
		c.trees.AddPending(t, makeEntry(id, r))
	} else {
		c.trees.Insert(t, makeEntry(id, r))
	}
	c.countDue(r, 1)
	c.slotDemand[r.Slot] += c.groups[r.Group].perMs
}

// unplace takes held record id out of its tree (a pending entry is left to go stale) and its
// counts.
func (c *Core) unplace(id uint32, r *rowstore.Rec) {
	if id == c.unleasing {
		c.unleasing = noRecord // the entry goes, and its leased bit with it
	}
	if r.Has(flagPending) {
		r.Clear(flagPending)
	} else {
		c.trees.Delete(c.treeOf(r), makeEntry(id, r))
	}
	c.countDue(r, -1)
	c.slotDemand[r.Slot] -= c.groups[r.Group].perMs
}

// BeginBulk makes placing rows cheap until EndBulk, for a load: a row's tree entry is appended to
// a list, and the lists are sorted and built into their trees (leaves packed) when a tree is next
// read or at EndBulk, instead of each row descending its tree. Everything else works as usual.
func (c *Core) BeginBulk() { c.bulk = true }

// EndBulk builds every pending entry into its tree and ends bulk mode.
func (c *Core) EndBulk() {
	c.bulk = false
	for _, g := range c.groups {
		c.trees.Flush(&g.owned)
		c.trees.Flush(&g.incoming)
	}
}

// lookup returns the newest rev the core knows of key and whether it holds it (as record id).
func (c *Core) lookup(key string) (id uint32, held bool, rev int64, knownKey bool) {
	return c.lookupFound(key, noRecord)
}

// lookupFound is lookup where heldID, when not noRecord, is key's record, found already.
func (c *Core) lookupFound(key string, heldID uint32) (id uint32, held bool, rev int64, knownKey bool) {
	if heldID != noRecord {
		return heldID, true, c.rows.At(heldID).Rev, true
	}
	if id, ok := c.find(key); ok {
		return id, true, c.rows.At(id).Rev, true
	}
	if k, ok := c.invalid[key]; ok {
		return 0, false, k.rev, true
	}
	if k, ok := c.tombstones[key]; ok {
		return 0, false, k.rev, true
	}
	return 0, false, 0, false
}

// Prefetch reads ahead what looking up the n keys key(0) … key(n-1) reads first (their index
// entries, and the records and keys these point to: rowstore.Store.Prefetch), before a batch of
// them is applied, walked or completed. It changes nothing the core holds or reports. The
// batch's lookups then find their memory in the CPU's caches: one by one, each waits for its own
// cache misses, which are most of a lookup's time once the index outgrows the caches; read
// ahead, the misses of different keys overlap. Batches of about 128 keys keep what is read
// within the caches until it is used.
func (c *Core) Prefetch(n int, key func(i int) string) {
	c.prefetched += c.rows.Prefetch(n, key)
}

// PrefetchHints is Prefetch for ApplyCompleted: it reads ahead the records the n hints hint(0) …
// hint(n-1) point to, and their keys, which ApplyCompleted reads first. Completing found the
// rows there when the request came in, but by the time their writes return, the cache lines have
// long made way for other requests'. It changes nothing the core holds or reports; the zero Hint
// reads nothing.
func (c *Core) PrefetchHints(n int, hint func(i int) Hint) {
	c.prefetched += c.rows.PrefetchRecords(n, func(i int) uint32 { return hint(i).rec - 1 })
}

// Apply applies one row (walked or from an event) at time now.
func (c *Core) Apply(now time.Time, row schedule.Row) Outcome {
	return c.apply(now.UnixMilli(), &row, noRecord)
}

// ApplyCompleted applies the version of a row that completing it wrote and ends the completing
// lease: the same as Apply(now, row) followed by Release(now, row.Key, token) with its error
// ignored, with one key lookup and one change to the row's tree instead of three and two. hint
// is Completing's (Completion.Hint), or the zero Hint: with the row still held where Completing
// found it, there is no index lookup at all.
func (c *Core) ApplyCompleted(now time.Time, row schedule.Row, token uint64, hint Hint) Outcome {
	return c.applyCompleted(now, row, token, hint, true)
}

// ApplyRefused is ApplyCompleted for a completion the store refused because the row changed
// since it was claimed: row is the version stored, the lease ends, and the render it reported
// decides no freshness event (objectives.go).
func (c *Core) ApplyRefused(now time.Time, row schedule.Row, token uint64, hint Hint) Outcome {
	return c.applyCompleted(now, row, token, hint, false)
}

func (c *Core) applyCompleted(now time.Time, row schedule.Row, token uint64, hint Hint, written bool) Outcome {
	nowMs := now.UnixMilli()
	c.expireLeases(nowMs)
	id, ok := c.findFrom(row.Key, hint.rec-1)
	if !ok {
		return c.apply(nowMs, &row, noRecord)
	}
	r := c.rows.At(id)
	if c.leases.Current(id, token) {
		// a completion of the version leased decides its event (objectives.go); one refused
		// because the row changed since does not
		if l, ok := c.leases.Get(id); ok && written && l.Rev == r.Rev {
			c.objCompleted(nowMs, l.Since, r)
		}
		// end the lease on the record now; its tree entry is rewritten by the apply, or cleared
		// below when the apply leaves it in place
		c.leases.End(id)
		r.Clear(flagLeased)
		c.unleasing = id
		if !written {
			c.objLeaseEnded(r) // a render that did not complete
		}
	}
	o := c.apply(nowMs, &row, id)
	if c.unleasing != noRecord {
		c.trees.SetLeased(c.treeOf(r), makeEntry(c.unleasing, r), false)
		c.unleasing = noRecord
	}
	return o
}

func (c *Core) apply(nowMs int64, row *schedule.Row, heldID uint32) Outcome {
	c.opNowMs = nowMs
	slot := row.Slot()
	if c.slots[slot] == SlotNone {
		return Outcome{Result: NotOwned}
	}
	id, held, rev, knownKey := c.lookupFound(row.Key, heldID)
	if knownKey && row.Rev <= rev {
		if held && c.walk != nil {
			c.markSeen(c.rows.At(id))
		}
		return Outcome{Result: Ignored, WasHeld: held}
	}
	if reason := row.HoldProblem(); reason != "" {
		if held {
			c.removeRow(id)
		}
		c.forget(row.Key)
		c.setInvalid(row.Key, row.Rev, slot)
		return Outcome{Result: Invalid, WasHeld: held, Reason: reason}
	}
	delete(c.invalid, row.Key)
	due := row.Due.UnixMilli()
	if c.cfg.Window > 0 && due >= nowMs+c.cfg.Window.Milliseconds() {
		res := NotHeld
		if held {
			c.removeRow(id)
			res = Dropped
			c.addBeyond(slot, row.Cadence)
		}
		c.remember(row.Key, row.Rev, slot)
		return Outcome{Result: res, WasHeld: held}
	}
	gi, ok := c.groupOf(row)
	if !ok {
		if held {
			c.removeRow(id)
		}
		c.setInvalid(row.Key, row.Rev, slot)
		return Outcome{Result: Invalid, WasHeld: held, Reason: fmt.Sprintf("more than %d distinct (cadence, source, urgent) classes", maxGroups)}
	}
	ri, ok := c.routeOf(row.Route)
	if !ok {
		if held {
			c.removeRow(id)
		}
		c.setInvalid(row.Key, row.Rev, slot)
		return Outcome{Result: Invalid, WasHeld: held, Reason: fmt.Sprintf("more than %d distinct routes", maxRoutes)}
	}
	if held {
		r := c.rows.At(id)
		if c.walk != nil {
			c.markSeen(r)
		}
		if r.Group == gi && r.Due() == due {
			// same place in the same tree: only the rev and the route change
			c.countDue(r, -1)
			r.Rev, r.Route = row.Rev, ri
			c.countDue(r, 1)
			return Outcome{Result: Held, WasHeld: true}
		}
		c.objVersionEnds(nowMs, id, r)
		c.unplace(id, r)
	} else {
		if c.rows.Len() >= MaxRows && c.departed > 0 {
			c.Drain(math.MaxInt) // departed rows take room until they go
		}
		if c.rows.Len() >= MaxRows {
			c.remember(row.Key, row.Rev, slot)
			return Outcome{Result: Invalid, Reason: fmt.Sprintf("the shard holds the most rows one keeper can (%d); add shards", MaxRows)}
		}
		c.forget(row.Key)
		if c.rows.Len() == 0 {
			c.due.reset(nowMs) // nothing is counted: the cursor may move for free
		}
		id = c.rows.Add(row.Key)
		r := c.rows.At(id)
		r.Slot = uint16(slot)
		c.newSeen(r)
		c.slotHeld[slot]++
		if len(c.awaitingRow) > 0 {
			c.attachAwaited(nowMs, id, r, row.Key) // leased before it is placed: never claimable
		}
	}
	r := c.rows.At(id)
	r.SetDue(due)
	r.Rev = row.Rev
	r.Group = gi
	r.Route = ri
	r.Clear(flagUrgent)
	if row.Urgent {
		r.Set(flagUrgent)
	}
	c.place(id, r)
	if len(c.objs) > 0 {
		c.objPlaced(id, r)
	}
	return Outcome{Result: Held, WasHeld: held}
}

// Delete applies the deletion of key at rev.
func (c *Core) Delete(now time.Time, key string, slot int, rev int64) Outcome {
	c.opNowMs = now.UnixMilli()
	if c.slots[slot] == SlotNone {
		return Outcome{Result: NotOwned}
	}
	id, held, known, knownKey := c.lookup(key)
	if knownKey && rev <= known {
		return Outcome{Result: Ignored, WasHeld: held}
	}
	if held {
		c.removeRow(id)
	}
	delete(c.invalid, key)
	c.remember(key, rev, slot)
	return Outcome{Result: Removed, WasHeld: held}
}

// addBeyond counts a row of slot and cadence that went beyond the window in the slot's demand
// beyond the window (see Core.beyond).
func (c *Core) addBeyond(slot int, cadence time.Duration) {
	d := 1 / float64(cadence.Milliseconds())
	c.beyond[slot] += d
	if c.slots[slot] == SlotOwned {
		c.beyondOwned += d
	}
}

// sumBeyond sums the demand beyond the window over the owned slots.
func (c *Core) sumBeyond() {
	c.beyondOwned = 0
	for s, d := range c.beyond {
		if c.slots[s] == SlotOwned {
			c.beyondOwned += d
		}
	}
}

// remember records, while a walk runs, that key's newest rev is not held.
func (c *Core) remember(key string, rev int64, slot int) {
	if c.walk != nil {
		c.tombstones[strings.Clone(key)] = known{rev: rev, slot: uint16(slot)}
	}
}

// setInvalid records that key's latest known version (rev) is invalid.
func (c *Core) setInvalid(key string, rev int64, slot int) {
	c.invalid[strings.Clone(key)] = known{rev: rev, slot: uint16(slot)}
}

func (c *Core) forget(key string) {
	if c.tombstones != nil {
		delete(c.tombstones, key)
	}
}

// removeRow drops a held row: out of its tree and counts, its lease, and the store.
func (c *Core) removeRow(id uint32) {
	r := c.rows.At(id)
	if c.isDeparted(r) {
		// a departed row (a walk's sweep of a slot that left meanwhile): its events were decided
		// and its lease ended when its slot left; it goes as Drain removes it, out of the counts
		// it is still in
		c.removeDeparted(id, r)
		return
	}
	c.objVersionEnds(c.opNowMs, id, r)
	c.unplace(id, r)
	c.unseen(r)
	c.slotHeld[r.Slot]--
	if r.Has(flagLeased) {
		c.leases.End(id)
	}
	c.rows.Remove(id)
}

func (c *Core) groupOf(row *schedule.Row) (uint16, bool) {
	k := groupKey{cadenceMs: row.Cadence.Milliseconds(), source: row.Source, urgent: row.Urgent}
	if g, ok := c.groupIdx[k]; ok {
		return g, true
	}
	if len(c.groups) >= maxGroups {
		return 0, false
	}
	g := uint16(len(c.groups))
	grp := &group{cadenceMs: k.cadenceMs, source: k.source, urgent: k.urgent, lastClaimMs: math.MinInt64, perMs: 1 / float64(k.cadenceMs)}
	grp.floor = c.floorOf(grp)
	grp.obj = c.objectiveOf(grp)
	c.groups = append(c.groups, grp)
	c.groupIdx[k] = g
	return g, true
}

func (c *Core) routeOf(route string) (uint16, bool) {
	if r, ok := c.routeIdx[route]; ok {
		return r, true
	}
	if len(c.routes) >= maxRoutes {
		return 0, false
	}
	r := uint16(len(c.routes))
	c.routes = append(c.routes, route)
	c.due.route = append(c.due.route, 0)
	c.due.routeIncoming = append(c.due.routeIncoming, 0)
	c.routeIdx[route] = r
	return r, true
}
