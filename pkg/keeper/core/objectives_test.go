package core

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"pgregory.net/rapid"
)

// objRefLease is one lease of a key in the reference: granted at since, ended at end
// (math.MaxInt64 while it lasts), completed when it ended in a written completion.
type objRefLease struct {
	token      uint64
	rev        int64 // the version it was granted on
	since, end int64
	expires    int64
	completed  bool
	removed    bool // ended with its row (a delete)
	// startSeq and endSeq order its grant and end among the versions' starts and ends (endSeq
	// math.MaxInt64 while it lasts)
	startSeq, endSeq int64
}

// objRefVersion is one due time of one key: [start, end) in ms.
type objRefVersion struct {
	key        string
	rev, due   int64
	start, end int64
	// startSeq and endSeq order its start and end among the leases' ends (endSeq math.MaxInt64
	// while it lasts)
	startSeq, endSeq int64
}

// objRef decides the events of the versions from the whole history, by the definition
// (objectives.go), with X = due + maxLateness: good when a render started before X completed (a
// completion at or before X, or the completion of the lease active at X); late when no render
// had started before X (no lease granted before X active then), or when the lease active at X
// ended without a completion while the version lasted; not counted when the version ended before
// X, when X is after the end of the run or at or before fromMs (when counting began), or when the
// version ended while the lease active at X still ran.
func objRef(versions []objRefVersion, leases map[string][]*objRefLease, maxMs, fromMs, endMs int64) (good, late uint64) {
	for _, v := range versions {
		x := v.due + maxMs
		if x <= fromMs {
			continue // before counting began
		}
		var done bool
		for _, l := range leases[v.key] {
			if l.completed && l.rev == v.rev && l.since < x && l.end <= x && l.endSeq > v.startSeq && l.endSeq <= v.endSeq {
				good++ // completed by X
				done = true
			}
		}
		if done || v.end < x || x > endMs {
			continue
		}
		var atX *objRefLease // the render in progress at X
		for _, l := range leases[v.key] {
			if l.since < x && x <= l.end && x < l.expires && l.endSeq > v.startSeq && l.startSeq < v.endSeq {
				atX = l
			}
		}
		switch {
		case atX == nil:
			late++
		case atX.completed && atX.rev == v.rev && atX.endSeq <= v.endSeq:
			good++
		case atX.removed:
			// the row went while it was being rendered
		case atX.endSeq < v.endSeq:
			late++ // ended without completing while the version lasted
		}
	}
	return good, late
}

// TestObjectivesAgainstReference drives a core with one objective through writes, claims,
// completions, releases, expiries, deletes and catch-ups at random times, and compares its good and
// late counts with objRef's decisions over the recorded history.
func TestObjectivesAgainstReference(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		const maxL = 10 * time.Minute
		c, err := New(policy.Config{SubmittedBoost: 1, UrgentMaxShare: 0.2})
		if err != nil {
			rt.Fatal(err)
		}
		for _, s := range testSlots {
			c.SetSlot(s, SlotOwned)
		}
		now := base
		if err := c.SetObjectives(now, []policy.Objective{{Name: "all", MaxLateness: maxL}}); err != nil {
			rt.Fatal(err)
		}
		ms := func() int64 { return now.UnixMilli() }
		type keyState struct {
			rev, due int64
			exists   bool
			lease    *objRefLease // the current lease, nil when none
		}
		keys := map[string]*keyState{}
		var versions []objRefVersion
		leases := map[string][]*objRefLease{}
		var seq int64
		endVersion := func(k string) {
			v := &versions[len(versions)-1-indexFromEnd(versions, k)]
			seq++
			v.end, v.endSeq = ms(), seq
		}
		startVersion := func(k string, rev, due int64) {
			seq++
			versions = append(versions, objRefVersion{key: k, rev: rev, due: due, start: ms(), end: math.MaxInt64, startSeq: seq, endSeq: math.MaxInt64})
		}
		endLease := func(st *objRefLease, at int64) {
			seq++
			st.end, st.endSeq = at, seq
		}
		expire := func() {
			for _, st := range keys {
				if st.lease != nil && st.lease.expires <= ms() {
					endLease(st.lease, st.lease.expires)
					st.lease = nil
				}
			}
		}
		away := map[int]bool{} // slots given away (their writes are not the shard's)
		for step := range rapid.IntRange(1, 60).Draw(rt, "steps") {
			now = now.Add(time.Duration(rapid.IntRange(0, 8*60).Draw(rt, "advanceSec")) * time.Second)
			k := fmt.Sprintf("k%d", rapid.IntRange(0, 5).Draw(rt, "key"))
			switch op := rapid.IntRange(0, 8).Draw(rt, "op"); op {
			case 7: // k's slot leaves (its rows and leases end with it), or comes back
				sl := slotOfKey(k)
				if away[sl] {
					c.SetSlot(sl, SlotOwned)
					away[sl] = false
					continue
				}
				// as the shard does, the crossings up to now are decided first (the core does not
				// know when the slots change: TestObjectivesWhenSlotsLeave)
				for !c.ObjectivesCatchUp(now, rapid.IntRange(1, 10).Draw(rt, "maxRows")) {
				}
				c.expireLeases(ms())
				expire()
				c.SetSlot(sl, SlotNone)
				away[sl] = true
				for key, st := range keys {
					if slotOfKey(key) != sl || !st.exists {
						continue
					}
					if st.lease != nil {
						st.lease.removed = true
						endLease(st.lease, ms())
						st.lease = nil
					}
					endVersion(key)
					st.exists = false
				}
			case 8: // the service removes the departed rows in steps
				c.Drain(rapid.IntRange(0, 2).Draw(rt, "drainRows"))
			case 0, 1: // a producer's write: due within ±30 minutes
				if away[slotOfKey(k)] {
					continue
				}
				c.expireLeases(ms()) // the keeper's clock: leases that ran out end first
				expire()
				st := keys[k]
				if st == nil {
					st = &keyState{}
					keys[k] = st
				}
				due := ms() + int64(rapid.IntRange(-30, 30).Draw(rt, "dueMin"))*60_000
				if st.exists && st.due == due {
					continue
				}
				if st.exists {
					endVersion(k)
				}
				st.rev++
				st.due, st.exists = due, true
				c.Apply(now, schedule.Row{Key: k, KeyHash: testHash(k), Due: time.UnixMilli(due).UTC(), HasDue: true,
					Cadence: time.Hour, Route: "r", Rev: st.rev})
				startVersion(k, st.rev, due)
			case 2: // a claim
				leaseFor := time.Duration(rapid.IntRange(1, 20).Draw(rt, "leaseMin")) * time.Minute
				expire()
				for _, cl := range c.Claim(now, rapid.IntRange(1, 3).Draw(rt, "n"), leaseFor) {
					st := keys[cl.Key]
					if st.lease != nil {
						rt.Fatalf("step %d: %s claimed while leased", step, cl.Key)
					}
					seq++
					st.lease = &objRefLease{token: cl.Lease, rev: st.rev, since: ms(), end: math.MaxInt64, startSeq: seq, endSeq: math.MaxInt64, expires: cl.LeaseExpires.UnixMilli()}
					leases[cl.Key] = append(leases[cl.Key], st.lease)
				}
			case 3: // a completion of a leased key, written: the next due an hour on
				st := keys[k]
				if st == nil || st.lease == nil {
					continue
				}
				cp, _, err := c.BeginCompleting(now, k, st.lease.token)
				expire()
				if err != nil {
					continue // expired meanwhile
				}
				if st.lease.rev != st.rev {
					// written over another version: the store refuses it (the row changed since
					// the claim), and the row stays as it is
					c.ApplyRefused(now, schedule.Row{Key: k, KeyHash: testHash(k), Due: time.UnixMilli(st.due).UTC(), HasDue: true,
						Cadence: time.Hour, Route: "r", Rev: st.rev}, st.lease.token, cp.Hint)
					endLease(st.lease, ms())
					st.lease = nil
					continue
				}
				st.rev++
				next := ms() + time.Hour.Milliseconds()
				c.ApplyCompleted(now, schedule.Row{Key: k, KeyHash: testHash(k), Due: time.UnixMilli(next).UTC(), HasDue: true,
					Cadence: time.Hour, Route: "r", Rev: st.rev}, st.lease.token, cp.Hint)
				st.lease.completed = true
				endLease(st.lease, ms())
				st.lease = nil
				endVersion(k)
				st.due = next
				startVersion(k, st.rev, next)
			case 4: // a release
				st := keys[k]
				if st == nil || st.lease == nil {
					continue
				}
				if err := c.Release(now, k, st.lease.token); err == nil {
					endLease(st.lease, ms())
					st.lease = nil
				}
				expire()
			case 5: // a delete
				st := keys[k]
				if st == nil || !st.exists {
					continue
				}
				c.expireLeases(ms())
				expire()
				st.rev++
				c.Delete(now, k, slotOfKey(k), st.rev)
				if st.lease != nil {
					st.lease.removed = true
					endLease(st.lease, ms())
					st.lease = nil
				}
				endVersion(k)
				st.exists = false
			case 6: // the shard's catch-up, in small steps or whole
				for !c.ObjectivesCatchUp(now, rapid.IntRange(1, 10).Draw(rt, "maxRows")) {
				}
			}
		}
		// the end: every lease runs out, every crossing up to the end is visited
		now = now.Add(time.Hour)
		c.expireLeases(ms())
		expire()
		for !c.ObjectivesCatchUp(now, 1000) {
		}
		wantGood, wantLate := objRef(versions, leases, maxL.Milliseconds(), base.UnixMilli(), ms())
		got := c.ObjectiveCounts()[0]
		if got.Good != wantGood || got.Late != wantLate {
			rt.Fatalf("good %d late %d, want good %d late %d (%d versions: %+v, base %d)", got.Good, got.Late, wantGood, wantLate, len(versions), versions, base.UnixMilli())
		}
	})
}

// indexFromEnd returns how far from the end of versions the last version of key k is.
func indexFromEnd(versions []objRefVersion, k string) int {
	for i := len(versions) - 1; i >= 0; i-- {
		if versions[i].key == k {
			return len(versions) - 1 - i
		}
	}
	panic("no version of " + k)
}

// TestObjectivesWhenSlotsLeave: the core is not told when slots change, so a slot that leaves
// ends its rows' versions at its last operation's time (the shard decides the crossings up to now
// first, TestObjectivesAgainstReference): one whose X had passed by then, not visited yet and not
// being rendered, is decided late, as a delete would decide it; one being rendered since before X,
// or whose X is still ahead, is not decided; and the departed rows left for Drain are never
// decided afterwards.
func TestObjectivesWhenSlotsLeave(t *testing.T) {
	c := newCore(t, policy.Config{SubmittedBoost: 1})
	if err := c.SetObjectives(t0, []policy.Objective{{Name: "all", MaxLateness: 10 * time.Minute}}); err != nil {
		t.Fatal(err)
	}
	// k0, k4 and k8 live in slot 0, k1 in slot 1
	c.Apply(t0, row("k4", t0, time.Hour, 1))                     // X = t0+10m, rendered from t0+2m
	c.Apply(t0, row("k0", t0.Add(time.Minute), time.Hour, 1))    // X = t0+11m: passed, not rendered
	c.Apply(t0, row("k8", t0.Add(30*time.Minute), time.Hour, 1)) // X ahead
	c.Apply(t0, row("k1", t0.Add(time.Minute), time.Hour, 1))    // stays
	if got := c.Claim(t0.Add(2*time.Minute), 1, time.Hour); len(got) != 1 || got[0].Key != "k4" {
		t.Fatalf("claimed %v, want k4", claimedKeys(got))
	}
	c.Apply(t0.Add(12*time.Minute), row("k1", t0.Add(time.Minute), time.Hour, 2)) // the last operation
	c.SetSlot(testSlots[0], SlotNone)
	if got := c.ObjectiveCounts()[0]; got.Good != 0 || got.Late != 1 {
		t.Fatalf("after slot 0 left: good %d late %d, want 0 and 1 (k0)", got.Good, got.Late)
	}
	if !c.Draining() {
		t.Fatal("no departed rows left to drain")
	}
	for !c.ObjectivesCatchUp(t0.Add(time.Hour), 1) {
	}
	if got := c.ObjectiveCounts()[0]; got.Good != 0 || got.Late != 2 {
		t.Fatalf("after the catch-up: good %d late %d, want 0 and 2 (k0, k1; not the departed rows)", got.Good, got.Late)
	}
	if err := checkCore(c); err != nil {
		t.Fatal(err)
	}
}
