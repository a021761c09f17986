package controllers

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// Shard phases the operator reports itself, besides the shards' own (queued, empty, unready).
const (
	// PhasePending: the shard cannot be asked yet or is not expected to answer (no Pod, no Pod IP,
	// Pod not Ready yet, Pod being deleted).
	PhasePending = "Pending"
	// PhaseUnreachable: the shard was asked and did not answer with a valid status.
	PhaseUnreachable = "Unreachable"
)

// condition is the outcome of a condition policy: the status, a CamelCase reason and a message
// naming the shard and the figure.
type condition struct {
	Status  metav1.ConditionStatus
	Reason  string
	Message string
}

// reachable reports whether the operator read the shard's status in the last poll.
func reachable(s rqv1.ShardStatus) bool {
	return s.Phase != PhasePending && s.Phase != PhaseUnreachable
}

// andMore is " (and N more shards)" for n > 0.
func andMore(n int) string {
	switch {
	case n <= 0:
		return ""
	case n == 1:
		return " (and 1 more shard)"
	default:
		return fmt.Sprintf(" (and %d more shards)", n)
	}
}

// readyCondition: True when every shard is ready (loaded and reachable).
func readyCondition(shards []rqv1.ShardStatus) condition {
	if len(shards) == 0 {
		return condition{metav1.ConditionFalse, rqv1.ReasonShardsNotReady, "no shards yet"}
	}
	ready := 0
	var first *rqv1.ShardStatus
	for i := range shards {
		if shards[i].Ready {
			ready++
		} else if first == nil {
			first = &shards[i]
		}
	}
	if first == nil {
		return condition{metav1.ConditionTrue, rqv1.ReasonAllShardsReady, fmt.Sprintf("%d of %d shards ready", ready, len(shards))}
	}
	why := first.Phase
	if first.Error != "" {
		why += ": " + first.Error
	} else if first.Phase != PhasePending && first.Phase != PhaseUnreachable {
		why = "loading (" + first.Phase + ")"
	}
	return condition{metav1.ConditionFalse, rqv1.ReasonShardsNotReady,
		fmt.Sprintf("%d of %d shards ready; shard %s is %s", ready, len(shards), first.Name, why)}
}

// exactCondition: True when status.due is the true count: every shard reachable and exact, and
// every slot's owner has adopted the committed assignment (sumExact, see membership.SumDue).
// notAdopted names owners whose report does not match the assignment at epoch.
func exactCondition(shards []rqv1.ShardStatus, sumExact bool, notAdopted []string, epoch int64) condition {
	if len(shards) == 0 {
		return condition{metav1.ConditionFalse, rqv1.ReasonNoShardReports, "no shards yet; due is unknown"}
	}
	var unreachable, inexact []rqv1.ShardStatus
	for _, s := range shards {
		switch {
		case !reachable(s):
			unreachable = append(unreachable, s)
		case !s.Exact:
			inexact = append(inexact, s)
		}
	}
	if len(unreachable) > 0 {
		s := unreachable[0]
		what := "unreachable"
		if s.Phase == PhasePending {
			what = "not serving yet"
		}
		msg := fmt.Sprintf("shard %s is %s", s.Name, what)
		if s.Error != "" {
			msg += " (" + s.Error + ")"
		}
		return condition{metav1.ConditionFalse, rqv1.ReasonShardUnreachable,
			msg + andMore(len(unreachable)-1) + "; due is a lower bound"}
	}
	if len(inexact) > 0 {
		s := inexact[0]
		return condition{metav1.ConditionFalse, rqv1.ReasonShardInexact, fmt.Sprintf(
			"shard %s does not vouch for its due count %d (status %s)%s; due is a lower bound",
			s.Name, s.Due, s.Phase, andMore(len(inexact)-1))}
	}
	if !sumExact {
		msg := fmt.Sprintf("the owners of some slots have not adopted the assignment at epoch %d yet", epoch)
		if len(notAdopted) > 0 {
			msg = fmt.Sprintf("shard %s has not adopted the assignment at epoch %d yet%s", notAdopted[0], epoch, andMore(len(notAdopted)-1))
		}
		return condition{metav1.ConditionFalse, rqv1.ReasonMembershipChanging, msg + "; due is a lower bound"}
	}
	return condition{metav1.ConditionTrue, rqv1.ReasonAllShardsExact,
		fmt.Sprintf("all %d shards are reachable and exact; due is the true count", len(shards))}
}

// edgeCondition: False (EdgeLagging) when a reachable shard's edge is behind now, naming the
// shard lagging most and by how much.
func edgeCondition(shards []rqv1.ShardStatus) condition {
	var worst *rqv1.ShardStatus
	lagging, asked := 0, 0
	for i := range shards {
		s := &shards[i]
		if !reachable(*s) {
			continue
		}
		asked++
		if s.EdgeAheadSeconds != nil && *s.EdgeAheadSeconds < 0 {
			lagging++
			if worst == nil || *s.EdgeAheadSeconds < *worst.EdgeAheadSeconds {
				worst = s
			}
		}
	}
	switch {
	case worst != nil:
		return condition{metav1.ConditionFalse, rqv1.ReasonEdgeLagging, fmt.Sprintf(
			"shard %s edge is %s behind now%s: rows coming due past the edge may not be held",
			worst.Name, formatLag(time.Duration(-*worst.EdgeAheadSeconds)*time.Second), andMore(lagging-1))}
	case asked == 0:
		return condition{metav1.ConditionUnknown, rqv1.ReasonNoShardReports, "no shard could be asked"}
	default:
		return condition{metav1.ConditionTrue, rqv1.ReasonEdgeAhead, "every reachable shard's edge is ahead of now"}
	}
}

// walksCondition: False (PartialWalk) when a shard's last walk left segments unread, False
// (WalkFailed) when it failed as a whole.
func walksCondition(shards []rqv1.ShardStatus) condition {
	var partial, failed []rqv1.ShardStatus
	walkedAny := false
	for _, s := range shards {
		if s.LastWalk == nil {
			continue
		}
		walkedAny = true
		switch {
		case s.LastWalk.Failed:
			failed = append(failed, s)
		case s.LastWalk.Partial:
			partial = append(partial, s)
		}
	}
	switch {
	case len(partial) > 0:
		s := partial[0]
		return condition{metav1.ConditionFalse, rqv1.ReasonPartialWalk, fmt.Sprintf(
			"shard %s's last walk left %d segments unread%s%s", s.Name, s.LastWalk.UnreadSegments,
			finishedAt(s.LastWalk), andMore(len(partial)-1))}
	case len(failed) > 0:
		s := failed[0]
		msg := fmt.Sprintf("shard %s's last walk failed%s", s.Name, finishedAt(s.LastWalk))
		if s.Error != "" {
			msg += ": " + s.Error
		}
		return condition{metav1.ConditionFalse, rqv1.ReasonWalkFailed, msg + andMore(len(failed)-1)}
	case !walkedAny:
		return condition{metav1.ConditionUnknown, rqv1.ReasonNoShardReports, "no shard has reported a finished walk yet"}
	default:
		return condition{metav1.ConditionTrue, rqv1.ReasonWalksComplete, "every shard's last walk read all its segments"}
	}
}

func finishedAt(w *rqv1.WalkSummary) string {
	if w.FinishedAt == nil {
		return ""
	}
	return " (finished " + w.FinishedAt.UTC().Format(time.RFC3339) + ")"
}

// progressingCondition: True while the operator changes the shards (p, from the membership and
// rolling update steps) or a shard is loading; False (Settled) otherwise.
func progressingCondition(p *progress, shards []rqv1.ShardStatus, epoch int64) condition {
	if p != nil {
		return condition{metav1.ConditionTrue, p.Reason, p.Message}
	}
	var loading []string
	for _, s := range shards {
		if !s.Ready && s.Phase != PhaseUnreachable {
			loading = append(loading, s.Name)
		}
	}
	if len(loading) > 0 {
		return condition{metav1.ConditionTrue, rqv1.ReasonLoading, fmt.Sprintf(
			"shard %s is loading%s; %d of %d shards ready", loading[0], andMore(len(loading)-1),
			len(shards)-len(loading), len(shards))}
	}
	return condition{metav1.ConditionFalse, rqv1.ReasonSettled,
		fmt.Sprintf("%d shards settled at membership epoch %d", len(shards), epoch)}
}

// formatLag formats d for people, to the minute above an hour ("1h20m"), to the second below
// ("4m10s", "45s").
func formatLag(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	d = d.Round(time.Second)
	if d >= time.Hour {
		d = d.Round(time.Minute)
		h, m := d/time.Hour, (d%time.Hour)/time.Minute
		if m == 0 {
			return fmt.Sprintf("%dh", h)
		}
		return fmt.Sprintf("%dh%dm", h, m)
	}
	m, sec := d/time.Minute, (d%time.Minute)/time.Second
	switch {
	case m == 0:
		return fmt.Sprintf("%ds", sec)
	case sec == 0:
		return fmt.Sprintf("%dm", m)
	default:
		return fmt.Sprintf("%dm%ds", m, sec)
	}
}
