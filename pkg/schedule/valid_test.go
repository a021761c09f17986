package schedule

import (
	"strings"
	"testing"
	"time"
)

// TestStorableAndHoldable: one decision for the store and the keeper — a row is storable when its
// fields are within the limits, holdable when it is storable and has a due time.
func TestStorableAndHoldable(t *testing.T) {
	ok := Row{Key: "https://a", Cadence: time.Hour, HasDue: true, Due: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	with := func(f func(r *Row)) Row { r := ok; f(&r); return r }
	for _, c := range []struct {
		name     string
		row      Row
		storable bool
		hold     string // "" when holdable, else a part of HoldProblem's reason
	}{
		{"valid", ok, true, ""},
		{"unscheduled", with(func(r *Row) { r.HasDue = false }), true, "due time is absent"},
		{"empty key", with(func(r *Row) { r.Key = "" }), false, "empty key"},
		{"long key", with(func(r *Row) { r.Key = strings.Repeat("k", MaxKeyBytes+1) }), false, "longer than 2048"},
		{"longest key", with(func(r *Row) { r.Key = strings.Repeat("k", MaxKeyBytes) }), true, ""},
		{"NUL in key", with(func(r *Row) { r.Key = "a\x00b" }), false, "NUL"},
		{"zero cadence", with(func(r *Row) { r.Cadence = 0 }), false, "not positive"},
		{"sub-ms cadence", with(func(r *Row) { r.Cadence = 1500 * time.Microsecond }), false, "whole number of milliseconds"},
		{"1ms cadence", with(func(r *Row) { r.Cadence = MinCadence }), true, ""},
		{"10-year cadence", with(func(r *Row) { r.Cadence = MaxCadence }), true, ""},
		{"20-year cadence", with(func(r *Row) { r.Cadence = 2 * MaxCadence }), false, "is over"},
		{"long route", with(func(r *Row) { r.Route = strings.Repeat("r", MaxRouteBytes+1) }), false, "route is 257 bytes"},
		{"unknown source", with(func(r *Row) { r.Source = 7 }), false, "unknown source"},
		{"due in 1900", with(func(r *Row) { r.Due = time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC) }), false, "outside [1970, 2106)"},
		{"due just before 1970", with(func(r *Row) { r.Due = time.UnixMilli(MinDueMs).Add(-time.Microsecond) }), false, "outside"},
		{"due at 1970", with(func(r *Row) { r.Due = time.UnixMilli(MinDueMs) }), true, ""},
		{"last due", with(func(r *Row) { r.Due = time.UnixMilli(MaxDueMs - 1) }), true, ""},
		{"due in 2106", with(func(r *Row) { r.Due = time.UnixMilli(MaxDueMs) }), false, "outside"},
		{"unscheduled with a bad cadence", with(func(r *Row) { r.HasDue, r.Cadence = false, 0 }), false, "due time is absent"},
	} {
		t.Run(c.name, func(t *testing.T) {
			probs := c.row.Problems()
			if (len(probs) == 0) != c.storable {
				t.Errorf("Problems() = %q, storable want %v", probs, c.storable)
			}
			got := c.row.HoldProblem()
			if (got == "") != (c.hold == "") || !strings.Contains(got, c.hold) {
				t.Errorf("HoldProblem() = %q, want %q", got, c.hold)
			}
			if c.storable && c.row.HasDue && got != "" {
				t.Errorf("a storable row with a due time is not holdable: %q", got)
			}
		})
	}
}
