package core

import (
	"bytes"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/duetree"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/rowstore"
)

// The held rows are kept in the groups' trees (package duetree), all in one forest; this file
// is what the trees read of the records.

// record ids fit the trees' entries
const _ uint = duetree.IDBits - rowstore.IDBits

// makeEntry returns held record id's entry in its tree.
func makeEntry(id uint32, r *rowstore.Rec) duetree.Entry {
	return duetree.NewEntry(id, r.Due(), r.Has(flagLeased))
}

// cmpDueKey is the one tie-break of the core: held records a and b in due order, equal dues by
// key (bytes). It orders the trees, and so claims of equal score, the oldest row and everything
// else the core reports first.
func (c *Core) cmpDueKey(a, b uint32) int {
	ra, rb := c.rows.At(a), c.rows.At(b)
	if da, db := ra.Due(), rb.Due(); da != db {
		if da < db {
			return -1
		}
		return 1
	}
	return bytes.Compare(c.rows.Key(ra), c.rows.Key(rb))
}

// treeRecords is the core as its trees see it (duetree.Records).
type treeRecords Core

func (tr *treeRecords) DueMs(id uint32) int64 { return tr.rows.At(id).Due() }

func (tr *treeRecords) Compare(a, b uint32) int { return (*Core)(tr).cmpDueKey(a, b) }

// Pending: a record waits for tree t while it is held, marked pending and belongs in t.
func (tr *treeRecords) Pending(t *duetree.Tree, id uint32) (duetree.Entry, bool) {
	c := (*Core)(tr)
	r := c.rows.At(id)
	if !r.Has(rowstore.Held) || !r.Has(flagPending) || c.treeOf(r) != t {
		return 0, false
	}
	return makeEntry(id, r), true
}

func (tr *treeRecords) Built(id uint32) { tr.rows.At(id).Clear(flagPending) }
