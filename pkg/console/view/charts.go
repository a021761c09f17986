package view

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/statusview"
)

// The charts are computed here as plain geometry (pure functions of the view) and drawn as inline
// SVG by one template ("chart" in pkg/console/templates/fragments.html): no JavaScript, nothing
// fetched.

// svgRect is a rectangle (a bar, a slot run).
type svgRect struct {
	X, Y, W, H float64
	Class      string
	Title      string
}

// svgText is a label.
type svgText struct {
	X, Y   float64
	Text   string
	Anchor string // start, middle, end
	Class  string
}

// svgLine is a straight line (an axis, a grid line, a marker).
type svgLine struct {
	X1, Y1, X2, Y2 float64
	Class          string
}

// svgDot is a point with a tooltip.
type svgDot struct {
	X, Y, R float64
	Class   string
	Title   string
}

// svgPath is a polyline.
type svgPath struct {
	D     string
	Class string
}

// Chart is one SVG picture: its size, what is drawn, and a text alternative.
type Chart struct {
	W, H  float64
	Label string
	Rects []svgRect
	Lines []svgLine
	Paths []svgPath
	Dots  []svgDot
	Texts []svgText
	// Empty, when set, is shown instead of a picture (nothing to draw, and why).
	Empty string
}

// Chart layout: width and margins (left for y labels, bottom for x labels).
const (
	chartW      = 720.0
	marginLeft  = 64.0
	marginRight = 16.0
	marginTop   = 12.0
	marginBot   = 28.0
)

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (at least 1).
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// yAxis adds grid lines and labels at 0, max/2 and max to c, for a plot from top to bottom.
func yAxis(c *Chart, maxV, top, bottom float64) {
	for _, f := range []float64{0, 0.5, 1} {
		y := bottom - f*(bottom-top)
		c.Lines = append(c.Lines, svgLine{X1: marginLeft, Y1: y, X2: c.W - marginRight, Y2: y, Class: "grid"})
		c.Texts = append(c.Texts, svgText{X: marginLeft - 6, Y: y + 4, Text: num(int64(math.Round(f * maxV))), Anchor: "end", Class: "axis"})
	}
}

// comingChart is the bar chart of rows coming due by hour over the next 24 hours, the hours past
// the window drawn muted (the shards hold nothing there).
func comingChart(c Coming) Chart {
	ch := Chart{W: chartW, H: 220, Label: "Held rows coming due by hour over the next 24 hours"}
	if c.Shards == 0 {
		ch.Empty = "No shard answered: nothing to count."
		return ch
	}
	top, bottom := marginTop, ch.H-marginBot
	maxRows := 0
	for _, b := range c.ByHour {
		maxRows = max(maxRows, b.Rows)
	}
	maxV := niceCeil(float64(maxRows))
	yAxis(&ch, maxV, top, bottom)
	pw := ch.W - marginLeft - marginRight
	slot := pw / float64(len(c.ByHour))
	edgeDrawn := false
	for i, b := range c.ByHour {
		x := marginLeft + float64(i)*slot
		h := float64(b.Rows) / maxV * (bottom - top)
		class, title := "bar", fmt.Sprintf("+%dh to +%dh: %s rows held come due", b.Hour, b.Hour+1, num(int64(b.Rows)))
		if b.BeyondWindow {
			class, title = "bar muted", fmt.Sprintf("+%dh to +%dh: beyond the window, not held", b.Hour, b.Hour+1)
			if !edgeDrawn {
				edgeDrawn = true
				ch.Lines = append(ch.Lines, svgLine{X1: x, Y1: top, X2: x, Y2: bottom, Class: "edge"})
				ch.Texts = append(ch.Texts, svgText{X: x + 4, Y: top + 12, Text: "window " + statusview.Seconds(c.WindowSeconds), Anchor: "start", Class: "note"})
			}
		}
		ch.Rects = append(ch.Rects, svgRect{X: x + slot*0.1, Y: bottom - h, W: slot * 0.8, H: h, Class: class, Title: title})
		if b.Hour%3 == 0 {
			ch.Texts = append(ch.Texts, svgText{X: x + slot/2, Y: ch.H - 10, Text: fmt.Sprintf("+%dh", b.Hour), Anchor: "middle", Class: "axis"})
		}
	}
	return ch
}

// historyChart is status.due over the last hour: a line through the samples, inexact samples
// (a lower bound) marked.
func historyChart(samples []Sample, now time.Time, interval time.Duration) Chart {
	ch := Chart{W: chartW, H: 200, Label: "status.due over the last hour"}
	var known []Sample
	for _, s := range samples {
		if s.Known {
			known = append(known, s)
		}
	}
	if len(known) == 0 {
		ch.Empty = fmt.Sprintf("No samples yet: the console reads status.due every %s and keeps the last hour in memory.", interval)
		return ch
	}
	top, bottom := marginTop, ch.H-marginBot
	var maxDue int64
	for _, s := range known {
		maxDue = max(maxDue, s.Due)
	}
	maxV := niceCeil(float64(maxDue))
	yAxis(&ch, maxV, top, bottom)
	pw := ch.W - marginLeft - marginRight
	start := now.Add(-HistorySpan)
	xOf := func(t time.Time) float64 {
		return marginLeft + pw*float64(t.Sub(start))/float64(HistorySpan)
	}
	yOf := func(v int64) float64 { return bottom - float64(v)/maxV*(bottom-top) }
	for m := 0; m <= 60; m += 15 {
		label := fmt.Sprintf("-%dm", 60-m)
		if m == 60 {
			label = "now"
		}
		ch.Texts = append(ch.Texts, svgText{X: xOf(start.Add(time.Duration(m) * time.Minute)), Y: ch.H - 10, Text: label, Anchor: "middle", Class: "axis"})
	}
	var d strings.Builder
	var prev time.Time
	for i, s := range known {
		x, y := xOf(s.At), yOf(s.Due)
		// A missed sample (more than 2.5 intervals between two) breaks the line.
		if i == 0 || s.At.Sub(prev) > interval*5/2 {
			fmt.Fprintf(&d, "M%.1f %.1f", x, y)
		} else {
			fmt.Fprintf(&d, " L%.1f %.1f", x, y)
		}
		prev = s.At
		if !s.Exact {
			ch.Dots = append(ch.Dots, svgDot{X: x, Y: y, R: 3, Class: "inexact",
				Title: fmt.Sprintf("%s: at least %s (inexact)", clock(s.At), num(s.Due))})
		}
	}
	ch.Paths = append(ch.Paths, svgPath{D: d.String(), Class: "line"})
	last := known[len(known)-1]
	title := fmt.Sprintf("%s: %s", clock(last.At), num(last.Due))
	if !last.Exact {
		title += " (inexact)"
	}
	ch.Dots = append(ch.Dots, svgDot{X: xOf(last.At), Y: yOf(last.Due), R: 4, Class: "last", Title: title})
	return ch
}

// classChart draws one row per (cadence, source) class: the due rows (dark, on the scale of the
// largest due count) and the held rows (light, on the scale of the largest held count) side by
// side, then the share of the held rows that is due. Two scales, because due rows are usually
// a small fraction of those held.
func classChart(classes []Class) Chart {
	const rowH, labelW, barW, gap = 26.0, 150.0, 190.0, 70.0
	top := marginTop + 14
	ch := Chart{W: chartW, H: top + rowH*float64(len(classes)) + 8, Label: "Due and held rows by class"}
	if len(classes) == 0 {
		ch.Empty = "No class reported: no shard answered, or no rows are held."
		return ch
	}
	maxDue, maxHeld := 0, 0
	for _, c := range classes {
		maxDue, maxHeld = max(maxDue, c.Due), max(maxHeld, c.Held)
	}
	dueX, heldX := labelW, labelW+barW+gap
	shareX := heldX + barW + gap
	ch.Texts = append(ch.Texts,
		svgText{X: dueX, Y: top - 6, Text: "due", Anchor: "start", Class: "axis"},
		svgText{X: heldX, Y: top - 6, Text: "held", Anchor: "start", Class: "axis"},
		svgText{X: shareX + 40, Y: top - 6, Text: "due ÷ held", Anchor: "end", Class: "axis"})
	for i, c := range classes {
		y := top + float64(i)*rowH
		name := statusview.Seconds(c.CadenceSeconds) + " · " + c.Source
		ch.Texts = append(ch.Texts, svgText{X: labelW - 10, Y: y + 15, Text: name, Anchor: "end", Class: "label"})
		dw := 0.0
		if maxDue > 0 {
			dw = float64(c.Due) / float64(maxDue) * barW
		}
		hw := 0.0
		if maxHeld > 0 {
			hw = float64(c.Held) / float64(maxHeld) * barW
		}
		ch.Rects = append(ch.Rects,
			svgRect{X: dueX, Y: y + 4, W: dw, H: 15, Class: "bar due", Title: fmt.Sprintf("%s: %s rows due", name, num(int64(c.Due)))},
			svgRect{X: heldX, Y: y + 4, W: hw, H: 15, Class: "bar held", Title: fmt.Sprintf("%s: %s rows held", name, num(int64(c.Held)))})
		ch.Texts = append(ch.Texts,
			svgText{X: dueX + dw + 6, Y: y + 16, Text: num(int64(c.Due)), Anchor: "start", Class: "label"},
			svgText{X: heldX + hw + 6, Y: y + 16, Text: num(int64(c.Held)), Anchor: "start", Class: "label"})
		share := "—"
		if c.Held > 0 {
			share = fmt.Sprintf("%.1f%%", 100*float64(c.Due)/float64(c.Held))
		}
		ch.Texts = append(ch.Texts, svgText{X: shareX + 40, Y: y + 16, Text: share, Anchor: "end", Class: "label"})
	}
	return ch
}

// lateNames names the buckets of Class.LateBy (cadences late).
var lateNames = [shardapi.LateBuckets]string{"≤ 0.1", "0.1–0.5", "0.5–1", "1–2", "> 2"}

// lateChart draws one row per class with due rows: a bar of the class's due rows split by how
// many cadences late they are (shares of the class's due rows, most overdue on the right), and
// the most overdue row's lateness. Rows of shards that did not report lateness are drawn as an
// "unknown" segment, so the bar never claims more than it knows.
func lateChart(classes []Class) Chart {
	const rowH, labelW, barW = 26.0, 150.0, 400.0
	top := marginTop + 30
	var shown []Class
	for _, c := range classes {
		if c.Due > 0 {
			shown = append(shown, c)
		}
	}
	ch := Chart{W: chartW, H: top + rowH*float64(len(shown)) + 8, Label: "Due rows by class and by how many cadences late"}
	if len(shown) == 0 {
		ch.Empty = "No class has due rows: nothing is late."
		return ch
	}
	// legend: one key per bucket, then unknown
	x := labelW
	for i, name := range lateNames {
		ch.Rects = append(ch.Rects, svgRect{X: x, Y: marginTop, W: 10, H: 10, Class: fmt.Sprintf("late l%d", i), Title: name + " cadences late"})
		ch.Texts = append(ch.Texts, svgText{X: x + 14, Y: marginTop + 9, Text: name, Anchor: "start", Class: "axis"})
		x += 74
	}
	ch.Texts = append(ch.Texts, svgText{X: x, Y: marginTop + 9, Text: "cadences late", Anchor: "start", Class: "axis"},
		svgText{X: labelW + barW + 90, Y: top - 6, Text: "max late", Anchor: "end", Class: "axis"})
	for i, c := range shown {
		y := top + float64(i)*rowH
		name := statusview.Seconds(c.CadenceSeconds) + " · " + c.Source
		ch.Texts = append(ch.Texts, svgText{X: labelW - 10, Y: y + 15, Text: name, Anchor: "end", Class: "label"})
		x := labelW
		seg := func(n int, class, what string) {
			if n <= 0 {
				return
			}
			w := float64(n) / float64(c.Due) * barW
			ch.Rects = append(ch.Rects, svgRect{X: x, Y: y + 4, W: w, H: 15, Class: class,
				Title: fmt.Sprintf("%s: %s of %s due rows %s (%.1f%%)", name, num(int64(n)), num(int64(c.Due)), what, 100*float64(n)/float64(c.Due))})
			x += w
		}
		for b, n := range c.LateBy {
			if b < len(lateNames) {
				seg(n, fmt.Sprintf("late l%d", b), lateNames[b]+" cadences late")
			}
		}
		seg(c.LateUnknown, "late unknown", "on shards that do not report lateness")
		maxLate := statusview.Seconds(c.MaxLateSeconds)
		if c.LateUnknown > 0 {
			maxLate = "≥ " + maxLate
		}
		ch.Texts = append(ch.Texts, svgText{X: labelW + barW + 90, Y: y + 16, Text: maxLate, Anchor: "end", Class: "label"})
	}
	return ch
}

// slotStrip draws the 1024 slots left to right, coloured by owner; during a handoff a second
// strip shows the incoming slots. colour maps a shard to its colour index.
func slotStrip(m Membership, colour map[string]int) Chart {
	const stripH = 22.0
	ch := Chart{W: chartW, H: marginTop + stripH + 22, Label: "Slot ownership, slots 0 to 1023"}
	if len(m.Assignment) == 0 {
		ch.Empty = "No assignment yet."
		return ch
	}
	rows := [][]SlotOwner{m.Assignment}
	names := []string{"owned"}
	if len(m.Incoming) > 0 {
		rows = append(rows, m.Incoming)
		names = append(names, "incoming")
		ch.H += stripH + 6
	}
	pw := ch.W - marginLeft - marginRight
	for r, owners := range rows {
		y := marginTop + float64(r)*(stripH+6)
		ch.Texts = append(ch.Texts, svgText{X: marginLeft - 6, Y: y + 15, Text: names[r], Anchor: "end", Class: "axis"})
		ch.Rects = append(ch.Rects, svgRect{X: marginLeft, Y: y, W: pw, H: stripH, Class: "slots-empty", Title: "no owner"})
		for _, o := range owners {
			for _, run := range o.Runs {
				class := fmt.Sprintf("slot c%d", colour[o.Shard]%8)
				if r == 1 {
					class += " incoming"
				}
				ch.Rects = append(ch.Rects, svgRect{
					X: marginLeft + pw*float64(run.First)/schedule.NumSlots, Y: y,
					W: pw * float64(run.Len()) / schedule.NumSlots, H: stripH, Class: class,
					Title: fmt.Sprintf("%s: slots %s (%d)", o.Shard, run, run.Len()),
				})
			}
		}
	}
	bottom := ch.H - 8
	for _, s := range []int{0, 256, 512, 768, 1023} {
		ch.Texts = append(ch.Texts, svgText{X: marginLeft + pw*float64(s)/schedule.NumSlots, Y: bottom, Text: fmt.Sprint(s), Anchor: "middle", Class: "axis"})
	}
	return ch
}

// timelineChart draws the latest handoff's events on a time axis: prepare, then commit or
// rollback (or, while preparing, now and the rollback deadline).
func timelineChart(h *Handoff) Chart {
	ch := Chart{W: chartW, H: 112, Label: "The latest handoff"}
	if h == nil || len(h.Events) == 0 {
		ch.Empty = "No handoff recorded."
		return ch
	}
	t0, t1 := h.Events[0].At, h.Events[0].At
	for _, e := range h.Events {
		if e.At.Before(t0) {
			t0 = e.At
		}
		if e.At.After(t1) {
			t1 = e.At
		}
	}
	span := t1.Sub(t0)
	if span < time.Second {
		span = time.Second
	}
	left, right := marginLeft+40, ch.W-marginRight-90
	xOf := func(t time.Time) float64 { return left + (right-left)*float64(t.Sub(t0))/float64(span) }
	axisY := 52.0
	if len(h.Events) == 1 {
		// One point in time (the first assignment): no span to draw.
		xOf = func(time.Time) float64 { return left }
	} else {
		outcome := "line-" + strings.ToLower(h.State)
		ch.Lines = append(ch.Lines, svgLine{X1: left, Y1: axisY, X2: right, Y2: axisY, Class: "timeline " + outcome})
	}
	for i, e := range h.Events {
		x := xOf(e.At)
		ch.Dots = append(ch.Dots, svgDot{X: x, Y: axisY, R: 6, Class: "event " + e.Kind, Title: e.Label + " at " + e.At.UTC().Format(time.RFC3339)})
		// Labels above the axis and times below, on two alternating rows, so that events close
		// in time do not overwrite each other.
		row := float64(i % 2)
		labelY, timeY := axisY-16-16*row, axisY+22+15*row
		ch.Texts = append(ch.Texts,
			svgText{X: x, Y: labelY, Text: e.Label, Anchor: "middle", Class: "label"},
			svgText{X: x, Y: timeY, Text: clock(e.At), Anchor: "middle", Class: "axis"})
	}
	if len(h.Events) > 1 {
		ch.Texts = append(ch.Texts, svgText{X: right + 10, Y: axisY + 4, Text: statusview.Seconds(t1.Sub(t0).Seconds()), Anchor: "start", Class: "note"})
	}
	return ch
}
