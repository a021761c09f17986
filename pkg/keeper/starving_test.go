package keeper

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// starving lists the status's classes as cadence/source:waitingSince, starving ones marked "!".
func starving(st shardapi.Status) string {
	var out []string
	for _, c := range st.Classes {
		since := "-"
		if c.WaitingSince != nil {
			since = c.WaitingSince.Sub(t0).String()
		}
		mark := ""
		if c.Starving(st.AsOf) {
			mark = "!"
		}
		out = append(out, fmt.Sprintf("%v/%s:%s%s", c.CadenceDuration(), c.Source, since, mark))
	}
	return strings.Join(out, " ")
}

// TestStatusSaysSinceWhenAClassWaits: /v1/status carries, per class, since when it has had due
// rows and no render (waitingSince, relative to t0 below), and a class that has waited longer
// than its cadence is starving until a claim serves it.
func TestStatusSaysSinceWhenAClassWaits(t *testing.T) {
	e := newShardEnv(t, allSlots(24*time.Hour))
	e.upsert(srow("h1", t0.Add(-30*time.Minute), time.Hour), srow("h2", t0.Add(-10*time.Minute), time.Hour),
		srow("d", t0.Add(-2*time.Hour), 96*time.Hour), srow("n", t0.Add(time.Hour), 24*time.Hour))
	e.sh.Walk(e.ctx, true)
	steps := []struct {
		name  string
		at    time.Duration // after t0
		claim string        // the key a claim of one row at that time must hand out, if any
		want  string
	}{
		{"loaded: each class since its most overdue row came due", 0, "",
			"1h0m0s/discovered:-30m0s 24h0m0s/discovered:- 96h0m0s/discovered:-2h0m0s"},
		{"an hour and a minute without a render: the hourly class is starving", 31 * time.Minute, "",
			"1h0m0s/discovered:-30m0s! 24h0m0s/discovered:- 96h0m0s/discovered:-2h0m0s"},
		{"a claim serves it: it waits from the claim", 31 * time.Minute, "h1",
			"1h0m0s/discovered:31m0s 24h0m0s/discovered:- 96h0m0s/discovered:-2h0m0s"},
	}
	for _, s := range steps {
		e.clock.Set(t0.Add(s.at))
		if s.claim != "" {
			got, err := e.sh.Claim(e.clock.Now(), 1, time.Hour)
			if err != nil || len(got) != 1 || got[0].Key != s.claim {
				t.Fatalf("%s: claimed %v, %v; want %s", s.name, got, err, s.claim)
			}
		}
		if got := starving(e.status()); got != s.want {
			t.Errorf("%s:\n got %s\nwant %s", s.name, got, s.want)
		}
	}
}
