package core

import (
	"bytes"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/duetree"
)

// The held rows are kept in the groups' trees (package duetree), all in one forest; this file
// is what the trees read of the records.

// makeEntry returns held record id's entry in its tree.
func makeEntry(id uint32, r *rec) duetree.Entry {
	return duetree.NewEntry(id, r.due(), r.has(flagLeased))
}

// cmpDueKey is the one tie-break of the core: held records a and b in due order, equal dues by
// key (bytes). It orders the trees, and so claims of equal score, the oldest row and everything
// else the core reports first.
func (c *Core) cmpDueKey(a, b uint32) int {
	ra, rb := c.rows.at(a), c.rows.at(b)
	if da, db := ra.due(), rb.due(); da != db {
		if da < db {
			return -1
		}
		return 1
	}
	return bytes.Compare(c.keys.get(ra.keyOff), c.keys.get(rb.keyOff))
}

// treeRecords is the core as its trees see it (duetree.Records).
type treeRecords Core

func (tr *treeRecords) DueMs(id uint32) int64 { return tr.rows.at(id).due() }

func (tr *treeRecords) Compare(a, b uint32) int { return (*Core)(tr).cmpDueKey(a, b) }

// Pending: a record waits for tree t while it is held, marked pending and belongs in t.
func (tr *treeRecords) Pending(t *duetree.Tree, id uint32) (duetree.Entry, bool) {
	c := (*Core)(tr)
	r := c.rows.at(id)
	if !r.has(flagHeld) || !r.has(flagPending) || c.treeOf(r) != t {
		return 0, false
	}
	return makeEntry(id, r), true
}

func (tr *treeRecords) Built(id uint32) { tr.rows.at(id).clear(flagPending) }
