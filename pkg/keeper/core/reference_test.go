package core

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/pace"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/summary"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// refModel is a naive reference implementation of the core's semantics: maps and sorting, no
// heaps, no arena, no index. Property tests check the core against it.
type refModel struct {
	cfg       policy.Config
	slots     [schedule.NumSlots]SlotState
	walked    [schedule.NumSlots]bool
	held      map[string]*refRow
	invalid   map[string]int64
	tomb      map[string]int64 // only while walking
	walking   bool
	walkSlots map[int]bool
	seen      map[string]bool
	prevEdge  Edge
	startMs   int64
	counts    WalkCounts
	nextLease uint64
	credit    []float64 // per Config.Floors
	// lastClaim is when a non-urgent row of each class was last claimed (the starvation bound)
	lastClaim map[refClass]int64
	// claims since the last claim that found fewer due rows than it asked for (the Adaptive
	// policy's claim rate), and its decision at the last claim
	saturated bool
	claims    []refClaim
	stretch   bool
	// beyond is the demand beyond the window per slot (renders per ms), walkBeyond what the
	// running walk has counted
	beyond, walkBeyond map[int]float64
	// fence is, per slot, until when (ms) it hands out nothing (math.MaxInt64: until lifted)
	fence [schedule.NumSlots]int64
	// awaiting holds the leases taken over whose row is not held yet, by key
	awaiting map[string]Lease
}

type refClass struct {
	cadence time.Duration
	source  schedule.Source
}

type refClaim struct {
	ms  int64
	got int
}

type refRow struct {
	row     schedule.Row
	dueMs   int64
	leased  bool
	token   uint64
	expires int64
	rev     int64 // the rev the lease was granted for
}

func newRef(cfg policy.Config) *refModel {
	return &refModel{cfg: cfg, held: map[string]*refRow{}, invalid: map[string]int64{}, nextLease: cfg.FirstLease, credit: make([]float64, len(cfg.Floors)), lastClaim: map[refClass]int64{}, beyond: map[int]float64{}, awaiting: map[string]Lease{}}
}

func (m *refModel) knownRev(key string) (int64, bool) {
	if r, ok := m.held[key]; ok {
		return r.row.Rev, true
	}
	if v, ok := m.invalid[key]; ok {
		return v, true
	}
	if v, ok := m.tomb[key]; ok && m.walking {
		return v, true
	}
	return 0, false
}

func (m *refModel) valid(r schedule.Row) bool {
	if r.Key == "" || len(r.Key) > schedule.MaxKeyBytes || !r.HasDue || r.Cadence < time.Millisecond || r.Cadence > schedule.MaxCadence {
		return false
	}
	if r.Source > schedule.SourceSubmitted {
		return false
	}
	ms := r.Due.UnixMilli()
	return ms >= 0 && ms < int64(math.MaxUint32)*1000
}

func (m *refModel) apply(nowMs int64, r schedule.Row) Result {
	if m.slots[r.Slot()] == SlotNone {
		return NotOwned
	}
	if rev, ok := m.knownRev(r.Key); ok && r.Rev <= rev {
		if m.walking && m.held[r.Key] != nil {
			m.seen[r.Key] = true
		}
		return Ignored
	}
	old := m.held[r.Key]
	delete(m.tomb, r.Key)
	delete(m.invalid, r.Key)
	if !m.valid(r) {
		delete(m.held, r.Key)
		m.invalid[r.Key] = r.Rev
		return Invalid
	}
	dueMs := r.Due.UnixMilli()
	if m.cfg.Window > 0 && dueMs >= nowMs+m.cfg.Window.Milliseconds() {
		delete(m.held, r.Key)
		if m.walking {
			m.tomb[r.Key] = r.Rev
		}
		if old != nil {
			m.beyond[r.Slot()] += 1 / float64(r.Cadence.Milliseconds())
			return Dropped
		}
		return NotHeld
	}
	nr := &refRow{row: r, dueMs: dueMs}
	if old != nil && old.leased {
		nr.leased, nr.token, nr.expires, nr.rev = true, old.token, old.expires, old.rev
	}
	if a, ok := m.awaiting[r.Key]; ok && old == nil {
		// a lease taken over before its row was read: the row is leased as it arrives
		delete(m.awaiting, r.Key)
		if exp := a.Expires.UnixMilli(); exp > nowMs && a.Slot == r.Slot() {
			nr.leased, nr.token, nr.expires, nr.rev = true, a.Token, exp, a.Rev
		}
	}
	m.held[r.Key] = nr
	if m.walking {
		m.seen[r.Key] = true
	}
	return Held
}

func (m *refModel) del(key string, slot int, rev int64) Result {
	if m.slots[slot] == SlotNone {
		return NotOwned
	}
	if k, ok := m.knownRev(key); ok && rev <= k {
		return Ignored
	}
	delete(m.held, key)
	delete(m.invalid, key)
	if m.walking {
		m.tomb[key] = rev
	}
	return Removed
}

func (m *refModel) setSlot(s int, st SlotState) {
	m.slots[s] = st
	if st == SlotNone {
		for k, a := range m.awaiting {
			if a.Slot == s {
				delete(m.awaiting, k)
			}
		}
		m.fence[s] = 0
		m.walked[s] = false
		m.beyond[s] = 0
		for k, r := range m.held {
			if r.row.Slot() == s {
				delete(m.held, k)
			}
		}
		for k := range m.invalid {
			if slotOfKey(k) == s {
				delete(m.invalid, k)
			}
		}
		for k := range m.tomb {
			if slotOfKey(k) == s {
				delete(m.tomb, k)
			}
		}
	}
}

func (m *refModel) expire(nowMs int64) {
	for k, a := range m.awaiting {
		if a.Expires.UnixMilli() <= nowMs {
			delete(m.awaiting, k)
		}
	}
	for _, r := range m.held {
		if r.leased && r.expires <= nowMs {
			r.leased = false
		}
	}
}

func (m *refModel) score(nowMs int64, r *refRow) float64 {
	return policy.Score(nowMs, r.dueMs, r.row.Cadence.Milliseconds(), r.row.Source == schedule.SourceSubmitted, m.cfg.SubmittedBoost)
}

func (m *refModel) claim(nowMs int64, n int, leaseFor time.Duration) []string {
	m.expire(nowMs)
	if n <= 0 {
		return nil
	}
	var urgent, other []*refRow
	for _, r := range m.held {
		if m.slots[r.row.Slot()] != SlotOwned || r.leased || r.dueMs > nowMs || m.fence[r.row.Slot()] > nowMs {
			continue
		}
		if r.row.Urgent {
			urgent = append(urgent, r)
		} else {
			other = append(other, r)
		}
	}
	order := func(a, b *refRow) int {
		sa, sb := m.score(nowMs, a), m.score(nowMs, b)
		switch {
		case sa > sb:
			return -1
		case sa < sb:
			return 1
		case a.dueMs != b.dueMs:
			if a.dueMs < b.dueMs {
				return -1
			}
			return 1
		}
		return strings.Compare(a.row.Key, b.row.Key)
	}
	slices.SortFunc(urgent, order)
	slices.SortFunc(other, order)
	capU := int(math.Floor(m.cfg.UrgentMaxShare * float64(n)))
	var picked []*refRow
	u := min(capU, len(urgent), n)
	picked = append(picked, urgent[:u]...)
	// floors: each floor reserves ⌊credit⌋ rows of its class, best first across classes
	taken := make([]int, len(m.cfg.Floors))
	done := map[*refRow]bool{}
	quota := make([]int, len(m.cfg.Floors))
	for i, f := range m.cfg.Floors {
		m.credit[i] += f.Share * float64(n-len(picked))
		quota[i] = int(min(math.Floor(m.credit[i]), float64(n)))
	}
	// the starvation bound: each class that has had due rows and no claim for StarvationBound
	// of its cadence gets its best row, longest waiting (in cadences) first; a row it gets
	// counts as one of its floor's reserved rows
	if m.cfg.StarvationBound > 0 {
		type starving struct {
			head   *refRow
			waited float64
		}
		var classes []starving
		seen := map[refClass]bool{}
		for _, r := range other { // best first: a class's first row is its head
			k := refClass{r.row.Cadence, r.row.Source}
			if seen[k] {
				continue
			}
			seen[k] = true
			since := r.dueMs
			if last, ok := m.lastClaim[k]; ok && last > since {
				since = last
			}
			if w := float64(nowMs-since) / float64(r.row.Cadence.Milliseconds()); w >= m.cfg.StarvationBound {
				classes = append(classes, starving{r, w})
			}
		}
		slices.SortStableFunc(classes, func(a, b starving) int {
			switch {
			case a.waited > b.waited:
				return -1
			case a.waited < b.waited:
				return 1
			case a.head.dueMs != b.head.dueMs:
				if a.head.dueMs < b.head.dueMs {
					return -1
				}
				return 1
			}
			return strings.Compare(a.head.row.Key, b.head.row.Key)
		})
		for _, c := range classes {
			if len(picked) == n {
				break
			}
			picked = append(picked, c.head)
			done[c.head] = true
			if i := m.floorOf(c.head); i >= 0 && quota[i] > 0 {
				quota[i]--
			}
		}
	}
	if len(m.cfg.Floors) > 0 {
		for _, r := range other {
			if len(picked) == n {
				break
			}
			if i := m.floorOf(r); i >= 0 && quota[i] > 0 && !done[r] {
				quota[i]--
				picked = append(picked, r)
				done[r] = true
			}
		}
	}
	for _, r := range other {
		if len(picked) == n {
			break
		}
		if !done[r] {
			picked = append(picked, r)
			done[r] = true
		}
	}
	if rest := min(n-len(picked), len(urgent)-u); rest > 0 {
		picked = append(picked, urgent[u:u+rest]...)
	}
	// settle the floors' credits: charge every row of the class, keep ≥ 0, and a class without
	// due rows left keeps only the fraction
	for _, r := range picked {
		if i := m.floorOf(r); i >= 0 {
			taken[i]++
		}
	}
	for i := range m.cfg.Floors {
		m.credit[i] = max(0, m.credit[i]-float64(taken[i]))
		left := false
		for _, r := range other {
			if !done[r] && m.floorOf(r) == i {
				left = true
			}
		}
		if !left {
			m.credit[i] -= math.Floor(m.credit[i])
		}
	}
	keys := make([]string, len(picked))
	for i, r := range picked {
		m.nextLease++
		r.leased, r.token, r.expires, r.rev = true, m.nextLease, nowMs+leaseFor.Milliseconds(), r.row.Rev
		keys[i] = r.row.Key
		if !r.row.Urgent {
			m.lastClaim[refClass{r.row.Cadence, r.row.Source}] = nowMs
		}
	}
	m.pace(nowMs, n, len(picked))
	return keys
}

// pace records a claim for the Adaptive policy and decides, naively: the rows the claims of the
// saturated stretch got, each weighted exp(−age / pace.Window), over the weight a constant rate
// would have, against the demand summed over every owned held row.
func (m *refModel) pace(nowMs int64, asked, got int) {
	if got < asked {
		m.saturated, m.claims = false, nil
	} else if got > 0 {
		if !m.saturated {
			m.saturated, m.claims = true, nil
		}
		m.claims = append(m.claims, refClaim{nowMs, got})
	}
	r := pace.Reading{Demand: m.demand()}
	if m.saturated {
		w := float64(pace.Window.Milliseconds())
		span := float64(nowMs - m.claims[0].ms)
		r.Saturated = time.Duration(nowMs-m.claims[0].ms) * time.Millisecond
		if span > 0 {
			acc := 0.0
			for _, c := range m.claims {
				acc += float64(c.got) * math.Exp(-float64(nowMs-c.ms)/w)
			}
			r.ClaimRate = acc / (w * (1 - math.Exp(-span/w))) * float64(time.Hour.Milliseconds())
		}
	}
	m.stretch = pace.Decide(r).Stretch
}

// demand is the renders an hour the owned rows need: Σ 1 / cadence over every owned held row, and
// the demand beyond the window of the owned slots.
func (m *refModel) demand() float64 {
	d := 0.0
	for _, h := range m.held {
		if m.slots[h.row.Slot()] == SlotOwned {
			d += float64(time.Hour) / float64(h.row.Cadence)
		}
	}
	for s, b := range m.beyond {
		if m.slots[s] == SlotOwned {
			d += b * float64(time.Hour.Milliseconds())
		}
	}
	return d
}

// floorOf returns the index of r's floor, or -1 (urgent rows have none).
func (m *refModel) floorOf(r *refRow) int {
	if r.row.Urgent {
		return -1
	}
	for i, f := range m.cfg.Floors {
		if f.Cadence == r.row.Cadence && f.Source == r.row.Source {
			return i
		}
	}
	return -1
}

// completing returns the next due time of a completion at nowMs: with policy.KeepPhase the point
// due + k·cadence (k ≥ 1) nearest to nowMs + cadence, ties to the later one, found by trying
// every k.
func (m *refModel) completing(nowMs int64, key string, token uint64) (int64, bool, error) {
	m.expire(nowMs)
	r := m.held[key]
	if r == nil {
		return 0, false, m.notHeld(key, token)
	}
	c := r.row.Cadence.Milliseconds()
	next := nowMs + c
	if p := m.cfg.Reschedule; p == policy.KeepPhase || p == policy.Adaptive && !m.stretch {
		target := nowMs + c
		best := r.dueMs + c
		for k := int64(2); r.dueMs+(k-1)*c <= target; k++ {
			cand := r.dueMs + k*c
			if dist(cand, target) <= dist(best, target) {
				best = cand
			}
		}
		next = best
	}
	if !r.leased || r.token != token {
		return next, true, ErrLeaseLost
	}
	return next, true, nil
}

func dist(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
}

func (m *refModel) release(nowMs int64, key string, token uint64) error {
	m.expire(nowMs)
	r := m.held[key]
	if r == nil {
		return m.notHeld(key, token)
	}
	if !r.leased || r.token != token {
		return ErrLeaseLost
	}
	r.leased = false
	return nil
}

// notHeld is the error of a lease operation on key, not held, under token.
func (m *refModel) notHeld(key string, token uint64) error {
	if a, ok := m.awaiting[key]; ok && a.Token == token {
		return ErrRowNotRead
	}
	return ErrNotHeld
}

// setFence fences slots until untilMs (math.MaxInt64: until lifted); a time not after nowMs
// lifts their fences.
func (m *refModel) setFence(nowMs int64, slots []int, untilMs int64) {
	m.expire(nowMs)
	if untilMs <= nowMs {
		untilMs = 0
	}
	for _, s := range slots {
		if m.slots[s] != SlotNone {
			m.fence[s] = untilMs
		}
	}
}

// importLease takes over a lease granted elsewhere, as Core.ImportLeases does for one.
func (m *refModel) importLease(nowMs int64, l Lease) bool {
	m.expire(nowMs)
	exp := l.Expires.UnixMilli()
	r := m.held[l.Key]
	if exp <= nowMs {
		return false
	}
	if r == nil {
		// not read here yet: the lease waits for its row
		if m.slots[l.Slot] == SlotNone {
			return false
		}
		if a, ok := m.awaiting[l.Key]; ok {
			if a.Token != l.Token || a.Slot != l.Slot {
				return false
			}
			l.Expires = time.UnixMilli(max(exp, a.Expires.UnixMilli()))
		}
		m.awaiting[l.Key] = l
		return true
	}
	if r.leased {
		if r.token != l.Token {
			return false
		}
		r.expires = max(r.expires, exp)
		return true
	}
	r.leased, r.token, r.expires, r.rev = true, l.Token, exp, l.Rev
	return true
}

// exportLeases lists the leases of slots, as Core.ExportLeases does (nothing is pinned here).
func (m *refModel) exportLeases(nowMs int64, slots []int) []Lease {
	m.expire(nowMs)
	var out []Lease
	for k, r := range m.held {
		if r.leased && slices.Contains(slots, r.row.Slot()) {
			out = append(out, Lease{Key: k, Slot: r.row.Slot(), Token: r.token, Expires: time.UnixMilli(r.expires).UTC(), Rev: r.rev})
		}
	}
	for k, a := range m.awaiting {
		if slices.Contains(slots, a.Slot) {
			out = append(out, Lease{Key: k, Slot: a.Slot, Token: a.Token, Expires: a.Expires.UTC(), Rev: a.Rev})
		}
	}
	slices.SortFunc(out, func(a, b Lease) int { return strings.Compare(a.Key, b.Key) })
	return out
}

func (m *refModel) beginWalk(nowMs int64, prev Edge, slots []int) {
	m.walking = true
	m.tomb = map[string]int64{}
	m.seen = map[string]bool{}
	m.walkSlots = map[int]bool{}
	for _, s := range slots {
		m.walkSlots[s] = true
	}
	m.prevEdge = prev
	m.startMs = nowMs
	m.counts = WalkCounts{}
	m.walkBeyond = map[int]float64{}
}

func (m *refModel) walkRow(nowMs int64, r schedule.Row) {
	m.counts.Scanned++
	wasHeld := m.held[r.Key] != nil
	res := m.apply(nowMs, r)
	dueMs := r.Due.UnixMilli()
	notHeld := func() {
		m.counts.OwnedNotHeld++
		if d := dueMs - m.startMs; d >= 0 && d < 24*hourMs {
			m.counts.OwnedNotHeldByHour[d/hourMs]++
		}
	}
	switch res {
	case Invalid:
		m.counts.Invalid++
	case Held:
		if wasHeld || (m.walked[r.Slot()] && m.prevEdge.Known && (m.prevEdge.Unbounded || dueMs < m.prevEdge.At.UnixMilli())) {
			m.counts.Repaired++
		} else {
			m.counts.Admitted++
		}
	case Dropped:
		m.counts.Repaired++
		notHeld()
		m.walkBeyond[r.Slot()] += 1 / float64(r.Cadence.Milliseconds())
	case NotHeld:
		notHeld()
		m.walkBeyond[r.Slot()] += 1 / float64(r.Cadence.Milliseconds())
	}
}

func (m *refModel) endWalk(unread []int) WalkCounts {
	read := map[int]bool{}
	for s := range m.walkSlots {
		read[s] = !slices.Contains(unread, s)
	}
	for k, r := range m.held {
		if read[r.row.Slot()] && !m.seen[k] {
			delete(m.held, k)
			m.counts.Repaired++
			m.counts.Deleted++
		}
	}
	for s, ok := range read {
		if ok {
			m.walked[s] = true
			m.beyond[s] = m.walkBeyond[s]
		}
	}
	m.walking = false
	m.tomb = nil
	return m.counts
}

func (m *refModel) summary(nowMs int64) summary.Summary {
	m.expire(nowMs)
	s := summary.Summary{Held: len(m.held), Invalid: len(m.invalid), DuePerSlot: map[int]int{}, DuePerIncomingSlot: map[int]int{}, ByRoute: map[string]int{}}
	var abs []int64
	var rel []float64
	classes := map[[2]int64]*summary.Class{}
	head := map[[2]int64]int64{} // the earliest due of each class's claimable due non-urgent rows
	var oldest *refRow
	for _, r := range m.held {
		if r.leased {
			s.Leased++
		}
		if m.slots[r.row.Slot()] != SlotOwned {
			s.HeldIncoming++
			if r.dueMs <= nowMs {
				s.DuePerIncomingSlot[r.row.Slot()]++
			}
			continue
		}
		ck := [2]int64{r.row.Cadence.Milliseconds(), int64(r.row.Source)}
		cl := classes[ck]
		if cl == nil {
			cl = &summary.Class{Cadence: time.Duration(ck[0]) * time.Millisecond, Source: r.row.Source}
			classes[ck] = cl
		}
		cl.Held++
		if d := r.dueMs - nowMs; d > 0 {
			for h := 0; h < 24; h++ {
				if d > int64(h)*hourMs && d <= int64(h+1)*hourMs {
					s.Coming.ByHour[h]++
				}
			}
			if d <= 15*60_000 {
				s.Coming.Next15m++
			}
			if d <= hourMs {
				s.Coming.Next60m++
			}
			if d <= 24*hourMs {
				s.Coming.Next24h++
			}
			continue
		}
		s.Due++
		cl.Due++
		fenced := m.fence[r.row.Slot()] > nowMs
		if fenced {
			s.HeldBack++
		}
		if h, ok := head[ck]; !r.row.Urgent && !r.leased && !fenced && (!ok || r.dueMs < h) {
			head[ck] = r.dueMs
		}
		cl.MaxLateSeconds = max(cl.MaxLateSeconds, float64(nowMs-r.dueMs)/1000)
		cl.LateBy[lateBucket(nowMs-r.dueMs, r.row.Cadence.Milliseconds())]++
		s.DuePerSlot[r.row.Slot()]++
		s.ByRoute[r.row.Route]++
		abs = append(abs, nowMs-r.dueMs)
		rel = append(rel, float64(nowMs-r.dueMs)/float64(r.row.Cadence.Milliseconds()))
		if oldest == nil || r.dueMs < oldest.dueMs || (r.dueMs == oldest.dueMs && r.row.Key < oldest.row.Key) {
			oldest = r
		}
	}
	for ck, cl := range classes {
		if h, ok := head[ck]; ok {
			since := h
			if last, ok := m.lastClaim[refClass{cl.Cadence, cl.Source}]; ok && last > since {
				since = last
			}
			cl.WaitingSince = time.UnixMilli(since).UTC()
		}
		s.Classes = append(s.Classes, *cl)
	}
	slices.SortFunc(s.Classes, func(a, b summary.Class) int {
		if a.Cadence != b.Cadence {
			return int(a.Cadence - b.Cadence)
		}
		return int(a.Source) - int(b.Source)
	})
	if oldest != nil {
		s.Oldest = &summary.OldestRow{Key: oldest.row.Key, Due: time.UnixMilli(oldest.dueMs).UTC()}
	}
	if len(abs) > 0 {
		slices.Sort(abs)
		slices.Sort(rel)
		rank := func(q float64, n int) int { return max(0, int(math.Ceil(q*float64(n)))-1) }
		s.Lateness = summary.Lateness{
			MaxSeconds: float64(abs[len(abs)-1]) / 1000, P50Seconds: float64(abs[rank(0.5, len(abs))]) / 1000,
			P99Seconds: float64(abs[rank(0.99, len(abs))]) / 1000, MaxRelative: rel[len(rel)-1],
			P50Relative: rel[rank(0.5, len(rel))], P99Relative: rel[rank(0.99, len(rel))],
		}
	}
	return s
}
