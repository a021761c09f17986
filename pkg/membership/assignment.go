package membership

import (
	"errors"
	"fmt"
	"sort"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// Assignment is one version (epoch) of the slot membership: the owner of every slot and, while a
// handoff is being prepared, the shard each moving slot is incoming to.
//
// The zero value is the empty assignment: epoch 0, no owners, the state before the first
// commit. Any other Assignment has an owner for every slot. Assignments are values: the
// functions of this package never modify one in place, and == compares them.
type Assignment struct {
	// Epoch is the version of the assignment; every change publishes a higher epoch.
	Epoch int64

	// owner[slot] is the shard owning slot ("" only in the empty assignment).
	owner [schedule.NumSlots]string
	// incoming[slot] is the shard slot is incoming to during a prepare phase, "" when none.
	incoming [schedule.NumSlots]string
}

// NewAssignment returns a settled assignment (nothing incoming) at epoch from each shard's
// owned slots. The sets must be disjoint and together cover every slot, or all be empty (the
// empty assignment); shard names must be non-empty.
func NewAssignment(epoch int64, owned map[string]schedule.SlotSet) (Assignment, error) {
	a := Assignment{Epoch: epoch}
	for _, name := range sortedKeys(owned) {
		if err := a.claim(name, owned[name]); err != nil {
			return Assignment{}, err
		}
	}
	if err := a.Validate(); err != nil {
		return Assignment{}, err
	}
	return a, nil
}

// claim makes name the owner of slots, failing if name is empty or a slot already has an owner.
func (a *Assignment) claim(name string, slots schedule.SlotSet) error {
	if name == "" {
		return errors.New("shard name is empty")
	}
	for _, slot := range slots.Slots() {
		if prev := a.owner[slot]; prev != "" {
			return fmt.Errorf("slot %d owned by both %q and %q", slot, prev, name)
		}
		a.owner[slot] = name
	}
	return nil
}

// Validate checks the invariants of an assignment: either no slot has an owner or incoming
// receiver (the empty assignment), or every slot has exactly one owner; an incoming slot is
// never incoming to its own owner.
func (a Assignment) Validate() error {
	if a.IsEmpty() {
		return nil
	}
	var unowned schedule.SlotSet
	for slot := 0; slot < schedule.NumSlots; slot++ {
		switch {
		case a.owner[slot] == "":
			unowned.Add(slot)
		case a.incoming[slot] == a.owner[slot]:
			return fmt.Errorf("assignment at epoch %d: slot %d is incoming to its own owner %q", a.Epoch, slot, a.owner[slot])
		}
	}
	if !unowned.IsEmpty() {
		return fmt.Errorf("assignment at epoch %d: slots %s have no owner", a.Epoch, unowned)
	}
	return nil
}

// IsEmpty reports whether no slot has an owner or receiver (the assignment before the first
// commit).
func (a Assignment) IsEmpty() bool {
	return a.owner == [schedule.NumSlots]string{} && a.incoming == [schedule.NumSlots]string{}
}

// Settled reports whether no slot is incoming, i.e. no handoff is being prepared.
func (a Assignment) Settled() bool {
	return a.incoming == [schedule.NumSlots]string{}
}

// Owner returns the shard owning slot, "" in the empty assignment or for a slot out of range.
func (a Assignment) Owner(slot int) string {
	if slot < 0 || slot >= schedule.NumSlots {
		return ""
	}
	return a.owner[slot]
}

// IncomingTo returns the shard slot is incoming to, "" when it is not moving or out of range.
func (a Assignment) IncomingTo(slot int) string {
	if slot < 0 || slot >= schedule.NumSlots {
		return ""
	}
	return a.incoming[slot]
}

// Owned returns the slots shard owns: the slots it serves and counts.
func (a Assignment) Owned(shard string) schedule.SlotSet {
	return slotsOf(&a.owner, shard)
}

// Incoming returns the slots incoming to shard: the slots it walks and holds, but neither serves
// nor counts, until the commit.
func (a Assignment) Incoming(shard string) schedule.SlotSet {
	return slotsOf(&a.incoming, shard)
}

// Shards returns the names of the shards owning or receiving slots, sorted.
func (a Assignment) Shards() []string {
	seen := map[string]bool{}
	for slot := 0; slot < schedule.NumSlots; slot++ {
		seen[a.owner[slot]] = true
		seen[a.incoming[slot]] = true
	}
	delete(seen, "")
	return sortedKeys(seen)
}

// Counts returns the number of slots each shard owns.
func (a Assignment) Counts() map[string]int {
	counts := map[string]int{}
	for _, o := range a.owner {
		if o != "" {
			counts[o]++
		}
	}
	return counts
}

func slotsOf(names *[schedule.NumSlots]string, shard string) schedule.SlotSet {
	var s schedule.SlotSet
	if shard == "" {
		return s
	}
	for slot, n := range names {
		if n == shard {
			s.Add(slot)
		}
	}
	return s
}

// AssignmentSpec is the text form of an Assignment, as RenderQueue status and each shard's view
// of it carry it: plain fields, slot sets in the compact text form.
type AssignmentSpec struct {
	// Epoch is the assignment's epoch.
	Epoch int64
	// Shards lists every shard that owns or receives slots, sorted by name.
	Shards []ShardSlots
}

// ShardSlots is one shard's part of an assignment.
type ShardSlots struct {
	// Name is the shard's name.
	Name string
	// Owned is the slots the shard owns (serves and counts), e.g. "0-340".
	Owned string
	// Incoming is the slots being handed to the shard (walked and held, not served or counted).
	Incoming string
}

// Spec returns the text form of a.
func (a Assignment) Spec() AssignmentSpec {
	spec := AssignmentSpec{Epoch: a.Epoch}
	for _, name := range a.Shards() {
		spec.Shards = append(spec.Shards, ShardSlots{
			Name:     name,
			Owned:    schedule.FormatSlots(a.Owned(name)),
			Incoming: schedule.FormatSlots(a.Incoming(name)),
		})
	}
	return spec
}

// ParseAssignment parses and validates the text form of an assignment. It is strict:
// a malformed slot set, an empty or repeated shard name, a slot owned twice or incoming twice,
// a slot incoming to its own owner, or a non-empty assignment leaving a slot without owner is an
// error, and on error the result is the zero Assignment, never a partial one.
func ParseAssignment(spec AssignmentSpec) (Assignment, error) {
	a := Assignment{Epoch: spec.Epoch}
	seen := map[string]bool{}
	for _, sh := range spec.Shards {
		if sh.Name == "" {
			return Assignment{}, fmt.Errorf("assignment at epoch %d: shard with empty name", spec.Epoch)
		}
		if seen[sh.Name] {
			return Assignment{}, fmt.Errorf("assignment at epoch %d: shard %q listed twice", spec.Epoch, sh.Name)
		}
		seen[sh.Name] = true
		owned, err := schedule.ParseSlots(sh.Owned)
		if err != nil {
			return Assignment{}, fmt.Errorf("assignment at epoch %d: shard %q owned: %w", spec.Epoch, sh.Name, err)
		}
		incoming, err := schedule.ParseSlots(sh.Incoming)
		if err != nil {
			return Assignment{}, fmt.Errorf("assignment at epoch %d: shard %q incoming: %w", spec.Epoch, sh.Name, err)
		}
		if err := a.claim(sh.Name, owned); err != nil {
			return Assignment{}, fmt.Errorf("assignment at epoch %d: %w", spec.Epoch, err)
		}
		for _, slot := range incoming.Slots() {
			if prev := a.incoming[slot]; prev != "" {
				return Assignment{}, fmt.Errorf("assignment at epoch %d: slot %d incoming to both %q and %q", spec.Epoch, slot, prev, sh.Name)
			}
			a.incoming[slot] = sh.Name
		}
	}
	if a.owner == [schedule.NumSlots]string{} && !a.Settled() {
		return Assignment{}, fmt.Errorf("assignment at epoch %d: slots are incoming but no slot has an owner", spec.Epoch)
	}
	if err := a.Validate(); err != nil {
		return Assignment{}, err
	}
	return a, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
