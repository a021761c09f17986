package core

import (
	"encoding/binary"
	"hash/maphash"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/duetree"
)

// This file holds the memory layout of the held rows: fixed-size records in chunks, keys in a
// byte arena, and an open-addressing index from key to record. Together with the claim trees
// (package duetree) they cost about 24 (record) + key length + 1 (length prefix) + ~7 (index) +
// ~11 (tree) bytes per row, with no per-row heap object for the garbage collector to trace.

const (
	recChunkBits = 12
	recChunkSize = 1 << recChunkBits // records per chunk
	arenaChunk   = 1 << 20           // bytes per key arena chunk
)

// Record flags, kept in the high bits of rec.msFlags.
const (
	flagHeld   uint16 = 1 << (10 + iota) // the record holds a row (otherwise it is on the free list)
	flagLeased                           // the row is leased to a worker
	flagUrgent                           // the row is urgent
	// flagSeen is the walk mark: a row of slot s counts as seen by the running walk when this
	// bit equals Core.parity[s] (see walk.go), so starting a walk unmarks a slot's rows at once.
	flagSeen
	// flagPending: the row's entry waits in its tree's pending list (bulk mode,
	// duetree.Forest.AddPending).
	flagPending
	msMask = 1<<10 - 1
)

// rec is one held row (24 bytes). Its cadence and source live in its group.
type rec struct {
	rev     int64  // revision of the row as held
	dueSec  uint32 // due time: seconds since the Unix epoch (until 2106) ...
	keyOff  uint32 // offset of the key's length-prefixed bytes in the arena
	msFlags uint16 // ... plus these low 10 bits of milliseconds; the high bits are flags
	route   uint16 // index into Core.routes
	group   uint16 // index into Core.groups
	slot    uint16
}

// due returns the due time in ms since the Unix epoch.
func (r *rec) due() int64 { return int64(r.dueSec)*1000 + int64(r.msFlags&msMask) }

// setDue sets the due time (ms in [0, schedule.MaxDueMs)), keeping the flags.
func (r *rec) setDue(ms int64) {
	r.dueSec = uint32(ms / 1000)
	r.msFlags = r.msFlags&^msMask | uint16(ms%1000)
}

func (r *rec) has(f uint16) bool { return r.msFlags&f != 0 }
func (r *rec) set(f uint16)      { r.msFlags |= f }
func (r *rec) clear(f uint16)    { r.msFlags &^= f }

// rows is chunked record storage with a free list; ids are stable while a row is held.
type rows struct {
	chunks [][]rec
	free   []uint32
	n      int // records in use
}

func (r *rows) at(id uint32) *rec {
	return &r.chunks[id>>recChunkBits][id&(recChunkSize-1)]
}

func (r *rows) alloc() uint32 {
	r.n++
	if k := len(r.free); k > 0 {
		id := r.free[k-1]
		r.free = r.free[:k-1]
		return id
	}
	// no free record: add a chunk, hand out its first record and free the rest, highest first
	// so that ids are handed out in ascending order.
	base := uint32(len(r.chunks)) * recChunkSize
	r.chunks = append(r.chunks, make([]rec, recChunkSize))
	for i := uint32(recChunkSize - 1); i >= 1; i-- {
		r.free = append(r.free, base+i)
	}
	return base
}

func (r *rows) release(id uint32) {
	*r.at(id) = rec{}
	r.free = append(r.free, id)
	r.n--
}

// arena stores keys as uvarint length + bytes, in chunks; freed keys become garbage reclaimed by
// compaction.
type arena struct {
	chunks  [][]byte
	live    int // bytes of keys in use
	garbage int // bytes of freed keys
}

func (a *arena) put(key string) uint32 {
	need := binary.MaxVarintLen16 + len(key)
	if len(a.chunks) == 0 || len(a.chunks[len(a.chunks)-1])+need > arenaChunk {
		a.chunks = append(a.chunks, make([]byte, 0, arenaChunk))
	}
	ci := len(a.chunks) - 1
	c := a.chunks[ci]
	off := uint32(ci)*arenaChunk + uint32(len(c))
	c = binary.AppendUvarint(c, uint64(len(key)))
	c = append(c, key...)
	a.live += len(c) - len(a.chunks[ci])
	a.chunks[ci] = c
	return off
}

func (a *arena) get(off uint32) []byte {
	c := a.chunks[off/arenaChunk]
	i := off % arenaChunk
	n, w := binary.Uvarint(c[i:])
	return c[i+uint32(w) : i+uint32(w)+uint32(n)]
}

func (a *arena) free(off uint32) {
	k := a.get(off)
	size := len(k) + uvarintLen(len(k))
	a.live -= size
	a.garbage += size
}

func uvarintLen(n int) int {
	l := 1
	for n >= 0x80 {
		n >>= 7
		l++
	}
	return l
}

// index maps keys to record ids: open addressing, linear probing, backward-shift deletion. An
// entry holds a 7-bit fingerprint of the key's hash above id+1 (0 is empty), so probing past
// other keys reads only the index; only a fingerprint match reads the record and its key. The
// key hash is this process's own (maphash), unrelated to the ownership hash of the database.
type index struct {
	seed    maphash.Seed
	slots   []uint32
	n       int
	resizes int // rebuilds so far
}

const (
	// idBits is the width of record ids: the trees' entries hold them in as many bits.
	idBits = duetree.IDBits
	idMask = 1<<idBits - 1
	// MaxRows is the most rows one core can hold: record ids (below MaxRows plus one chunk) must
	// fit beside the fingerprint here and beside the due time in the claim trees' entries.
	MaxRows = 1<<idBits - recChunkSize
)

func entry(h uint64, id uint32) uint32 { return uint32(h>>(64-(32-idBits)))<<idBits | (id + 1) }

func (ix *index) mask() uint64 { return uint64(len(ix.slots) - 1) }

// find returns the record id holding key, or false.
func (ix *index) find(rs *rows, ar *arena, key string) (uint32, bool) {
	if ix.n == 0 {
		return 0, false
	}
	m := ix.mask()
	h := maphash.String(ix.seed, key)
	fp := entry(h, 0) &^ idMask
	for i := h & m; ; i = (i + 1) & m {
		s := ix.slots[i]
		if s == 0 {
			return 0, false
		}
		if s&^idMask == fp {
			id := s&idMask - 1
			if string(ar.get(rs.at(id).keyOff)) == key {
				return id, true
			}
		}
	}
}

// insert adds id under key; key must not be present, and id must be below MaxRows.
func (ix *index) insert(rs *rows, ar *arena, key string, id uint32) {
	if (ix.n+1)*4 > len(ix.slots)*3 {
		ix.resize(rs, ar, ix.n+1, id) // id's record is held already: it is inserted below
	}
	m := ix.mask()
	h := maphash.String(ix.seed, key)
	i := h & m
	for ix.slots[i] != 0 {
		i = (i + 1) & m
	}
	ix.slots[i] = entry(h, id)
	ix.n++
}

// remove deletes key's entry; key must be present.
func (ix *index) remove(rs *rows, ar *arena, key string) {
	m := ix.mask()
	h := maphash.String(ix.seed, key)
	fp := entry(h, 0) &^ idMask
	i := h & m
	for {
		s := ix.slots[i]
		if s&^idMask == fp && string(ar.get(rs.at(s&idMask-1).keyOff)) == key {
			break
		}
		i = (i + 1) & m
	}
	// backward-shift: move later entries of the probe run into the hole when their home allows.
	j := i
	for {
		j = (j + 1) & m
		s := ix.slots[j]
		if s == 0 {
			break
		}
		home := maphash.Bytes(ix.seed, ar.get(rs.at(s&idMask-1).keyOff)) & m
		// the entry at j may move to i iff its home is not in the cyclic range (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			ix.slots[i] = s
			i = j
		}
	}
	ix.slots[i] = 0
	ix.n--
}

// reserve sizes the index for n keys, so that holding up to n rows never grows it again.
func (ix *index) reserve(rs *rows, ar *arena, n int) {
	if n > ix.n && n*4 > len(ix.slots)*3 {
		ix.resize(rs, ar, n, noRecord)
	}
}

// noRecord is no record id.
const noRecord = ^uint32(0)

// resize rebuilds the index with room for n keys (at most 3/4 full), at least doubling it, from
// the held records except skip. It reads the records in id order, so the keys are read in the
// order they were stored (mostly sequential memory) rather than in hash order (a miss each).
func (ix *index) resize(rs *rows, ar *arena, n int, skip uint32) {
	size := 1024
	for n*4 > size*3 {
		size *= 2
	}
	size = max(size, len(ix.slots)*2)
	ix.slots = make([]uint32, size)
	ix.resizes++
	m := ix.mask()
	for ci, chunk := range rs.chunks {
		for j := range chunk {
			r := &chunk[j]
			id := uint32(ci)<<recChunkBits | uint32(j)
			if r.msFlags&flagHeld == 0 || id == skip {
				continue
			}
			h := maphash.Bytes(ix.seed, ar.get(r.keyOff))
			i := h & m
			for ix.slots[i] != 0 {
				i = (i + 1) & m
			}
			ix.slots[i] = entry(h, id)
		}
	}
}
