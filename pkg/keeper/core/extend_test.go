package core

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
)

func TestCoreExtend(t *testing.T) {
	c := newCore(t, policy.Config{UrgentMaxShare: 0.2})
	c.Apply(t0, row("a", t0.Add(-time.Hour), time.Hour, 1))
	c.Apply(t0, row("b", t0.Add(-time.Hour), time.Hour, 2))
	got := c.Claim(t0, 2, time.Minute)
	if len(got) != 2 {
		t.Fatalf("claimed %v", keysOf(got))
	}
	a, b := got[0], got[1]
	if a.Key != "a" {
		a, b = b, a
	}

	// the current lease is extended: it outlives its first expiry (whose heap entry still pops)
	exp, err := c.Extend(t0.Add(50*time.Second), a.Key, a.Lease, 2*time.Minute)
	if err != nil || !exp.Equal(t0.Add(170*time.Second)) {
		t.Fatalf("extend: %v %v", exp, err)
	}
	if err := c.CheckLease(t0.Add(90*time.Second), a.Key, a.Lease); err != nil {
		t.Fatalf("extended lease ended at its first expiry: %v", err)
	}
	if got := c.Claim(t0.Add(90*time.Second), 10, time.Minute); keysOf(got) != "b" {
		t.Fatalf("after b's lease lapsed, claimed %q, want b only (a is still leased)", keysOf(got))
	}
	// ... and lapses at the new expiry
	if err := c.CheckLease(t0.Add(170*time.Second), a.Key, a.Lease); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("at the new expiry: %v, want ErrLeaseLost", err)
	}

	// a stale lease is refused and changes nothing: b's first lease lapsed and b was claimed again
	if _, err := c.Extend(t0.Add(100*time.Second), b.Key, b.Lease, time.Hour); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("extending a lapsed lease: %v, want ErrLeaseLost", err)
	}
	if _, err := c.Extend(t0, "nope", a.Lease, time.Hour); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("extending an unknown key: %v, want ErrNotHeld", err)
	}
	// a released lease cannot be extended
	again := c.Claim(t0.Add(200*time.Second), 1, time.Minute)
	if len(again) != 1 || again[0].Key != "a" {
		t.Fatalf("claim a again: %v", keysOf(again))
	}
	if err := c.Release(t0.Add(201*time.Second), "a", again[0].Lease); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Extend(t0.Add(202*time.Second), "a", again[0].Lease, time.Hour); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("extending a released lease: %v, want ErrLeaseLost", err)
	}

	// shortening: the row is handed out again at the shorter expiry
	short := c.Claim(t0.Add(300*time.Second), 1, time.Hour)
	if len(short) != 1 {
		t.Fatal("no row to claim")
	}
	if _, err := c.Extend(t0.Add(300*time.Second), short[0].Key, short[0].Lease, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := c.Claim(t0.Add(309*time.Second), 1, time.Minute); len(got) != 0 && got[0].Key == short[0].Key {
		t.Fatalf("claimed %s before its shortened lease lapsed", got[0].Key)
	}
	if got := c.Claim(t0.Add(311*time.Second), 5, time.Minute); !strings.Contains(keysOf(got), short[0].Key) {
		t.Fatalf("after the shortened lease lapsed, claimed %q, want %s among them", keysOf(got), short[0].Key)
	}
}
