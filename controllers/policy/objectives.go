package policy

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/internal/textfmt"
	"github.com/renderqueue/renderqueue/pkg/objective"
)

// Buckets of an objective's history: hours over its window, and 5-minute steps over the last
// 6 hours (the burn rates).
const (
	HistoryHour   = time.Hour
	HistoryStep   = 5 * time.Minute
	HistoryRecent = 6 * time.Hour
)

// ObjectiveHistory is what the operator remembers of the freshness events the shards counted
// (spec.objectives; docs/objectives.md): per objective, the events decided per hour over its
// window and per 5 minutes over the last 6 hours; per shard and objective, the counters last
// taken into it. It is kept as JSON in the ConfigMap <name>-objective-history, so that the
// window's figures survive an operator restart: the shards' counters are cumulative, so the
// events decided since the last write are the difference from the counters stored with it.
type ObjectiveHistory struct {
	Objectives map[string]*ObjectiveRecord `json:"objectives,omitempty"`
	// Shards maps "<shard>/<objective>" to the counters last taken into the history.
	Shards map[string]ShardObjectiveCounters `json:"shards,omitempty"`
}

// ObjectiveRecord is one objective's history.
type ObjectiveRecord struct {
	// Definition is the objective's class and maxLateness as counted: a change starts the
	// record again (the shards start counting again too).
	Definition string `json:"definition"`
	// Since is when the record began.
	Since time.Time `json:"since"`
	// Hours and Steps are [bucket start (Unix seconds), good, late], ascending.
	Hours [][3]int64 `json:"hours,omitempty"`
	Steps [][3]int64 `json:"steps,omitempty"`
}

// ShardObjectiveCounters are a shard's counters of one objective as last taken.
type ShardObjectiveCounters struct {
	Since time.Time `json:"since"`
	Good  uint64    `json:"good"`
	Late  uint64    `json:"late"`
}

// objectiveDefinition is the canonical form of what an objective counts (not its percentile or
// window: those change how the counts are judged, not the counts).
func objectiveDefinition(o rqv1.Objective) string {
	d := func(p *metav1.Duration) string {
		if p == nil {
			return "-"
		}
		return p.Duration.String()
	}
	u := "-"
	if o.Class.Urgent != nil {
		u = strconv.FormatBool(*o.Class.Urgent)
	}
	return fmt.Sprintf("cadence %s..%s source %s urgent %s maxLateness %s", d(o.Class.MinCadence), d(o.Class.MaxCadence),
		cmpOr(o.Class.Source, "-"), u, o.MaxLateness.Duration)
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Observe takes the shards' counters of one poll (reports with a status) into h at now, for the
// objectives of spec; records of objectives no longer in it, or whose definition changed, go, and
// so do the counters of shards the poll did not ask at all (the RenderQueue no longer has them).
// A shard's counter is taken as the difference from what was last taken from it; a counter that
// started again (a keeper process that restarted, a definition that changed: a later since) is
// taken whole when it began after the record did, and otherwise only remembered (a record that
// began after the keeper's counting does not take what came before it). It reports whether h
// changed, and whether it changed in more than its counts: a record begun or gone, a shard's
// counters seen for the first time or started again. Those must be written at once: events
// counted after a counter is first seen are taken as differences from it, so a history written
// later with later counters would miss them.
func (h *ObjectiveHistory) Observe(now time.Time, objs []rqv1.Objective, reports []ShardReport) (changed, structural bool) {
	if h.Objectives == nil {
		h.Objectives = map[string]*ObjectiveRecord{}
	}
	if h.Shards == nil {
		h.Shards = map[string]ShardObjectiveCounters{}
	}
	want := map[string]rqv1.Objective{}
	for _, o := range objs {
		want[o.Name] = o
		def := objectiveDefinition(o)
		if r := h.Objectives[o.Name]; r == nil || r.Definition != def {
			h.Objectives[o.Name] = &ObjectiveRecord{Definition: def, Since: now.UTC()}
			changed, structural = true, true
			for k := range h.Shards {
				if strings.HasSuffix(k, "/"+o.Name) {
					delete(h.Shards, k)
				}
			}
		}
	}
	for name := range h.Objectives {
		if _, ok := want[name]; !ok {
			delete(h.Objectives, name)
			changed, structural = true, true
		}
	}
	polled := map[string]bool{} // the shards the RenderQueue has (reachable or not)
	for _, rep := range reports {
		polled[rep.Name] = true
	}
	for k := range h.Shards {
		i := strings.LastIndexByte(k, '/')
		if _, ok := want[k[i+1:]]; !ok || (len(reports) > 0 && !polled[k[:i]]) {
			// an objective gone, or a shard the RenderQueue no longer has: a keeper that comes
			// back under its name is a new process, whose counters are taken whole
			delete(h.Shards, k)
			changed, structural = true, true
		}
	}
	for _, rep := range reports {
		if rep.Status == nil {
			continue
		}
		if _, err := validateReport(rep.Status); err != nil {
			continue // a status ComputeStatus rejects counts for nothing here either
		}
		for _, oc := range rep.Status.Objectives {
			r := h.Objectives[oc.Name]
			if r == nil {
				continue // not (or no longer) in the spec
			}
			key := rep.Name + "/" + oc.Name
			base, seen := h.Shards[key]
			var good, late uint64
			switch {
			case seen && base.Since.Equal(oc.Since) && oc.Good >= base.Good && oc.Late >= base.Late:
				good, late = oc.Good-base.Good, oc.Late-base.Late
			case !oc.Since.Before(r.Since):
				good, late = oc.Good, oc.Late // counting began after the record did
			}
			if !seen || !base.Since.Equal(oc.Since) || base.Good != oc.Good || base.Late != oc.Late {
				h.Shards[key] = ShardObjectiveCounters{Since: oc.Since.UTC(), Good: oc.Good, Late: oc.Late}
				changed = true
				structural = structural || !seen || !base.Since.Equal(oc.Since)
			}
			if good > 0 || late > 0 {
				r.Hours = addBucket(r.Hours, now.Truncate(HistoryHour).Unix(), good, late)
				r.Steps = addBucket(r.Steps, now.Truncate(HistoryStep).Unix(), good, late)
			}
		}
	}
	for name, r := range h.Objectives {
		window := want[name].WindowDuration()
		n, m := len(r.Hours), len(r.Steps)
		r.Hours = slices.DeleteFunc(r.Hours, func(b [3]int64) bool { return b[0]+int64(HistoryHour/time.Second) <= now.Add(-window).Unix() })
		r.Steps = slices.DeleteFunc(r.Steps, func(b [3]int64) bool { return b[0]+int64(HistoryStep/time.Second) <= now.Add(-HistoryRecent).Unix() })
		if len(r.Hours) != n || len(r.Steps) != m {
			changed = true
		}
	}
	return changed, structural
}

// addBucket adds good and late to the bucket starting at start, appending it when it is new.
func addBucket(bs [][3]int64, start int64, good, late uint64) [][3]int64 {
	if n := len(bs); n > 0 && bs[n-1][0] == start {
		bs[n-1][1] += int64(good)
		bs[n-1][2] += int64(late)
		return bs
	}
	return append(bs, [3]int64{start, int64(good), int64(late)})
}

// sumSince sums the buckets that start at or after from (Unix seconds).
func sumSince(bs [][3]int64, from int64) (good, late int64) {
	for _, b := range bs {
		if b[0] >= from {
			good += b[1]
			late += b[2]
		}
	}
	return good, late
}

// ObjectiveStatuses returns status.objectives from h at now, in the order of objs.
func (h *ObjectiveHistory) ObjectiveStatuses(now time.Time, objs []rqv1.Objective) []rqv1.ObjectiveStatus {
	out := make([]rqv1.ObjectiveStatus, 0, len(objs))
	for _, o := range objs {
		s := rqv1.ObjectiveStatus{Name: o.Name, Window: metav1.Duration{Duration: o.WindowDuration()}}
		r := h.Objectives[o.Name]
		if r == nil {
			out = append(out, s)
			continue
		}
		obj := CountedObjective(o)
		from := now.Add(-o.WindowDuration())
		s.Since = metav1.NewTime(latest(r.Since, from.Truncate(HistoryHour)))
		s.Good, s.Late = sumSince(r.Hours, from.Truncate(HistoryHour).Unix())
		window := objective.Tally{Good: s.Good, Late: s.Late}
		if a, ok := window.Attainment(); ok {
			s.Attainment = objective.Percent(a)
			s.BudgetRemaining = objective.Percent(obj.BudgetRemaining(window))
		}
		burn := func(d time.Duration) string {
			g, l := sumSince(r.Steps, now.Add(-d).Truncate(HistoryStep).Unix())
			if g+l == 0 {
				return ""
			}
			return strconv.FormatFloat(math.Round(obj.BurnRate(objective.Tally{Good: g, Late: l})*100)/100, 'f', -1, 64)
		}
		s.BurnRate1h, s.BurnRate6h = burn(time.Hour), burn(6*time.Hour)
		s.Met = obj.Met(window)
		out = append(out, s)
	}
	return out
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// CountedObjective is spec objective o as pkg/objective judges counts: its percentile (the
// arithmetic of attainment, budget and burn rate is that package's, shared with
// `renderqueue simulate --objectives`). The class is not needed to judge counts and is left out.
func CountedObjective(o rqv1.Objective) objective.Objective {
	p, _ := o.PercentileValue() // validated with the spec
	return objective.Objective{Name: o.Name, Percentile: p, MaxLateness: o.MaxLateness.Duration}
}

// ObjectivesCondition is the ObjectivesMet condition for the statuses: True when every objective
// is met over its window, False naming the ones that are not, Unknown while none has an event.
func ObjectivesCondition(objs []rqv1.Objective, sts []rqv1.ObjectiveStatus) Condition {
	var missed []string
	events := int64(0)
	for i, s := range sts {
		events += s.Good + s.Late
		if !s.Met {
			missed = append(missed, fmt.Sprintf("%s: %s of %s events good over %s, below %s%%", s.Name, s.Attainment,
				textfmt.Thousands(s.Good+s.Late), s.Window.Duration, objs[i].Percentile))
		}
	}
	switch {
	case len(missed) > 0:
		return Condition{Status: metav1.ConditionFalse, Reason: rqv1.ReasonObjectiveMissed, Message: strings.Join(missed, "; ")}
	case events == 0:
		return Condition{Status: metav1.ConditionUnknown, Reason: rqv1.ReasonNoObjectiveEvents,
			Message: "no event of any objective has been decided yet"}
	default:
		return Condition{Status: metav1.ConditionTrue, Reason: rqv1.ReasonObjectivesMet,
			Message: fmt.Sprintf("%d objective(s) met over their windows", len(objs))}
	}
}
