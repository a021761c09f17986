// Package statusview prints keeper shards' GET /v1/status (shardapi.Status, read with
// pkg/client) for people: one shard in full — queue state, due and exactness, the edge, rows held,
// lateness, due by class and route, what is coming, and the last verification walk
// (`renderqueue status --url`) — or a whole RenderQueue as a per-shard table with the
// coming-due-by-hour profile as a text chart (`renderqueue status --renderqueue`, the
// `kubectl renderqueue` plugin), its shards read through the API server's Pod proxy.
package statusview

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/renderqueue/renderqueue/internal/textfmt"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// Write prints st for people.
func Write(w io.Writer, st shardapi.Status) error {
	p := &printer{w: w}
	p.f("shard %s — status %s, exact %s, complete %s (as of %s)\n", orDash(st.Shard), strings.ToUpper(orDash(st.Status)),
		yesNo(st.Exact), yesNo(st.Complete), stamp(st.AsOf))
	if st.Error != "" {
		p.f("  ERROR: %s\n", st.Error)
	}
	window := "0 (holds every row)"
	if st.Window > 0 {
		window = Seconds(st.Window)
	}
	p.f("  window %s, verify interval %s", window, Seconds(st.VerifyInterval))
	switch r := st.VerifyWalkRate; {
	case r == nil: // a keeper that predates the field
	case *r == 0:
		p.f(" (walks unpaced)")
	default:
		p.f(" (walks at %s rows/s)", num(*r))
	}
	p.f("; membership epoch %d, owned %s", st.Membership.Epoch, orDash(st.Membership.Owned))
	if st.Membership.Incoming != "" {
		p.f(", incoming %s", st.Membership.Incoming)
	}
	p.f("\n")
	switch {
	case st.Edge == nil && st.Window == 0 && st.LastWalk != nil && st.LastWalk.FinishedAt != nil:
		p.f("  edge      unbounded (window 0)\n")
	case st.Edge == nil:
		p.f("  edge      none yet (no walk finished)\n")
	default:
		p.f("  edge      %s", stamp(*st.Edge))
		if st.EdgeAheadSeconds != nil {
			if a := *st.EdgeAheadSeconds; a >= 0 {
				p.f(" (%s ahead)", Seconds(a))
			} else {
				p.f(" (LAGGING: %s behind now)", Seconds(-a))
			}
		}
		p.f("\n")
	}
	if g := st.Gap; g != nil {
		p.f("  gap       since %s", stamp(g.Since))
		if g.Resumed != nil {
			p.f(", resumed %s", stamp(*g.Resumed))
		} else {
			p.f(", not resumed")
		}
		if g.Reason != "" {
			p.f(": %s", g.Reason)
		}
		p.f("\n")
	}
	p.f("  rows      held %s, owned not held %s", num(st.Rows.Held), num(st.Rows.OwnedNotHeld))
	if st.Rows.OwnedNotHeldAsOf != nil {
		p.f(" (as of %s)", stamp(*st.Rows.OwnedNotHeldAsOf))
	}
	p.f(", invalid %s\n", num(st.Rows.Invalid))
	p.f("  due       %s (leased %s)\n", num(st.Due), num(st.Leased))
	l := st.Lateness
	p.f("  lateness  p50 %s, p99 %s, max %s (relative to cadence: p50 %.2f, p99 %.2f, max %.2f)\n",
		Seconds(l.P50Seconds), Seconds(l.P99Seconds), Seconds(l.MaxSeconds), l.P50Relative, l.P99Relative, l.MaxRelative)
	if o := st.Oldest; o != nil {
		p.f("  oldest    due %s (%s ago)\n", stamp(o.Due), Seconds(st.AsOf.Sub(o.Due).Seconds()))
	}
	if len(st.Classes) > 0 {
		classes := append([]shardapi.Class(nil), st.Classes...)
		sort.Slice(classes, func(i, j int) bool {
			if classes[i].Cadence != classes[j].Cadence {
				return classes[i].Cadence < classes[j].Cadence
			}
			return classes[i].Source < classes[j].Source
		})
		p.f("  due by class (≤0.1c … >2c: due rows by how many cadences late):\n")
		var tb strings.Builder
		tw := tabwriter.NewWriter(&tb, 0, 0, 2, ' ', tabwriter.AlignRight)
		_, _ = fmt.Fprintf(tw, "cadence\tsource\tdue\theld\tmax late\t≤0.1c\t≤0.5c\t≤1c\t≤2c\t>2c\t\n")
		for _, c := range classes {
			maxLate := "–" // a shard older than the lateness columns
			if c.LateBy != nil {
				maxLate = Seconds(c.MaxLateSeconds)
			}
			_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t", Seconds(c.Cadence), c.Source, num(c.Due), num(c.Held), maxLate)
			for i := range shardapi.LateBuckets {
				n := "–"
				if i < len(c.LateBy) {
					n = num(c.LateBy[i])
				}
				_, _ = fmt.Fprintf(tw, "%s\t", n)
			}
			_, _ = fmt.Fprintf(tw, "\n")
		}
		_ = tw.Flush() // a strings.Builder does not fail
		for _, line := range strings.SplitAfter(tb.String(), "\n") {
			if line != "" {
				p.f("  %s", line)
			}
		}
		for _, c := range classes {
			if c.Starving(st.AsOf) {
				p.f("  STARVING  %s/%s: due rows and no render for %s (since %s), longer than its cadence\n",
					Seconds(c.Cadence), c.Source, Seconds(c.Waiting(st.AsOf).Seconds()), stamp(*c.WaitingSince))
			}
		}
	}
	if len(st.ByRoute) > 0 {
		routes := make([]string, 0, len(st.ByRoute))
		for r := range st.ByRoute {
			routes = append(routes, r)
		}
		sort.Slice(routes, func(i, j int) bool {
			if a, b := st.ByRoute[routes[i]], st.ByRoute[routes[j]]; a != b {
				return a > b
			}
			return routes[i] < routes[j]
		})
		parts := make([]string, len(routes))
		for i, r := range routes {
			name := r
			if name == "" {
				name = `""`
			}
			parts[i] = name + " " + num(st.ByRoute[r])
		}
		p.f("  due by route: %s\n", strings.Join(parts, ", "))
	}
	c := st.Coming
	p.f("  coming    next 15m %s, next 60m %s, next 24h %s", num(c.Next15m), num(c.Next60m), num(c.Next24h))
	if c.CutAtWindow {
		p.f(" (cut at the window)")
	}
	p.f("\n")
	if wk := st.LastWalk; wk != nil {
		state := "finished"
		switch {
		case wk.Failed:
			state = "FAILED"
		case wk.Partial:
			state = "PARTIAL"
		case wk.FinishedAt == nil:
			state = "unfinished"
		}
		p.f("  last walk %s, started %s", state, stamp(wk.StartedAt))
		if wk.FinishedAt != nil {
			p.f(", took %s", Seconds(wk.FinishedAt.Sub(wk.StartedAt).Seconds()))
		}
		p.f(": scanned %s, admitted %s, repaired %s, invalid %s, unread segments %d\n",
			num(wk.Scanned), num(wk.Admitted), num(wk.Repaired), num(wk.Invalid), wk.UnreadSegments)
		if wk.Error != "" {
			p.f("            error: %s\n", wk.Error)
		}
	} else {
		p.f("  last walk none yet\n")
	}
	if st.WalkingSince != nil {
		p.f("  walking   since %s\n", stamp(*st.WalkingSince))
	}
	return p.err
}

type printer struct {
	w   io.Writer
	err error
}

func (p *printer) Write(b []byte) (int, error) {
	if p.err != nil {
		return 0, p.err
	}
	n, err := p.w.Write(b)
	p.err = err
	return n, err
}

func (p *printer) f(format string, args ...any) { _, _ = fmt.Fprintf(p, format, args...) }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// Seconds formats a duration in seconds compactly: 0s, 850ms, 42s, 12m5s, 10m, 3h20m, 1h, 4d, 4d6h.
func Seconds(s float64) string {
	if math.IsNaN(s) || math.IsInf(s, 0) {
		return fmt.Sprint(s)
	}
	neg := s < 0
	s = math.Abs(s)
	var out string
	switch {
	case s == 0:
		out = "0s"
	case s < 1:
		out = strconv.FormatFloat(s*1000, 'f', 0, 64) + "ms"
	case s < 60:
		out = strconv.FormatFloat(s, 'f', 1, 64) + "s"
		out = strings.Replace(out, ".0s", "s", 1)
	case s < 3600:
		m := int64(s) / 60
		out = fmt.Sprintf("%dm%ds", m, int64(s)%60)
	case s < 48*3600:
		m := int64(math.Round(s / 60))
		out = fmt.Sprintf("%dh%dm", m/60, m%60)
	default:
		h := int64(math.Round(s / 3600))
		out = fmt.Sprintf("%dd%dh", h/24, h%24)
	}
	for _, zero := range []string{"m0s", "h0m", "d0h"} {
		if strings.HasSuffix(out, zero) {
			out = out[:len(out)-2]
		}
	}
	if neg {
		return "-" + out
	}
	return out
}

// num formats an integer with thousands separators.
func num(n int) string { return textfmt.Thousands(int64(n)) }
