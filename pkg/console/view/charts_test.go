package view

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestNiceCeil(t *testing.T) {
	for in, want := range map[float64]float64{0: 1, 1: 1, 3: 5, 7: 10, 10: 10, 11: 20, 199: 200, 201: 500, 67003: 100000} {
		if got := niceCeil(in); got != want {
			t.Errorf("niceCeil(%v) = %v, want %v", in, got, want)
		}
	}
}

func TestComingChart(t *testing.T) {
	c := Coming{WindowSeconds: 3 * 3600, Shards: 1, Of: 1, ByHour: make([]HourBin, 24)}
	for h := range c.ByHour {
		c.ByHour[h] = HourBin{Hour: h, BeyondWindow: h >= 3}
	}
	c.ByHour[0].Rows, c.ByHour[1].Rows, c.ByHour[2].Rows = 100, 50, 0
	ch := comingChart(c)
	if ch.Empty != "" || len(ch.Rects) != 24 {
		t.Fatalf("chart: empty %q, %d bars", ch.Empty, len(ch.Rects))
	}
	full := ch.Rects[0].H
	if ch.Rects[1].H != full/2 || ch.Rects[2].H != 0 {
		t.Errorf("bar heights %v %v %v: not proportional", full, ch.Rects[1].H, ch.Rects[2].H)
	}
	if ch.Rects[2].Class != "bar" || ch.Rects[3].Class != "bar muted" || !strings.Contains(ch.Rects[3].Title, "beyond the window") {
		t.Errorf("bars 2 and 3: %+v %+v", ch.Rects[2], ch.Rects[3])
	}
	edges := 0
	for _, l := range ch.Lines {
		if l.Class == "edge" {
			edges++
			if l.X1 != ch.Rects[3].X-(ch.Rects[3].W/0.8)*0.1 {
				t.Errorf("the window edge is at x=%v, not where hour 3 starts", l.X1)
			}
		}
	}
	if edges != 1 {
		t.Errorf("%d window edges drawn, want 1", edges)
	}
	if ch := comingChart(Coming{Of: 3}); ch.Empty == "" {
		t.Error("no shard answered, yet a chart is drawn")
	}
}

func TestHistoryChartBreaksAtGapsAndMarksInexact(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return now.Add(time.Duration(m) * time.Minute) }
	samples := []Sample{
		{At: at(-50), Due: 10, Exact: true, Known: true},
		{At: at(-49), Due: 12, Exact: true, Known: true},
		// 20 minutes without a sample (the operator was restarting): the line breaks
		{At: at(-29), Due: 30, Exact: false, Known: true},
		{At: at(-28), Due: 0, Known: false}, // never computed: not drawn
		{At: at(-27), Due: 20, Exact: true, Known: true},
	}
	ch := historyChart(samples, now, time.Minute)
	if len(ch.Paths) != 1 {
		t.Fatalf("%d paths", len(ch.Paths))
	}
	if moves := strings.Count(ch.Paths[0].D, "M"); moves != 2 {
		t.Errorf("path %q: %d segments, want 2 (broken at the gap)", ch.Paths[0].D, moves)
	}
	inexact := 0
	for _, d := range ch.Dots {
		if d.Class == "inexact" {
			inexact++
		}
	}
	if inexact != 1 {
		t.Errorf("%d inexact marks, want 1", inexact)
	}
	if ch := historyChart(nil, now, 10*time.Second); !strings.Contains(ch.Empty, "every 10s") {
		t.Errorf("empty history: %q", ch.Empty)
	}
}

func TestClassChartScalesEachColumn(t *testing.T) {
	ch := classChart([]Class{{CadenceSeconds: 3600, Source: "submitted", Due: 10, Held: 1000}, {CadenceSeconds: 86400, Source: "discovered", Due: 5, Held: 100000}})
	// rects: due0, held0, due1, held1
	if len(ch.Rects) != 4 {
		t.Fatalf("%d rects", len(ch.Rects))
	}
	if ch.Rects[0].W != 2*ch.Rects[2].W || ch.Rects[3].W != 100*ch.Rects[1].W {
		t.Errorf("widths %v: due and held not each on its own scale", []float64{ch.Rects[0].W, ch.Rects[1].W, ch.Rects[2].W, ch.Rects[3].W})
	}
	var texts []string
	for _, x := range ch.Texts {
		texts = append(texts, x.Text)
	}
	if s := strings.Join(texts, "|"); !strings.Contains(s, "1h · submitted") || !strings.Contains(s, "1.0%") || !strings.Contains(s, "100,000") {
		t.Errorf("labels %s", s)
	}
}

func TestLateChartSplitsEachClassByBucket(t *testing.T) {
	ch := lateChart([]Class{
		{CadenceSeconds: 3600, Source: "submitted", Due: 10, MaxLateSeconds: 7200, LateBy: []int{5, 0, 0, 5, 0}},
		{CadenceSeconds: 86400, Source: "discovered", Due: 0, Held: 100, LateBy: make([]int, 5)}, // nothing due: no row
	})
	var segs []svgRect
	for _, r := range ch.Rects {
		if strings.HasPrefix(r.Class, "late ") && r.Y > marginTop+10 {
			segs = append(segs, r)
		}
	}
	if len(segs) != 2 || segs[0].Class != "late l0" || segs[1].Class != "late l3" || segs[0].W != segs[1].W || segs[1].X != segs[0].X+segs[0].W {
		t.Fatalf("segments %+v: want two halves, ≤ 0.1 then 1–2 cadences late", segs)
	}
	if !strings.Contains(segs[1].Title, "5 of 10 due rows 1–2 cadences late (50.0%)") {
		t.Errorf("title %q", segs[1].Title)
	}
	if strings.Contains(fmt.Sprint(ch.Texts), "discovered") {
		t.Error("a class with nothing due is drawn")
	}
	if lateChart([]Class{{CadenceSeconds: 60, Due: 0}}).Empty == "" {
		t.Error("nothing due, yet a lateness chart")
	}
}

func TestTimelineChart(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	h := &Handoff{State: "Committed", Events: []Event{{At: now.Add(-70 * time.Second), Kind: "prepare", Label: "prepare"}, {At: now, Kind: "commit", Label: "commit"}}}
	ch := timelineChart(h)
	if len(ch.Dots) != 2 || ch.Dots[0].X >= ch.Dots[1].X || ch.Lines[0].Class != "timeline line-committed" {
		t.Errorf("timeline: dots %+v, line %+v", ch.Dots, ch.Lines)
	}
	one := timelineChart(&Handoff{State: "Committed", Events: []Event{{At: now, Kind: "commit", Label: "first assignment (epoch 1)"}}})
	if len(one.Dots) != 1 || len(one.Lines) != 0 {
		t.Errorf("a single event: dots %+v, lines %+v (want one dot, no span)", one.Dots, one.Lines)
	}
	if timelineChart(nil).Empty == "" {
		t.Error("no handoff, yet a timeline")
	}
}
