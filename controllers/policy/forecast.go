package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// ForecastRefresh is how long status.forecast may keep figures that changed since its AsOf while
// the due count does not change: a still queue, whose rows come due as time passes, then rewrites
// its status once a minute, not on every poll. While Due changes the forecast is refreshed with
// it, and a change of exactness always at once.
const ForecastRefresh = time.Minute

// ForecastHorizons are status.forecast's horizons, shortest first, by name.
var ForecastHorizons = []struct {
	Name string
	D    time.Duration
}{{"15m", 15 * time.Minute}, {"1h", time.Hour}, {"24h", 24 * time.Hour}}

// ForecastInputs is what Forecast computes from.
type ForecastInputs struct {
	// Now is the time of the poll.
	Now time.Time
	// Due and DueExact are the poll's due sum and whether it is exact; DueChanged whether either
	// changed in this poll.
	Due        int64
	DueExact   bool
	DueChanged bool
	// Handoff is true while a slot handoff is in progress.
	Handoff bool
	// NotAdopted names the shards whose reported owned slots are not the committed assignment's.
	NotAdopted []string
	// Reports are the shards' valid reports of the poll (Status set).
	Reports []ShardReport
}

// Forecast returns status.forecast for a poll, given the one in the status (prev, nil when none):
// per horizon, Due plus the rows the shards report coming due within it. A horizon's figure is
// exact when the due count is, no handoff is in progress, every shard serves the committed
// assignment (so their owned slots partition the slots), and every shard holds every row due
// within the horizon. It returns prev itself when the figures and their exactness are prev's, or
// when only the figures changed, the due count did not and prev is younger than ForecastRefresh
// (the status is then not rewritten for it).
func Forecast(prev *rqv1.ForecastStatus, in ForecastInputs) *rqv1.ForecastStatus {
	next := &rqv1.ForecastStatus{AsOf: metav1.NewTime(in.Now)}
	notAdopted := slices.Sorted(slices.Values(in.NotAdopted))
	for _, h := range ForecastHorizons {
		f := rqv1.ForecastHorizon{Horizon: h.Name, Due: in.Due}
		var short []string
		for _, rep := range in.Reports {
			f.Due += int64(comingWithin(rep.Status.Coming, h.D))
			if !holdsHorizon(rep.Status, h.D) {
				short = append(short, rep.Name)
			}
		}
		switch {
		case !in.DueExact:
			f.Reason = "the due count is not exact"
		case in.Handoff:
			f.Reason = "a slot handoff is in progress: the shards' counts of the moving slots' coming rows may overlap or miss"
		case len(notAdopted) > 0:
			f.Reason = fmt.Sprintf("shard(s) %s do not serve the committed assignment yet", strings.Join(notAdopted, ", "))
		case len(short) > 0:
			f.Reason = fmt.Sprintf("shard(s) %s do not hold all their rows due within %s (the edge of the window is nearer)", strings.Join(short, ", "), h.Name)
		default:
			f.Exact = true
		}
		next.Horizons = append(next.Horizons, f)
	}
	if prev == nil || len(prev.Horizons) != len(next.Horizons) {
		return next
	}
	same, sameExactness := true, true
	for i, f := range next.Horizons {
		p := prev.Horizons[i]
		if p.Horizon != f.Horizon || p.Exact != f.Exact || p.Reason != f.Reason {
			sameExactness = false
		}
		if p.Due != f.Due {
			same = false
		}
	}
	if sameExactness && (same || (!in.DueChanged && in.Now.Sub(prev.AsOf.Time) < ForecastRefresh)) {
		return prev
	}
	return next
}

// comingWithin is a shard's count of held rows coming due within d (one of ForecastHorizons).
func comingWithin(c shardapi.Coming, d time.Duration) int {
	switch d {
	case 15 * time.Minute:
		return c.Next15m
	case time.Hour:
		return c.Next60m
	default:
		return c.Next24h
	}
}

// holdsHorizon reports whether a shard holds every owned row due within d of its report: its
// edge is at least d ahead, or it has no edge (a window of 0 holds every row) and vouches for its
// count; and a window shorter than 24 h has not cut the 24 h count.
func holdsHorizon(st *shardapi.Status, d time.Duration) bool {
	if st.Edge == nil {
		return st.Exact
	}
	if d >= 24*time.Hour && st.Coming.CutAtWindow {
		return false
	}
	return !st.Edge.Before(st.AsOf.Add(d))
}
