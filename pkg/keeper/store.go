package keeper

import (
	"encoding/binary"
	"hash/maphash"
)

// This file holds the memory layout of the held rows: fixed-size records in chunks, keys in a
// byte arena, and an open-addressing index from key to record. Together they cost about
// 32 (record) + key length + 2 (length prefix) + ~8 (index) bytes per row, with no per-row heap
// object for the garbage collector to trace.

const (
	recChunkBits = 12
	recChunkSize = 1 << recChunkBits // records per chunk
	arenaChunk   = 1 << 20           // bytes per key arena chunk
)

// Record flags.
const (
	flagHeld   uint8 = 1 << iota // the record holds a row (otherwise it is on the free list)
	flagLeased                   // the row is leased to a worker
	flagUrgent                   // the row is urgent
	flagSeen                     // the running walk has read or an event has touched the row
)

// rec is one held row. Its cadence and source live in its group.
type rec struct {
	due     int64  // due time, ms since the Unix epoch
	rev     int64  // revision of the row as held
	keyOff  uint32 // offset of the key's length-prefixed bytes in the arena
	heapIdx int32  // position in its group's claim heap, or -1 when not in it
	route   uint16 // index into Core.routes
	group   uint16 // index into Core.groups
	slot    uint16
	flags   uint8
}

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
// entry holds a 6-bit fingerprint of the key's hash above id+1 (0 is empty), so probing past
// other keys reads only the index; only a fingerprint match reads the record and its key. The
// key hash is this process's own (maphash), unrelated to the ownership hash of the database.
type index struct {
	seed  maphash.Seed
	slots []uint32
	n     int
}

const (
	idBits = 26
	idMask = 1<<idBits - 1
	// MaxRows is the most rows one core can hold (ids must fit beside the fingerprint).
	MaxRows = idMask - 1
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
		ix.grow(rs, ar)
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

func (ix *index) grow(rs *rows, ar *arena) {
	size := 1024
	for (ix.n+1)*4 > size*3 {
		size *= 2
	}
	if size <= len(ix.slots) {
		size = len(ix.slots) * 2
	}
	old := ix.slots
	ix.slots = make([]uint32, size)
	m := ix.mask()
	for _, s := range old {
		if s == 0 {
			continue
		}
		i := maphash.Bytes(ix.seed, ar.get(rs.at(s&idMask-1).keyOff)) & m
		for ix.slots[i] != 0 {
			i = (i + 1) & m
		}
		ix.slots[i] = s
	}
}
