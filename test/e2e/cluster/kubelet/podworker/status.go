package podworker

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/runtime"
)

// buildStatus is the Pod's status as kubelet would write it now: phase, conditions, IPs, start
// time and the container statuses.
func (w *Worker) buildStatus() corev1.PodStatus {
	var inits, apps []corev1.ContainerStatus
	for _, c := range w.inits {
		inits = append(inits, c.Status())
	}
	for _, c := range w.apps {
		apps = append(apps, c.Status())
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	pod := w.pod
	st := corev1.PodStatus{
		ObservedGeneration:    pod.Generation,
		StartTime:             w.startTime,
		InitContainerStatuses: inits,
		ContainerStatuses:     apps,
	}
	if w.sandbox {
		st.HostIP = runtime.NodeIP
		st.HostIPs = []corev1.HostIP{{IP: st.HostIP}}
		st.PodIP = w.podIP
		st.PodIPs = []corev1.PodIP{{IP: w.podIP}}
	}
	st.Phase, st.Reason, st.Message = w.phase, w.reason, w.message
	if st.Phase == "" {
		st.Phase = podPhase(w.initsDone, inits, apps, w.restartPolicyLocked())
	}
	terminal := st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed

	var incomplete, unready []string
	for i, s := range inits {
		if w.inits[i].Sidecar() {
			if s.Started == nil || !*s.Started {
				incomplete = append(incomplete, s.Name)
			}
			if !s.Ready {
				unready = append(unready, s.Name)
			}
			continue
		}
		if s.State.Terminated == nil || s.State.Terminated.ExitCode != 0 {
			incomplete = append(incomplete, s.Name)
		}
	}
	for _, s := range apps {
		if !s.Ready {
			unready = append(unready, s.Name)
		}
	}
	add := func(t corev1.PodConditionType, ok bool, reason, msg string) {
		status := corev1.ConditionFalse
		if ok {
			status, reason, msg = corev1.ConditionTrue, "", ""
		}
		prev, seen := w.conditions[t]
		cond := corev1.PodCondition{Type: t, Status: status, Reason: reason, Message: msg, ObservedGeneration: pod.Generation}
		if seen && prev.Status == status {
			cond.LastTransitionTime = prev.LastTransitionTime
		} else {
			cond.LastTransitionTime = metav1.Now()
		}
		w.conditions[t] = cond
		st.Conditions = append(st.Conditions, cond)
	}
	add(corev1.PodReadyToStartContainers, w.sandbox && !terminal, "", "")
	if len(incomplete) > 0 && !terminal {
		add(corev1.PodInitialized, false, "ContainersNotInitialized", fmt.Sprintf("containers with incomplete status: [%s]", strings.Join(incomplete, " ")))
	} else {
		add(corev1.PodInitialized, true, "", "")
	}
	readyReason, readyMsg := "ContainersNotReady", fmt.Sprintf("containers with unready status: [%s]", strings.Join(unready, " "))
	if terminal {
		readyReason, readyMsg = "PodCompleted", ""
	}
	containersReady := len(unready) == 0 && !terminal
	add(corev1.ContainersReady, containersReady, readyReason, readyMsg)
	ready := containersReady
	if ready {
		// readiness gates: conditions set by others on the Pod
		for _, g := range pod.Spec.ReadinessGates {
			found := false
			for _, c := range pod.Status.Conditions {
				if c.Type == g.ConditionType {
					found = true
					if c.Status != corev1.ConditionTrue {
						ready, readyReason = false, "ReadinessGatesNotReady"
						readyMsg = fmt.Sprintf("the status of pod readiness gate %q is not \"True\", but %s", g.ConditionType, c.Status)
					}
				}
			}
			if !found {
				ready, readyReason = false, "ReadinessGatesNotReady"
				readyMsg = fmt.Sprintf("corresponding condition of pod readiness gate %q does not exist.", g.ConditionType)
			}
		}
	}
	add(corev1.PodReady, ready, readyReason, readyMsg)
	return st
}

func (w *Worker) restartPolicyLocked() corev1.RestartPolicy {
	if p := w.pod.Spec.RestartPolicy; p != "" {
		return p
	}
	return corev1.RestartPolicyAlways
}

// podPhase is kubelet's getPhase for a Pod that is not known to be terminal yet.
func podPhase(initsDone bool, inits, apps []corev1.ContainerStatus, policy corev1.RestartPolicy) corev1.PodPhase {
	if !initsDone {
		return corev1.PodPending
	}
	var running, waiting, stopped, succeeded int
	for _, s := range apps {
		switch {
		case s.State.Running != nil:
			running++
		case s.State.Terminated != nil:
			stopped++
			if s.State.Terminated.ExitCode == 0 {
				succeeded++
			}
		case s.State.Waiting != nil:
			if s.LastTerminationState.Terminated != nil {
				stopped++
			} else {
				waiting++
			}
		}
	}
	switch {
	case waiting > 0:
		return corev1.PodPending
	case running > 0:
		return corev1.PodRunning
	case stopped > 0:
		if policy == corev1.RestartPolicyAlways {
			return corev1.PodRunning // restarting
		}
		if stopped == succeeded {
			return corev1.PodSucceeded
		}
		if policy == corev1.RestartPolicyNever {
			return corev1.PodFailed
		}
		return corev1.PodRunning // OnFailure: restarting
	}
	return corev1.PodPending
}
