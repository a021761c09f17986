package lease

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// expire returns the ids whose leases Expire ends at nowMs, in order.
func expire(t *Table, nowMs int64) []uint32 {
	var ids []uint32
	t.Expire(nowMs, func(id uint32) {
		if t.Leased(id) {
			panic("Expire calls fn before the lease has ended")
		}
		ids = append(ids, id)
	})
	return ids
}

// TestTable checks tokens, current leases and expiry through extensions, ends and new leases of
// the same records: only a lease's current expiry ends it.
func TestTable(t *testing.T) {
	tb := NewTable(41)
	if tok := tb.Grant(1, 7, 1, 100); tok != 42 {
		t.Fatalf("first token %d, want 42", tok)
	}
	tok2 := tb.Grant(2, 8, 1, 200)
	tok3 := tb.Grant(3, 9, 1, 300)
	if tok2 != 43 || tok3 != 44 || tb.Len() != 3 {
		t.Fatalf("tokens %d, %d; %d leases", tok2, tok3, tb.Len())
	}
	if !tb.Current(1, 42) || tb.Current(1, 43) || tb.Current(4, 42) || !tb.Leased(2) || tb.Leased(4) {
		t.Fatal("Current or Leased is wrong")
	}
	tb.Extend(1, 42, 250) // later: its first expiry entry is skipped
	tb.Extend(3, tok3, 150)
	tb.End(2)
	tok5 := tb.Grant(2, 10, 1, 120) // a new lease of record 2: the old one's expiry is not its own
	if rev, ok := tb.Rev(1, 42); rev != 7 || !ok {
		t.Fatalf("extended lease: rev %d (current %v), want 7", rev, ok)
	}
	if rev, ok := tb.Rev(2, tok5); rev != 10 || !ok {
		t.Fatalf("new lease of record 2: rev %d (current %v), want 10", rev, ok)
	}
	if rev, ok := tb.Rev(2, tok2); rev != 0 || ok {
		t.Fatalf("ended lease of record 2: rev %d (current %v), want none", rev, ok)
	}
	if got := expire(tb, 99); len(got) != 0 {
		t.Fatalf("expired at 99: %v", got)
	}
	if got := expire(tb, 200); !slices.Equal(got, []uint32{2, 3}) {
		t.Fatalf("expired at 200: %v, want [2 3]", got)
	}
	if tb.Current(2, tok5) || !tb.Current(1, 42) || tb.Len() != 1 {
		t.Fatalf("after 200: record 2 current %v, record 1 current %v, %d leases", tb.Current(2, tok5), tb.Current(1, 42), tb.Len())
	}
	if got := expire(tb, 1000); !slices.Equal(got, []uint32{1}) || tb.Len() != 0 {
		t.Fatalf("expired at 1000: %v, %d leases left", got, tb.Len())
	}
	if tok := tb.Grant(1, 11, 1, 2000); tok != tok5+1 {
		t.Fatalf("token %d after %d", tok, tok5)
	}
}

// TestTableMatchesReference runs random grants, extensions, ends and expiries on a table and on
// a plain map, and checks after each step that both hold the same leases with the same revs, that
// Expire ends the same ones in the order of their expiry, and that the heap holds exactly the
// leases in flight.
func TestTableMatchesReference(t *testing.T) {
	type ref struct {
		token   uint64
		expires int64
		rev     int64
	}
	rng := rand.New(rand.NewPCG(1, 2))
	tb := NewTable(0)
	want := map[uint32]ref{}
	now := int64(0)
	for step := range 200_000 {
		id := uint32(rng.IntN(300))
		switch op := rng.IntN(10); {
		case op < 4: // a claim of a record not leased
			if _, ok := want[id]; !ok {
				exp, rev := now+int64(rng.IntN(50)), rng.Int64()
				want[id] = ref{tb.Grant(id, rev, 1, exp), exp, rev}
			}
		case op < 5: // an extension of a current lease
			if r, ok := want[id]; ok {
				exp := now + int64(rng.IntN(50))
				tb.Extend(id, r.token, exp)
				want[id] = ref{r.token, exp, r.rev}
			}
		case op < 8: // a completion or release
			tb.End(id)
			delete(want, id)
		default: // time passes
			now += int64(rng.IntN(5))
			var wantIDs []uint32
			for id, r := range want {
				if r.expires <= now {
					wantIDs = append(wantIDs, id)
				}
			}
			got := expire(tb, now)
			for i := 1; i < len(got); i++ {
				if want[got[i-1]].expires > want[got[i]].expires {
					t.Fatalf("step %d: Expire out of order: %v", step, got)
				}
			}
			slices.Sort(got)
			slices.Sort(wantIDs)
			if !slices.Equal(got, wantIDs) {
				t.Fatalf("step %d: expired %v, want %v", step, got, wantIDs)
			}
			for _, id := range wantIDs {
				delete(want, id)
			}
		}
		if tb.Len() != len(want) || len(tb.heap) != len(want) || len(tb.slab)-len(tb.free) != len(want) {
			t.Fatalf("step %d: %d leases, heap %d, slab %d in use; want %d", step, tb.Len(), len(tb.heap), len(tb.slab)-len(tb.free), len(want))
		}
		for id, r := range want {
			if !tb.Current(id, r.token) || tb.Current(id, r.token+1) {
				t.Fatalf("step %d: lease of %d (token %d) not current", step, id, r.token)
			}
			if rev, _ := tb.Rev(id, r.token); rev != r.rev {
				t.Fatalf("step %d: lease of %d has rev %d, want %d", step, id, rev, r.rev)
			}
		}
	}
}

// TestEndedLeasesLeaveTheTable: a million leases granted and ended, at most 100 in flight, leave
// a table sized for 100, not for a million.
func TestEndedLeasesLeaveTheTable(t *testing.T) {
	tb := NewTable(0)
	for i := range 1_000_000 {
		tb.Grant(uint32(i), int64(i), 1, int64(60_000+i))
		if i >= 100 {
			tb.End(uint32(i - 100))
		}
	}
	if tb.Len() != 100 || len(tb.heap) != 100 || len(tb.slab) > 101 || cap(tb.heap) > 256 {
		t.Fatalf("%d leases: heap %d (cap %d), slab %d", tb.Len(), len(tb.heap), cap(tb.heap), len(tb.slab))
	}
}

// TestPin: a pinned lease leaves the expiry order (it outlives its expiry, and the leases around
// it expire in order), keeps an extension, ends like any other, and when unpinned expires at once
// if its time has passed. Pin and Unpin refuse a token that is not current, and pinning twice.
func TestPin(t *testing.T) {
	tb := NewTable(0)
	t1 := tb.Grant(1, 1, 1, 100)
	t2 := tb.Grant(2, 2, 1, 200)
	t3 := tb.Grant(3, 3, 1, 300)
	if tb.Pin(2, t1) || !tb.Pin(2, t2) || tb.Pin(2, t2) || !tb.Pinned(2) || tb.Pinned(1) {
		t.Fatal("Pin or Pinned is wrong")
	}
	if got := expire(tb, 250); !slices.Equal(got, []uint32{1}) || !tb.Current(2, t2) {
		t.Fatalf("expired at 250 with 2 pinned: %v (2 current %v)", got, tb.Current(2, t2))
	}
	tb.Extend(2, t2, 400) // kept for the unpin
	if tb.Unpin(2, t3) || !tb.Unpin(2, t2) || tb.Unpin(2, t2) || tb.Pinned(2) {
		t.Fatal("Unpin is wrong")
	}
	if got := expire(tb, 350); !slices.Equal(got, []uint32{3}) {
		t.Fatalf("expired at 350: %v, want [3] (2 extended to 400)", got)
	}
	if got := expire(tb, 400); !slices.Equal(got, []uint32{2}) || tb.Len() != 0 {
		t.Fatalf("expired at 400: %v, %d left", got, tb.Len())
	}
	// a pinned lease past its expiry ends when unpinned; one that ends while pinned leaves no trace
	t4, t5 := tb.Grant(4, 4, 1, 10), tb.Grant(5, 5, 1, 20)
	tb.Pin(4, t4)
	tb.Pin(5, t5)
	tb.End(5)
	if tb.Len() != 1 || len(tb.heap) != 0 {
		t.Fatalf("after ending pinned 5: %d leases, heap %v", tb.Len(), tb.heap)
	}
	if got := expire(tb, 1000); len(got) != 0 {
		t.Fatalf("pinned lease expired: %v", got)
	}
	tb.Unpin(4, t4)
	if got := expire(tb, 1000); !slices.Equal(got, []uint32{4}) || tb.Len() != 0 || len(tb.slab) != len(tb.free) {
		t.Fatalf("unpinned past its expiry: %v, %d left, slab %d free %d", got, tb.Len(), len(tb.slab), len(tb.free))
	}
}

// TestHoldsAndPut: a hold is current for no token (not even 0), cannot be pinned, expires like a
// lease and is counted; Put takes a lease over with its token and replaces a hold.
func TestHoldsAndPut(t *testing.T) {
	tb := NewTable(10)
	tb.Hold(1, 100)
	if tb.Current(1, 0) || tb.Pin(1, 0) || !tb.IsHold(1) || tb.Holds() != 1 || !tb.Leased(1) {
		t.Fatalf("hold: current %v pinned %v isHold %v holds %d", tb.Current(1, 0), tb.Pinned(1), tb.IsHold(1), tb.Holds())
	}
	tb.Put(1, 777, 5, 200)
	if rev, ok := tb.Rev(1, 777); !ok || rev != 5 || tb.IsHold(1) || tb.Holds() != 0 {
		t.Fatalf("put over a hold: rev %d %v, isHold %v, holds %d", rev, ok, tb.IsHold(1), tb.Holds())
	}
	if exp, ok := tb.Expires(1); !ok || exp != 200 {
		t.Fatalf("expires %d %v", exp, ok)
	}
	tb.Hold(2, 50)
	var expired []uint32
	tb.Expire(150, func(id uint32) { expired = append(expired, id) })
	if len(expired) != 1 || expired[0] != 2 || tb.Holds() != 0 || tb.Len() != 1 {
		t.Fatalf("expired %v, holds %d, len %d", expired, tb.Holds(), tb.Len())
	}
	if got := tb.Grant(3, 1, 1, 300); got != 11 {
		t.Fatalf("Put moved the token sequence: granted %d, want 11", got)
	}
}

// TestGetSince: a granted lease knows when it was granted, through extensions; a lease taken over
// (Put) and a hold do not, and a record without a lease has none.
func TestGetSince(t *testing.T) {
	tb := NewTable(0)
	tok := tb.Grant(1, 1, 500, 1000)
	tb.Extend(1, tok, 5000)
	if l, ok := tb.Get(1); !ok || l.Since != 500 || l.Token != tok || l.Expires != 5000 || l.Rev != 1 || l.Hold || l.Pinned {
		t.Errorf("granted at 500 and extended: %+v, %v", l, ok)
	}
	tb.Put(2, 77, 3, 900)
	tb.Hold(3, 900)
	for _, id := range []uint32{2, 3} {
		if l, ok := tb.Get(id); !ok || l.Since != 0 {
			t.Errorf("record %d: %+v, %v, want a lease without Since", id, l, ok)
		}
	}
	if l, ok := tb.Get(4); ok {
		t.Errorf("record 4 has no lease: %+v", l)
	}
	tb.Put(1, tok, 1, 6000) // taken over again: no longer this table's grant
	if l, _ := tb.Get(1); l.Since != 0 {
		t.Error("a lease replaced by Put still reports when it was granted")
	}
}
