package view

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/renderqueue/renderqueue/internal/textfmt"
	"github.com/renderqueue/renderqueue/pkg/statusview"
)

// num formats an integer with thousands separators: 1234567 → "1,234,567".
func num(n int64) string { return textfmt.Thousands(n) }

// ago says how long before now t was, compactly ("42s ago", "3h20m ago"; "in 5s" for the future).
func ago(t, now time.Time) string {
	d := now.Sub(t).Seconds()
	if d < 0 {
		return "in " + statusview.Seconds(math.Round(-d))
	}
	return statusview.Seconds(math.Round(d)) + " ago"
}

// TemplateFuncs are the helpers the console's templates use to format the view: num, secs,
// clock, ago, stamp, rel, f1, stateTone, handoffTone and more.
func TemplateFuncs() template.FuncMap {
	return template.FuncMap{
		"num": func(v any) string {
			switch n := v.(type) {
			case int:
				return num(int64(n))
			case int32:
				return num(int64(n))
			case int64:
				return num(n)
			default:
				return fmt.Sprint(v)
			}
		},
		"secs":       statusview.Seconds,
		"clock":      clock,
		"ago":        ago,
		"stamp":      func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"rel":        func(f float64) string { return strconv.FormatFloat(f, 'f', 2, 64) },
		"f1":         func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
		"lower":      strings.ToLower,
		"join":       strings.Join,
		"deref":      func(t *time.Time) time.Time { return *t },
		"neg":        func(f *float64) bool { return f != nil && *f < 0 },
		"abs":        math.Abs,
		"deref64":    func(f *float64) float64 { return *f },
		"mod":        func(a, b int) int { return a % b },
		"seconds":    func(ms int64) float64 { return float64(ms) / 1000 },
		"durSeconds": func(d time.Duration) float64 { return d.Seconds() },
		"stateTone":  stateTone,
		"handoffTone": func(state string) string {
			switch state {
			case "Committed":
				return toneOK
			case "RolledBack":
				return toneBad
			default:
				return toneWarn
			}
		},
		"dur": func(a time.Time, b *time.Time) string { return statusview.Seconds(b.Sub(a).Seconds()) },
		"explainForm": func(ns, name, key, root string) ExplainForm {
			return ExplainForm{Namespace: ns, Name: name, Key: key, Root: root}
		},
		"rowTone": RowTone,
	}
}

// ExplainForm is the search box of a queue's page: the queue, the key given, and the page's
// relative path to the console's root.
type ExplainForm struct {
	Namespace, Name, Key, Root string
}

// RowTone is the tone of an explained row's state (shardapi.RowExplanation.State): waiting,
// leased and not due are the shard at work; held back or in an incoming slot, worth a look;
// invalid or not seen, wrong; beyond the window or another shard's, neutral.
func RowTone(state string) string {
	switch state {
	case "waiting", "leased", "notDue":
		return toneOK
	case "heldBack", "incoming":
		return toneWarn
	case "invalid", "notSeen":
		return toneBad
	default:
		return toneUnknown
	}
}

// stateTone is the tone of a shard's state: queued and empty are normal, unready is worth a
// look, unreachable is wrong.
func stateTone(state string) string {
	switch state {
	case "queued", "empty":
		return toneOK
	case "unready":
		return toneWarn
	case "unreachable":
		return toneBad
	default:
		return toneUnknown
	}
}
