package containerworker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/kubelet/podconfig"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/process"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/runtime"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/wait"
)

// Worker runs one container of a Pod: starts it, probes it, restarts it per the restart policy
// with kubelet's back-off, and keeps its status.
type Worker struct {
	node    *Node
	pod     Pod
	spec    corev1.Container
	init    bool // an init container
	sidecar bool // an init container with restartPolicy Always

	mu           sync.Mutex
	state        corev1.ContainerState
	last         corev1.ContainerState
	instances    int // instances started (the restart count is instances-1)
	ready        bool
	started      bool
	proc         *process.Process
	logPaths     []string // per instance
	containerID  string
	imageID      string
	user         *corev1.ContainerUser
	lastFinished time.Time
	killCh       chan killRequest // a failed liveness/startup probe asks for a kill
}

// New returns the worker of the container spec of pod on node: an init container when init is
// true (a sidecar when it also has restartPolicy Always), else an app container. Run runs it.
func New(node *Node, pod Pod, spec corev1.Container, init bool) *Worker {
	sidecar := init && spec.RestartPolicy != nil && *spec.RestartPolicy == corev1.ContainerRestartPolicyAlways
	return &Worker{
		node: node, pod: pod, spec: spec, init: init, sidecar: sidecar,
		state:  corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}},
		killCh: make(chan killRequest, 1),
	}
}

// Initializing shows an app container as waiting for the Pod's init containers (PodInitializing)
// rather than ContainerCreating. Call it before Run.
func (c *Worker) Initializing() {
	c.mu.Lock()
	c.state.Waiting.Reason = "PodInitializing"
	c.mu.Unlock()
}

// Name is the container's name.
func (c *Worker) Name() string { return c.spec.Name }

// Sidecar reports whether the container is a sidecar: an init container with restartPolicy
// Always, which runs alongside the app containers and stops after them.
func (c *Worker) Sidecar() bool { return c.sidecar }

// Started reports whether the running instance has started (its startup probe, if any, has
// succeeded).
func (c *Worker) Started() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started
}

// Proc is the running instance's process (nil between instances).
func (c *Worker) Proc() *process.Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.proc
}

// LogPaths are the log files of the container's instances, the current (or last) one last.
func (c *Worker) LogPaths() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.logPaths...)
}

// Restarts is the container's restart count.
func (c *Worker) Restarts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return max(c.instances-1, 0)
}

// ref is the event reference of the container.
func (c *Worker) ref() *corev1.ObjectReference {
	pod := c.pod.Current()
	field := fmt.Sprintf("spec.containers{%s}", c.spec.Name)
	if c.init {
		field = fmt.Sprintf("spec.initContainers{%s}", c.spec.Name)
	}
	return &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
		ResourceVersion: pod.ResourceVersion, FieldPath: field}
}

func (c *Worker) event(typ, reason, format string, args ...any) {
	c.node.Recorder.Eventf(c.ref(), typ, reason, format, args...)
}

func (c *Worker) logf(format string, args ...any) {
	c.pod.Logf("container %s: %s", c.spec.Name, fmt.Sprintf(format, args...))
}

// setWaiting shows the container waiting with reason and message.
func (c *Worker) setWaiting(reason, msg string) {
	c.mu.Lock()
	c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
	c.ready, c.started = false, false
	c.mu.Unlock()
	c.pod.StatusChanged()
}

// restartAfter reports whether a container that exited with code restarts.
func (c *Worker) restartAfter(code int) bool {
	if c.sidecar {
		return true
	}
	policy := c.pod.Current().Spec.RestartPolicy
	if policy == "" {
		policy = corev1.RestartPolicyAlways
	}
	if c.init {
		return code != 0 && policy != corev1.RestartPolicyNever
	}
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return code != 0
	}
	return true
}

// backoffKey identifies the container in the Node's back-off (as kubelet's key does).
func (c *Worker) backoffKey() string {
	pod := c.pod.Current()
	return fmt.Sprintf("%s_%s_%s_%s", pod.Namespace, pod.Name, pod.UID, c.spec.Name)
}

// podFormat is kubelet's format.Pod: name_namespace(uid).
func (c *Worker) podFormat() string {
	pod := c.pod.Current()
	return fmt.Sprintf("%s_%s(%s)", pod.Name, pod.Namespace, pod.UID)
}

// grace is the termination grace period: the Pod's deletion grace period when it is being
// deleted, else the probe's or the Pod's terminationGracePeriodSeconds (default 30s), capped by
// Node.MaxGrace.
func (c *Worker) grace(probe *corev1.Probe) time.Duration {
	pod := c.pod.Current()
	secs := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		secs = *pod.Spec.TerminationGracePeriodSeconds
	}
	if probe != nil && probe.TerminationGracePeriodSeconds != nil {
		secs = *probe.TerminationGracePeriodSeconds
	}
	if pod.DeletionGracePeriodSeconds != nil {
		secs = *pod.DeletionGracePeriodSeconds
	}
	g := time.Duration(secs) * time.Second
	if max := c.node.MaxGrace; max > 0 && g > max {
		g = max
	}
	return g
}

// Run is the container's life until it exits for good (the restart policy says no more; code is
// its last exit code) or ctx ends (the Pod stops; the running instance is stopped with
// the Pod's grace period first).
func (c *Worker) Run(ctx context.Context) (finished bool, code int) {
	pulledEvent := false
	for {
		if ctx.Err() != nil {
			return false, 0
		}
		m, ok := c.node.Images.Find(c.spec.Image)
		if !ok {
			msg := fmt.Sprintf("image %q is not mapped to a local program by the local pod runner (it knows: %s; see RunnerOptions.Images)", c.spec.Image, c.node.Images.Names())
			c.setWaiting("ErrImagePull", msg)
			c.event(corev1.EventTypeWarning, "Failed", "Failed to pull image %q: %s", c.spec.Image, msg)
			c.logf("ErrImagePull: %s", msg)
			if !wait.Sleep(ctx, time.Second, nil) {
				return false, 0
			}
			c.setWaiting("ImagePullBackOff", fmt.Sprintf("Back-off pulling image %q: ErrImagePull: %s", c.spec.Image, msg))
			c.event(corev1.EventTypeNormal, "BackOff", "Back-off pulling image %q", c.spec.Image)
			<-ctx.Done() // the mapping never changes
			return false, 0
		}
		if !pulledEvent {
			c.event(corev1.EventTypeNormal, "Pulled", "Container image %q mapped to the local program %s (%s)", c.spec.Image, m.Image.Binary, m.Name)
			pulledEvent = true
		}

		// kubelet's crash-loop back-off, counted from when the last instance finished.
		c.mu.Lock()
		finishedAt := c.lastFinished
		c.mu.Unlock()
		if !finishedAt.IsZero() {
			key := c.backoffKey()
			if c.node.Backoff.IsInBackOffSince(key, finishedAt) {
				d := c.node.Backoff.Get(key)
				msg := fmt.Sprintf("back-off %s restarting failed container=%s pod=%s", d, c.spec.Name, c.podFormat())
				c.setWaiting("CrashLoopBackOff", msg)
				c.event(corev1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s in pod %s", c.spec.Name, c.podFormat())
				if !wait.Sleep(ctx, time.Until(finishedAt.Add(d)), nil) {
					return false, 0
				}
				continue
			}
			c.node.Backoff.Next(key, finishedAt)
		}

		cfg, err := c.pod.Config(c.spec, m.Image)
		if err != nil {
			var ce *podconfig.ConfigError
			if errors.As(err, &ce) {
				c.setWaiting(ce.Reason, ce.Message)
				c.event(corev1.EventTypeWarning, "Failed", "Error: %s", ce.Message)
				c.logf("%s: %s (retrying)", ce.Reason, ce.Message)
				if !wait.Sleep(ctx, c.node.RetryPeriod, c.pod.Kicked()) {
					return false, 0
				}
				continue
			}
			cfg = nil
		}

		term, again := c.runInstance(ctx, cfg, err)
		if !again {
			return false, 0
		}
		if !c.restartAfter(int(term.ExitCode)) {
			return true, int(term.ExitCode) // state: terminated; lastState: the instance before
		}
		c.mu.Lock()
		c.last = corev1.ContainerState{Terminated: term}
		if term.Reason == "StartError" {
			c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "RunContainerError", Message: term.Message}}
		}
		c.mu.Unlock()
		c.pod.StatusChanged()
	}
}

// runInstance starts one instance (or records why it could not start) and supervises it until it
// exits: the container's state is then its termination, which is returned. again is false when
// ctx ended (the instance was stopped).
func (c *Worker) runInstance(ctx context.Context, cfg *runtime.ContainerConfig, cfgErr error) (term *corev1.ContainerStateTerminated, again bool) {
	pod := c.pod.Current()
	if ctx.Err() != nil {
		return nil, false
	}
	c.mu.Lock()
	c.instances++
	n := c.instances - 1
	c.containerID = fmt.Sprintf("local://%s-%s-%d", pod.UID, c.spec.Name, n)
	cdir := filepath.Join(c.pod.Dir(), "containers", c.spec.Name)
	logPath := filepath.Join(cdir, fmt.Sprintf("%d.log", n))
	c.logPaths = append(c.logPaths, logPath)
	c.mu.Unlock()
	termPath := filepath.Join(cdir, fmt.Sprintf("%d.termination-log", n))

	started := time.Now()
	var proc *process.Process
	err := cfgErr
	if err == nil {
		err = os.MkdirAll(cdir, 0o700)
	}
	if err == nil {
		// kubelet's termination message file: a fresh, world-writable file per instance.
		err = os.WriteFile(termPath, nil, 0o666)
		if err == nil {
			err = os.Chmod(termPath, 0o666)
		}
	}
	if err == nil {
		tp := c.spec.TerminationMessagePath
		if tp == "" {
			tp = corev1.TerminationMessagePathDefault
		}
		cfg.Mounts = append(cfg.Mounts, runtime.BindMount{Src: termPath, Dst: path.Clean(tp), File: true, Mode: runtime.ReadWrite})
		name := pod.Name + "/" + c.spec.Name
		proc, err = runtime.StartContainer(name, cfg, filepath.Join(cdir, "root"), filepath.Join(cdir, "layer"), logPath, c.node.ProcessLog)
	}
	if err != nil {
		now := metav1.Now()
		term := &corev1.ContainerStateTerminated{
			ExitCode: 128, Reason: "StartError", Message: err.Error(), StartedAt: metav1.NewTime(started), FinishedAt: now,
			ContainerID: c.containerID,
		}
		c.mu.Lock()
		c.state = corev1.ContainerState{Terminated: term}
		c.lastFinished = now.Time
		c.mu.Unlock()
		c.pod.StatusChanged()
		c.event(corev1.EventTypeWarning, "Failed", "Error: %v", err)
		c.logf("could not start: %v", err)
		return term, ctx.Err() == nil
	}

	startedAt := metav1.Now()
	c.mu.Lock()
	c.proc = proc
	c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: startedAt}}
	c.user = &corev1.ContainerUser{Linux: &corev1.LinuxContainerUser{UID: cfg.UID, GID: cfg.GID, SupplementalGroups: cfg.Groups}}
	c.imageID = "local-runner://" + cfg.Binary
	c.ready = false
	c.started = c.spec.StartupProbe == nil
	select {
	case <-c.killCh:
	default:
	}
	c.mu.Unlock()
	c.pod.StatusChanged()
	c.event(corev1.EventTypeNormal, "Created", "Created container %s", c.spec.Name)
	c.event(corev1.EventTypeNormal, "Started", "Started container %s", c.spec.Name)
	c.logf("started pid %d (instance %d): %s", proc.Pid(), n, strings.Join(cfg.Argv, " "))

	probeCtx, stopProbes := context.WithCancel(ctx)
	var probes sync.WaitGroup
	c.startProbes(probeCtx, &probes, startedAt.Time)
	stopped := false
	select {
	case <-proc.Done():
	case <-ctx.Done():
		// The Pod stops: its grace period (the deletion's, when it is being deleted).
		stopped = true
		c.event(corev1.EventTypeNormal, "Killing", "Stopping container %s", c.spec.Name)
		proc.Stop(c.grace(nil))
	case k := <-c.killCh:
		grace := c.grace(k.probe)
		c.event(corev1.EventTypeNormal, "Killing", "Container %s %s, will be restarted", c.spec.Name, k.why)
		c.logf("%s: killing it (grace %s)", k.why, grace)
		proc.Stop(grace)
	}
	stopProbes()
	probes.Wait()

	_, werr := proc.Exited()
	code := runtime.ExitCode(werr)
	term = &corev1.ContainerStateTerminated{
		ExitCode: int32(code), Reason: "Error", StartedAt: startedAt, FinishedAt: metav1.Now(), ContainerID: c.containerID,
	}
	if code == 0 {
		term.Reason = "Completed"
	}
	term.Message = terminationMessage(termPath, logPath, c.spec.TerminationMessagePolicy, code)
	c.mu.Lock()
	c.proc = nil
	c.ready, c.started = false, false
	c.state = corev1.ContainerState{Terminated: term}
	c.lastFinished = term.FinishedAt.Time
	c.mu.Unlock()
	c.pod.StatusChanged()
	c.logf("pid %d exited with code %d", proc.Pid(), code)
	return term, !stopped
}

// Kubelet's limits on termination messages.
const (
	maxTerminationMessage         = 4096
	maxTerminationMessageLogLines = 80
	maxTerminationMessageLogBytes = 2048
)

// terminationMessage is kubelet's: the termination message file (first 4 KiB), or with
// FallbackToLogsOnError and a failed container, the end of its log (80 lines, 2 KiB).
func terminationMessage(termPath, logPath string, policy corev1.TerminationMessagePolicy, code int) string {
	if b, err := os.ReadFile(termPath); err == nil && len(b) > 0 {
		if len(b) > maxTerminationMessage {
			b = b[:maxTerminationMessage]
		}
		return string(b)
	}
	if policy != corev1.TerminationMessageFallbackToLogsOnError || code == 0 {
		return ""
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		return ""
	}
	return logTail(b, maxTerminationMessageLogLines, maxTerminationMessageLogBytes)
}

// logTail is the last n lines of b, at most max bytes of them.
func logTail(b []byte, n, max int) string {
	s := strings.TrimRight(string(b), "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	out := strings.Join(lines, "\n") + "\n"
	if len(out) > max {
		out = out[len(out)-max:]
	}
	return out
}

// Status is the container's ContainerStatus.
func (c *Worker) Status() corev1.ContainerStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	restarts := int32(0)
	if c.instances > 1 {
		restarts = int32(c.instances - 1)
	}
	started := c.started
	st := corev1.ContainerStatus{
		Name: c.spec.Name, State: c.state, LastTerminationState: c.last, Ready: c.ready, RestartCount: restarts,
		Image: c.spec.Image, ImageID: c.imageID, Started: &started, User: c.user,
	}
	if c.state.Running != nil || c.state.Terminated != nil {
		st.ContainerID = c.containerID
	}
	return st
}

// killRequest is a probe's request to kill the container (why, for the event).
type killRequest struct {
	why   string
	probe *corev1.Probe
}
