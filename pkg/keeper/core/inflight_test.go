package core

import (
	"errors"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
)

// TestCompletionInFlightHoldsTheRow: a lease whose completion is being written (BeginCompleting)
// outlives its expiry: the row is not handed out, the lease can be neither released nor completed
// again (ErrCompletionInFlight), and an extension is kept for later. Once the write is applied
// (ApplyCompleted) the lease ends with the new version held; once it is abandoned
// (AbortCompleting: not written) a lease whose time passed ends at once and the row is claimable
// again, and one still live stands under its expiry.
func TestCompletionInFlightHoldsTheRow(t *testing.T) {
	c := newCore(t, policy.Config{UrgentMaxShare: 0.2})
	c.Apply(t0, row("a", t0.Add(-time.Hour), time.Hour, 1))
	c.Apply(t0, row("b", t0.Add(-time.Hour), time.Hour, 2))
	got := c.Claim(t0, 2, time.Minute)
	if len(got) != 2 {
		t.Fatalf("claimed %v", keysOf(got))
	}
	a := got[0]
	if a.Key != "a" {
		a = got[1]
	}
	// a's completion is accepted 1 ms before its lease ends, and its write takes 2 minutes
	cpA, held, err := c.BeginCompleting(t0.Add(time.Minute-time.Millisecond), "a", a.Lease)
	if err != nil || !held || cpA.ClaimedRev != 1 {
		t.Fatalf("begin completing a: %+v held %v, %v", cpA, held, err)
	}
	late := t0.Add(3 * time.Minute)
	if got := c.Claim(late, 10, time.Minute); keysOf(got) != "b" {
		t.Fatalf("while a's completion is written, after its lease's end: claimed %q, want b only", keysOf(got))
	}
	if err := c.Release(late, "a", a.Lease); !errors.Is(err, ErrCompletionInFlight) {
		t.Fatalf("releasing a during its completion: %v, want ErrCompletionInFlight", err)
	}
	if _, _, err := c.BeginCompleting(late, "a", a.Lease); !errors.Is(err, ErrCompletionInFlight) {
		t.Fatalf("completing a again during its completion: %v, want ErrCompletionInFlight", err)
	}
	if _, _, err := c.Completing(late, "a", a.Lease); !errors.Is(err, ErrCompletionInFlight) {
		t.Fatalf("Completing a during its completion: %v, want ErrCompletionInFlight", err)
	}
	if got := c.Summary(late).Leased; got != 2 {
		t.Fatalf("leased during the write: %d, want 2 (a, and b claimed again)", got)
	}
	// the write lands: the new version is held and the lease has ended
	next := row("a", t0.Add(time.Hour), time.Hour, 3)
	if o := c.ApplyCompleted(late, next, a.Lease, cpA.Hint); o.Result != Held {
		t.Fatalf("apply completed: %+v", o)
	}
	if err := c.CheckLease(late, "a", a.Lease); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("a's lease after its completion: %v, want ErrLeaseLost", err)
	}
	if got := c.Claim(t0.Add(2*time.Hour), 10, time.Minute); keysOf(got) != "a,b" && keysOf(got) != "b,a" {
		t.Fatalf("a (due again at t0+1h) and b (lease lapsed) at t0+2h: claimed %q", keysOf(got))
	}

	// a write that fails after the lease's end: the row is claimable at once
	c2 := newCore(t, policy.Config{UrgentMaxShare: 0.2})
	c2.Apply(t0, row("x", t0.Add(-time.Hour), time.Hour, 1))
	x := c2.Claim(t0, 1, time.Minute)[0]
	cpX, _, err := c2.BeginCompleting(t0.Add(30*time.Second), "x", x.Lease)
	if err != nil {
		t.Fatal(err)
	}
	// extended meanwhile: kept for when the write fails
	if exp, err := c2.Extend(t0.Add(40*time.Second), "x", x.Lease, 2*time.Minute); err != nil || !exp.Equal(t0.Add(160*time.Second)) {
		t.Fatalf("extending during the write: %v %v", exp, err)
	}
	if got := c2.Claim(t0.Add(5*time.Minute), 1, time.Minute); len(got) != 0 {
		t.Fatalf("claimed %q while its completion is written", keysOf(got))
	}
	if err := c2.AbortCompleting(t0.Add(5*time.Minute), "x", x.Lease, cpX.Hint); err != nil {
		t.Fatal(err)
	}
	if err := c2.CheckLease(t0.Add(5*time.Minute), "x", x.Lease); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("x's lapsed lease after the failed write: %v, want ErrLeaseLost", err)
	}
	if got := c2.Claim(t0.Add(5*time.Minute), 1, time.Minute); keysOf(got) != "x" {
		t.Fatalf("after the failed write: claimed %q, want x", keysOf(got))
	}

}

// TestAbortCompletingKeepsALiveLease: a write that fails before the lease's end leaves the lease
// as it was: current until its (possibly extended) expiry, released or completed again by its
// worker; a row gone meanwhile (a delete's event) makes AbortCompleting report ErrNotHeld.
func TestAbortCompletingKeepsALiveLease(t *testing.T) {
	c := newCore(t, policy.Config{UrgentMaxShare: 0.2})
	c.Apply(t0, row("x", t0.Add(-time.Hour), time.Hour, 1))
	c.Apply(t0, row("y", t0.Add(-time.Hour), time.Hour, 2))
	got := c.Claim(t0, 2, time.Minute)
	x := got[0]
	if x.Key != "x" {
		x = got[1]
	}
	cp, _, err := c.BeginCompleting(t0.Add(10*time.Second), "x", x.Lease)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Extend(t0.Add(20*time.Second), "x", x.Lease, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.AbortCompleting(t0.Add(30*time.Second), "x", x.Lease, cp.Hint); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckLease(t0.Add(4*time.Minute), "x", x.Lease); err != nil {
		t.Fatalf("x's extended lease after the failed write: %v", err)
	}
	if got := c.Claim(t0.Add(4*time.Minute), 10, time.Minute); keysOf(got) != "y" {
		t.Fatalf("claimed %q, want y only (x leased until t0+5m20s)", keysOf(got))
	}
	if err := c.CheckLease(t0.Add(6*time.Minute), "x", x.Lease); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("x's lease after its extended expiry: %v, want ErrLeaseLost", err)
	}
	// a completion in flight whose row is deleted meanwhile (a producer's delete, its event
	// applied): the lease went with the row
	ly := c.Claim(t0.Add(6*time.Minute), 10, time.Minute) // both lapsed: y at t0+5m, x at t0+5m20s
	if keysOf(ly) != "x,y" {
		t.Fatalf("claimed %q at t0+6m, want x,y", keysOf(ly))
	}
	cp, _, err = c.BeginCompleting(t0.Add(6*time.Minute), "y", ly[1].Lease)
	if err != nil {
		t.Fatal(err)
	}
	yr := row("y", t0, time.Hour, 9)
	c.Delete(t0.Add(6*time.Minute), "y", yr.Slot(), 9)
	if err := c.AbortCompleting(t0.Add(6*time.Minute), "y", ly[1].Lease, cp.Hint); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("aborting the completion of a deleted row: %v, want ErrNotHeld", err)
	}
	if got := c.Summary(t0.Add(6 * time.Minute)).Leased; got != 1 {
		t.Fatalf("leased after y's delete: %d, want 1 (x)", got)
	}
}
