package keeper

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// Summary is the exact state of the held rows of owned slots at one instant. Rows of incoming
// slots are counted only in Held and HeldIncoming.
type Summary struct {
	AsOf time.Time
	// Held is every held row, owned and incoming slots; HeldIncoming the incoming part.
	Held, HeldIncoming int
	// Invalid is the number of keys whose latest known version is invalid.
	Invalid int
	// Due counts rows with due ≤ AsOf (leased ones included); Leased the rows under lease.
	Due, Leased int
	// DuePerSlot has an entry for every owned slot with due rows.
	DuePerSlot map[int]int
	// DuePerIncomingSlot has an entry for every incoming slot with due rows (held, not counted in
	// Due: the operator uses it for slots whose new owner has not adopted a commit yet).
	DuePerIncomingSlot map[int]int
	Lateness           Lateness
	// Oldest is the due row with the earliest due time (ties: smallest key); nil when none.
	Oldest  *OldestRow
	ByRoute map[string]int
	// Classes is due and held per (cadence, source), sorted by cadence then source.
	Classes []Class
	Coming  Coming
}

// Lateness of the due rows: absolute (seconds late) and relative (seconds late ÷ cadence).
// Percentiles are nearest-rank: the smallest value with at least q of the rows at or below it.
type Lateness struct {
	MaxSeconds, P50Seconds, P99Seconds    float64
	MaxRelative, P50Relative, P99Relative float64
}

// OldestRow is the longest-due row.
type OldestRow struct {
	Key string
	Due time.Time
}

// Class is one (cadence, source) class.
type Class struct {
	Cadence   time.Duration
	Source    schedule.Source
	Due, Held int
}

// Coming counts held rows of owned slots not yet due, by how soon they come due: Next15m has
// due in (now, now+15m], ByHour[h] due in (now+h hours, now+h+1 hours].
type Coming struct {
	Next15m, Next60m, Next24h int
	ByHour                    [24]int
}

const hourMs = 3600_000

// Summary computes the summary at now in one pass over the held rows (plus a selection for the
// percentiles).
func (c *Core) Summary(now time.Time) Summary {
	nowMs := now.UnixMilli()
	c.expireLeases(nowMs)
	s := Summary{
		AsOf:               now,
		Held:               c.rows.n,
		Invalid:            len(c.invalid),
		Leased:             len(c.leases),
		DuePerSlot:         map[int]int{},
		DuePerIncomingSlot: map[int]int{},
		ByRoute:            map[string]int{},
	}
	type classKey struct {
		cadenceMs int64
		source    schedule.Source
	}
	classes := map[classKey]*Class{}
	routeDue := make([]int, len(c.routes))
	var slotDue [schedule.NumSlots]int
	var abs []int64
	var rel []float64
	var oldest uint32
	haveOldest := false
	c.forEachHeld(func(id uint32, r *rec) {
		if c.slots[r.slot] != SlotOwned {
			s.HeldIncoming++
			if r.due <= nowMs {
				s.DuePerIncomingSlot[int(r.slot)]++
			}
			return
		}
		g := c.groups[r.group]
		ck := classKey{g.cadenceMs, g.source}
		cl := classes[ck]
		if cl == nil {
			cl = &Class{Cadence: time.Duration(g.cadenceMs) * time.Millisecond, Source: g.source}
			classes[ck] = cl
		}
		cl.Held++
		if r.due > nowMs {
			d := r.due - nowMs
			if d <= 24*hourMs {
				s.Coming.ByHour[(d-1)/hourMs]++
				s.Coming.Next24h++
				if d <= hourMs {
					s.Coming.Next60m++
					if d <= 15*60_000 {
						s.Coming.Next15m++
					}
				}
			}
			return
		}
		s.Due++
		cl.Due++
		slotDue[r.slot]++
		routeDue[r.route]++
		late := nowMs - r.due
		abs = append(abs, late)
		rel = append(rel, float64(late)/float64(g.cadenceMs))
		if !haveOldest || c.before(id, oldest) {
			oldest, haveOldest = id, true
		}
	})
	for slot, n := range slotDue {
		if n > 0 {
			s.DuePerSlot[slot] = n
		}
	}
	for ri, n := range routeDue {
		if n > 0 {
			s.ByRoute[c.routes[ri]] = n
		}
	}
	for _, cl := range classes {
		s.Classes = append(s.Classes, *cl)
	}
	slices.SortFunc(s.Classes, func(a, b Class) int {
		if a.Cadence != b.Cadence {
			return cmp.Compare(a.Cadence, b.Cadence)
		}
		return cmp.Compare(a.Source, b.Source)
	})
	if haveOldest {
		r := c.rows.at(oldest)
		s.Oldest = &OldestRow{Key: string(c.keys.get(r.keyOff)), Due: time.UnixMilli(r.due).UTC()}
	}
	if len(abs) > 0 {
		s.Lateness.MaxSeconds = float64(slices.Max(abs)) / 1000
		s.Lateness.P50Seconds = float64(nearestRank(abs, 0.50)) / 1000
		s.Lateness.P99Seconds = float64(nearestRank(abs, 0.99)) / 1000
		s.Lateness.MaxRelative = slices.Max(rel)
		s.Lateness.P50Relative = nearestRank(rel, 0.50)
		s.Lateness.P99Relative = nearestRank(rel, 0.99)
	}
	return s
}

// nearestRank returns the q-quantile of v by nearest rank (v[ceil(q·n)−1] of v sorted). It
// reorders v.
func nearestRank[T cmp.Ordered](v []T, q float64) T {
	k := int(math.Ceil(q*float64(len(v)))) - 1
	k = max(0, min(k, len(v)-1))
	return quickselect(v, k)
}

// quickselect returns the k-th smallest element of v (0-based), reordering v.
func quickselect[T cmp.Ordered](v []T, k int) T {
	lo, hi := 0, len(v)-1
	for lo < hi {
		// median of three as the pivot
		mid := lo + (hi-lo)/2
		if v[mid] < v[lo] {
			v[mid], v[lo] = v[lo], v[mid]
		}
		if v[hi] < v[lo] {
			v[hi], v[lo] = v[lo], v[hi]
		}
		if v[hi] < v[mid] {
			v[hi], v[mid] = v[mid], v[hi]
		}
		p := v[mid]
		i, j := lo, hi
		for i <= j {
			for v[i] < p {
				i++
			}
			for p < v[j] {
				j--
			}
			if i <= j {
				v[i], v[j] = v[j], v[i]
				i++
				j--
			}
		}
		switch {
		case k <= j:
			hi = j
		case k >= i:
			lo = i
		default:
			return v[k]
		}
	}
	return v[k]
}
