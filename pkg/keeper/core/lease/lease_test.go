package lease

import (
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
	if tok := tb.Grant(1, 100); tok != 42 {
		t.Fatalf("first token %d, want 42", tok)
	}
	tok2 := tb.Grant(2, 200)
	tok3 := tb.Grant(3, 300)
	if tok2 != 43 || tok3 != 44 || tb.Len() != 3 {
		t.Fatalf("tokens %d, %d; %d leases", tok2, tok3, tb.Len())
	}
	if !tb.Current(1, 42) || tb.Current(1, 43) || tb.Current(4, 42) || !tb.Leased(2) || tb.Leased(4) {
		t.Fatal("Current or Leased is wrong")
	}
	tb.Extend(1, 42, 250) // later: its first expiry entry is skipped
	tb.Extend(3, tok3, 150)
	tb.End(2)
	tok5 := tb.Grant(2, 120) // a new lease of record 2: the old one's expiry is not its own
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
	if tok := tb.Grant(1, 2000); tok != tok5+1 {
		t.Fatalf("token %d after %d", tok, tok5)
	}
}
