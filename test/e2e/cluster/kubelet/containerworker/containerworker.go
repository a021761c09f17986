// Package containerworker runs one container of a Pod as kubelet does: it maps the container's
// image to a local program (ErrImagePull, then ImagePullBackOff, when no mapping matches), waits
// out kubelet's crash-loop back-off, resolves what the instance starts with
// (CreateContainerConfigError until it can), starts each instance through package runtime with a
// fresh termination message file, probes it (startup, readiness and liveness; httpGet and
// tcpSocket), stops it with the Pod's grace period when the Pod stops or a probe fails, restarts
// it per the restart policy, and keeps its ContainerStatus and events. The Pod around it —
// ordering of init, sidecar and app containers, the Pod's status — is package podworker's.
package containerworker

import (
	"io"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/runtime"
)

// Node is what the containers of a Node share.
type Node struct {
	// Recorder records the containers' events (Pulled, Created, Started, Killing, BackOff,
	// Unhealthy, Failed).
	Recorder record.EventRecorder
	// Images map image references to local programs.
	Images runtime.Images
	// Backoff is kubelet's crash-loop back-off, keyed per container.
	Backoff *flowcontrol.Backoff
	// RetryPeriod is how often a container whose configuration cannot be resolved yet is tried
	// again (besides whenever Pod.Kicked fires).
	RetryPeriod time.Duration
	// MaxGrace caps a Pod's termination grace period (0: no cap).
	MaxGrace time.Duration
	// ProcessLog, if not nil, also receives every container's output, line-prefixed.
	ProcessLog io.Writer
}

// Pod is what a container's worker needs of its Pod (the Pod's worker provides it).
type Pod interface {
	// Current is the latest version of the Pod object.
	Current() *corev1.Pod
	// IP is the Pod's IP: the probes' default host.
	IP() string
	// Dir is the Pod's directory on this machine; a container's instance logs, termination
	// message files and root filesystem mount points go under Dir()/containers/NAME.
	Dir() string
	// Config resolves what an instance of spec starts with from the image img; a
	// *podconfig.ConfigError when it cannot yet.
	Config(spec corev1.Container, img runtime.Image) (*runtime.ContainerConfig, error)
	// Kicked is closed when what Config depends on may have changed next (a Secret or ConfigMap
	// of the Pod's namespace, or the Pod).
	Kicked() <-chan struct{}
	// StatusChanged tells the Pod that the container's status may have changed.
	StatusChanged()
	// NoteIgnored reports something of the container that is not honoured, once per key.
	NoteIgnored(key, format string, args ...any)
	// Logf logs about the Pod.
	Logf(format string, args ...any)
}
