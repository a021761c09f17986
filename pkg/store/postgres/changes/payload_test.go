package changes

import (
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/internal/columns"
)

func TestParseEntries(t *testing.T) {
	evs, err := parseEntries(
		"7,-5,1700000000000001,3600000,3,12:https://a,b:4:home"+
			"8,9,,1,4,3:k:10:",
		columns.Interner{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 {
		t.Fatalf("%d events", len(evs))
	}
	a, b := evs[0], evs[1]
	if a.Row.Rev != 7 || a.Row.KeyHash != -5 || !a.Row.HasDue || a.Row.Due.UnixMicro() != 1700000000000001 ||
		a.Row.Cadence != time.Hour || a.Row.Source != schedule.SourceSubmitted || !a.Row.Urgent || a.Deleted ||
		a.Row.Key != "https://a,b:" || a.Row.Route != "home" {
		t.Errorf("first event %+v", a)
	}
	if b.Row.Rev != 8 || b.Row.HasDue || b.Row.Cadence != time.Millisecond || b.Row.Source != schedule.SourceDiscovered ||
		b.Row.Urgent || !b.Deleted || b.Row.Key != "k:1" || b.Row.Route != "" {
		t.Errorf("second event %+v", b)
	}
	for _, bad := range []string{"x", "1x", "17,", "17,1,,1,0,5:abc", "17,1,,1,0,-1:", "17,1,,1,0,1:a", "17,1,,1,0,1:a3:ab"} {
		if _, err := parseEntries(bad, columns.Interner{}, nil); err == nil {
			t.Errorf("payload %q accepted", bad)
		}
	}
}

// FuzzParseEntries: no input makes the parser panic or return events with keys it did not read.
func FuzzParseEntries(f *testing.F) {
	f.Add("17,-5,1700000000000001,3600000,3,12:https://a,b:4:home")
	f.Add("18,9,,1,4,3:k:10:")
	f.Fuzz(func(t *testing.T, p string) {
		evs, _ := parseEntries(p, columns.Interner{}, nil)
		for _, e := range evs {
			if !strings.Contains(p, e.Row.Key) {
				t.Fatalf("key %q not in payload", e.Row.Key)
			}
		}
	})
}

// TestReplayGuard: the guard's window, its memory of payloads and its bound.
func TestReplayGuard(t *testing.T) {
	const sec = int64(time.Second / time.Microsecond)
	g := newReplayGuard(time.Minute, 3)
	mac := func(i int) *[sha256.Size]byte {
		var m [sha256.Size]byte
		m[0], m[1] = byte(i), byte(i>>8)
		return &m
	}
	now := int64(1_000_000) * sec
	for i, tc := range []struct {
		ts, now int64
		mac     int
		want    error
	}{
		{now, now, 1, nil},
		{now, now, 1, errReplayed},
		{now - 61*sec, now, 2, errStale},
		{now + 61*sec, now, 3, errStale},
		{now - 30*sec, now, 4, nil},
		{now + 30*sec, now, 5, nil},
		{now + 1, now, 6, nil},                       // a fourth remembered: the oldest arrival (mac 1, ts now) is forgotten
		{now, now, 7, errStale},                      // signed no later than a forgotten one: cannot be told from a replay
		{now + 2, now, 1, nil},                       // a new payload
		{now + 30*sec, now + 80*sec, 5, errReplayed}, // remembered while fresh
		{now + 30*sec, now + 100*sec, 5, errStale},   // then too old: refused by age, forgotten
		{now + 190*sec, now + 200*sec, 8, nil},
	} {
		err := g.admit(tc.ts, mac(tc.mac), tc.now)
		if !errors.Is(err, tc.want) && (err != nil || tc.want != nil) {
			t.Errorf("step %d: %v, want %v", i, err, tc.want)
		}
	}
	if len(g.seen) > 3 || len(g.ring)-g.head > 3 {
		t.Errorf("remembers %d payloads, at most 3", len(g.seen))
	}
}
