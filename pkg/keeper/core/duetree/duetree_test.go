package duetree

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// t0Ms is the tests' now: 2026-11-29 12:00 UTC in ms since the Unix epoch.
const t0Ms = 1796040000000

// testRecords is a model of the records a forest's entries name. Its tie-break of equal due
// times is the id, highest first.
type testRecords struct {
	recs []*testRec // by id; nil: no such record
}

type testRec struct {
	due     int64
	leased  bool
	tree    *Tree // the tree the record belongs in; nil when it is in none
	pending bool  // its entry waits in its tree's pending list
}

func newTestRecords(n int) *testRecords { return &testRecords{recs: make([]*testRec, n)} }

func (m *testRecords) DueMs(id uint32) int64 { return m.recs[id].due }

func (m *testRecords) Compare(a, b uint32) int {
	if c := cmp.Compare(m.recs[a].due, m.recs[b].due); c != 0 {
		return c
	}
	return cmp.Compare(b, a)
}

func (m *testRecords) Pending(t *Tree, id uint32) (Entry, bool) {
	r := m.recs[id]
	if r == nil || !r.pending || r.tree != t {
		return 0, false
	}
	return NewEntry(id, r.due, r.leased), true
}

func (m *testRecords) Built(id uint32) { m.recs[id].pending = false }

// entry returns record id's entry as it is now.
func (m *testRecords) entry(id uint32) Entry { r := m.recs[id]; return NewEntry(id, r.due, r.leased) }

// want returns the ids of the records in t, in order.
func (m *testRecords) want(t *Tree) []uint32 {
	var ids []uint32
	for id, r := range m.recs {
		if r != nil && r.tree == t {
			ids = append(ids, uint32(id))
		}
	}
	slices.SortFunc(ids, m.Compare)
	return ids
}

// checkAgainst checks t's structure and that it holds exactly the records the model puts in it,
// in order, with their leased bits, and that Head is the first claimable one.
func checkAgainst(f *Forest, m *testRecords, t *Tree) ([]Entry, error) {
	f.Flush(t)
	got, err := f.Check(t)
	if err != nil {
		return nil, err
	}
	want := m.want(t)
	if len(got) != len(want) {
		return nil, fmt.Errorf("tree holds %d entries, the model %d", len(got), len(want))
	}
	var head Entry
	headOK := false
	for i, e := range got {
		if e != m.entry(want[i]) {
			return nil, fmt.Errorf("entry %d is %x (record %d), want %x (record %d)", i, uint64(e), e.ID(), uint64(m.entry(want[i])), want[i])
		}
		if !headOK && !e.Leased() {
			head, headOK = e, true
		}
	}
	if h, ok := f.Head(t); h != head || ok != headOK {
		return nil, fmt.Errorf("head %x %v, want %x %v", uint64(h), ok, uint64(head), headOK)
	}
	if n := f.Len(t); n != len(want) {
		return nil, fmt.Errorf("Len %d, want %d", n, len(want))
	}
	return got, nil
}

// TestTreeOrderStatistics drives a tree through random inserts, deletions and lease changes
// (claims of the first claimable entries, half of them released again) large enough to split and
// merge nodes at several levels, and checks its structure, rank, select and head against a sorted
// slice after every batch.
func TestTreeOrderStatistics(t *testing.T) {
	m := newTestRecords(30000)
	f := NewForest(m)
	tr := &Tree{}
	rng := rand.New(rand.NewPCG(7, 8))
	now := int64(t0Ms)
	maxHeight := 0
	for round := range 40 {
		for range 2000 {
			id := uint32(rng.IntN(30000))
			r := m.recs[id]
			if r != nil && rng.IntN(3) == 0 {
				f.Delete(tr, m.entry(id))
				m.recs[id] = nil
				continue
			}
			if r != nil {
				f.Delete(tr, m.entry(id))
			} else {
				r = &testRec{tree: tr}
				m.recs[id] = r
			}
			// due within ±10 minutes on a 250 ms grid: many ties within one second
			r.due = now + int64(rng.IntN(4800)-2400)*250
			f.Insert(tr, m.entry(id))
		}
		if round%3 == 0 {
			for i := range 500 { // claim the first 500 due claimable entries, release every other one
				e, ok := f.Head(tr)
				if !ok || m.recs[e.ID()].due > now {
					break
				}
				f.LeaseHead(tr)
				m.recs[e.ID()].leased = true
				if i%2 == 0 {
					f.SetLeased(tr, m.entry(e.ID()), false)
					m.recs[e.ID()].leased = false
				}
			}
		}
		entries, err := checkAgainst(f, m, tr)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for _, q := range []int64{-1, 0, 1, 999, 1000, 1250, 300_000, -300_000} {
			tMs := now + q
			want := 0
			for _, e := range entries {
				if m.recs[e.ID()].due <= tMs {
					want++
				}
			}
			if got := f.Rank(tr, tMs); got != want {
				t.Fatalf("round %d: rank(now%+dms) = %d, want %d", round, q, got, want)
			}
		}
		points := []int64{-300_000, -1, 0, 0, 1, 999, 1000, 1250, 300_000, 600_000}
		for i := range points {
			points[i] += now
		}
		ranks := make([]int, len(points))
		f.Ranks(tr, points, ranks)
		for i, tMs := range points {
			if want := f.Rank(tr, tMs); ranks[i] != want {
				t.Fatalf("round %d: Ranks at now%+dms = %d, Rank %d", round, tMs-now, ranks[i], want)
			}
		}
		for _, k := range []int{0, len(entries) / 3, len(entries) - 1} {
			if got := f.Select(tr, k); got.ID() != entries[k].ID() {
				t.Fatalf("round %d: select(%d) = record %d, want %d", round, k, got.ID(), entries[k].ID())
			}
		}
		for _, k := range []int{0, 1, len(entries) / 3, len(entries) / 2, len(entries) - 1, len(entries)} {
			// the prefix before entries[k] (all of them at len(entries)), asked by comparison
			in := func(e Entry) bool { return k == len(entries) || f.Compare(e, entries[k]) < 0 }
			want := 0
			for _, e := range entries[:k] {
				if !m.recs[e.ID()].leased {
					want++
				}
			}
			if n, c := f.Prefix(tr, in); n != k || c != want {
				t.Fatalf("round %d: Prefix before entry %d = %d entries, %d claimable; want %d, %d", round, k, n, c, k, want)
			}
		}
		if first, _ := f.First(tr); first.ID() != entries[0].ID() {
			t.Fatalf("round %d: first is record %d, want %d", round, first.ID(), entries[0].ID())
		}
		lo, hi := len(entries)/4, len(entries)/2
		var visited []Entry
		f.Visit(tr, lo, hi, func(e Entry) { visited = append(visited, e) })
		if !slices.Equal(visited, entries[lo:hi]) {
			t.Fatalf("round %d: Visit(%d, %d) = %d entries, not the tree's", round, lo, hi, len(visited))
		}
		maxHeight = max(maxHeight, tr.Height())
	}
	if maxHeight < 2 {
		t.Fatalf("the tree reached height %d: the test does not exercise inner-node splits and merges", maxHeight)
	}
}

// TestBulkBuild adds entries in bulk to two trees that already hold entries, with everything that
// can happen while they wait: records moved to another due time and back (a stale entry and a
// second one of the same step), to a later step (a stale entry), to the other tree, deleted, and
// leased; then the trees are built and checked against the model.
func TestBulkBuild(t *testing.T) {
	m := newTestRecords(9000)
	f := NewForest(m)
	a, b := &Tree{}, &Tree{}
	rng := rand.New(rand.NewPCG(1, 2))
	now := int64(t0Ms)
	due := func() int64 { return now + int64(rng.IntN(600_000)-300_000) }
	for id := range uint32(3000) { // built one by one
		tr := a
		if id%4 == 0 {
			tr = b
		}
		m.recs[id] = &testRec{due: due(), tree: tr}
		f.Insert(tr, m.entry(id))
	}
	add := func(id uint32, tr *Tree) {
		r := m.recs[id]
		r.tree, r.pending = tr, true
		f.AddPending(tr, m.entry(id))
	}
	remove := func(id uint32) { // out of its tree: a pending entry is left to go stale
		r := m.recs[id]
		if r.pending {
			r.pending = false
		} else {
			f.Delete(r.tree, m.entry(id))
		}
		r.tree = nil
	}
	for id := uint32(3000); id < 9000; id++ {
		tr := a
		if id%3 == 0 {
			tr = b
		}
		m.recs[id] = &testRec{due: due()}
		add(id, tr)
	}
	for id := uint32(0); id < 9000; id += 7 { // away and back to the same due, in the same tree
		r := m.recs[id]
		tr, d := r.tree, r.due
		remove(id)
		r.due = d + 3_600_000
		add(id, tr)
		remove(id)
		r.due = d
		add(id, tr)
	}
	for id := uint32(1); id < 9000; id += 11 { // to a later step
		r := m.recs[id]
		tr := r.tree
		remove(id)
		r.due += 1000
		add(id, tr)
	}
	for id := uint32(2); id < 9000; id += 13 { // to the other tree
		other := a
		if m.recs[id].tree == a {
			other = b
		}
		remove(id)
		add(id, other)
	}
	for id := uint32(3); id < 9000; id += 17 { // deleted
		remove(id)
		m.recs[id] = nil
	}
	for id := uint32(5); id < 9000; id += 19 { // leased while pending (SetLeased would build the tree)
		if r := m.recs[id]; r != nil && r.pending {
			r.leased = true
		}
	}
	if a.PendingLen() == 0 || b.PendingLen() == 0 {
		t.Fatal("nothing pending")
	}
	for _, tr := range []*Tree{a, b} {
		pending := map[uint32]bool{}
		for _, e := range f.Pending(tr) {
			if e != m.entry(e.ID()) || !m.recs[e.ID()].pending || m.recs[e.ID()].tree != tr {
				t.Fatalf("Pending lists %x, not a pending entry of the tree", uint64(e))
			}
			pending[e.ID()] = true
		}
		for id, r := range m.recs {
			if r != nil && r.pending && r.tree == tr && !pending[uint32(id)] {
				t.Fatalf("record %d waits for its tree, Pending does not list it", id)
			}
		}
		if _, err := checkAgainst(f, m, tr); err != nil {
			t.Fatal(err)
		}
		if tr.PendingLen() != 0 {
			t.Fatalf("%d pending entries left after the build", tr.PendingLen())
		}
	}
	for id, r := range m.recs {
		if r != nil && r.pending {
			t.Fatalf("record %d still pending after the build", id)
		}
	}
}

// TestFlushFewPending: a tree of 20,000 built entries takes small bulk batches (as a load's rows
// come in between two statuses, each of which reads the tree), with stale and moved entries among
// them; every Flush inserts the batch one by one (it is under 1/flushInsertRatio of the tree) and
// the tree must match the model after each, and after a last batch large enough to be merged.
func TestFlushFewPending(t *testing.T) {
	const built, batch, batches = 20_000, 300, 20
	m := newTestRecords(built + batch*batches + 5_000)
	f := NewForest(m)
	tr := &Tree{}
	rng := rand.New(rand.NewPCG(7, 8))
	due := func() int64 { return t0Ms + int64(rng.IntN(600_000)) }
	for id := range uint32(built) {
		m.recs[id] = &testRec{due: due(), leased: rng.IntN(5) == 0, tree: tr}
		f.Insert(tr, m.entry(id))
	}
	add := func(id uint32) {
		r := m.recs[id]
		r.tree, r.pending = tr, true
		f.AddPending(tr, m.entry(id))
	}
	next := uint32(built)
	for round := range batches + 1 {
		n := batch
		if round == batches {
			n = 5_000 // over 1/flushInsertRatio of the tree: merged and rebuilt
		}
		first := next
		for range n {
			m.recs[next] = &testRec{due: due(), leased: rng.IntN(5) == 0}
			add(next)
			next++
		}
		for id := first; id < next; id += 9 { // moved while pending: its first entry goes stale
			r := m.recs[id]
			r.pending = false
			r.due += 1000
			add(id)
		}
		for id := first + 4; id < next; id += 23 { // deleted while pending: a stale entry
			m.recs[id].pending, m.recs[id].tree = false, nil
			m.recs[id] = nil
		}
		if round < batches && tr.PendingLen()*flushInsertRatio >= tr.n {
			t.Fatalf("round %d: %d pending beside %d: not the few that are inserted one by one", round, tr.PendingLen(), tr.n)
		}
		if _, err := checkAgainst(f, m, tr); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if tr.PendingLen() != 0 {
			t.Fatalf("round %d: %d pending entries left after Flush", round, tr.PendingLen())
		}
	}
}

// addRandom puts record id into tr: due within ten minutes of t0Ms, leased one time in five,
// pending (added in bulk) one time in three.
func addRandom(f *Forest, m *testRecords, tr *Tree, id uint32, rng *rand.Rand) {
	m.recs[id] = &testRec{due: t0Ms + int64(rng.IntN(600_000)), leased: rng.IntN(5) == 0, tree: tr}
	if rng.IntN(3) == 0 {
		m.recs[id].pending = true
		f.AddPending(tr, m.entry(id))
		return
	}
	f.Insert(tr, m.entry(id))
}

// TestAbsorb: a tree absorbs another (both holding entries, leased ones among them, and pending
// ones; one of them empty; both empty): dst holds every entry of both in order, src none, and
// both stay usable.
func TestAbsorb(t *testing.T) {
	for _, sizes := range [][2]int{{3000, 5000}, {0, 4000}, {4000, 0}, {0, 0}, {1, 1}} {
		t.Run(fmt.Sprintf("%d+%d", sizes[0], sizes[1]), func(t *testing.T) {
			m := newTestRecords(sizes[0] + sizes[1] + 10)
			f := NewForest(m)
			dst, src := &Tree{}, &Tree{}
			rng := rand.New(rand.NewPCG(3, uint64(sizes[0])))
			id := uint32(0)
			for k, tr := range []*Tree{dst, src} {
				for range sizes[k] {
					addRandom(f, m, tr, id, rng)
					id++
				}
			}
			f.Absorb(dst, src)
			for _, r := range m.recs {
				if r != nil {
					r.tree = dst
				}
			}
			if _, err := checkAgainst(f, m, dst); err != nil {
				t.Fatal(err)
			}
			if _, err := checkAgainst(f, m, src); err != nil {
				t.Fatal(err)
			}
			// both usable afterwards
			m.recs[id] = &testRec{due: t0Ms, tree: src}
			f.Insert(src, m.entry(id))
			m.recs[id+1] = &testRec{due: t0Ms + 1, tree: dst}
			f.Insert(dst, m.entry(id+1))
			for _, tr := range []*Tree{dst, src} {
				if _, err := checkAgainst(f, m, tr); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestSortEntriesMatchesCompare: sortEntries orders lists long and short, spread over years or
// crowded into a few steps (ties broken by the records), leased or not, as a sort by Compare does.
func TestSortEntriesMatchesCompare(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, tc := range []struct {
		n      int   // entries
		spanMs int64 // their due times spread over [t0Ms, t0Ms+spanMs)
	}{
		{10, 1000}, {5000, 16}, {5000, 1000}, {100_000, 96 * 3600 * 1000}, {100_000, 40 * 365 * 24 * 3600 * 1000}, {20_000, 0},
	} {
		m := newTestRecords(tc.n)
		f := NewForest(m)
		es := make([]Entry, tc.n)
		for i := range es {
			due := int64(t0Ms)
			if tc.spanMs > 0 {
				due += rng.Int64N(tc.spanMs)
			}
			m.recs[i] = &testRec{due: due, leased: rng.IntN(3) == 0}
			es[i] = m.entry(uint32(i))
		}
		want := slices.Clone(es)
		slices.SortFunc(want, f.Compare)
		f.sortEntries(es)
		if !slices.Equal(es, want) {
			t.Fatalf("%d entries over %d ms: sortEntries differs from a sort by Compare", tc.n, tc.spanMs)
		}
	}
}
