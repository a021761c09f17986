package view

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/statusview"
)

// Tones of badges and cells: how a value should be read at a glance.
const (
	toneOK      = "ok"      // as it should be
	toneWarn    = "warn"    // changing, or worth a look
	toneBad     = "bad"     // wrong: a number is not true, a shard cannot be asked
	toneUnknown = "unknown" // not known yet
)

// Condition is one status condition of a RenderQueue, with the tone it is shown in.
type Condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// Since is the condition's lastTransitionTime.
	Since time.Time `json:"since"`
	// Stale is true when the condition was computed for an older generation of the spec.
	Stale bool   `json:"stale"`
	Tone  string `json:"tone"`
}

// QueueSummary is one RenderQueue on the queues page (GET api/v1/queues).
type QueueSummary struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Shards is spec.shards; CurrentShards and ReadyShards come from the status.
	Shards        int32 `json:"shards"`
	CurrentShards int32 `json:"currentShards"`
	ReadyShards   int32 `json:"readyShards"`
	// Due is status.due: the true count when DueExact, a lower bound otherwise.
	Due      int64 `json:"due"`
	DueExact bool  `json:"dueExact"`
	// DueAsOf is status.dueAsOf; nil when the operator has never computed the status (Due is
	// then meaningless and shown as unknown).
	DueAsOf *time.Time `json:"dueAsOf"`
	// Phase is the membership phase: Preparing while a handoff is, Settled otherwise ("" before
	// the first assignment).
	Phase      string      `json:"phase"`
	Conditions []Condition `json:"conditions"`
}

// DueKnown reports whether the operator has computed the due count at all.
func (q QueueSummary) DueKnown() bool { return q.DueAsOf != nil }

// Walk is a shard's last verification walk.
type Walk struct {
	StartedAt      time.Time  `json:"startedAt"`
	FinishedAt     *time.Time `json:"finishedAt"`
	Partial        bool       `json:"partial"`
	Failed         bool       `json:"failed"`
	UnreadSegments int        `json:"unreadSegments"`
}

// Shard is one row of the per-shard table. Reachable says whether the values come from the
// shard's own /v1/status (asked when the page was built); when it is false Error says why, and
// the values are the operator's last poll (status.shards), shown as such.
type Shard struct {
	Name      string `json:"name"`
	Slots     string `json:"slots"`
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"`
	// AsOf is the shard's own asOf (reachable) or nil.
	AsOf *time.Time `json:"asOf"`
	// State is queued, empty or unready (the shard's word), or unreachable.
	State string `json:"state"`
	Exact bool   `json:"exact"`
	// Inexact lists why the shard does not vouch for its count, as far as its status tells.
	Inexact []string `json:"inexact,omitempty"`
	Due     int64    `json:"due"`
	// EdgeAheadSeconds is edge − now; negative when the edge lags; nil when there is no edge
	// (no walk finished, or window 0).
	EdgeAheadSeconds *float64 `json:"edgeAheadSeconds"`
	// Edge is the shard's edge (reachable shards only).
	Edge     *time.Time `json:"edge"`
	LastWalk *Walk      `json:"lastWalk"`
	// WalkingSince is the start of a walk in progress.
	WalkingSince *time.Time `json:"walkingSince"`
	// Lateness of the due rows relative to their cadence (reachable shards only).
	P50Relative float64 `json:"p50Relative"`
	P99Relative float64 `json:"p99Relative"`
	MaxRelative float64 `json:"maxRelative"`
	P99Seconds  float64 `json:"p99Seconds"`
	RowsHeld    int64   `json:"rowsHeld"`
	// OwnedNotHeld is approximate: counted by the last full walk.
	OwnedNotHeld     int64      `json:"ownedNotHeld"`
	OwnedNotHeldAsOf *time.Time `json:"ownedNotHeldAsOf"`
	// ShardError is the error the shard itself reports (a failed walk, a store outage).
	ShardError string `json:"shardError,omitempty"`
}

// HourBin is one bar of "coming due by hour": held rows of owned slots coming due in
// (now + Hour h, now + Hour+1 h].
type HourBin struct {
	Hour int `json:"hour"`
	Rows int `json:"rows"`
	// BeyondWindow is true for hours past the window, where shards hold nothing: the bar is not
	// the rows coming due then.
	BeyondWindow bool `json:"beyondWindow"`
}

// Coming is "rows coming due by hour over the window", summed over the shards that answered.
type Coming struct {
	ByHour  []HourBin `json:"byHour"`
	Next15m int       `json:"next15m"`
	Next60m int       `json:"next60m"`
	Next24h int       `json:"next24h"`
	// WindowSeconds is spec.window; 0 holds every row.
	WindowSeconds float64 `json:"windowSeconds"`
	// Shards is how many shards the figures add up; Of how many there are. When Shards < Of
	// they are a lower bound.
	Shards int `json:"shards"`
	Of     int `json:"of"`
}

// Class is the due and held rows of one (cadence, source) class, summed over the shards that
// answered.
type Class struct {
	CadenceSeconds float64 `json:"cadenceSeconds"`
	Source         string  `json:"source"`
	Due            int     `json:"due"`
	Held           int     `json:"held"`
	// MaxLateSeconds is how late the class's most overdue row is, over the shards that answered.
	MaxLateSeconds float64 `json:"maxLateSeconds"`
	// LateBy sums the shards' due rows by relative lateness, in the buckets of
	// shardapi.Class.LateBy (≤ 0.1, 0.5, 1, 2 and > 2 cadences late): counts add up exactly
	// across shards, where percentiles would not.
	LateBy []int `json:"lateBy"`
	// LateUnknown is the due rows of shards that reported the class without its lateness (a
	// shard older than the lateness buckets): not in LateBy.
	LateUnknown int `json:"lateUnknown"`
}

// SlotOwner is the slots of one shard in the assignment.
type SlotOwner struct {
	Shard string `json:"shard"`
	Slots string `json:"slots"`
	Count int    `json:"count"`
	// Runs are the slot ranges, for the slot strip.
	Runs []schedule.Run `json:"-"`
}

// Event is one point of the handoff timeline.
type Event struct {
	At    time.Time `json:"at"`
	Label string    `json:"label"`
	// Kind is prepare, commit, rollback, deadline or now.
	Kind string `json:"kind"`
}

// Handoff is the latest two-phase handoff (status.membership.handoff).
type Handoff struct {
	State        string          `json:"state"`
	FromEpoch    int64           `json:"fromEpoch"`
	PrepareEpoch int64           `json:"prepareEpoch"`
	FinalEpoch   int64           `json:"finalEpoch"`
	Moves        []rqv1.SlotMove `json:"moves"`
	Waiting      []string        `json:"waiting"`
	Events       []Event         `json:"events"`
}

// Membership is the slot assignment and the latest handoff.
type Membership struct {
	Epoch       int64       `json:"epoch"`
	Phase       string      `json:"phase"`
	Assignment  []SlotOwner `json:"assignment"`
	Incoming    []SlotOwner `json:"incoming"`
	SlotsMoving int32       `json:"slotsMoving"`
	Handoff     *Handoff    `json:"handoff"`
	// Error names a slot set in the status that could not be parsed (the strip then omits it).
	Error string `json:"error,omitempty"`
}

// QueueDetail is the one-queue page (GET api/v1/queues/{namespace}/{name}).
type QueueDetail struct {
	QueueSummary
	// Now is when the console built this view.
	Now        time.Time  `json:"now"`
	Shard      []Shard    `json:"shardTable"`
	Reachable  int        `json:"shardsReachable"`
	Coming     Coming     `json:"coming"`
	Classes    []Class    `json:"classes"`
	History    []Sample   `json:"history"`
	Membership Membership `json:"membership"`
}

// Unreachable is the number of shards that did not answer the console.
func (d QueueDetail) Unreachable() int { return len(d.Shard) - d.Reachable }

// ShardReport is what the console learnt about one shard for one page: its /v1/status, or why
// there is none.
type ShardReport struct {
	// Name of the shard.
	Name string
	// Status is its /v1/status; nil when it could not be read.
	Status *shardapi.Status
	// Err says why Status is nil.
	Err error
}

// HistorySpan is how far back the due history goes ("due over the last hour"): the span of the
// history chart, and what the console's History keeps.
const HistorySpan = time.Hour

// Sample is one reading of a RenderQueue's status.due.
type Sample struct {
	// At is when the console read the status.
	At time.Time `json:"at"`
	// Due is status.due at that moment.
	Due int64 `json:"due"`
	// Exact is status.dueExact at that moment: false makes Due a lower bound.
	Exact bool `json:"exact"`
	// Known is false when the status had never been computed (no status.dueAsOf): Due means
	// nothing then.
	Known bool `json:"known"`
}

// QueueView is the one-queue page's data: the detail and its charts.
type QueueView struct {
	QueueDetail
	ComingChart   Chart
	HistoryChart  Chart
	ClassChart    Chart
	LateChart     Chart
	SlotChart     Chart
	TimelineChart Chart
	// Colour is each shard's colour index in the slot strip and legend.
	Colour map[string]int
}

// NewQueueView draws the charts of d; interval is the history's sampling interval (for the
// history chart's gaps and caption).
func NewQueueView(d QueueDetail, interval time.Duration) *QueueView {
	v := &QueueView{QueueDetail: d, Colour: map[string]int{}}
	for i, s := range d.Shard {
		v.Colour[s.Name] = i
	}
	for _, o := range d.Membership.Assignment {
		if _, ok := v.Colour[o.Shard]; !ok {
			v.Colour[o.Shard] = len(v.Colour)
		}
	}
	v.ComingChart = comingChart(d.Coming)
	v.HistoryChart = historyChart(d.History, d.Now, interval)
	v.ClassChart = classChart(d.Classes)
	v.LateChart = lateChart(d.Classes)
	v.SlotChart = slotStrip(d.Membership, v.Colour)
	v.TimelineChart = timelineChart(d.Membership.Handoff)
	return v
}

// goodWhenTrue says, per condition type, whether True is the healthy state.
var goodWhenTrue = map[string]bool{
	rqv1.ConditionReady:         true,
	rqv1.ConditionExact:         true,
	rqv1.ConditionEdgeHealthy:   true,
	rqv1.ConditionWalksComplete: true,
	rqv1.ConditionProgressing:   false,
	rqv1.ConditionReconciled:    true,
	rqv1.ConditionClassesServed: true,
}

// conditionOrder is the order conditions are shown in; others follow by type.
var conditionOrder = []string{rqv1.ConditionReady, rqv1.ConditionExact, rqv1.ConditionEdgeHealthy,
	rqv1.ConditionWalksComplete, rqv1.ConditionProgressing, rqv1.ConditionReconciled, rqv1.ConditionClassesServed}

func conditionTone(c metav1.Condition) string {
	switch c.Status {
	case metav1.ConditionTrue, metav1.ConditionFalse:
	default:
		return toneUnknown
	}
	good, known := goodWhenTrue[c.Type]
	isTrue := c.Status == metav1.ConditionTrue
	switch {
	case !known:
		return toneUnknown
	case c.Type == rqv1.ConditionProgressing && isTrue:
		return toneWarn // something is changing; not wrong
	case isTrue == good:
		return toneOK
	default:
		return toneBad
	}
}

// Summarize is the queues-page view of rq.
func Summarize(rq *rqv1.RenderQueue) QueueSummary {
	st := rq.Status
	q := QueueSummary{
		Namespace: rq.Namespace, Name: rq.Name,
		Shards: rq.Spec.Shards, CurrentShards: st.CurrentShards, ReadyShards: st.ReadyShards,
		Due: st.Due, DueExact: st.DueExact, Phase: membershipPhase(&st.Membership),
		Conditions: []Condition{},
	}
	if st.DueAsOf != nil {
		t := st.DueAsOf.UTC()
		q.DueAsOf = &t
	}
	rank := map[string]int{}
	for i, t := range conditionOrder {
		rank[t] = i
	}
	conds := append([]metav1.Condition(nil), st.Conditions...)
	sort.SliceStable(conds, func(i, j int) bool {
		ri, iok := rank[conds[i].Type]
		rj, jok := rank[conds[j].Type]
		switch {
		case iok && jok:
			return ri < rj
		case iok != jok:
			return iok
		default:
			return conds[i].Type < conds[j].Type
		}
	})
	for _, c := range conds {
		q.Conditions = append(q.Conditions, Condition{
			Type: c.Type, Status: string(c.Status), Reason: c.Reason, Message: c.Message,
			Since: c.LastTransitionTime.UTC(), Stale: c.ObservedGeneration < rq.Generation,
			Tone: conditionTone(c),
		})
	}
	return q
}

// inexactReasons explains, from its status, why a shard does not vouch for its due count. The
// flag is the shard's; these are the causes its status shows (empty when it shows none).
func inexactReasons(st *shardapi.Status) []string {
	if st.Exact {
		return nil
	}
	var out []string
	switch {
	case st.LastWalk == nil || (st.LastWalk.FinishedAt == nil && st.Edge == nil):
		out = append(out, "first walk not finished")
	case st.EdgeAheadSeconds != nil && *st.EdgeAheadSeconds < 0:
		out = append(out, "edge lags by "+statusview.Seconds(-*st.EdgeAheadSeconds))
	}
	if g := st.Gap; g != nil {
		if g.Resumed == nil {
			out = append(out, "change events lost since "+clock(g.Since))
		} else {
			out = append(out, "change-event gap at "+clock(g.Since)+" not yet covered by a walk")
		}
	}
	if w := st.LastWalk; w != nil {
		switch {
		case w.Failed:
			out = append(out, "last walk failed")
		case w.Partial:
			out = append(out, fmt.Sprintf("last walk partial (%d segments unread)", w.UnreadSegments))
		}
	}
	if st.Membership.Incoming != "" {
		out = append(out, "handoff: walking incoming slots "+st.Membership.Incoming)
	}
	if len(out) == 0 && !st.Complete {
		out = append(out, "not complete")
	}
	if len(out) == 0 {
		out = append(out, "the shard reports its count inexact")
	}
	return out
}

// clock formats t as a UTC time of day.
func clock(t time.Time) string { return t.UTC().Format("15:04:05Z") }

func timePtr(t *metav1.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// shardRow builds one row of the shard table from the shard's report, falling back on the
// operator's last poll (op, may be nil) when the shard could not be asked.
func shardRow(r ShardReport, op *rqv1.ShardStatus, now time.Time) Shard {
	s := Shard{Name: r.Name}
	if op != nil {
		s.Slots = op.Slots
	}
	st := r.Status
	if st == nil {
		s.State = "unreachable"
		if r.Err != nil {
			s.Error = r.Err.Error()
		} else {
			s.Error = "not asked"
		}
		s.Inexact = []string{"unreachable: the console cannot vouch for it"}
		if op != nil {
			// The operator's last poll, for context; the count is not vouched for now.
			s.Due, s.RowsHeld, s.OwnedNotHeld = op.Due, op.RowsHeld, op.RowsOwned-op.RowsHeld
			if s.OwnedNotHeld < 0 {
				s.OwnedNotHeld = 0
			}
			if op.EdgeAheadSeconds != nil {
				a := float64(*op.EdgeAheadSeconds)
				s.EdgeAheadSeconds = &a
			}
			if w := op.LastWalk; w != nil && w.StartedAt != nil {
				s.LastWalk = &Walk{StartedAt: w.StartedAt.UTC(), FinishedAt: timePtr(w.FinishedAt), Partial: w.Partial,
					Failed: w.Failed, UnreadSegments: int(w.UnreadSegments)}
			}
		}
		return s
	}
	asOf := st.AsOf.UTC()
	s.Reachable, s.AsOf, s.State, s.Exact = true, &asOf, st.Status, st.Exact
	s.Inexact = inexactReasons(st)
	if st.Membership.Owned != "" || s.Slots == "" {
		s.Slots = st.Membership.Owned
	}
	s.Due = int64(st.Due)
	if st.Edge != nil {
		// Against the console's clock, so that every row is read at the same instant.
		a := st.Edge.Sub(now).Seconds()
		s.EdgeAheadSeconds = &a
		s.Edge = st.Edge
	}
	if w := st.LastWalk; w != nil {
		s.LastWalk = &Walk{StartedAt: w.StartedAt.UTC(), FinishedAt: w.FinishedAt, Partial: w.Partial, Failed: w.Failed,
			UnreadSegments: w.UnreadSegments}
	}
	s.WalkingSince = st.WalkingSince
	l := st.Lateness
	s.P50Relative, s.P99Relative, s.MaxRelative = finite(l.P50Relative), finite(l.P99Relative), finite(l.MaxRelative)
	s.P99Seconds = finite(l.P99Seconds)
	s.RowsHeld, s.OwnedNotHeld, s.OwnedNotHeldAsOf = int64(st.Rows.Held), int64(st.Rows.OwnedNotHeld), st.Rows.OwnedNotHeldAsOf
	s.ShardError = st.Error
	return s
}

// Detail is the one-queue view of rq from the shards' reports, the due history and now.
func Detail(rq *rqv1.RenderQueue, reports []ShardReport, history []Sample, now time.Time) QueueDetail {
	d := QueueDetail{QueueSummary: Summarize(rq), Now: now.UTC(), History: history, Shard: []Shard{}, Classes: []Class{}}
	if d.History == nil {
		d.History = []Sample{}
	}
	ops := map[string]*rqv1.ShardStatus{}
	for i := range rq.Status.Shards {
		ops[rq.Status.Shards[i].Name] = &rq.Status.Shards[i]
	}
	window := rq.Spec.WindowDuration()
	d.Coming = Coming{WindowSeconds: window.Seconds(), Of: len(reports), ByHour: make([]HourBin, 24)}
	for h := range d.Coming.ByHour {
		d.Coming.ByHour[h] = HourBin{Hour: h, BeyondWindow: window > 0 && time.Duration(h)*time.Hour >= window}
	}
	type classKey struct {
		cadence float64
		source  string
	}
	classes := map[classKey]*Class{}
	for _, r := range reports {
		d.Shard = append(d.Shard, shardRow(r, ops[r.Name], now))
		st := r.Status
		if st == nil {
			continue
		}
		d.Reachable++
		d.Coming.Shards++
		for h, n := range st.Coming.ByHour {
			if h < len(d.Coming.ByHour) {
				d.Coming.ByHour[h].Rows += n
			}
		}
		d.Coming.Next15m += st.Coming.Next15m
		d.Coming.Next60m += st.Coming.Next60m
		d.Coming.Next24h += st.Coming.Next24h
		for _, c := range st.Classes {
			k := classKey{c.Cadence, c.Source}
			cl := classes[k]
			if cl == nil {
				cl = &Class{CadenceSeconds: c.Cadence, Source: c.Source, LateBy: make([]int, shardapi.LateBuckets)}
				classes[k] = cl
			}
			cl.Due += c.Due
			cl.Held += c.Held
			if len(c.LateBy) != shardapi.LateBuckets {
				cl.LateUnknown += c.Due
				continue
			}
			cl.MaxLateSeconds = max(cl.MaxLateSeconds, c.MaxLateSeconds)
			for i, n := range c.LateBy {
				cl.LateBy[i] += n
			}
		}
	}
	for _, c := range classes {
		d.Classes = append(d.Classes, *c)
	}
	sort.Slice(d.Classes, func(i, j int) bool {
		a, b := d.Classes[i], d.Classes[j]
		if a.CadenceSeconds != b.CadenceSeconds {
			return a.CadenceSeconds < b.CadenceSeconds
		}
		return a.Source < b.Source
	})
	d.Membership = membershipView(rq.Status.Membership, now)
	return d
}

func slotOwners(list []rqv1.ShardSlots) ([]SlotOwner, error) {
	out := make([]SlotOwner, 0, len(list))
	var errs []string
	for _, s := range list {
		o := SlotOwner{Shard: s.Shard, Slots: s.Slots}
		set, err := schedule.ParseSlots(s.Slots)
		if err != nil {
			errs = append(errs, fmt.Sprintf("shard %s: %v", s.Shard, err))
		} else {
			o.Count = set.Len()
			o.Runs = set.Runs()
		}
		out = append(out, o)
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return out, nil
}

// membershipPhase names the membership's state: Preparing while a handoff is, Settled
// otherwise, "" before the first assignment.
func membershipPhase(m *rqv1.MembershipStatus) string {
	switch {
	case m.HandoffInProgress():
		return string(rqv1.HandoffPreparing)
	case m.Epoch == 0:
		return ""
	}
	return "Settled"
}

func membershipView(m rqv1.MembershipStatus, now time.Time) Membership {
	v := Membership{Epoch: m.Epoch, Phase: membershipPhase(&m), SlotsMoving: m.SlotsMoving}
	var errs []string
	var err error
	if v.Assignment, err = slotOwners(m.Assignment); err != nil {
		errs = append(errs, "assignment: "+err.Error())
	}
	if v.Incoming, err = slotOwners(m.Incoming); err != nil {
		errs = append(errs, "incoming: "+err.Error())
	}
	v.Error = strings.Join(errs, "; ")
	h := m.Handoff
	if h == nil {
		return v
	}
	hv := &Handoff{State: string(h.State), FromEpoch: h.FromEpoch, PrepareEpoch: h.PrepareEpoch, FinalEpoch: h.FinalEpoch,
		Moves: h.Moves, Waiting: h.Waiting}
	start := h.StartedAt.UTC()
	if h.PrepareEpoch == 0 {
		// The first assignment is committed directly: one event.
		at := start
		if h.FinishedAt != nil {
			at = h.FinishedAt.UTC()
		}
		hv.Events = append(hv.Events, Event{At: at, Kind: "commit", Label: fmt.Sprintf("first assignment (epoch %d)", h.FinalEpoch)})
		v.Handoff = hv
		return v
	}
	hv.Events = append(hv.Events, Event{At: start, Kind: "prepare", Label: fmt.Sprintf("prepare (epoch %d → %d)", h.FromEpoch, h.PrepareEpoch)})
	switch h.State {
	case rqv1.HandoffPreparing:
		label := "now"
		if len(h.Waiting) > 0 {
			label = fmt.Sprintf("now: waiting for %s", strings.Join(h.Waiting, ", "))
		}
		hv.Events = append(hv.Events,
			Event{At: now.UTC(), Kind: "now", Label: label},
			Event{At: h.Deadline.UTC(), Kind: "deadline", Label: "rollback deadline"})
	case rqv1.HandoffCommitted, rqv1.HandoffRolledBack:
		kind, label := "commit", fmt.Sprintf("commit (epoch %d)", h.FinalEpoch)
		if h.State == rqv1.HandoffRolledBack {
			kind, label = "rollback", fmt.Sprintf("rollback (epoch %d)", h.FinalEpoch)
		}
		if h.FinishedAt != nil {
			hv.Events = append(hv.Events, Event{At: h.FinishedAt.UTC(), Kind: kind, Label: label})
		}
	}
	sort.SliceStable(hv.Events, func(i, j int) bool { return hv.Events[i].At.Before(hv.Events[j].At) })
	v.Handoff = hv
	return v
}

// finite replaces NaN and ±Inf (which JSON cannot carry) by 0.
func finite(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	return f
}
