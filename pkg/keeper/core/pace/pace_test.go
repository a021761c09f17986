package pace

import (
	"math"
	"strings"
	"testing"
	"time"
)

const minute = int64(60_000)

// TestMeterMeasuresAConstantRate: claims of a constant size at a constant interval read as that
// rate, within the discreteness of the claims (the first claim of the stretch counts whole), at
// any point of the stretch — minutes in, or many Windows.
func TestMeterMeasuresAConstantRate(t *testing.T) {
	cases := []struct {
		every int64   // ms between claims
		rows  int     // rows each claim asks for and gets
		after int64   // ms from the stretch's first claim to the reading
		want  float64 // rows an hour
		tol   float64 // relative
	}{
		{minute, 45, 15 * minute, 2700, 0.07},      // 16 claims over 15 minutes: one claim too many
		{minute, 45, 60 * minute, 2700, 0.02},      // an hour in
		{minute, 45, 48 * 60 * minute, 2700, 0.01}, // two days in: the last Window weighs most
		{1000, 1, 30 * minute, 3600, 0.001},        // a claim of one row every second
	}
	for _, tc := range cases {
		var m Meter
		for at := int64(0); at <= tc.after; at += tc.every {
			m.Claimed(at, tc.rows, tc.rows)
		}
		r := m.Reading(tc.after, 1000)
		if math.Abs(r.ClaimRate-tc.want) > tc.tol*tc.want || r.Saturated != time.Duration(tc.after)*time.Millisecond || r.Demand != 1000 {
			t.Errorf("every %d ms, %d rows, read at %d ms: %+v, want a claim rate of %v ± %v%%", tc.every, tc.rows, tc.after, r, tc.want, 100*tc.tol)
		}
	}
}

// TestMeterFollowsTheLastWindow: after the capacity halves, the measured rate follows within a
// few Windows; a claim that finds fewer due rows than it asked for ends the stretch.
func TestMeterFollowsTheLastWindow(t *testing.T) {
	var m Meter
	at := int64(0)
	for ; at < 24*60*minute; at += minute {
		m.Claimed(at, 60, 60) // 3600 rows an hour
	}
	for end := at + 4*60*minute; at <= end; at += minute {
		m.Claimed(at, 30, 30) // 1800 rows an hour
	}
	if r := m.Reading(at-minute, 0); math.Abs(r.ClaimRate-1800) > 0.03*1800 {
		t.Errorf("4 Windows after the capacity halved: %v rows/h, want about 1800", r.ClaimRate)
	}
	m.Claimed(at, 30, 29)
	if r := m.Reading(at, 0); r.ClaimRate != 0 || r.Saturated != 0 {
		t.Errorf("after a claim that found fewer rows than it asked for: %+v, want nothing measured", r)
	}
	m.Claimed(at+minute, 10, 10)
	if r := m.Reading(at+minute, 0); r.Saturated != 0 {
		t.Errorf("a new stretch's first claim: %+v, want saturated for 0s", r)
	}
	if r := m.Reading(at+6*minute, 0); r.Saturated != 5*time.Minute {
		t.Errorf("5 minutes into a new stretch: saturated %v", r.Saturated)
	}
}

func TestDecide(t *testing.T) {
	cases := []struct {
		name    string
		reading Reading
		stretch bool   // AfterRender (true) or KeepPhase
		reason  string // Decide's reason
		message string // a substring of its message
	}{
		{"no claim yet", Reading{Demand: 100}, false, ReasonKeepingUp, "fewer due rows than it asked for: rows keep their phase"},
		{"due rows ran out", Reading{Demand: 5000, ClaimRate: 0, Saturated: 0}, false, ReasonKeepingUp, "fewer due rows"},
		{"just saturated", Reading{Demand: 5000, ClaimRate: 100, Saturated: 14 * time.Minute}, false, ReasonMeasuring, "14m0s, less than the 15m0s"},
		{"draining a backlog", Reading{Demand: 2567, ClaimRate: 2702, Saturated: 3 * 24 * time.Hour}, false, ReasonDraining, "2702 rows/h, at least the demand of 2567"},
		{"exactly at capacity", Reading{Demand: 2702, ClaimRate: 2702, Saturated: time.Hour}, false, ReasonDraining, ""},
		{"overloaded", Reading{Demand: 2567, ClaimRate: 2140, Saturated: time.Hour}, true, ReasonOverloaded, "(load 120%): intervals stretch like AfterRender"},
		{"overloaded from the first measured claim", Reading{Demand: 2567, ClaimRate: 513, Saturated: MinSaturated}, true, ReasonOverloaded, "(load 500%)"},
	}
	for _, tc := range cases {
		d := Decide(tc.reading)
		stretch, reason, message := d.Stretch, d.Reason, d.Message()
		if stretch != tc.stretch || reason != tc.reason || !strings.Contains(message, tc.message) {
			t.Errorf("%s: Decide(%+v) = %v, %q, %q; want %v, %q, a message containing %q", tc.name, tc.reading, stretch, reason, message, tc.stretch, tc.reason, tc.message)
		}
	}
}

// TestRecent: the rate of claimed rows over the whole seconds of the last minute before the
// current one, over the whole seconds since the first claim while those are fewer; claims older
// than the window drop out, an empty claim counts nothing, the current second does not count.
func TestRecent(t *testing.T) {
	const t0 = int64(1_796_040_000_000) // a whole second
	var r Recent
	if rate, over := r.Rate(t0); rate != 0 || over != 0 {
		t.Fatalf("before any claim: %v over %v", rate, over)
	}
	r.Claimed(t0, 0) // found nothing: not the first claim
	if rate, over := r.Rate(t0 + 5000); rate != 0 || over != 0 {
		t.Fatalf("after an empty claim: %v over %v", rate, over)
	}
	// 10 rows a second for 30 s, from t0 (one claim of 5 rows every 500 ms)
	for ms := int64(0); ms < 30_000; ms += 500 {
		r.Claimed(t0+ms, 5)
	}
	if rate, over := r.Rate(t0 + 900); rate != 0 || over != 0 {
		t.Errorf("within the first claim's second: %v over %v, want none", rate, over)
	}
	if rate, over := r.Rate(t0 + 20_700); rate != 10 || over != 20*time.Second {
		t.Errorf("20.7 s into a steady 10/s: %v over %v, want 10 over 20s", rate, over)
	}
	r.Claimed(t0+30_000, 1000) // a burst in the current second is not counted yet
	if rate, over := r.Rate(t0 + 30_000); rate != 10 || over != 30*time.Second {
		t.Errorf("after 30 s at 10/s: %v over %v, want 10 over 30s", rate, over)
	}
	if rate, over := r.Rate(t0 + 31_000); rate != 1300.0/31 || over != 31*time.Second {
		t.Errorf("a second later: %v over %v, want %v over 31s", rate, over, 1300.0/31)
	}
	// nothing for a while: seconds 16..29 of the claims remain in the minute before second 76
	if rate, over := r.Rate(t0 + 76_000); over != time.Minute || rate != (140.0+1000)/60 {
		t.Errorf("76 s in: %v over %v, want %v over 1m", rate, over, (140.0+1000)/60)
	}
	if rate, _ := r.Rate(t0 + 200_000); rate != 0 {
		t.Errorf("long after: %v, want 0", rate)
	}
	// a bucket reused a minute later counts only its new second
	r.Claimed(t0+60_500, 3)
	if rate, _ := r.Rate(t0 + 62_000); rate != (3.0+10*28+1000)/60 { // seconds 2..61
		t.Errorf("reused bucket: %v, want %v", rate, (3.0+10*28+1000)/60)
	}
}
