package policy

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/specs"
	"github.com/renderqueue/renderqueue/pkg/membership"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// edgeAheadTolerance is how far a shard's edgeAheadSeconds may drift (it falls by a second every
// second between walks) before the operator rewrites it: the larger of a minute and a tenth of
// the value. The edge itself is exact; this only keeps a still queue from rewriting its status on
// every poll.
func edgeAheadTolerance(prev int64) int64 {
	return max(60, abs64(prev)/10)
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// secTime is t truncated to the second (what the API server stores), nil for nil.
func secTime(t *time.Time) *metav1.Time {
	if t == nil {
		return nil
	}
	mt := metav1.NewTime(t.Truncate(time.Second))
	return &mt
}

// shardStatus builds one shard's status from its report. owned is its slots in the committed
// assignment; prev its previous status (nil if none), for edgeAheadSeconds.
func shardStatus(rep ShardReport, owned string, prev *rqv1.ShardStatus) rqv1.ShardStatus {
	s := rqv1.ShardStatus{Name: rep.Name, Slots: owned, URL: rep.URL}
	st := rep.Status
	if st == nil {
		// what Kubernetes says is wrong with the Pod names the cause better than the poll's
		// "connection refused"
		if reason, msg := podProblem(rep.Pod); reason != "" {
			s.State, s.Error = StateFailing, reason
			if msg != "" {
				s.Error += ": " + msg
			}
			return s
		}
		s.State = StateUnreachable
		// a Pod that is not Ready yet (its keeper starting) is pending, not unreachable: no
		// warning for a shard that was never expected to answer
		if !rep.Asked || !PodReady(rep.Pod) {
			s.State = StatePending
		}
		if rep.Err != nil {
			s.Error = rep.Err.Error()
		}
		return s
	}
	s.State = st.Status
	s.Ready = PodReady(rep.Pod) && walked(rep)
	s.RowsHeld = int64(st.Rows.Held)
	s.RowsOwned = int64(st.Rows.Held) + int64(st.Rows.OwnedNotHeld)
	s.Due = int64(st.Due)
	s.Exact = st.Exact
	s.Edge = secTime(st.Edge)
	s.Epoch = st.Membership.Epoch
	s.PreparedEpoch = st.Membership.PreparedEpoch
	s.RowsHeldBack = int64(st.HeldBack)
	s.HeldBack = heldBackText(st.Fences)
	s.Error = st.Error
	if st.EdgeAheadSeconds != nil {
		v := int64(math.Floor(*st.EdgeAheadSeconds))
		if prev != nil && prev.EdgeAheadSeconds != nil && prev.Edge != nil && s.Edge != nil && prev.Edge.Equal(s.Edge) &&
			(*prev.EdgeAheadSeconds < 0) == (v < 0) && abs64(v-*prev.EdgeAheadSeconds) < edgeAheadTolerance(*prev.EdgeAheadSeconds) {
			v = *prev.EdgeAheadSeconds
		}
		s.EdgeAheadSeconds = &v
	}
	if w := st.LastWalk; w != nil {
		startedAt := w.StartedAt
		s.LastWalk = &rqv1.WalkSummary{
			StartedAt:      secTime(&startedAt),
			FinishedAt:     secTime(w.FinishedAt),
			Partial:        w.Partial,
			Failed:         w.Failed,
			Scanned:        int64(w.Scanned),
			Admitted:       int64(w.Admitted),
			Repaired:       int64(w.Repaired),
			Invalid:        int64(w.Invalid),
			UnreadSegments: int64(w.UnreadSegments),
		}
		if w.Failed && s.Error == "" {
			s.Error = w.Error
		}
	}
	return s
}

// maxHeldBackText bounds ShardStatus.HeldBack (its CRD's maxLength).
const maxHeldBackText = 1024

// heldBackText is a shard's fences in one line for its status: "slots 0-63 until
// 2026-12-01T12:00:30Z (why); slots 64-127 until their handover (why)".
func heldBackText(fs []shardapi.Fence) string {
	parts := make([]string, 0, len(fs))
	for _, f := range fs {
		until := "their handover"
		if f.Until != nil {
			until = f.Until.UTC().Format(time.RFC3339)
		}
		parts = append(parts, fmt.Sprintf("slots %s until %s (%s)", f.Slots, until, f.Reason))
	}
	text := strings.Join(parts, "; ")
	if len(text) > maxHeldBackText {
		cut := maxHeldBackText - len("…")
		for cut > 0 && !utf8.RuneStart(text[cut]) {
			cut--
		}
		text = text[:cut] + "…"
	}
	return text
}

// validateReport checks the parts of a shard's status the operator computes with; a report that
// fails is treated like an unreachable shard.
func validateReport(st *shardapi.Status) (membership.ShardDue, error) {
	owned, err := schedule.ParseSlots(st.Membership.Owned)
	if err != nil {
		return membership.ShardDue{}, fmt.Errorf("bad membership.owned: %w", err)
	}
	incoming, err := schedule.ParseSlots(st.Membership.Incoming)
	if err != nil {
		return membership.ShardDue{}, fmt.Errorf("bad membership.incoming: %w", err)
	}
	per, err := slotCounts("duePerSlot", st.DuePerSlot, owned)
	if err != nil {
		return membership.ShardDue{}, err
	}
	d := membership.ShardDue{Owned: owned, DuePerSlot: per}
	// incoming slots count only once the shard has walked all of them for the epoch it reports;
	// which report a slot's count comes from is membership.SumDue's (pkg/membership's doc, "When a
	// moving slot's count counts")
	if st.Membership.PreparedEpoch >= st.Membership.Epoch && !incoming.IsEmpty() {
		if d.DuePerPreparedSlot, err = slotCounts("duePerIncomingSlot", st.DuePerIncomingSlot, incoming); err != nil {
			return membership.ShardDue{}, err
		}
		d.Prepared = incoming
	}
	return d, nil
}

// slotCounts parses a per-slot count map whose slots must all be in within.
func slotCounts(field string, m map[string]int, within schedule.SlotSet) (map[int]int, error) {
	out := make(map[int]int, len(m))
	for k, v := range m {
		slot, err := strconv.Atoi(k)
		if err != nil || slot < 0 || slot >= schedule.NumSlots || v < 0 || !within.Has(slot) {
			return nil, fmt.Errorf("bad %s entry %q: %d", field, k, v)
		}
		out[slot] = v
	}
	return out, nil
}

// StatusInputs is what ComputeStatus needs besides the RenderQueue.
type StatusInputs struct {
	// Committed is the assignment next.Membership publishes (parsed once per reconcile, or as
	// the membership step made it).
	Committed membership.Assignment
	// Reports are the shards' reports of this poll, in shard order.
	Reports []ShardReport
	// Progress is what the operator is changing (the Progressing condition); nil when nothing.
	Progress *Progress
	// Blocked is what stops the operator from acting on the spec (the Reconciled condition);
	// nil when nothing does.
	Blocked *Blocker
	// Now is the time of this reconcile, truncated to the second.
	Now time.Time
}

// ComputeStatus fills next (already carrying the membership step's result) with the shards,
// the due sum and the conditions.
func ComputeStatus(rq *rqv1.RenderQueue, next *rqv1.RenderQueueStatus, in StatusInputs) error {
	committed := in.Committed
	prev := map[string]*rqv1.ShardStatus{}
	for i := range rq.Status.Shards {
		prev[rq.Status.Shards[i].Name] = &rq.Status.Shards[i]
	}
	dues := map[string]membership.ShardDue{}
	shards := make([]rqv1.ShardStatus, 0, len(in.Reports))
	allExact := true
	var notAdopted []string
	answered := make([]ShardReport, 0, len(in.Reports)) // the reports with a valid status
	for _, rep := range in.Reports {
		if rep.Status != nil {
			d, err := validateReport(rep.Status)
			if err != nil {
				rep.Status, rep.Err = nil, fmt.Errorf("bad status: %w", err)
			} else {
				answered = append(answered, rep)
				dues[rep.Name] = d
				if want := committed.Owned(rep.Name); d.Owned != want {
					notAdopted = append(notAdopted, rep.Name)
				}
			}
		}
		s := shardStatus(rep, schedule.FormatSlots(committed.Owned(rep.Name)), prev[rep.Name])
		if !reachable(s) || !s.Exact {
			allExact = false
		}
		shards = append(shards, s)
	}
	due, sumExact := membership.SumDue(committed, dues)
	next.Shards = shards
	next.ObservedGeneration = rq.Generation
	next.Selector = specs.SelectorString(rq)
	next.CurrentShards = int32(len(committed.Counts()))
	var ready int32
	for _, s := range shards {
		if s.Ready {
			ready++
		}
	}
	next.ReadyShards = ready
	dueExact := sumExact && allExact
	dueChanged := next.DueAsOf == nil || int64(due) != next.Due || dueExact != next.DueExact
	if dueChanged {
		next.DueAsOf = ptr.To(metav1.NewTime(in.Now))
	}
	next.Due, next.DueExact = int64(due), dueExact
	next.Forecast = Forecast(next.Forecast, ForecastInputs{Now: in.Now, Due: int64(due), DueExact: dueExact, DueChanged: dueChanged,
		Handoff: next.Membership.HandoffInProgress(), NotAdopted: notAdopted, Reports: answered})
	next.RowsHeldBack = 0
	for _, s := range shards {
		next.RowsHeldBack += s.RowsHeldBack
	}

	epoch := next.Membership.Epoch
	SetCondition(next, rq.Generation, in.Now, rqv1.ConditionReady, readyCondition(shards))
	SetCondition(next, rq.Generation, in.Now, rqv1.ConditionExact, exactCondition(shards, sumExact, notAdopted, epoch))
	SetCondition(next, rq.Generation, in.Now, rqv1.ConditionEdgeHealthy, edgeCondition(shards))
	SetCondition(next, rq.Generation, in.Now, rqv1.ConditionWalksComplete, walksCondition(shards))
	SetCondition(next, rq.Generation, in.Now, rqv1.ConditionProgressing, progressingCondition(in.Progress, shards, epoch))
	SetCondition(next, rq.Generation, in.Now, rqv1.ConditionReconciled, reconciledCondition(in.Blocked))
	SetCondition(next, rq.Generation, in.Now, rqv1.ConditionClassesServed, classesServedCondition(answered))
	return nil
}

// SetCondition sets the condition typ of st to c, observed at generation; its transition time
// is now when its status changes.
func SetCondition(st *rqv1.RenderQueueStatus, generation int64, now time.Time, typ string, c Condition) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{
		Type:               typ,
		Status:             c.Status,
		Reason:             c.Reason,
		Message:            c.Message,
		ObservedGeneration: generation,
		LastTransitionTime: metav1.NewTime(now),
	})
}
