package duetree

import "fmt"

// Check verifies t's structure — nodes not empty, inner counts and separators exact, entries in
// order, the cached head the first claimable entry — and returns its entries in order (pending
// ones not included). It visits every entry: for tests.
func (f *Forest) Check(t *Tree) ([]Entry, error) {
	if t.n == 0 {
		if t.clm != 0 {
			return nil, fmt.Errorf("empty tree with %d claimable", t.clm)
		}
		return nil, nil
	}
	var out []Entry
	var walk func(node uint32, h int) (cnt, clm uint32, first Entry, err error)
	walk = func(node uint32, h int) (uint32, uint32, Entry, error) {
		if h == 0 {
			l := f.pool.leaf(node)
			if l.n == 0 {
				return 0, 0, 0, fmt.Errorf("empty leaf %d", node)
			}
			var clm uint32
			for _, e := range l.e[:l.n] {
				out = append(out, e)
				clm += claimable(e)
			}
			return uint32(l.n), clm, l.e[0], nil
		}
		in := f.pool.inner(node)
		if in.n == 0 {
			return 0, 0, 0, fmt.Errorf("empty inner node %d", node)
		}
		var cnt, clm uint32
		for i := range int(in.n) {
			n, m, first, err := walk(in.child[i], h-1)
			if err != nil {
				return 0, 0, 0, err
			}
			if n != in.cnt[i] || m != in.clm[i] {
				return 0, 0, 0, fmt.Errorf("inner %d child %d: counts %d/%d, subtree %d/%d", node, i, in.cnt[i], in.clm[i], n, m)
			}
			if first.ID() != in.sep[i].ID() {
				return 0, 0, 0, fmt.Errorf("inner %d child %d: separator names record %d, first entry %d", node, i, in.sep[i].ID(), first.ID())
			}
			cnt += n
			clm += m
		}
		return cnt, clm, in.sep[0], nil
	}
	cnt, clm, _, err := walk(t.root, t.height)
	if err != nil {
		return nil, err
	}
	if int(cnt) != t.n || int(clm) != t.clm {
		return nil, fmt.Errorf("tree counts %d/%d, nodes %d/%d", t.n, t.clm, cnt, clm)
	}
	for i := 1; i < len(out); i++ {
		if f.Compare(out[i-1], out[i]) >= 0 {
			return nil, fmt.Errorf("entries %d and %d out of order", i-1, i)
		}
	}
	if t.headOK {
		var first Entry
		for _, e := range out {
			if !e.Leased() {
				first = e
				break
			}
		}
		if t.head != first {
			return nil, fmt.Errorf("cached head %x, first claimable %x", t.head, first)
		}
	}
	return out, nil
}

// Height returns the number of inner levels of t above its leaves (0 when empty).
func (t *Tree) Height() int {
	if t.n == 0 {
		return 0
	}
	return t.height
}
