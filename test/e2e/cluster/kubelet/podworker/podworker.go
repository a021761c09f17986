// Package podworker runs one Pod on the local cluster's Node as kubelet's pod worker does: its
// sandbox (a Pod IP from the pod network, the Pod's directory, /etc/hosts), its volumes (kept up
// to date while it runs), its init containers in order, its sidecars alongside and its app
// containers (each run by package containerworker), activeDeadlineSeconds, the terminal phase of
// Pods whose containers have all finished for good, the Pod status (phase, conditions, IPs,
// container statuses; written only when it changed) and graceful deletion, after which it
// deletes the Pod object for good. Every field the Pod sets that is not honoured is logged once
// and recorded as a LocalRunner event of the Pod. Which Pods run is package kubelet's.
package podworker

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/kubelet/containerworker"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/kubelet/podconfig"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/runtime"
)

// Node is what the Pods of a Node share.
type Node struct {
	// Client writes the Pods' status and deletes them for good.
	Client kubernetes.Interface
	// Recorder records the Pods' events (FailedCreatePodSandBox, FailedMount, DeadlineExceeded,
	// LocalRunner).
	Recorder record.EventRecorder
	// Network hands out the Pod IPs (hostNetwork Pods have runtime.NodeIP).
	Network *runtime.PodNetwork
	// Config is where the Pods' configuration comes from.
	Config podconfig.Sources
	// Containers is what the Pods' containers share.
	Containers containerworker.Node
	// RetryPeriod is how often volumes that are not ready are tried again (besides whenever a
	// Secret or ConfigMap of the namespace changes: Worker.Kick).
	RetryPeriod time.Duration
	// VolumeSyncPeriod is how often a running Pod's volumes are brought up to date.
	VolumeSyncPeriod time.Duration
	// Logf logs what the workers do.
	Logf func(format string, args ...any)
}

// FinalDelete deletes a terminating Pod for good (grace 0, UID precondition), as kubelet does
// once its containers are stopped.
func (n *Node) FinalDelete(namespace, name string, uid types.UID) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := n.Client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		n.Logf("runner: deleting pod %s/%s: %v", namespace, name, err)
	}
}

// PodProcess describes a container process the runner runs.
type PodProcess struct {
	Namespace, Name string
	UID             types.UID
	// Container is the container's name.
	Container string
	// IP is the Pod's IP.
	IP string
	// Pid is the process id (0 while no process runs).
	Pid int
	// LogPath is the log of the container's current (or last) instance.
	LogPath string
	// Restarts is the container's restart count.
	Restarts int
}

// containerPod is the Pod as its containers' workers see it.
type containerPod struct{ w *Worker }

func (p containerPod) Current() *corev1.Pod { return p.w.currentPod() }

func (p containerPod) IP() string { return p.w.currentIP() }

func (p containerPod) Dir() string { return p.w.dir }

func (p containerPod) Config(spec corev1.Container, img runtime.Image) (*runtime.ContainerConfig, error) {
	return p.w.config.Container(p.w.currentPod(), p.w.currentIP(), spec, img)
}

func (p containerPod) Kicked() <-chan struct{} { return p.w.kickCh() }

func (p containerPod) StatusChanged() { p.w.statusChanged() }

func (p containerPod) NoteIgnored(key, format string, args ...any) {
	p.w.noteIgnored(key, format, args...)
}

func (p containerPod) Logf(format string, args ...any) { p.w.logf(format, args...) }
