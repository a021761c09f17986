//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
)

const (
	alertFastBurn = "RenderQueueObjectiveFastBurn"
	objectiveName = "fresh"
	// objectiveLateness is the e2e objective's maxLateness: rows due and not claimed within it
	// are late events.
	objectiveLateness = 15 * time.Second
	// lateRows are made due while no worker runs (each a late event once objectiveLateness has
	// passed); burstRows are made due at once when the workers are back, and rendered in time.
	// The fast burn alert is a late share above 14.4 × (1 − 0.99) = 0.144 over 5 minutes and
	// over an hour: 150 late of 150 fires it, 150 late of 1,350 (0.111) clears it. The sample's
	// workers (4 Pods of 16 renders of 200 ms) render the burst in about 4 s, well within
	// objectiveLateness.
	lateRows, burstRows = 150, 1200
	burnWorkers         = 4
)

// stepObjectiveBurn: a freshness objective on the sample queue (spec.objectives: every row
// rendered within objectiveLateness of due, 99%), and the shipped fast burn-rate alert
// (config/prometheus, RenderQueueObjectiveFastBurn; its `for:` shortened to promRulesFor) on the
// real Prometheus of stepPrometheus. The render workers of stepWorkers are scaled to 0 (their HPA
// deleted) and lateRows rows made due: they pass their maxLateness unrendered, the shards count
// them late, status.objectives and ObjectivesMet (kubectl describe) say the objective is missed,
// and the alert goes pending, then fires. The workers are scaled back up and burstRows rows made
// due at once: rendered in time, they are good events that bring the late share of the alert's
// windows under its threshold, and the alert resolves. (In a real fleet the late events leave the
// 5-minute window within 5 minutes of the last one; the burst makes that happen at once.)
func (e *env) stepObjectiveBurn(t *testing.T) {
	api, ok := e.runningProm()
	if !ok {
		t.Fatal("no Prometheus running (stepPrometheus did not run?)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	patch := fmt.Sprintf(`{"spec":{"objectives":[{"name":%q,"class":{},"percentile":"99","maxLateness":%q}]}}`, objectiveName, objectiveLateness.String())
	e.kubectl("patch", "renderqueue", queueName, "--type=merge", "-p", patch)
	shards := len(e.queue().Status.Shards)
	target := fmt.Sprintf(`renderqueue_keeper_objective_target_ratio{namespace=%q, renderqueue=%q, objective=%q}`, namespace, queueName, objectiveName)
	e.eventually(t, 2*time.Minute, time.Second, fmt.Sprintf("every shard (%d) exporting objective %s to Prometheus", shards, objectiveName), func() (bool, string) {
		s, err := api.query(target)
		if err != nil {
			return false, err.Error()
		}
		return len(s) == shards, fmt.Sprintf("%d series of %s", len(s), target)
	})
	t.Logf("spec.objectives: %s; every shard counts it", patch)

	// the workers down
	e.kubectl("-n", namespace, "delete", "hpa", workers, "--wait=true")
	e.kubectl("-n", namespace, "scale", "deployment", workers, "--replicas=0")
	e.eventually(t, time.Minute, 500*time.Millisecond, "no worker Pods", func() (bool, string) {
		pods, err := e.c.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + workers})
		if err != nil {
			return false, err.Error()
		}
		return len(pods.Items) == 0, fmt.Sprintf("%d worker Pods", len(pods.Items))
	})
	made := e.sql(fmt.Sprintf(`UPDATE render_schedule SET due_at = now() WHERE key IN
		(SELECT key FROM render_schedule WHERE due_at > now() + interval '4 hours' ORDER BY key LIMIT %d)`, lateRows))
	if made != lateRows {
		t.Fatalf("made %d rows due, want %d", made, lateRows)
	}
	start := time.Now()
	t.Logf("%s workers at 0; %d rows made due (late %s from now unless claimed)", start.Format("15:04:05.000"), made, objectiveLateness)

	state := "inactive"
	var activeAt, firingAt time.Time
	watch := func(what string, timeout time.Duration, until func() bool) {
		t.Helper()
		e.eventually(t, timeout, 500*time.Millisecond, what, func() (bool, string) {
			a, err := api.alertOf(alertFastBurn, namespace, queueName)
			if err != nil {
				return false, err.Error()
			}
			now := "inactive"
			if a != nil {
				now = a.State
				if a.Labels["objective"] != objectiveName {
					e.errorf(t, "%s fires for objective %q, want %q: %v", alertFastBurn, a.Labels["objective"], objectiveName, a.Labels)
				}
			}
			if now != state {
				line := fmt.Sprintf("%s +%s %s %s → %s", time.Now().Format("15:04:05.000"), time.Since(start).Round(100*time.Millisecond), alertFastBurn, state, now)
				if a != nil {
					line += fmt.Sprintf(" (activeAt %s, burn rate %s, severity %s)", a.ActiveAt.Format("15:04:05.000"), a.Value, a.Labels["severity"])
					activeAt = a.ActiveAt
				}
				t.Log(line)
				switch {
				case now == "pending" && state == "inactive":
				case now == "firing" && state == "pending":
					firingAt = time.Now()
				case now == "inactive" && state == "firing":
				default:
					e.errorf(t, "%s went %s → %s: want inactive → pending → firing → inactive", alertFastBurn, state, now)
				}
				state = now
			}
			return until(), "alert " + state
		})
	}
	watch(alertFastBurn+" firing with the workers at 0", 3*time.Minute, func() bool { return state == "firing" })
	if firingAt.Sub(activeAt) < promRulesFor {
		e.errorf(t, "%s fired at %s, less than its for (%s) after it became active at %s", alertFastBurn,
			firingAt.Format("15:04:05.000"), promRulesFor, activeAt.Format("15:04:05.000"))
	}
	// what the status and describe say meanwhile
	var o rqv1.ObjectiveStatus
	e.eventually(t, time.Minute, time.Second, "status.objectives counting the late rows, ObjectivesMet False", func() (bool, string) {
		st := e.queue().Status
		for _, s := range st.Objectives {
			if s.Name == objectiveName {
				o = s
			}
		}
		c := meta.FindStatusCondition(st.Conditions, rqv1.ConditionObjectivesMet)
		if c == nil {
			return false, fmt.Sprintf("objective %+v; no ObjectivesMet condition", o)
		}
		return o.Late >= lateRows && !o.Met && c.Status == metav1.ConditionFalse && c.Reason == rqv1.ReasonObjectiveMissed &&
				strings.Contains(c.Message, objectiveName),
			fmt.Sprintf("objective %+v; ObjectivesMet %s %s: %s", o, c.Status, c.Reason, c.Message)
	})
	describe := e.kubectl("describe", "renderqueue", queueName)
	for _, want := range []string{"Objectives:", objectiveName, "ObjectivesMet", rqv1.ReasonObjectiveMissed} {
		if !strings.Contains(describe, want) {
			e.errorf(t, "kubectl describe does not show %q while the objective is missed", want)
		}
	}
	t.Logf("status.objectives: good %d, late %d, attainment %s, budget remaining %s, burn rate 1h %s; kubectl describe:\n%s",
		o.Good, o.Late, o.Attainment, o.BudgetRemaining, o.BurnRate1h, describe)

	// the workers back, and a burst rendered in time
	e.kubectl("-n", namespace, "scale", "deployment", workers, fmt.Sprintf("--replicas=%d", burnWorkers))
	e.eventually(t, 90*time.Second, 500*time.Millisecond, "the worker Pods ready", func() (bool, string) {
		pods, err := e.c.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + workers})
		if err != nil {
			return false, err.Error()
		}
		ready := 0
		for i := range pods.Items {
			if ok, _ := podIsReady(&pods.Items[i]); ok {
				ready++
			}
		}
		return ready == burnWorkers, fmt.Sprintf("%d of %d worker Pods ready", ready, burnWorkers)
	})
	made = e.sql(fmt.Sprintf(`UPDATE render_schedule SET due_at = now() WHERE key IN
		(SELECT key FROM render_schedule WHERE due_at > now() + interval '4 hours' ORDER BY key LIMIT %d)`, burstRows))
	if made != burstRows {
		t.Fatalf("made %d rows due, want %d", made, burstRows)
	}
	back := time.Now()
	t.Logf("%s %d workers back; %d rows made due at once", back.Format("15:04:05.000"), burnWorkers, made)
	watch(alertFastBurn+" resolved once the burst is rendered in time", 3*time.Minute, func() bool { return state == "inactive" })
	t.Logf("%s resolved %s after the workers came back", alertFastBurn, time.Since(back).Round(100*time.Millisecond))
	e.eventually(t, time.Minute, time.Second, "status.objectives counting the burst good", func() (bool, string) {
		for _, s := range e.queue().Status.Objectives {
			if s.Name == objectiveName {
				o = s
			}
		}
		return o.Good >= burstRows, fmt.Sprintf("objective %+v", o)
	})
	t.Logf("status.objectives: good %d, late %d, attainment %s, budget remaining %s, burn rate 1h %s", o.Good, o.Late, o.Attainment, o.BudgetRemaining, o.BurnRate1h)
}
