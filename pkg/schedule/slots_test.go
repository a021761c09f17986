package schedule

import (
	"strings"
	"testing"
)

func TestFormatSlots(t *testing.T) {
	tests := []struct {
		// name describes the case.
		name string
		// set is the set to format.
		set SlotSet
		// want is the expected text.
		want string
	}{
		{name: "empty", set: SlotSet{}, want: ""},
		{name: "single slot", set: SlotRange(7, 7), want: "7"},
		{name: "first slot", set: SlotRange(0, 0), want: "0"},
		{name: "last slot", set: SlotRange(1023, 1023), want: "1023"},
		{name: "all", set: AllSlots(), want: "0-1023"},
		{name: "two runs", set: SlotRange(0, 255).Union(SlotRange(512, 600)), want: "0-255,512-600"},
		{name: "run of two", set: SlotRange(63, 64), want: "63-64"},
		{name: "mixed", set: SlotRange(1, 1).Union(SlotRange(3, 5)).Union(SlotRange(1023, 1023)), want: "1,3-5,1023"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := FormatSlots(tt.set); got != tt.want {
				t.Errorf("FormatSlots = %q, want %q", got, tt.want)
			}
			back, err := ParseSlots(tt.want)
			if err != nil {
				t.Fatalf("ParseSlots(%q): %v", tt.want, err)
			}
			if back != tt.set {
				t.Errorf("ParseSlots(%q) = %s, want %s", tt.want, back, tt.set)
			}
		})
	}
}

func TestParseSlotsRejects(t *testing.T) {
	tests := []struct {
		// text is the malformed input.
		text string
		// wantErr is a fragment the error must contain, naming the problem.
		wantErr string
	}{
		{text: ",", wantErr: "empty element"},
		{text: "1,", wantErr: "empty element"},
		{text: ",1", wantErr: "empty element"},
		{text: "1,,3", wantErr: "empty element"},
		{text: "1024", wantErr: "out of range"},
		{text: "0-1024", wantErr: "out of range"},
		{text: "99999999999999999999", wantErr: "out of range"},
		{text: "-1", wantErr: "missing slot number"},
		{text: "1-", wantErr: "missing slot number"},
		{text: "+1", wantErr: "unexpected character"},
		{text: "1-2-3", wantErr: "unexpected character"},
		{text: " 1", wantErr: "unexpected character"},
		{text: "1, 3", wantErr: "unexpected character"},
		{text: "1 ", wantErr: "unexpected character"},
		{text: "a", wantErr: "unexpected character"},
		{text: "0x10", wantErr: "unexpected character"},
		{text: "01", wantErr: "leading zero"},
		{text: "00", wantErr: "leading zero"},
		{text: "5-3", wantErr: "descending range"},
		{text: "5-5", wantErr: "must be written 5"},
		{text: "0-10,5-20", wantErr: "overlaps"},
		{text: "3,3", wantErr: "overlaps"},
		{text: "10,2", wantErr: "overlaps or is below"},
		{text: "0-5,6-9", wantErr: "touches"},
		{text: "4,5", wantErr: "touches"},
		{text: "1\n", wantErr: "unexpected character"},
	}
	for _, tt := range tests {
		t.Run(tt.text, func(t *testing.T) {
			got, err := ParseSlots(tt.text)
			if err == nil {
				t.Fatalf("ParseSlots(%q) = %s, want an error", tt.text, got)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseSlots(%q) error %q does not mention %q", tt.text, err, tt.wantErr)
			}
			if !got.IsEmpty() {
				t.Errorf("ParseSlots(%q) returned a partial set %s with its error", tt.text, got)
			}
		})
	}
}

func TestSlotSetOps(t *testing.T) {
	var s SlotSet
	for _, slot := range []int{0, 1, 2, 63, 64, 700, 1023} {
		s.Add(slot)
	}
	s.Remove(1)
	s.Remove(5) // absent: no-op
	if got, want := s.Len(), 6; got != want {
		t.Errorf("Len = %d, want %d", got, want)
	}
	if !s.Has(63) || s.Has(1) || s.Has(-1) || s.Has(NumSlots) {
		t.Errorf("Has wrong for %s", s)
	}
	if got, want := s.String(), "0,2,63-64,700,1023"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	wantRuns := []Run{{0, 0}, {2, 2}, {63, 64}, {700, 700}, {1023, 1023}}
	if got := s.Runs(); !equalRuns(got, wantRuns) {
		t.Errorf("Runs = %v, want %v", got, wantRuns)
	}
	if got := s.Slots(); len(got) != 6 || got[0] != 0 || got[5] != 1023 {
		t.Errorf("Slots = %v", got)
	}
	if got, want := AllSlots().Minus(s).Len(), NumSlots-6; got != want {
		t.Errorf("Minus Len = %d, want %d", got, want)
	}
	if got := s.Intersect(SlotRange(60, 800)); got != SlotRange(63, 64).Union(SlotRange(700, 700)) {
		t.Errorf("Intersect = %s", got)
	}
}

func TestSlotSetPanicsOutOfRange(t *testing.T) {
	for _, f := range []func(){
		func() { var s SlotSet; s.Add(NumSlots) },
		func() { var s SlotSet; s.Remove(-1) },
		func() { SlotRange(5, 4) },
		func() { SlotRange(0, NumSlots) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			f()
		}()
	}
}

func equalRuns(a, b []Run) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// FuzzParseSlots checks that any text is either rejected with an empty set or is exactly the
// canonical form of the set returned. `go test` runs the seeds; `go test -fuzz` explores.
func FuzzParseSlots(f *testing.F) {
	for _, seed := range []string{"", "0", "0-1023", "0-255,512-600", "1,3-5,1023", "5-5", "0-5,6-9", "01", "1,", "1024", " 1"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		got, err := ParseSlots(text)
		if err != nil {
			if !got.IsEmpty() {
				t.Fatalf("ParseSlots(%q) returned %s with error %v", text, got, err)
			}
			return
		}
		if canon := FormatSlots(got); canon != text {
			t.Fatalf("ParseSlots(%q) accepted non-canonical text (canonical %q)", text, canon)
		}
	})
}
