package policy

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

// Shard states the operator reports itself (status.shards[].state), besides the shards' own (queued,
// empty, unready).
const (
	// StatePending: the shard cannot be asked yet or is not expected to answer (no Pod, no Pod IP,
	// Pod not Ready yet, Pod being deleted).
	StatePending = "Pending"
	// StateUnreachable: the shard was asked and did not answer with a valid status.
	StateUnreachable = "Unreachable"
	// StateFailing: the shard did not answer and Kubernetes says why its keeper does not run (a
	// container waiting with an error such as CreateContainerConfigError or CrashLoopBackOff, a
	// terminated container, an unschedulable or failed Pod); the shard's error is
	// "<Reason>: <message>" from the Pod's status (podProblem).
	StateFailing = "Failing"
)

// Progress is what the operator is changing, for the Progressing condition; nil when nothing.
type Progress struct {
	// Reason is the condition's reason (Rebalancing, RollingUpdate).
	Reason string
	// Message says what changes and what it waits for.
	Message string
}

// Condition is the outcome of a condition policy: the status, a CamelCase reason and a message
// naming the shard and the figure.
type Condition struct {
	// Status is True, False or Unknown.
	Status metav1.ConditionStatus
	// Reason is the CamelCase reason.
	Reason string
	// Message is for people.
	Message string
}

// reachable reports whether the operator read the shard's status in the last poll.
func reachable(s rqv1.ShardStatus) bool {
	return s.State != StatePending && s.State != StateUnreachable && s.State != StateFailing
}

// troubled reports whether the shard is not ready for a reason someone must look at: its Pod
// cannot run the keeper, a Ready Pod does not answer, or the shard answers with an error while not
// ready (its database unreachable, say). A Pod that is starting or a shard that is loading is not
// troubled.
func troubled(s rqv1.ShardStatus) bool {
	switch s.State {
	case StateFailing, StateUnreachable:
		return true
	case StatePending:
		return false
	default:
		return !s.Ready && s.Error != ""
	}
}

// troubleKey identifies what is wrong with a shard, for events on a change: "Failing/<Reason>"
// for a Failing shard (CrashLoopBackOff of "CrashLoopBackOff: ...", so a new back-off message is
// not a new problem), "error/<error>" for a shard answering with an error while not ready, ""
// otherwise (Unreachable has events of its own).
func troubleKey(s rqv1.ShardStatus) string {
	switch {
	case s.State == StateFailing:
		reason, _, _ := strings.Cut(s.Error, ":")
		return StateFailing + "/" + reason
	case s.State == StateUnreachable || !troubled(s):
		return ""
	default:
		return "error/" + s.Error
	}
}

// troubleMessage says what is wrong with a troubled shard, for people.
func troubleMessage(s rqv1.ShardStatus) string {
	if s.State == StateFailing {
		return fmt.Sprintf("shard %s cannot run: %s", s.Name, s.Error)
	}
	return fmt.Sprintf("shard %s is %s: %s", s.Name, s.State, s.Error)
}

// maxProblemMessage bounds the part of a container's message quoted in a shard's error.
const maxProblemMessage = 300

// podProblem says why the Pod of a shard does not run its keeper, from the Pod's status as the
// kubelet reports it: a CamelCase reason (the kubelet's own: CreateContainerConfigError,
// CrashLoopBackOff, ImagePullBackOff, Unschedulable, Evicted, ...) and a message naming the
// cause (`secret "renderqueue-db" not found`; for a crash loop the last exit code and the last
// line of the container's termination message). ("", "") when nothing is known to be wrong: no
// Pod, a Pod being deleted, containers creating or running.
func podProblem(pod *corev1.Pod) (reason, message string) {
	if pod == nil || pod.DeletionTimestamp != nil {
		return "", ""
	}
	if pod.Status.Phase == corev1.PodFailed {
		reason = pod.Status.Reason
		if reason == "" {
			reason = "PodFailed"
		}
		return reason, oneLine(pod.Status.Message)
	}
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, cs := range list {
			if r, m := containerProblem(cs); r != "" {
				return r, m
			}
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			reason = c.Reason
			if reason == "" {
				reason = "Unschedulable"
			}
			return reason, oneLine(c.Message)
		}
	}
	return "", ""
}

// containerProblem is podProblem for one container status.
func containerProblem(cs corev1.ContainerStatus) (reason, message string) {
	switch {
	case cs.State.Waiting != nil:
		w := cs.State.Waiting
		if w.Reason == "" || w.Reason == "ContainerCreating" || w.Reason == "PodInitializing" {
			return "", ""
		}
		if w.Reason == "CrashLoopBackOff" {
			msg := fmt.Sprintf("container %s restarted %d times", cs.Name, cs.RestartCount)
			if t := cs.LastTerminationState.Terminated; t != nil {
				msg = terminated(cs.Name, t) + fmt.Sprintf("; restarted %d times", cs.RestartCount)
			}
			return w.Reason, msg
		}
		return w.Reason, oneLine(w.Message)
	case cs.State.Terminated != nil:
		t := cs.State.Terminated
		reason = t.Reason
		if reason == "" {
			reason = "Terminated"
		}
		return reason, terminated(cs.Name, t)
	default:
		return "", ""
	}
}

// terminated describes a container's termination: "container keeper exited with code 1
// (Error): <last line of its termination message>".
func terminated(name string, t *corev1.ContainerStateTerminated) string {
	msg := fmt.Sprintf("container %s exited with code %d", name, t.ExitCode)
	if t.Signal != 0 {
		msg = fmt.Sprintf("container %s was killed by signal %d", name, t.Signal)
	}
	if t.Reason != "" {
		msg += " (" + t.Reason + ")"
	}
	if line := lastLine(t.Message); line != "" {
		msg += ": " + line
	}
	return msg
}

// lastLine is the last non-empty line of s, shortened to maxProblemMessage: a termination
// message taken from the container's log (FallbackToLogsOnError) ends with the fatal error.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return oneLine(lines[len(lines)-1])
}

// oneLine is s on one line, shortened to maxProblemMessage.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > maxProblemMessage {
		s = s[:maxProblemMessage] + "..."
	}
	return s
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
func readyCondition(shards []rqv1.ShardStatus) Condition {
	if len(shards) == 0 {
		return Condition{metav1.ConditionFalse, rqv1.ReasonShardsNotReady, "no shards yet"}
	}
	ready := 0
	var first *rqv1.ShardStatus // the first troubled shard, else the first not ready
	for i := range shards {
		switch {
		case shards[i].Ready:
			ready++
		case first == nil || (troubled(shards[i]) && !troubled(*first)):
			first = &shards[i]
		}
	}
	if first == nil {
		return Condition{metav1.ConditionTrue, rqv1.ReasonAllShardsReady, fmt.Sprintf("%d of %d shards ready", ready, len(shards))}
	}
	if first.State == StateFailing {
		return Condition{metav1.ConditionFalse, rqv1.ReasonShardsNotReady,
			fmt.Sprintf("%d of %d shards ready; shard %s cannot run: %s", ready, len(shards), first.Name, first.Error)}
	}
	why := first.State
	if first.Error != "" {
		why += ": " + first.Error
	} else if first.State != StatePending && first.State != StateUnreachable {
		why = "loading (" + first.State + ")"
	}
	return Condition{metav1.ConditionFalse, rqv1.ReasonShardsNotReady,
		fmt.Sprintf("%d of %d shards ready; shard %s is %s", ready, len(shards), first.Name, why)}
}

// exactCondition: True when status.due is the true count: every shard reachable and exact, and
// every slot's owner has adopted the committed assignment (sumExact, see membership.SumDue).
// notAdopted names owners whose report does not match the assignment at epoch.
func exactCondition(shards []rqv1.ShardStatus, sumExact bool, notAdopted []string, epoch int64) Condition {
	if len(shards) == 0 {
		return Condition{metav1.ConditionFalse, rqv1.ReasonNoShardReports, "no shards yet; due is unknown"}
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
		switch s.State {
		case StatePending:
			what = "not serving yet"
		case StateFailing:
			what = "not running"
		}
		msg := fmt.Sprintf("shard %s is %s", s.Name, what)
		if s.Error != "" {
			msg += " (" + s.Error + ")"
		}
		return Condition{metav1.ConditionFalse, rqv1.ReasonShardUnreachable,
			msg + andMore(len(unreachable)-1) + "; due is a lower bound"}
	}
	if len(inexact) > 0 {
		s := inexact[0]
		why := s.State
		if s.Error != "" {
			why += ": " + s.Error
		}
		return Condition{metav1.ConditionFalse, rqv1.ReasonShardInexact, fmt.Sprintf(
			"shard %s does not vouch for its due count %d (status %s)%s; due is a lower bound",
			s.Name, s.Due, why, andMore(len(inexact)-1))}
	}
	if !sumExact {
		msg := fmt.Sprintf("the owners of some slots have not adopted the assignment at epoch %d yet", epoch)
		if len(notAdopted) > 0 {
			msg = fmt.Sprintf("shard %s has not adopted the assignment at epoch %d yet%s", notAdopted[0], epoch, andMore(len(notAdopted)-1))
		}
		return Condition{metav1.ConditionFalse, rqv1.ReasonMembershipChanging, msg + "; due is a lower bound"}
	}
	return Condition{metav1.ConditionTrue, rqv1.ReasonAllShardsExact,
		fmt.Sprintf("all %d shards are reachable and exact; due is the true count", len(shards))}
}

// edgeCondition: False (EdgeLagging) when a reachable shard's edge is behind now, naming the
// shard lagging most and by how much.
func edgeCondition(shards []rqv1.ShardStatus) Condition {
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
		return Condition{metav1.ConditionFalse, rqv1.ReasonEdgeLagging, fmt.Sprintf(
			"shard %s edge is %s behind now%s: rows coming due past the edge may not be held",
			worst.Name, formatLag(time.Duration(-*worst.EdgeAheadSeconds)*time.Second), andMore(lagging-1))}
	case asked == 0:
		return Condition{metav1.ConditionUnknown, rqv1.ReasonNoShardReports, "no shard could be asked"}
	default:
		return Condition{metav1.ConditionTrue, rqv1.ReasonEdgeAhead, "every reachable shard's edge is ahead of now"}
	}
}

// walksCondition: False (PartialWalk) when a shard's last walk left segments unread, False
// (WalkFailed) when it failed as a whole.
func walksCondition(shards []rqv1.ShardStatus) Condition {
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
		return Condition{metav1.ConditionFalse, rqv1.ReasonPartialWalk, fmt.Sprintf(
			"shard %s's last walk left %d segments unread%s%s", s.Name, s.LastWalk.UnreadSegments,
			finishedAt(s.LastWalk), andMore(len(partial)-1))}
	case len(failed) > 0:
		s := failed[0]
		msg := fmt.Sprintf("shard %s's last walk failed%s", s.Name, finishedAt(s.LastWalk))
		if s.Error != "" {
			msg += ": " + s.Error
		}
		return Condition{metav1.ConditionFalse, rqv1.ReasonWalkFailed, msg + andMore(len(failed)-1)}
	case !walkedAny:
		return Condition{metav1.ConditionUnknown, rqv1.ReasonNoShardReports, "no shard has reported a finished walk yet"}
	default:
		return Condition{metav1.ConditionTrue, rqv1.ReasonWalksComplete, "every shard's last walk read all its segments"}
	}
}

func finishedAt(w *rqv1.WalkSummary) string {
	if w.FinishedAt == nil {
		return ""
	}
	return " (finished " + w.FinishedAt.UTC().Format(time.RFC3339) + ")"
}

// progressingCondition: True while the operator changes the shards (p, from the membership and
// rolling update steps) or a shard is loading (not ready, not troubled: a shard that cannot run
// or reports an error is not making progress); False (Settled) otherwise.
func progressingCondition(p *Progress, shards []rqv1.ShardStatus, epoch int64) Condition {
	if p != nil {
		return Condition{metav1.ConditionTrue, p.Reason, p.Message}
	}
	var loading []string
	for _, s := range shards {
		if !s.Ready && !troubled(s) {
			loading = append(loading, s.Name)
		}
	}
	if len(loading) > 0 {
		return Condition{metav1.ConditionTrue, rqv1.ReasonLoading, fmt.Sprintf(
			"shard %s is loading%s; %d of %d shards ready", loading[0], andMore(len(loading)-1),
			len(shards)-len(loading), len(shards))}
	}
	var holding []rqv1.ShardStatus
	for _, s := range shards {
		if s.HeldBack != "" {
			holding = append(holding, s)
		}
	}
	if len(holding) > 0 {
		return Condition{metav1.ConditionTrue, rqv1.ReasonRowsHeldBack, heldBackMessage(holding[0]) + andMore(len(holding)-1)}
	}
	return Condition{metav1.ConditionFalse, rqv1.ReasonSettled,
		fmt.Sprintf("%d shards settled at membership epoch %d", len(shards), epoch)}
}

// heldBackMessage says what shard s holds back: "shard web-shard-1 holds back 120 due rows:
// slots 0-63 until ... (why)".
func heldBackMessage(s rqv1.ShardStatus) string {
	return fmt.Sprintf("shard %s holds back %d due rows: %s", s.Name, s.RowsHeldBack, s.HeldBack)
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
