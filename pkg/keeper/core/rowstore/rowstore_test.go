package rowstore

import (
	"fmt"
	"strings"
	"testing"
)

// TestReserveSizesIndex checks that Reserve sizes the index for a load of that many rows (no
// rebuild on the way) and that rebuilding it as it grows keeps every key findable.
func TestReserveSizesIndex(t *testing.T) {
	s := New()
	s.Reserve(5000)
	size, _ := s.IndexSize()
	if size*3 < 5000*4 {
		t.Fatalf("reserved %d slots for 5000 keys", size)
	}
	for i := range 5000 {
		s.Add(fmt.Sprintf("k%d", i))
	}
	if got, _ := s.IndexSize(); got != size {
		t.Fatalf("the index grew from %d to %d slots within its reservation", size, got)
	}
	for i := 5000; i < 20000; i++ { // past the reservation: rebuilt from the records as it grows
		s.Add(fmt.Sprintf("k%d", i))
	}
	if got, _ := s.IndexSize(); s.index.n != 20000 || got == size {
		t.Fatalf("index holds %d keys in %d slots", s.index.n, got)
	}
	for i := range 20000 {
		k := fmt.Sprintf("k%d", i)
		if id, ok := s.Find(k); !ok || string(s.Key(s.At(id))) != k {
			t.Fatalf("%s not found after the index grew", k)
		}
	}
	s.Reserve(10) // never shrinks
	if got, _ := s.IndexSize(); s.index.n != 20000 || got < size {
		t.Fatal("Reserve changed the index")
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestArenaCompactionKeepsKeys churns well over a MiB of keys through the arena so it compacts,
// then checks that every remaining key is still found by its exact key, with its record.
func TestArenaCompactionKeepsKeys(t *testing.T) {
	s := New()
	long := strings.Repeat("p", 1000)
	key := func(round, i int) string {
		return long + string(rune('a'+round)) + strings.Repeat("z", i%7) + string(rune('A'+i%26)) + string(rune('0'+i%10)) + strings.Repeat("q", i/260)
	}
	for round := range 6 {
		for i := range 800 {
			id := s.Add(key(round, i))
			s.At(id).Rev = int64(round*1000 + i)
			if round > 0 {
				old, ok := s.Find(key(round-1, i))
				if !ok {
					t.Fatalf("round %d: key %d of the round before not found", round, i)
				}
				s.Remove(old)
			}
		}
	}
	if s.Len() != 800 {
		t.Fatalf("%d records held, want 800", s.Len())
	}
	for i := range 800 {
		k := key(5, i)
		id, ok := s.Find(k)
		if !ok {
			t.Fatalf("key %.20s... not found", k[1000:])
		}
		if r := s.At(id); string(s.Key(r)) != k || r.Rev != int64(5000+i) {
			t.Fatalf("key %.20s...: record holds key %.20s..., rev %d", k[1000:], s.Key(r)[1000:], r.Rev)
		}
	}
	if s.keys.garbage > s.keys.live+compactAt {
		t.Fatalf("arena never compacted: live %d garbage %d", s.keys.live, s.keys.garbage)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestRecordFlagsAndDue checks that the due time and the flags share their bits without
// disturbing each other, and that a removed record comes back cleared.
func TestRecordFlagsAndDue(t *testing.T) {
	s := New()
	id := s.Add("k")
	r := s.At(id)
	if !r.Has(Held) || r.Due() != 0 {
		t.Fatalf("new record: held %v, due %d", r.Has(Held), r.Due())
	}
	last := UserFlag << (UserFlags - 1)
	r.Set(UserFlag)
	r.Set(last)
	const due = 4_294_967_295_999 // the last millisecond of 32-bit seconds
	r.SetDue(due)
	if r.Due() != due || !r.Has(UserFlag) || !r.Has(last) || !r.Has(Held) || r.Has(UserFlag<<1) {
		t.Fatalf("due %d, flags %016b", r.Due(), r.msFlags)
	}
	r.Clear(UserFlag)
	r.SetDue(1_000)
	if r.Due() != 1_000 || r.Has(UserFlag) || !r.Has(last) {
		t.Fatalf("due %d, flags %016b", r.Due(), r.msFlags)
	}
	s.Remove(id)
	if id2 := s.Add("k2"); id2 != id || s.At(id2).Has(last) || s.At(id2).Due() != 0 {
		t.Fatalf("reused record %d (removed %d): flags %016b, due %d", id2, id, s.At(id2).msFlags, s.At(id2).Due())
	}
}

// TestFindFrom checks that FindFrom answers as Find for every guess: the key's record, a record
// of another key, a freed record (also one reused by another key), and ids past every record.
func TestFindFrom(t *testing.T) {
	s := New()
	for i := range 100 {
		s.Add(fmt.Sprintf("k%d", i))
	}
	a, _ := s.Find("k7")
	b, _ := s.Find("k8")
	s.Remove(b)
	c := s.Add("new") // reuses b's record
	for _, tc := range []struct {
		key   string
		guess uint32
	}{
		{"k7", a},          // the key's record
		{"k7", c},          // another key's record
		{"k8", b},          // the record the key left (now another key's)
		{"k8", a},          // a key no longer held, guessed at a held record
		{"new", c},         // the reused record, right
		{"k9", 1 << 20},    // past the records
		{"k9", ^uint32(0)}, // the largest id
	} {
		wantID, wantOK := s.Find(tc.key)
		gotID, gotOK := s.FindFrom(tc.key, tc.guess)
		if gotOK != wantOK || (wantOK && gotID != wantID) {
			t.Errorf("FindFrom(%q, %d) = %d, %v; Find = %d, %v", tc.key, tc.guess, gotID, gotOK, wantID, wantOK)
		}
	}
	s.Remove(c)
	if _, ok := s.FindFrom("new", c); ok {
		t.Error("FindFrom found a removed key at its freed record")
	}
}

// TestPrefetchChangesNothing reads ahead keys held, removed, never held and empty, and records
// held, freed and beyond the store's (PrefetchRecords, PrefetchRemove), more than one pass's
// worth, in an empty store, a populated one and one emptied again, and checks that the store is
// as it was: every lookup the same, the invariants intact.
func TestPrefetchChangesNothing(t *testing.T) {
	s := New()
	keys := []string{"", "k0", "k1", "k50", "gone", "never", strings.Repeat("x", 300)}
	for i := range 300 { // more than one pass of Prefetch, held and not
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	var ids []uint32
	for i := range 300 {
		ids = append(ids, uint32(i))
	}
	ids = append(ids, recChunkSize-1, recChunkSize, 1<<31, ^uint32(0))
	check := func(stage string) {
		t.Helper()
		type found struct {
			id uint32
			ok bool
		}
		before := map[string]found{}
		for _, k := range keys {
			id, ok := s.Find(k)
			before[k] = found{id, ok}
		}
		n := s.Len()
		s.Prefetch(len(keys), func(i int) string { return keys[i] })
		s.PrefetchRecords(len(ids), func(i int) uint32 { return ids[i] })
		s.PrefetchRemove(len(ids), func(i int) uint32 { return ids[i] })
		if s.Len() != n {
			t.Errorf("%s: Len %d after Prefetch, was %d", stage, s.Len(), n)
		}
		for _, k := range keys {
			if id, ok := s.Find(k); (found{id, ok}) != before[k] {
				t.Errorf("%s: Find(%q) = %d, %v after Prefetch, was %+v", stage, k, id, ok, before[k])
			}
		}
		if err := s.Check(); err != nil {
			t.Errorf("%s: %v", stage, err)
		}
	}
	check("empty")
	for i := range 100 {
		s.Add(fmt.Sprintf("k%d", i))
	}
	s.Add(strings.Repeat("x", 300))
	gone := s.Add("gone")
	s.Remove(gone)
	check("populated")
	s.Each(func(id uint32, _ *Rec) { s.Remove(id) })
	check("emptied")
}
