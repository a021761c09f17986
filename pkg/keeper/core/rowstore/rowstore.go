package rowstore

import (
	"encoding/binary"
	"hash/maphash"
)

const (
	recChunkBits = 12
	recChunkSize = 1 << recChunkBits // records per chunk
	arenaChunk   = 1 << 20           // bytes per key arena chunk
	// compactAt is the garbage (bytes of freed keys) past which the key arena is rewritten, when
	// it is also more than the live keys.
	compactAt = 1 << 20
)

// Flag is one of a record's flags, kept in the high bits beside its due milliseconds.
type Flag uint16

const (
	// Held: the record holds a row (otherwise it is on the free list). The store sets and clears it.
	Held Flag = 1 << 10
	// UserFlag is the lowest of the flags left to the store's user, who names them: UserFlag << i
	// for i < UserFlags. The store keeps them and clears them when the record is removed.
	UserFlag  = Held << 1
	UserFlags = 5
	msMask    = 1<<10 - 1
)

// Rec is one held row (24 bytes): its key's place in the store, its due time and flags, and four
// fields the store keeps for its user (the core: the row's rev and slot, and the indexes of its
// interned route and (cadence, source, urgent) group).
type Rec struct {
	Rev     int64  // revision of the row as held
	dueSec  uint32 // due time: seconds since the Unix epoch (until 2106) ...
	keyOff  uint32 // offset of the key's length-prefixed bytes in the arena
	msFlags uint16 // ... plus these low 10 bits of milliseconds; the high bits are flags
	Route   uint16
	Group   uint16
	Slot    uint16
}

// Due returns the due time in ms since the Unix epoch.
func (r *Rec) Due() int64 { return int64(r.dueSec)*1000 + int64(r.msFlags&msMask) }

// SetDue sets the due time (ms in [0, schedule.MaxDueMs)), keeping the flags.
func (r *Rec) SetDue(ms int64) {
	r.dueSec = uint32(ms / 1000)
	r.msFlags = r.msFlags&^msMask | uint16(ms%1000)
}

// Has says whether flag f is set.
func (r *Rec) Has(f Flag) bool { return r.msFlags&uint16(f) != 0 }

// Set sets flag f (a user flag).
func (r *Rec) Set(f Flag) { r.msFlags |= uint16(f) }

// Clear clears flag f (a user flag).
func (r *Rec) Clear(f Flag) { r.msFlags &^= uint16(f) }

// Store holds rows: their records, their keys and the index from key to record. Record ids are
// stable while a row is held and below MaxRows. It is not safe for concurrent use.
type Store struct {
	recs  rows
	keys  arena
	index index
}

// New returns an empty store.
func New() *Store {
	s := &Store{}
	s.index.seed = maphash.MakeSeed()
	return s
}

// Len returns the number of held records.
func (s *Store) Len() int { return s.recs.n }

// At returns held record id.
func (s *Store) At(id uint32) *Rec { return s.recs.at(id) }

// Key returns the key of held record r. The bytes are the store's: valid until the next Remove.
func (s *Store) Key(r *Rec) []byte { return s.keys.get(r.keyOff) }

// Find returns the id of the record holding key, or false.
func (s *Store) Find(key string) (uint32, bool) { return s.index.find(&s.recs, &s.keys, key) }

// FindFrom is Find with a guess: when record id holds key (the caller found key there earlier,
// and the row may have left since), it returns id without probing the index; otherwise, for any
// id, it is Find. Record ids are stable while a row is held, so a record that holds key now is
// key's record.
func (s *Store) FindFrom(key string, id uint32) (uint32, bool) {
	if r, ok := s.held(id); ok && string(s.keys.get(r.keyOff)) == key {
		return id, true
	}
	return s.Find(key)
}

// held returns record id when it is one of the store's records and holds a row: any id is
// safe to ask about.
func (s *Store) held(id uint32) (*Rec, bool) {
	if id >= uint32(len(s.recs.chunks))*recChunkSize {
		return nil, false
	}
	r := s.recs.at(id)
	return r, r.Has(Held)
}

// Prefetch reads what looking up the n keys key(0) … key(n-1) reads first: each key's home
// index entry and, when that entry's fingerprint matches, the record and key bytes it points to.
// It changes nothing. Called before a batch of keys is looked up, it lets the memory reads of the
// batch overlap, where lookups one by one wait for each other's cache misses (most of a lookup's
// time once the index is larger than the CPU's caches). It reads in passes of up to
// prefetchBatch keys — all the hashes, then all the entries, then the records, then the keys —
// so that each pass is a short loop of independent reads, as many in flight as the CPU allows: a
// loop that also hashed the next key between two reads kept about one miss in flight. The result
// only keeps the reads from being optimised away.
func (s *Store) Prefetch(n int, key func(i int) string) uint32 {
	ix := &s.index
	if ix.n == 0 {
		return 0
	}
	m := ix.mask()
	var (
		hs   [prefetchBatch]uint64
		es   [prefetchBatch]uint32
		offs [prefetchBatch]uint32
		sum  uint32
	)
	for lo := 0; lo < n; lo += prefetchBatch {
		k := min(n-lo, prefetchBatch)
		for i := range k {
			hs[i] = maphash.String(ix.seed, key(lo+i))
		}
		for i := range k {
			es[i] = ix.slots[hs[i]&m]
		}
		found := 0
		for i := range k {
			if e := es[i]; e != 0 && e&^idMask == fingerprint(hs[i]) {
				offs[found] = s.recs.at(e&idMask - 1).keyOff
				found++
			}
		}
		sum += s.touchKeys(offs[:found])
	}
	return sum
}

// PrefetchRecords is Prefetch for FindFrom: it reads the n records id(0) … id(n-1) and the keys
// of those held, what FindFrom compares first. Ids that are not records are skipped. It changes
// nothing.
func (s *Store) PrefetchRecords(n int, id func(i int) uint32) uint32 {
	var (
		offs [prefetchBatch]uint32
		sum  uint32
	)
	for lo := 0; lo < n; lo += prefetchBatch {
		found := 0
		for i := range min(n-lo, prefetchBatch) {
			if r, ok := s.held(id(lo + i)); ok {
				offs[found] = r.keyOff
				found++
			}
		}
		sum += s.touchKeys(offs[:found])
	}
	return sum
}

// PrefetchRemove is Prefetch for Remove: it reads what removing the n held records id(0) …
// id(n-1) reads, their keys, their index entries and the keys of the entries a removal may move
// back (the rest of each probe run, up to prefetchRun entries), in passes whose reads overlap, as
// Prefetch does. Removed one by one without it, each record waits for those misses in turn. It
// changes nothing.
func (s *Store) PrefetchRemove(n int, id func(i int) uint32) uint32 {
	ix := &s.index
	if ix.n == 0 {
		return 0
	}
	m := ix.mask()
	var (
		hs   [prefetchBatch]uint64
		offs [prefetchBatch * prefetchRun]uint32
		recs [prefetchBatch * prefetchRun]uint32
		sum  uint32
	)
	for lo := 0; lo < n; lo += prefetchBatch {
		k := min(n-lo, prefetchBatch)
		found := 0
		for i := range k {
			if r, ok := s.held(id(lo + i)); ok {
				offs[found] = r.keyOff
				found++
			}
		}
		for i, off := range offs[:found] {
			hs[i] = maphash.Bytes(ix.seed, s.keys.get(off))
		}
		for i := range found {
			sum += ix.slots[hs[i]&m]
		}
		next := 0
		for i := range found {
			for j, p := 0, hs[i]&m; j < prefetchRun; j, p = j+1, (p+1)&m {
				e := ix.slots[p]
				if e == 0 {
					break
				}
				recs[next] = e&idMask - 1
				next++
			}
		}
		for i, rid := range recs[:next] {
			offs[i] = s.recs.at(rid).keyOff
		}
		sum += s.touchKeys(offs[:next])
	}
	return sum
}

// prefetchRun is how many entries of each probe run PrefetchRemove reads ahead.
const prefetchRun = 8

// touchKeys reads the first and last bytes of the held keys at offs: a 64-byte key spans two
// cache lines.
func (s *Store) touchKeys(offs []uint32) uint32 {
	var sum uint32
	for _, off := range offs {
		c, i := s.keys.chunks[off/arenaChunk], off%arenaChunk
		l := uint32(c[i])
		sum += l + uint32(c[min(i+l, uint32(len(c)-1))])
	}
	return sum
}

// prefetchBatch is how many keys Prefetch reads ahead per pass: the batches it is called for
// (the shard applies rows 128 at a time) in one pass.
const prefetchBatch = 128

// Add holds a new record for key (not held) and returns its id: flag Held set, everything else
// zero. The caller makes sure fewer than MaxRows records are held.
func (s *Store) Add(key string) uint32 {
	id := s.recs.alloc()
	r := s.recs.at(id)
	r.keyOff = s.keys.put(key)
	r.msFlags = uint16(Held)
	s.index.insert(&s.recs, &s.keys, key, id)
	return id
}

// Remove drops held record id: out of the index, its key freed (the key arena is rewritten when
// more than half of it is garbage), the record cleared and free for reuse.
func (s *Store) Remove(id uint32) {
	r := s.recs.at(id)
	s.index.remove(&s.recs, &s.keys, s.keys.get(r.keyOff), id)
	s.keys.free(r.keyOff)
	s.recs.release(id)
	s.maybeCompact()
}

// Reserve sizes the key index for n held records, so that holding up to n never grows (rebuilds)
// it. It never shrinks anything.
func (s *Store) Reserve(n int) { s.index.reserve(&s.recs, &s.keys, min(n, MaxRows)) }

// IndexSize returns the key index's capacity (0 before the first record or Reserve) and how many
// times it has been built or rebuilt.
func (s *Store) IndexSize() (slots, builds int) { return len(s.index.slots), s.index.resizes }

// Each calls fn for every held record, in id order. fn may remove the record it is given.
func (s *Store) Each(fn func(id uint32, r *Rec)) {
	for ci := range s.recs.chunks {
		s.EachInChunk(ci, fn)
	}
}

// IDs returns the bound of the record ids: every record, held or free, has an id below it (At may
// be asked about any of them; a free record does not have Held set).
func (s *Store) IDs() uint32 { return uint32(len(s.recs.chunks)) * recChunkSize }

// Chunks returns the number of chunks the records are kept in; EachInChunk visits one.
func (s *Store) Chunks() int { return len(s.recs.chunks) }

// EachInChunk calls fn for every held record of chunk ci, in id order, and returns the number of
// records (held or free) the chunk has. fn may remove the record it is given.
func (s *Store) EachInChunk(ci int, fn func(id uint32, r *Rec)) int {
	chunk := s.recs.chunks[ci]
	for i := range chunk {
		if chunk[i].msFlags&uint16(Held) != 0 {
			fn(uint32(ci)<<recChunkBits|uint32(i), &chunk[i])
		}
	}
	return len(chunk)
}

// maybeCompact rewrites the key arena when more than half of it is garbage.
func (s *Store) maybeCompact() {
	if s.keys.garbage < compactAt || s.keys.garbage < s.keys.live {
		return
	}
	var fresh arena
	s.Each(func(_ uint32, r *Rec) {
		r.keyOff = fresh.put(string(s.keys.get(r.keyOff)))
	})
	s.keys = fresh
}

// rows is chunked record storage with a free list; ids are stable while a row is held.
type rows struct {
	chunks [][]Rec
	free   []uint32
	n      int // records in use
}

func (r *rows) at(id uint32) *Rec {
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
	r.chunks = append(r.chunks, make([]Rec, recChunkSize))
	for i := uint32(recChunkSize - 1); i >= 1; i-- {
		r.free = append(r.free, base+i)
	}
	return base
}

func (r *rows) release(id uint32) {
	*r.at(id) = Rec{}
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
	// IDBits is the width of record ids: every id is below 1<<IDBits.
	IDBits = 25
	idBits = IDBits
	idMask = 1<<idBits - 1
	// MaxRows is the most rows one store can hold: record ids (below MaxRows plus one chunk) must
	// fit in IDBits, beside the fingerprint here.
	MaxRows = 1<<idBits - recChunkSize
)

func entry(h uint64, id uint32) uint32 { return uint32(h>>(64-(32-idBits)))<<idBits | (id + 1) }

// fingerprint is the part of an entry for key hash h that does not depend on the record: what a
// probe compares before it reads a record.
func fingerprint(h uint64) uint32 { return entry(h, 0) &^ idMask }

func (ix *index) mask() uint64 { return uint64(len(ix.slots) - 1) }

// find returns the record id holding key, or false.
func (ix *index) find(rs *rows, ar *arena, key string) (uint32, bool) {
	if ix.n == 0 {
		return 0, false
	}
	m := ix.mask()
	h := maphash.String(ix.seed, key)
	fp := fingerprint(h)
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

// remove deletes the entry of record id, whose key is key; it must be present. Its entry is
// found by the id: no key is read but key.
func (ix *index) remove(rs *rows, ar *arena, key []byte, id uint32) {
	m := ix.mask()
	h := maphash.Bytes(ix.seed, key)
	want := entry(h, id)
	i := h & m
	for ix.slots[i] != want {
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

// fill inserts the keys of the held records but skip into the index's empty slots, and counts
// them.
func (ix *index) fill(rs *rows, ar *arena, skip uint32) {
	ix.n = 0
	m := ix.mask()
	for ci, chunk := range rs.chunks {
		for j := range chunk {
			r := &chunk[j]
			id := uint32(ci)<<recChunkBits | uint32(j)
			if r.msFlags&uint16(Held) == 0 || id == skip {
				continue
			}
			h := maphash.Bytes(ix.seed, ar.get(r.keyOff))
			i := h & m
			for ix.slots[i] != 0 {
				i = (i + 1) & m
			}
			ix.slots[i] = entry(h, id)
			ix.n++
		}
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
	ix.fill(rs, ar, skip)
}
