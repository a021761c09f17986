package keeper

import (
	"fmt"
	"strings"
	"testing"
)

// TestClaimKeys: the strings claimKeys hands out keep their bytes while the buffer fills and is
// replaced under them.
func TestClaimKeys(t *testing.T) {
	keys := claimKeys{b: make([]byte, 0, 8)} // far too small: replaced many times
	var want, got []string
	for i := range 200 {
		k := fmt.Sprintf("%s%d", strings.Repeat("k", i%50), i)
		want = append(want, k)
		got = append(got, keys.add([]byte(k)))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("key %d is %q, want %q", i, got[i], want[i])
		}
	}
}

// TestClaimBuffers: a claim's buffers have room for its rows and, after a claim, for keys a
// little longer than the last claim's.
func TestClaimBuffers(t *testing.T) {
	s := &Shard{}
	rows, keys := s.claimBuffers(10)
	if len(rows) != 0 || cap(rows) != 10 || len(keys.b) != 0 || cap(keys.b) < 10*defaultClaimKeyBytes {
		t.Fatalf("claimBuffers(10) = rows len %d cap %d, keys len %d cap %d", len(rows), cap(rows), len(keys.b), cap(keys.b))
	}
	s.noteClaimed(10, 10, 10*192) // 192 key bytes a row, 200 with the margin
	if _, keys := s.claimBuffers(10); cap(keys.b) < 2000 {
		t.Fatalf("with 200 key bytes a row, claimBuffers(10) has key room %d, want 2000", cap(keys.b))
	}
}

// TestClaimRoom: a claim makes room for all it asks (up to maxClaimRoom) while claims get what
// they ask for, and for twice what the last one got (at least minClaimRoom) after one got less.
func TestClaimRoom(t *testing.T) {
	s := &Shard{}
	for _, step := range []struct {
		lastAsked, lastGot int // the last claim (0 asked: none yet)
		n, want            int // the room a claim of n makes
	}{
		{0, 0, 500, 500},            // no claim yet: all
		{0, 0, 5000, maxClaimRoom},  // never more than maxClaimRoom
		{500, 500, 500, 500},        // it got all it asked
		{500, 0, 500, minClaimRoom}, // nothing due: little room
		{500, 100, 500, 200},        // some: twice that
		{500, 100, 150, 150},        // never more than asked
		{100, 100, 500, 500},        // the queue filled again
	} {
		s.noteClaimed(step.lastAsked, step.lastGot, 64*step.lastGot)
		if got := s.claimRoom(step.n); got != step.want {
			t.Errorf("after a claim of %d that got %d: claimRoom(%d) = %d, want %d", step.lastAsked, step.lastGot, step.n, got, step.want)
		}
	}
}
