package podworker

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestPodPhase(t *testing.T) {
	running := corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	waiting := corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}
	crashLoop := corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}}
	ok := corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}}
	failed := corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2}}}
	for _, c := range []struct {
		name      string
		initsDone bool
		apps      []corev1.ContainerStatus
		policy    corev1.RestartPolicy
		want      corev1.PodPhase
	}{
		{"init running", false, []corev1.ContainerStatus{waiting}, corev1.RestartPolicyAlways, corev1.PodPending},
		{"creating", true, []corev1.ContainerStatus{waiting}, corev1.RestartPolicyAlways, corev1.PodPending},
		{"one creating, one running", true, []corev1.ContainerStatus{waiting, running}, corev1.RestartPolicyAlways, corev1.PodPending},
		{"running", true, []corev1.ContainerStatus{running}, corev1.RestartPolicyAlways, corev1.PodRunning},
		{"crash loop", true, []corev1.ContainerStatus{crashLoop}, corev1.RestartPolicyAlways, corev1.PodRunning},
		{"all exited 0, Never", true, []corev1.ContainerStatus{ok, ok}, corev1.RestartPolicyNever, corev1.PodSucceeded},
		{"one failed, Never", true, []corev1.ContainerStatus{ok, failed}, corev1.RestartPolicyNever, corev1.PodFailed},
		{"one failed, OnFailure", true, []corev1.ContainerStatus{ok, failed}, corev1.RestartPolicyOnFailure, corev1.PodRunning},
		{"exited, Always", true, []corev1.ContainerStatus{ok}, corev1.RestartPolicyAlways, corev1.PodRunning},
	} {
		if got := podPhase(c.initsDone, nil, c.apps, c.policy); got != c.want {
			t.Errorf("%s: phase %s, want %s", c.name, got, c.want)
		}
	}
}
