package schedule

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// slotWords is the number of 64-bit words in a SlotSet.
const slotWords = NumSlots / 64

// SlotSet is a set of slots, one bit per slot. The zero value is the empty set. It is a plain
// comparable value: copying it copies the set, and == compares sets.
type SlotSet [slotWords]uint64

// Run is an inclusive range of consecutive slots, First <= Last.
type Run struct {
	// First is the lowest slot of the run.
	First int
	// Last is the highest slot of the run.
	Last int
}

// Len returns the number of slots in the run.
func (r Run) Len() int { return r.Last - r.First + 1 }

// Contains reports whether slot s is in the run.
func (r Run) Contains(s int) bool { return s >= r.First && s <= r.Last }

// HashRange returns the inclusive range of ownership hashes of the run's slots: one key range,
// which is what makes a shard's walk a few range scans.
func (r Run) HashRange() (lo, hi int64) {
	lo, _ = SlotHashRange(r.First)
	_, hi = SlotHashRange(r.Last)
	return lo, hi
}

// String returns the run in the compact text form: "7" for a single slot, "0-255" otherwise.
func (r Run) String() string {
	if r.First == r.Last {
		return strconv.Itoa(r.First)
	}
	return strconv.Itoa(r.First) + "-" + strconv.Itoa(r.Last)
}

// AllSlots returns the set of every slot.
func AllSlots() SlotSet {
	var s SlotSet
	for i := range s {
		s[i] = ^uint64(0)
	}
	return s
}

// SlotRange returns the set of slots first..last inclusive. It panics when the range is not
// within [0, NumSlots) or is descending, which is a programming error.
func SlotRange(first, last int) SlotSet {
	if first < 0 || last >= NumSlots || first > last {
		panic(fmt.Sprintf("schedule: slot range %d-%d not within [0,%d)", first, last, NumSlots))
	}
	var s SlotSet
	for i := first; i <= last; i++ {
		s.Add(i)
	}
	return s
}

// Has reports whether slot is in the set; slots outside [0, NumSlots) never are.
func (s SlotSet) Has(slot int) bool {
	if slot < 0 || slot >= NumSlots {
		return false
	}
	return s[slot/64]&(1<<(uint(slot)%64)) != 0
}

// Add adds slot to the set. It panics when slot is outside [0, NumSlots).
func (s *SlotSet) Add(slot int) {
	checkSlot(slot)
	s[slot/64] |= 1 << (uint(slot) % 64)
}

// Remove removes slot from the set. It panics when slot is outside [0, NumSlots).
func (s *SlotSet) Remove(slot int) {
	checkSlot(slot)
	s[slot/64] &^= 1 << (uint(slot) % 64)
}

// Len returns the number of slots in the set.
func (s SlotSet) Len() int {
	n := 0
	for _, w := range s {
		n += bits.OnesCount64(w)
	}
	return n
}

// IsEmpty reports whether the set has no slots.
func (s SlotSet) IsEmpty() bool { return s == SlotSet{} }

// Union returns the slots in s or t.
func (s SlotSet) Union(t SlotSet) SlotSet {
	for i := range s {
		s[i] |= t[i]
	}
	return s
}

// Intersect returns the slots in both s and t.
func (s SlotSet) Intersect(t SlotSet) SlotSet {
	for i := range s {
		s[i] &= t[i]
	}
	return s
}

// Minus returns the slots in s but not in t.
func (s SlotSet) Minus(t SlotSet) SlotSet {
	for i := range s {
		s[i] &^= t[i]
	}
	return s
}

// Slots returns the slots of the set in ascending order (nil when empty).
func (s SlotSet) Slots() []int {
	var out []int
	for i, w := range s {
		for w != 0 {
			b := bits.TrailingZeros64(w)
			out = append(out, i*64+b)
			w &^= 1 << uint(b)
		}
	}
	return out
}

// Runs returns the maximal runs of consecutive slots in ascending order (nil when empty). Each
// run is one contiguous range of the hash space (SlotHashRange of its first and last slot).
func (s SlotSet) Runs() []Run {
	var out []Run
	for slot := 0; slot < NumSlots; slot++ {
		if !s.Has(slot) {
			continue
		}
		first := slot
		for slot+1 < NumSlots && s.Has(slot+1) {
			slot++
		}
		out = append(out, Run{First: first, Last: slot})
	}
	return out
}

// String returns FormatSlots(s).
func (s SlotSet) String() string { return FormatSlots(s) }

func checkSlot(slot int) {
	if slot < 0 || slot >= NumSlots {
		panic(fmt.Sprintf("schedule: slot %d out of range [0,%d)", slot, NumSlots))
	}
}

// FormatSlots returns the canonical compact text form of a slot set: its maximal runs in
// ascending order, separated by commas, a run of one slot written as "n" and a longer run as
// "first-last", e.g. "0-255,300,512-600". The empty set is "".
//
// Every set has exactly one text form, so two texts are equal exactly when the sets are, and
// ParseSlots(FormatSlots(s)) == s.
func FormatSlots(s SlotSet) string {
	var b strings.Builder
	for i, r := range s.Runs() {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(r.String())
	}
	return b.String()
}

// ParseSlots parses the canonical text form written by FormatSlots. It is strict: anything but
// the canonical form is an error naming the problem, and on error the returned set is always
// empty, never a partial result. Rejected are: empty elements (leading, trailing or doubled
// commas), spaces or any character other than digits, '-' and ',', signs, leading zeros, slots
// outside [0, NumSlots), descending ranges, ranges of one slot written "n-n", and runs that are
// not in ascending order, overlap, or touch (e.g. "0-5,6-9", which is written "0-9").
func ParseSlots(text string) (SlotSet, error) {
	var s SlotSet
	if text == "" {
		return s, nil
	}
	prevLast := -2 // last slot of the previous run; -2 so that run 0 does not "touch" it
	for i, elem := range strings.Split(text, ",") {
		r, err := parseRun(elem)
		if err != nil {
			return SlotSet{}, fmt.Errorf("slot set %q: element %d %q: %w", text, i+1, elem, err)
		}
		switch {
		case r.First <= prevLast:
			return SlotSet{}, fmt.Errorf("slot set %q: element %d %q: overlaps or is below the previous run (ending at %d); runs must be ascending and disjoint", text, i+1, elem, prevLast)
		case r.First == prevLast+1:
			return SlotSet{}, fmt.Errorf("slot set %q: element %d %q: touches the previous run (ending at %d); adjacent runs must be merged", text, i+1, elem, prevLast)
		}
		for slot := r.First; slot <= r.Last; slot++ {
			s.Add(slot)
		}
		prevLast = r.Last
	}
	return s, nil
}

// parseRun parses one element of the text form: "n" or "first-last" with first < last.
func parseRun(elem string) (Run, error) {
	if elem == "" {
		return Run{}, fmt.Errorf("empty element (leading, trailing or doubled comma)")
	}
	lo, hi, isRange := strings.Cut(elem, "-")
	first, err := parseSlot(lo)
	if err != nil {
		return Run{}, err
	}
	if !isRange {
		return Run{First: first, Last: first}, nil
	}
	last, err := parseSlot(hi)
	if err != nil {
		return Run{}, err
	}
	switch {
	case first > last:
		return Run{}, fmt.Errorf("descending range %d-%d", first, last)
	case first == last:
		return Run{}, fmt.Errorf("range of one slot %d-%d must be written %d", first, last, first)
	}
	return Run{First: first, Last: last}, nil
}

// parseSlot parses a slot number: decimal digits only, no sign, no leading zero, below NumSlots.
func parseSlot(num string) (int, error) {
	if num == "" {
		return 0, fmt.Errorf("missing slot number")
	}
	for _, c := range num {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("slot number %q: unexpected character %q (only digits, '-' and ',' are allowed)", num, c)
		}
	}
	if len(num) > 1 && num[0] == '0' {
		return 0, fmt.Errorf("slot number %q has a leading zero", num)
	}
	// At most 4 digits are needed; longer ones are out of range (and might overflow Atoi).
	if len(num) > 4 {
		return 0, fmt.Errorf("slot %s out of range [0,%d)", num, NumSlots)
	}
	n, err := strconv.Atoi(num)
	if err != nil {
		return 0, fmt.Errorf("slot number %q: %w", num, err)
	}
	if n >= NumSlots {
		return 0, fmt.Errorf("slot %d out of range [0,%d)", n, NumSlots)
	}
	return n, nil
}
