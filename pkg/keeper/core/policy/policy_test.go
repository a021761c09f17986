package policy

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want string // substring of the error; "" = valid
	}{
		{"defaults", Config{SubmittedBoost: 1}, ""},
		{"negative window", Config{Window: -time.Second, SubmittedBoost: 1}, "window"},
		{"zero boost", Config{}, "submittedBoost"},
		{"share above 1", Config{SubmittedBoost: 1, UrgentMaxShare: 1.5}, "urgentMaxShare"},
		{"floors", Config{SubmittedBoost: 1, Floors: []Floor{{time.Hour, schedule.SourceSubmitted, 0.1}, {96 * time.Hour, schedule.SourceDiscovered, 0.2}}}, ""},
		// decimal shares summing to exactly 1 are valid despite float rounding
		{"floors sum to 1", Config{SubmittedBoost: 1, Floors: []Floor{{time.Hour, 0, 0.1}, {2 * time.Hour, 0, 0.2}, {3 * time.Hour, 0, 0.7}}}, ""},
		{"floors past 1", Config{SubmittedBoost: 1, Floors: []Floor{{time.Hour, 0, 0.6}, {2 * time.Hour, 0, 0.5}}}, "sum to 1.1"},
		{"floor share 0", Config{SubmittedBoost: 1, Floors: []Floor{{time.Hour, 0, 0}}}, "share must be within (0, 1]"},
		{"floor share NaN", Config{SubmittedBoost: 1, Floors: []Floor{{time.Hour, 0, math.NaN()}}}, "share must be within (0, 1]"},
		{"floor twice", Config{SubmittedBoost: 1, Floors: []Floor{{time.Hour, 1, 0.1}, {60 * time.Minute, 1, 0.1}}}, "more than one floor"},
		{"floor cadence 0", Config{SubmittedBoost: 1, Floors: []Floor{{0, 1, 0.1}}}, "cadence must be within"},
		{"floor cadence µs", Config{SubmittedBoost: 1, Floors: []Floor{{time.Hour + time.Microsecond, 1, 0.1}}}, "whole milliseconds"},
		{"floor source", Config{SubmittedBoost: 1, Floors: []Floor{{time.Hour, 7, 0.1}}}, "unknown source"},
		{"reschedule", Config{SubmittedBoost: 1, Reschedule: 9}, "not a policy"},
		{"adaptive", Config{SubmittedBoost: 1, Reschedule: Adaptive, StarvationBound: DefaultStarvationBound}, ""},
		{"negative starvation bound", Config{SubmittedBoost: 1, StarvationBound: -0.5}, "starvationBound -0.5"},
		{"starvation bound NaN", Config{SubmittedBoost: 1, StarvationBound: math.NaN()}, "starvationBound NaN"},
		{"starvation bound +Inf", Config{SubmittedBoost: 1, StarvationBound: math.Inf(1)}, "starvationBound +Inf"},
	}
	for _, tc := range cases {
		err := tc.cfg.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: Validate() = %v, want error containing %q", tc.name, err, tc.want)
		}
	}
}

func TestNextDue(t *testing.T) {
	due := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		policy  Reschedule
		late    time.Duration
		cadence time.Duration
		want    time.Duration // after due
	}{
		{AfterRender, 0, time.Hour, time.Hour},
		{AfterRender, 150 * time.Minute, time.Hour, 210 * time.Minute},
		{KeepPhase, 0, time.Hour, time.Hour},
		{KeepPhase, 29 * time.Minute, time.Hour, time.Hour},                             // due again 31 min after the render
		{KeepPhase, 30 * time.Minute, time.Hour, 2 * time.Hour},                         // tie: the later point
		{KeepPhase, 150 * time.Minute, time.Hour, 4 * time.Hour},                        // 2.5 late: due + 4h, 1.5h after the render
		{KeepPhase, 151 * time.Minute, time.Hour, 4 * time.Hour},                        // nearest to render + 1h = due + 3h31m
		{KeepPhase, 60 * time.Hour, 96 * time.Hour, 192 * time.Hour},                    // 0.625 late: skip one point
		{KeepPhase, -time.Hour, time.Hour, time.Hour},                                   // rendered before its due (moved while leased)
		{KeepPhase, 3*time.Millisecond + 1, 3 * time.Millisecond, 6 * time.Millisecond}, // odd cadence
	}
	for _, tc := range cases {
		got := NextDue(tc.policy, due.Add(tc.late), due, tc.cadence).Sub(due)
		if got != tc.want {
			t.Errorf("%v late %v cadence %v: due + %v, want due + %v", tc.policy, tc.late, tc.cadence, got, tc.want)
		}
	}
	for _, p := range []Reschedule{KeepPhase, AfterRender, Adaptive} {
		if got, err := ParseReschedule(p.String()); got != p || err != nil {
			t.Errorf("ParseReschedule(%q) = %v, %v", p.String(), got, err)
		}
	}
	if _, err := ParseReschedule("keepphase"); err == nil {
		t.Error("ParseReschedule accepted a misspelt name")
	}
}

func TestResolve(t *testing.T) {
	cases := []struct {
		policy  Reschedule
		stretch bool       // the core's decision (pace.Decide)
		want    Reschedule // what the completion follows
	}{
		{Adaptive, false, KeepPhase},
		{Adaptive, true, AfterRender},
		{KeepPhase, true, KeepPhase},      // an explicit policy is never overridden
		{AfterRender, false, AfterRender}, // nor this one
	}
	for _, tc := range cases {
		if got := tc.policy.Resolve(tc.stretch); got != tc.want {
			t.Errorf("%v.Resolve(%v) = %v, want %v", tc.policy, tc.stretch, got, tc.want)
		}
	}
}
