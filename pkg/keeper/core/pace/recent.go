package pace

import "time"

// RecentWindow is how far back Recent counts claimed rows.
const RecentWindow = time.Minute

// recentBuckets is Recent's number of one-second buckets.
const recentBuckets = int(RecentWindow / time.Second)

// Recent counts the rows claims handed out over the last RecentWindow, in one-second buckets, for
// a rough claim rate: how fast the shard's due rows are being taken now, whatever the reason
// (workers busy, or the due rows running out). The zero Recent has seen no claim.
type Recent struct {
	// rows[i] counts the rows claimed in second sec[i] (Unix seconds), for the second s with
	// s % recentBuckets == i.
	rows [recentBuckets]int64
	sec  [recentBuckets]int64
	// firstMs is when the first claim that got rows was made; 0 before it.
	firstMs int64
}

// Claimed records got rows handed out by a claim at nowMs.
func (r *Recent) Claimed(nowMs int64, got int) {
	if got <= 0 {
		return
	}
	if r.firstMs == 0 {
		r.firstMs = max(nowMs, 1)
	}
	s := floorDiv(nowMs, 1000)
	i := int(floorMod(s, int64(recentBuckets)))
	if r.sec[i] != s {
		r.sec[i], r.rows[i] = s, 0
	}
	r.rows[i] += int64(got)
}

// Rate returns the rows a second claims handed out in the whole seconds of the RecentWindow
// before nowMs's second — the current second, still under way, is left out: counted whole over
// part of a second it would bias the rate — over the window's length, or over the whole seconds
// since the first claim's second when those are fewer; and that span. It is 0, over a zero span,
// until a whole second has passed since the first claim. The rate lags by up to a second, and its
// resolution is a second's rows over the span.
func (r *Recent) Rate(nowMs int64) (perSecond float64, over time.Duration) {
	if r.firstMs == 0 {
		return 0, 0
	}
	now := floorDiv(nowMs, 1000)
	n := min(now-floorDiv(r.firstMs, 1000), int64(recentBuckets))
	if n <= 0 {
		return 0, 0
	}
	var rows int64
	for i := range r.rows {
		if s := r.sec[i]; s >= now-n && s < now {
			rows += r.rows[i]
		}
	}
	over = time.Duration(n) * time.Second
	return float64(rows) / over.Seconds(), over
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

func floorMod(a, b int64) int64 { return a - floorDiv(a, b)*b }
