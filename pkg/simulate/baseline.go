package simulate

import (
	"cmp"
	"slices"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/pace"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
)

// queueSched is a baseline claim order, not the keeper: queues ordered by due time (ties by
// row), served in a fixed order of queues — one queue for oldest-due-first, one per class in
// priority order for strict class priority. With the Adaptive policy it measures its claims
// as the core does (package pace), against the fleet's demand.
type queueSched struct {
	s       *sim
	policy  policy.Reschedule
	queueOf []int // class → queue
	queues  []dueHeap
	pace    pace.Meter
	stretch bool
}

func newQueueSched(s *sim, p policy.Reschedule, byClass bool) *queueSched {
	classes := s.cfg.Fleet.Classes
	q := &queueSched{s: s, policy: p, queueOf: make([]int, len(classes))}
	if !byClass {
		q.queues = make([]dueHeap, 1)
		return q
	}
	// strict class priority: shorter cadence first, submitted before discovered
	order := make([]int, len(classes))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		if c := cmp.Compare(classes[a].Cadence, classes[b].Cadence); c != 0 {
			return c
		}
		return cmp.Compare(classes[b].Source, classes[a].Source) // submitted (1) first
	})
	for rank, ci := range order {
		q.queueOf[ci] = rank
	}
	q.queues = make([]dueHeap, len(classes))
	return q
}

func (q *queueSched) add(i int, dueMs int64) {
	q.queues[q.queueOf[q.s.class[i]]].push(entry{dueMs: dueMs, row: int32(i)})
}

func (q *queueSched) claim(nowMs int64, n int, out []claimed) []claimed {
	asked, before := n, len(out)
	for qi := range q.queues {
		h := &q.queues[qi]
		for n > 0 && len(*h) > 0 && (*h)[0].dueMs <= nowMs {
			e := h.pop()
			out = append(out, claimed{row: int(e.row), dueMs: e.dueMs})
			n--
		}
	}
	if asked > 0 {
		q.pace.Claimed(nowMs, asked, len(out)-before)
		q.stretch = pace.Decide(q.pace.Reading(nowMs, q.s.cfg.Fleet.Demand())).Stretch
	}
	return out
}

func (q *queueSched) complete(nowMs int64, c claimed) (int64, error) {
	ci := q.s.class[c.row]
	next := policy.NextDue(q.policy.Resolve(q.stretch), ms2time(nowMs), ms2time(c.dueMs), q.s.cfg.Fleet.Classes[ci].Cadence).UnixMilli()
	q.queues[q.queueOf[ci]].push(entry{dueMs: next, row: int32(c.row)})
	return next, nil
}

type entry struct {
	dueMs int64
	row   int32
}

func (a entry) less(b entry) bool {
	if a.dueMs != b.dueMs {
		return a.dueMs < b.dueMs
	}
	return a.row < b.row
}

// dueHeap is a binary min-heap of entries.
type dueHeap []entry

func (h *dueHeap) push(e entry) {
	*h = append(*h, e)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s[i].less(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *dueHeap) pop() entry {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(s) {
			break
		}
		m := l
		if r := l + 1; r < len(s) && s[r].less(s[l]) {
			m = r
		}
		if !s[m].less(s[i]) {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}
