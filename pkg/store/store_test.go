package store

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

func TestSegments(t *testing.T) {
	for _, tc := range []struct {
		slots []int
		max   int
		want  string
	}{
		{nil, 16, "[]"},
		{[]int{0}, 16, "[0]"},
		{[]int{0, 1, 2, 5, 6, 9}, 16, "[0-2 5-6 9]"},
		{[]int{0, 1, 2, 3, 4}, 2, "[0-1 2-3 4]"},
		{[]int{1021, 1022, 1023}, 0, "[1021-1023]"},
	} {
		if got := fmt.Sprint(Segments(tc.slots, tc.max)); got != tc.want {
			t.Errorf("Segments(%v, %d) = %s, want %s", tc.slots, tc.max, got, tc.want)
		}
	}
	lo, hi := schedule.Run{First: 0, Last: schedule.NumSlots - 1}.HashRange()
	if lo != -1<<63 || hi != 1<<63-1 {
		t.Errorf("all slots: hash range %d..%d", lo, hi)
	}
	lo, hi = schedule.Run{First: 3, Last: 4}.HashRange()
	if schedule.SlotOf(lo) != 3 || schedule.SlotOf(hi) != 4 || schedule.SlotOf(lo-1) != 2 || schedule.SlotOf(hi+1) != 5 {
		t.Errorf("slots 3-4: hash range %d..%d", lo, hi)
	}
}

func TestNormalizeSlots(t *testing.T) {
	got, err := NormalizeSlots([]int{5, 1, 5, 3, 1})
	if err != nil || fmt.Sprint(got) != "[1 3 5]" {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []int{-1, schedule.NumSlots} {
		if _, err := NormalizeSlots([]int{0, bad}); err == nil {
			t.Errorf("slot %d accepted", bad)
		}
	}
}

func TestValidateRows(t *testing.T) {
	ok := schedule.Row{Key: "https://a", Cadence: time.Hour, HasDue: true, Due: time.Now()}
	if err := ValidateRows([]schedule.Row{ok, {Key: "https://b", Cadence: time.Millisecond}}); err != nil {
		t.Errorf("valid rows refused: %v", err)
	}
	bad := ok
	bad.Key, bad.Cadence = strings.Repeat("k", schedule.MaxKeyBytes+1), 0
	err := ValidateRows([]schedule.Row{ok, bad, {Key: "x\x00y", Cadence: time.Hour, Route: "r\x00"},
		{Key: "https://c", Cadence: time.Hour, HasDue: true, Due: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		// what the keeper could never hold is not stored either
		{Key: "https://d", Cadence: 20 * 365 * 24 * time.Hour, HasDue: true, Due: time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC)}})
	var ve *ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 4 {
		t.Fatalf("got %v", err)
	}
	msg := err.Error()
	for _, want := range []string{"nothing written", "item 1", "longer than 2048", "cadence 0s is not positive",
		"item 2", "NUL", "item 3", "outside [1970, 2106)", "item 4", "cadence 175200h0m0s is over 87600h0m0s", "1900-01-01T00:00:00Z is outside"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, strings.Repeat("k", 100)) {
		t.Errorf("error message quotes a whole over-long key")
	}
}
