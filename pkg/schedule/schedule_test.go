package schedule

import (
	"math"
	"testing"
)

func TestSlotOf(t *testing.T) {
	cases := []struct {
		hash int64
		want int
	}{
		{math.MinInt64, 0},
		{math.MinInt64 + 1<<54 - 1, 0},
		{math.MinInt64 + 1<<54, 1},
		{-1, NumSlots/2 - 1},
		{0, NumSlots / 2},
		{math.MaxInt64, NumSlots - 1},
	}
	for _, c := range cases {
		if got := SlotOf(c.hash); got != c.want {
			t.Errorf("SlotOf(%d) = %d, want %d", c.hash, got, c.want)
		}
	}
}

func TestSlotRangeRoundTrip(t *testing.T) {
	prevHi := int64(0)
	for s := 0; s < NumSlots; s++ {
		lo, hi := SlotHashRange(s)
		if SlotOf(lo) != s || SlotOf(hi) != s {
			t.Fatalf("slot %d: range [%d,%d] maps to %d..%d", s, lo, hi, SlotOf(lo), SlotOf(hi))
		}
		if s > 0 && lo != prevHi+1 {
			t.Fatalf("slot %d starts at %d, previous ended at %d", s, lo, prevHi)
		}
		prevHi = hi
	}
	if lo, _ := SlotHashRange(0); lo != math.MinInt64 {
		t.Fatalf("slot 0 starts at %d", lo)
	}
	if prevHi != math.MaxInt64 {
		t.Fatalf("last slot ends at %d", prevHi)
	}
}

func TestParseSource(t *testing.T) {
	for _, s := range []Source{SourceDiscovered, SourceSubmitted} {
		got, err := ParseSource(s.String())
		if err != nil || got != s {
			t.Fatalf("ParseSource(%q) = %v, %v", s.String(), got, err)
		}
	}
	if _, err := ParseSource(""); err == nil {
		t.Fatal("empty source accepted")
	}
}
