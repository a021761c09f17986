package shardmetrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/renderqueue/renderqueue/pkg/keeper/core"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// The keeper's Prometheus metrics are all named renderqueue_keeper_*: they describe one shard
// process. The per-RenderQueue figures (the due count the HPA reads, conditions, handoffs) come
// from the operator as renderqueue_queue_*; the shard's due gauge is renderqueue_keeper_due so
// that it never shares a name with the operator's renderqueue_queue_due nor with the external
// metric renderqueue_due.
//
// Rows are labelled with a bounded class, never with their raw cadence: cadence_le is the
// smallest of CadenceClasses at or above the row's cadence ("+Inf" beyond the last), and source
// is "discovered" or "submitted".

// CadenceClasses are the upper bounds (label values of cadence_le) of the cadence classes, in
// order; a row whose cadence exceeds the last is in class "+Inf".
func CadenceClasses() []string {
	out := make([]string, 0, len(cadenceBounds)+1)
	for _, b := range cadenceBounds {
		out = append(out, b.label)
	}
	return append(out, "+Inf")
}

// cadenceBounds are the upper bounds of the cadence classes.
var cadenceBounds = [...]struct {
	d     time.Duration
	label string
}{
	{15 * time.Minute, "15m"}, {time.Hour, "1h"}, {6 * time.Hour, "6h"}, {24 * time.Hour, "24h"},
	{96 * time.Hour, "96h"}, {168 * time.Hour, "168h"}, {720 * time.Hour, "720h"},
}

// cadenceClass is the cadence_le label of a cadence.
func cadenceClass(cadence time.Duration) string {
	for _, b := range cadenceBounds {
		if cadence <= b.d {
			return b.label
		}
	}
	return "+Inf"
}

// sources are the label values of source.
var sources = [...]string{schedule.SourceDiscovered.String(), schedule.SourceSubmitted.String()}

// Walk results (label values of renderqueue_keeper_walks_total{result}).
const (
	walkComplete = "complete"
	walkPartial  = "partial"
	walkFailed   = "failed"
)

// walkRowKinds are the label values of renderqueue_keeper_walk_rows_total{kind}.
var walkRowKinds = [...]string{"scanned", "admitted", "repaired", "invalid", "deleted"}

// Completion results (label values of renderqueue_keeper_completed_rows_total{result}).
const (
	ResultOK          = "ok"
	ResultLeaseLost   = "lease_lost"
	ResultNotHeld     = "not_held"
	ResultWriteFailed = "write_failed"
	ResultChanged     = "changed" // the row changed since it was claimed: not written
	// ResultInFlight: a completion under the same lease was being written; this one was refused
	// (a retry sent before the first answer came).
	ResultInFlight = "in_flight"
	// ResultMoved: the lease left with its slot in a handoff; the worker was sent to the shard
	// that owns the slot now.
	ResultMoved = "moved"
)

// Metrics are a shard's event metrics (counters and histograms). A nil *Metrics records nothing.
// The state gauges are collected from the shard's status at scrape time by StatusCollector.
type Metrics struct {
	eventsTotal      prometheus.Counter
	gapsTotal        prometheus.Counter
	walkSeconds      prometheus.Histogram
	walkRows         *prometheus.CounterVec
	walksTotal       *prometheus.CounterVec
	unreadSegments   prometheus.Counter
	claimsTotal      *prometheus.CounterVec
	claimLateness    *prometheus.HistogramVec
	completesTotal   *prometheus.CounterVec
	claimLatency     prometheus.Histogram
	completeLatency  prometheus.Histogram
	claimedByClass   map[RowClass]prometheus.Counter
	latenessByClass  map[string]prometheus.Observer
	completedByClass map[classResult]prometheus.Counter
	httpConns        prometheus.Gauge
	httpRefused      prometheus.Counter
	httpRetired      prometheus.Counter
	handoverLeases   *prometheus.CounterVec
	handovers        *prometheus.CounterVec
}

// Handover results (label values of renderqueue_keeper_handovers_total{result}): how the
// handover of slots that came to this shard ended (shardapi.HandoverGiven, HandoverUnknown, or
// HandoverUnanswered).
const HandoverUnanswered = "unanswered"

type classResult struct {
	class  RowClass
	result string
}

// New registers the shard's event metrics with reg. Every labelled series that can occur
// is created at once with value 0, so that rate() and increase() see the first event.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		eventsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "renderqueue_keeper_events_applied_total", Help: "Change events applied from the subscription."}),
		gapsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "renderqueue_keeper_subscription_gaps_total", Help: "Times the change-event subscription lost continuity."}),
		walkSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "renderqueue_keeper_walk_duration_seconds", Help: "Duration of finished verification walks (failed ones included).",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 14)}),
		walkRows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "renderqueue_keeper_walk_rows_total", Help: "Rows read by walks, by what the walk found: scanned, admitted, repaired, invalid, deleted."},
			[]string{"kind"}),
		walksTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "renderqueue_keeper_walks_total", Help: "Finished walks by result: complete, partial (some segments unread), failed."},
			[]string{"result"}),
		unreadSegments: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "renderqueue_keeper_walk_unread_segments_total", Help: "Segments that partial walks could not read."}),
		claimsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "renderqueue_keeper_claimed_rows_total", Help: "Rows claimed, by cadence class (cadence_le) and source."},
			[]string{"cadence_le", "source"}),
		claimLateness: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "renderqueue_keeper_claimed_lateness_ratio",
			Help:    "Relative lateness of claimed rows when claimed, (now - due) / cadence, by cadence class (cadence_le).",
			Buckets: []float64{0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10}},
			[]string{"cadence_le"}),
		completesTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "renderqueue_keeper_completed_rows_total",
			Help: "Rows completed, by cadence class, source and result: ok, lease_lost, not_held, changed (the row changed since it was claimed: not written), write_failed (the store's write failed, the request was answered 503), in_flight (a completion under the same lease was still being written: refused), moved (the lease left with its slot in a handoff: the worker was sent to the new owner); class labels empty when the row is not held."},
			[]string{"cadence_le", "source", "result"}),
		claimLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "renderqueue_keeper_claim_duration_seconds", Help: "Time to serve a claim request.",
			Buckets: prometheus.ExponentialBuckets(0.00001, 4, 10)}),
		completeLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "renderqueue_keeper_complete_duration_seconds", Help: "Time to serve a complete request, including the group-committed write.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		httpConns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "renderqueue_keeper_http_connections", Help: "Open connections of the shard's HTTP server (at most --http-max-connections)."}),
		httpRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "renderqueue_keeper_http_connections_refused_total", Help: "Connections refused (answered 503 and closed) because --http-max-connections were open."}),
		httpRetired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "renderqueue_keeper_http_connections_retired_total", Help: "Connections told to close after their reply because they were older than --http-max-connection-age."}),
		handoverLeases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "renderqueue_keeper_handover_leases_total",
			Help: "Leases that travelled with their slots in handoffs: given (to the shard that took the slots over) or taken (from the shard that gave them)."},
			[]string{"direction"}),
		handovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "renderqueue_keeper_handovers_total",
			Help: "Handovers of slots that came to this shard, by result: handedOver (the giver's leases taken over), unknown (the giver's process had no record; fenced until its predecessor's leases ended), unanswered (the giver did not answer; fenced for the longest lease)."},
			[]string{"result"}),
		claimedByClass:   map[RowClass]prometheus.Counter{},
		latenessByClass:  map[string]prometheus.Observer{},
		completedByClass: map[classResult]prometheus.Counter{},
	}
	for _, r := range []string{walkComplete, walkPartial, walkFailed} {
		m.walksTotal.WithLabelValues(r)
	}
	for _, k := range walkRowKinds {
		m.walkRows.WithLabelValues(k)
	}
	for _, c := range CadenceClasses() {
		m.latenessByClass[c] = m.claimLateness.WithLabelValues(c)
		for _, src := range sources {
			rc := RowClass{cadence: c, source: src}
			m.claimedByClass[rc] = m.claimsTotal.WithLabelValues(c, src)
			for _, res := range []string{ResultOK, ResultLeaseLost, ResultNotHeld, ResultChanged, ResultWriteFailed, ResultInFlight} {
				m.completedByClass[classResult{rc, res}] = m.completesTotal.WithLabelValues(c, src, res)
			}
		}
	}
	m.completedByClass[classResult{RowClass{}, ResultNotHeld}] = m.completesTotal.WithLabelValues("", "", ResultNotHeld)
	m.completedByClass[classResult{RowClass{}, ResultMoved}] = m.completesTotal.WithLabelValues("", "", ResultMoved)
	for _, d := range []string{"given", "taken"} {
		m.handoverLeases.WithLabelValues(d)
	}
	for _, r := range []string{shardapi.HandoverGiven, shardapi.HandoverUnknown, HandoverUnanswered} {
		m.handovers.WithLabelValues(r)
	}
	reg.MustRegister(m.eventsTotal, m.gapsTotal, m.walkSeconds, m.walkRows, m.walksTotal, m.unreadSegments,
		m.claimsTotal, m.claimLateness, m.completesTotal, m.claimLatency, m.completeLatency,
		m.httpConns, m.httpRefused, m.httpRetired, m.handoverLeases, m.handovers)
	return m
}

// HandedOver counts leases given away with their slots.
func (m *Metrics) HandedOver(leases int) {
	if m == nil {
		return
	}
	m.handoverLeases.WithLabelValues("given").Add(float64(leases))
}

// Handover counts a handover of slots to this shard that ended with result, taking leases over.
func (m *Metrics) Handover(result string, leases int) {
	if m == nil {
		return
	}
	m.handovers.WithLabelValues(result).Inc()
	m.handoverLeases.WithLabelValues("taken").Add(float64(leases))
}

// ConnOpened counts an HTTP connection opened (httpserve.ConnObserver).
func (m *Metrics) ConnOpened() {
	if m != nil {
		m.httpConns.Inc()
	}
}

// ConnClosed counts an HTTP connection closed (httpserve.ConnObserver).
func (m *Metrics) ConnClosed() {
	if m != nil {
		m.httpConns.Dec()
	}
}

// ConnRefused counts an HTTP connection refused over the cap (httpserve.ConnObserver).
func (m *Metrics) ConnRefused() {
	if m != nil {
		m.httpRefused.Inc()
	}
}

// ConnRetired counts an HTTP connection retired at its maximum age (httpserve.ConnObserver).
func (m *Metrics) ConnRetired() {
	if m != nil {
		m.httpRetired.Inc()
	}
}

// EventsApplied counts n change events applied from the subscription.
func (m *Metrics) EventsApplied(n int) {
	if m != nil {
		m.eventsTotal.Add(float64(n))
	}
}

// Gap counts a loss of the subscription's continuity.
func (m *Metrics) Gap() {
	if m != nil {
		m.gapsTotal.Inc()
	}
}

// Walk is what the metrics record of one finished walk.
type Walk struct {
	// StartedAt and FinishedAt time the walk; a zero FinishedAt records no duration.
	StartedAt, FinishedAt time.Time
	// Failed: the walk failed as a whole; Partial: it left UnreadSegments segments unread.
	Failed, Partial bool
	UnreadSegments  int
	// Counts are the rows the walk read, by what it found.
	Counts core.WalkCounts
}

// Walk records a finished walk: its result, duration, unread segments and rows.
func (m *Metrics) Walk(r Walk) {
	if m == nil {
		return
	}
	switch {
	case r.Failed:
		m.walksTotal.WithLabelValues(walkFailed).Inc()
	case r.Partial:
		m.walksTotal.WithLabelValues(walkPartial).Inc()
	default:
		m.walksTotal.WithLabelValues(walkComplete).Inc()
	}
	m.unreadSegments.Add(float64(r.UnreadSegments))
	if !r.FinishedAt.IsZero() {
		m.walkSeconds.Observe(r.FinishedAt.Sub(r.StartedAt).Seconds())
	}
	m.walkRows.WithLabelValues("scanned").Add(float64(r.Counts.Scanned))
	m.walkRows.WithLabelValues("admitted").Add(float64(r.Counts.Admitted))
	m.walkRows.WithLabelValues("repaired").Add(float64(r.Counts.Repaired))
	m.walkRows.WithLabelValues("invalid").Add(float64(r.Counts.Invalid))
	m.walkRows.WithLabelValues("deleted").Add(float64(r.Counts.Deleted))
}

// Claimed counts the rows one claim at now handed out and observes their relative lateness;
// took is how long the claim took.
func (m *Metrics) Claimed(now time.Time, rows []core.Claimed, took time.Duration) {
	if m == nil {
		return
	}
	m.claimLatency.Observe(took.Seconds())
	for i := range rows {
		rc := ClassOf(rows[i].Cadence, rows[i].Source)
		if c := m.claimedByClass[rc]; c != nil {
			c.Inc()
		} else {
			m.claimsTotal.WithLabelValues(rc.cadence, rc.source).Inc()
		}
		if rows[i].Cadence > 0 {
			m.latenessByClass[rc.cadence].Observe(float64(now.Sub(rows[i].Due)) / float64(rows[i].Cadence))
		}
	}
}

// RowClass is a row's class as the metrics label it (cadence_le and source); the zero RowClass
// is a row the shard does not hold.
type RowClass struct{ cadence, source string }

// ClassOf is the class of a row of cadence and source.
func ClassOf(cadence time.Duration, source schedule.Source) RowClass {
	return RowClass{cadence: cadenceClass(cadence), source: source.String()}
}

// Completed counts one complete request's items by class and result (one of the Result*
// values); took is how long the request took, 0 when it wrote nothing (no duration recorded).
func (m *Metrics) Completed(results []string, classes []RowClass, took time.Duration) {
	if m == nil {
		return
	}
	if took > 0 {
		m.completeLatency.Observe(took.Seconds())
	}
	for i, result := range results {
		k := classResult{classes[i], result}
		if c := m.completedByClass[k]; c != nil {
			c.Inc()
		} else {
			m.completesTotal.WithLabelValues(k.class.cadence, k.class.source, result).Inc()
		}
	}
}

// StatusCollector exports the shard's state gauges (rows held, due, leased, exact, complete,
// lateness, classes, rows coming due, edge, last walk, ...) computed from its status at scrape
// time, so that none of them can freeze while the shard is busy (during a long walk, say).
type StatusCollector struct {
	status func() shardapi.Status
	descs  statusDescs
}

type statusDescs struct {
	held, ownedNotHeld, invalid, due, leased, exact, complete *prometheus.Desc
	lateMax, lateP50, lateP99, relMax, relP50, relP99         *prometheus.Desc
	classDue, classHeld, comingDue                            *prometheus.Desc
	classWaiting, classWaitingRatio                           *prometheus.Desc
	edge, lastWalkEnd, lastWalkPartial, lastWalkFailed, epoch *prometheus.Desc
	heldBack, fencedSlots                                     *prometheus.Desc
	objectiveEvents, objectiveTarget                          *prometheus.Desc
}

// NewStatusCollector returns a collector of the state gauges of the status that status returns
// at each scrape (keeper.NewStatusCollector passes a shard's recent status).
func NewStatusCollector(status func() shardapi.Status) *StatusCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("renderqueue_keeper_"+name, help, labels, nil)
	}
	return &StatusCollector{status: status, descs: statusDescs{
		held:         d("rows_held", "Rows held in memory (owned and incoming slots)."),
		ownedNotHeld: d("rows_owned_not_held", "Owned rows beyond the window at the last full walk (approximate)."),
		invalid:      d("rows_invalid", "Keys whose latest version is invalid (never held)."),
		due:          d("due", "Held rows of owned slots with due <= now (a lower bound unless renderqueue_keeper_exact is 1)."),
		leased:       d("leased", "Rows under lease."),
		exact:        d("exact", "1 when the shard vouches for its due count."),
		complete:     d("complete", "1 when every owned row due before the edge is held and no gap is open."),
		lateMax:      d("lateness_max_seconds", "How late the most overdue due row is, in seconds."),
		lateP50:      d("lateness_p50_seconds", "Median lateness of the due rows, in seconds."),
		lateP99:      d("lateness_p99_seconds", "p99 lateness of the due rows, in seconds."),
		relMax:       d("lateness_max_ratio", "Largest relative lateness of the due rows: (now - due) / cadence."),
		relP50:       d("lateness_p50_ratio", "Median relative lateness of the due rows: (now - due) / cadence."),
		relP99:       d("lateness_p99_ratio", "p99 relative lateness of the due rows: (now - due) / cadence."),
		classDue:     d("class_due", "Due rows of owned slots by cadence class (cadence_le) and source.", "cadence_le", "source"),
		classHeld:    d("class_held", "Held rows of owned slots by cadence class (cadence_le) and source.", "cadence_le", "source"),
		classWaiting: d("class_waiting_seconds",
			"How long the class has had due rows and no render (waitingSince in /v1/status), by cadence class (cadence_le) and source: the longest of its classes; 0 when none is waiting.",
			"cadence_le", "source"),
		classWaitingRatio: d("class_waiting_ratio",
			"How long the class has had due rows and no render, in cadences, by cadence class (cadence_le) and source: the largest of its classes; above 1 the class is starving (RenderQueueClassStarving).",
			"cadence_le", "source"),
		comingDue: d("coming_due",
			"Held rows of owned slots not yet due, by the hour in which they come due: hours_ahead=h counts due in (now+h-1h, now+h].",
			"hours_ahead"),
		edge: d("edge_timestamp_seconds",
			"The edge: every owned row due before it is held. Lagging when below time(). Absent before the first walk and with window 0."),
		lastWalkEnd:     d("last_walk_end_timestamp_seconds", "When the last walk finished. Absent before the first."),
		lastWalkPartial: d("last_walk_partial", "1 when the last finished walk left segments unread."),
		lastWalkFailed:  d("last_walk_failed", "1 when the last finished walk failed as a whole."),
		epoch:           d("membership_epoch", "The membership epoch the shard has adopted."),
		heldBack: d("rows_held_back",
			"Due rows of owned slots handed out to nobody until a fence ends: the leases an earlier owner may have granted on them are not known yet or not at all (counted in renderqueue_keeper_due)."),
		fencedSlots: d("fenced_slots", "Owned slots that hand out none of their rows until their fence ends."),
		objectiveEvents: d("objective_events_total",
			"Freshness events of spec.objectives decided by this keeper process: result=good (a render that started within maxLateness of due completed) or late (none had, when maxLateness passed). docs/objectives.md.",
			"objective", "result"),
		objectiveTarget: d("objective_target_ratio", "The share of an objective's events that must be good: its percentile / 100.", "objective"),
	}}
}

// Describe implements prometheus.Collector.
func (c *StatusCollector) Describe(ch chan<- *prometheus.Desc) {
	d := c.descs
	for _, desc := range []*prometheus.Desc{d.held, d.ownedNotHeld, d.invalid, d.due, d.leased, d.exact, d.complete,
		d.lateMax, d.lateP50, d.lateP99, d.relMax, d.relP50, d.relP99, d.classDue, d.classHeld, d.comingDue,
		d.classWaiting, d.classWaitingRatio,
		d.edge, d.lastWalkEnd, d.lastWalkPartial, d.lastWalkFailed, d.epoch, d.heldBack, d.fencedSlots,
		d.objectiveEvents, d.objectiveTarget} {
		ch <- desc
	}
}

// Collect implements prometheus.Collector.
func (c *StatusCollector) Collect(ch chan<- prometheus.Metric) {
	collectStatus(c.descs, c.status(), ch)
}

func collectStatus(d statusDescs, st shardapi.Status, ch chan<- prometheus.Metric) {
	g := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	g(d.held, float64(st.Rows.Held))
	g(d.ownedNotHeld, float64(st.Rows.OwnedNotHeld))
	g(d.invalid, float64(st.Rows.Invalid))
	g(d.due, float64(st.Due))
	g(d.leased, float64(st.Leased))
	g(d.exact, b2f(st.Exact))
	g(d.complete, b2f(st.Complete))
	g(d.lateMax, st.Lateness.MaxSeconds)
	g(d.lateP50, st.Lateness.P50Seconds)
	g(d.lateP99, st.Lateness.P99Seconds)
	g(d.relMax, st.Lateness.MaxRelative)
	g(d.relP50, st.Lateness.P50Relative)
	g(d.relP99, st.Lateness.P99Relative)

	due, held := map[RowClass]int{}, map[RowClass]int{}
	waiting, ratio := map[RowClass]float64{}, map[RowClass]float64{}
	for _, cl := range st.Classes {
		src := cl.Source
		if src != sources[0] && src != sources[1] {
			continue // not a source this build knows; cannot happen with its own status
		}
		rc := RowClass{cadence: cadenceClass(time.Duration(cl.Cadence * float64(time.Second))), source: src}
		due[rc] += cl.Due
		held[rc] += cl.Held
		if w := cl.Waiting(st.AsOf); w > 0 {
			waiting[rc] = max(waiting[rc], w.Seconds())
			if cl.Cadence > 0 {
				ratio[rc] = max(ratio[rc], w.Seconds()/cl.Cadence)
			}
		}
	}
	for _, cad := range CadenceClasses() {
		for _, src := range sources {
			rc := RowClass{cadence: cad, source: src}
			g(d.classDue, float64(due[rc]), cad, src)
			g(d.classHeld, float64(held[rc]), cad, src)
			g(d.classWaiting, waiting[rc], cad, src)
			g(d.classWaitingRatio, ratio[rc], cad, src)
		}
	}
	for h, n := range st.Coming.ByHour {
		g(d.comingDue, float64(n), strconv.Itoa(h+1))
	}
	for _, o := range st.Objectives {
		ch <- prometheus.MustNewConstMetric(d.objectiveEvents, prometheus.CounterValue, float64(o.Good), o.Name, "good")
		ch <- prometheus.MustNewConstMetric(d.objectiveEvents, prometheus.CounterValue, float64(o.Late), o.Name, "late")
		g(d.objectiveTarget, o.Percentile/100, o.Name)
	}
	if st.Edge != nil {
		g(d.edge, unixSeconds(*st.Edge))
	}
	if w := st.LastWalk; w != nil && w.FinishedAt != nil {
		g(d.lastWalkEnd, unixSeconds(*w.FinishedAt))
		g(d.lastWalkPartial, b2f(w.Partial))
		g(d.lastWalkFailed, b2f(w.Failed))
	}
	g(d.epoch, float64(st.Membership.Epoch))
	g(d.heldBack, float64(st.HeldBack))
	fenced := 0
	for _, f := range st.Fences {
		if set, err := schedule.ParseSlots(f.Slots); err == nil {
			fenced += set.Len()
		}
	}
	g(d.fencedSlots, float64(fenced))
}

func b2f(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// unixSeconds is t as Prometheus timestamps are written: seconds since the epoch, with fraction.
func unixSeconds(t time.Time) float64 {
	return float64(t.UnixNano()) / 1e9
}
