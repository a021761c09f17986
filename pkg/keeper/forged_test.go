package keeper

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/changes"
)

// forgedEntry is a change event entry in the trigger's format for row r.
func forgedEntry(r schedule.Row) string {
	flags := 0
	if r.Urgent {
		flags |= 2
	}
	return fmt.Sprintf("%d,%d,%d,%d,%d,%d:%s%d:%s", r.Rev, r.KeyHash, r.Due.UnixMicro(), r.Cadence.Milliseconds(), flags,
		len(r.Key), r.Key, len(r.Route), r.Route)
}

// TestForgedEventsChangeNothing: a role that can connect sends change events on a slot group's channel
// that would hide a real due row (a newer rev due far ahead) and put a row that does not exist,
// urgent, first in line — unsigned, and signed with a key of its own. The shard applies none of
// them: it holds and serves what it did, turns inexact (a gap) and asks for a walk, after which it
// is exact again; a real write after them is applied from its event, with no gap.
func TestForgedEventsChangeNothing(t *testing.T) {
	e := newShardEnv(t, allSlots(24*time.Hour))
	real := e.upsert(srow("https://example.com/real", t0.Add(-time.Hour), time.Hour))[0]
	e.sh.Walk(e.ctx, true)
	if st := e.status(); !st.Exact || st.Due != 1 {
		t.Fatalf("after load: exact %v due %d", st.Exact, st.Due)
	}

	hide := real
	hide.Rev += 1000
	hide.Due = t0.Add(1000 * time.Hour)
	fake := srow("https://example.com/fake", t0.Add(-10*time.Hour), time.Minute)
	fake.Urgent, fake.Rev, fake.KeyHash = true, hide.Rev+1, real.KeyHash
	body := forgedEntry(hide) + forgedEntry(fake)
	ch := changes.GroupChannel(changes.GroupOf(real.Slot())) // rq_slots_<slot/16>
	otherKey := make([]byte, 64)
	_, _ = rand.Read(otherKey)
	ts := strconv.FormatInt(time.Now().UnixMicro(), 10)
	m := hmac.New(sha256.New, otherKey)
	m.Write([]byte(ch + "," + ts + "," + body))
	payloads := []string{
		"1" + body, // the unsigned format every keeper accepted before
		"2" + ts + "," + hex.EncodeToString(m.Sum(nil)) + "," + body,
	}
	for i, p := range payloads {
		if _, err := e.st.Pool().Exec(e.ctx, `SELECT pg_notify($1, $2)`, ch, p); err != nil {
			t.Fatal(err)
		}
		e.pumpUntil(fmt.Sprintf("forgery %d", i), func() bool {
			e.sh.mu.Lock()
			defer e.sh.mu.Unlock()
			gap, lasting := e.sh.cov.LastGap()
			return gap.Seq == i+1 && !lasting
		})
		st := e.status()
		if st.Exact || st.Complete || st.Gap == nil {
			t.Fatalf("forgery %d: exact %v complete %v gap %+v", i, st.Exact, st.Complete, st.Gap)
		}
		if st.Rows.Held != 1 || st.Due != 1 || st.Oldest == nil || !st.Oldest.Due.Equal(real.Due) {
			t.Fatalf("forgery %d changed what the shard holds: held %d due %d oldest %+v", i, st.Rows.Held, st.Due, st.Oldest)
		}
		e.sh.mu.Lock()
		walk := e.sh.fullWanted
		e.sh.mu.Unlock()
		select {
		case <-e.sh.wake:
		default:
			walk = false
		}
		if !walk {
			t.Fatalf("forgery %d: no full walk requested", i)
		}
	}
	claimed, err := e.sh.Claim(e.clock.Now(), 10, time.Minute)
	if err != nil || len(claimed) != 1 || claimed[0].Key != real.Key || claimed[0].Rev != real.Rev {
		t.Fatalf("claim after the forgeries: %+v %v", claimed, err)
	}
	if rep := e.sh.Walk(e.ctx, true); rep.Failed || rep.Counts.Repaired != 0 {
		t.Fatalf("walk after the forgeries: %+v", rep)
	}
	if st := e.status(); !st.Exact {
		t.Fatalf("not exact after the walk: %+v", st.Gap)
	}

	// a real write still flows as an event, with no gap
	later := e.upsert(srow("https://example.com/later", t0.Add(-2*time.Hour), time.Hour))[0]
	e.pumpUntil("the real write", func() bool { return e.status().Rows.Held == 2 })
	e.sh.mu.Lock()
	gap, _ := e.sh.cov.LastGap()
	seq := gap.Seq
	e.sh.mu.Unlock()
	if st := e.status(); !st.Exact || seq != len(payloads) || st.Oldest == nil || !st.Oldest.Due.Equal(later.Due) {
		t.Fatalf("after a real write: exact %v gaps %d oldest %+v", st.Exact, seq, st.Oldest)
	}
}
