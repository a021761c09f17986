package podworker

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/kubelet/containerworker"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/kubelet/podconfig"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/runtime"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/wait"
)

// Worker runs one Pod: its sandbox (Pod IP, directory, volumes), init containers, containers
// and status, until the Pod is deleted (then it stops the containers and deletes the Pod for
// good) or the kubelet stops.
type Worker struct {
	node      *Node
	uid       types.UID
	namespace string
	name      string
	dir       string

	statusCh chan struct{} // the status may have changed
	kickMu   sync.Mutex
	kick     chan struct{} // closed (and replaced) when a Secret or ConfigMap of the namespace, or the Pod, changed
	stopCh   chan struct{} // closed when the Pod is to stop
	stopOnce sync.Once
	done     chan struct{}
	writerWG sync.WaitGroup
	writerCh chan struct{} // closed to end the status writer (after a last write)

	mu         sync.Mutex
	pod        *corev1.Pod // the latest seen
	deleting   bool        // stopping because the Pod is being deleted
	finalized  bool        // deleted for good
	ip         netip.Addr  // from the pod network (invalid for hostNetwork Pods)
	podIP      string
	startTime  *metav1.Time
	sandbox    bool // IP and directory ready
	inits      []*containerworker.Worker
	apps       []*containerworker.Worker
	initsDone  bool
	phase      corev1.PodPhase // a terminal phase once reached
	reason     string          // status.reason and message (DeadlineExceeded)
	message    string
	conditions map[corev1.PodConditionType]corev1.PodCondition
	lastStatus []byte
	config     *podconfig.Pod
	ignored    map[string]bool // ignored fields already logged
}

// New returns the worker of pod on node; dir is the Pod's directory on this machine (created with
// mode 0700 when the Pod starts; removed when it is deleted for good). Run runs it.
func New(node *Node, pod *corev1.Pod, dir string) *Worker {
	w := &Worker{
		node: node, uid: pod.UID, namespace: pod.Namespace, name: pod.Name, dir: dir,
		statusCh: make(chan struct{}, 1), kick: make(chan struct{}), stopCh: make(chan struct{}), done: make(chan struct{}),
		writerCh: make(chan struct{}),
		pod:      pod.DeepCopy(), conditions: map[corev1.PodConditionType]corev1.PodCondition{},
		ignored: map[string]bool{},
	}
	w.config = podconfig.New(node.Config, pod.Namespace, w.dir, w.noteIgnored, w.logf)
	cp := containerPod{w}
	for _, c := range pod.Spec.InitContainers {
		w.inits = append(w.inits, containerworker.New(&node.Containers, cp, c, true))
	}
	for _, c := range pod.Spec.Containers {
		cw := containerworker.New(&node.Containers, cp, c, false)
		if len(w.inits) > 0 {
			cw.Initializing()
		}
		w.apps = append(w.apps, cw)
	}
	return w
}

func (w *Worker) logf(format string, args ...any) {
	w.node.Logf("runner: pod %s/%s: %s", w.namespace, w.name, fmt.Sprintf(format, args...))
}

// Namespace is the Pod's namespace.
func (w *Worker) Namespace() string { return w.namespace }

// Name is the Pod's name.
func (w *Worker) Name() string { return w.name }

// Dir is the Pod's directory on this machine.
func (w *Worker) Dir() string { return w.dir }

// Done is closed when Run has returned.
func (w *Worker) Done() <-chan struct{} { return w.done }

func (w *Worker) currentPod() *corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pod
}

// currentIP is the Pod IP ("" before the sandbox is ready).
func (w *Worker) currentIP() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.podIP
}

// Update takes a newer version of the Pod (one marked for deletion stops it, see Stop).
func (w *Worker) Update(pod *corev1.Pod) {
	w.mu.Lock()
	w.pod = pod.DeepCopy()
	w.mu.Unlock()
	if pod.DeletionTimestamp != nil {
		w.Stop(true)
		return
	}
	if len(pod.Spec.EphemeralContainers) > 0 {
		w.noteIgnored("ephemeral", "ephemeral containers (kubectl debug) are not run")
	}
	w.Kick()          // labels and annotations feed downwardAPI volumes
	w.statusChanged() // readiness gates
}

// Stop asks the worker to stop the Pod's containers: because the Pod is being deleted (then it is
// deleted for good afterwards) or because the kubelet stops. It does not wait (see Done).
func (w *Worker) Stop(deleting bool) {
	w.mu.Lock()
	if deleting {
		w.deleting = true
	}
	w.mu.Unlock()
	w.stopOnce.Do(func() { close(w.stopCh) })
}

// Stopping reports whether the Pod is stopping (or has stopped).
func (w *Worker) Stopping() bool {
	select {
	case <-w.stopCh:
		return true
	default:
		return false
	}
}

// Kick wakes what waits for a Secret or ConfigMap of the Pod's namespace (or the Pod) to change:
// a container's configuration, the volumes.
func (w *Worker) Kick() {
	w.kickMu.Lock()
	close(w.kick)
	w.kick = make(chan struct{})
	w.kickMu.Unlock()
}

// kickCh is closed when a Secret or ConfigMap of the Pod's namespace (or the Pod) changes next.
func (w *Worker) kickCh() <-chan struct{} {
	w.kickMu.Lock()
	defer w.kickMu.Unlock()
	return w.kick
}

func (w *Worker) statusChanged() {
	select {
	case w.statusCh <- struct{}{}:
	default:
	}
}

// Run is the Pod's life on the Node, until it is stopped (Stop, or a terminal phase) or ctx ends;
// then every container has stopped.
func (w *Worker) Run(ctx context.Context) {
	defer close(w.done)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-w.stopCh:
		case <-ctx.Done():
		}
		cancel()
	}()
	w.writerWG.Add(1)
	go w.statusWriter()
	defer func() {
		close(w.writerCh)
		w.writerWG.Wait()
	}()

	pod := w.currentPod()
	w.logIgnored(pod)
	if err := w.setupSandbox(pod); err != nil {
		w.logf("setting up: %v", err)
		w.node.Recorder.Eventf(pod, corev1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: %v", err)
		<-runCtx.Done()
		w.finish()
		return
	}
	w.statusChanged()
	go w.enforceDeadline(runCtx)

	if w.mountVolumes(runCtx) {
		var vwg sync.WaitGroup
		vwg.Add(1)
		go func() {
			defer vwg.Done()
			w.syncVolumesLoop(runCtx)
		}()
		// Sidecars outlive the containers: they stop once the containers have stopped.
		sideCtx, stopSidecars := context.WithCancel(context.Background())
		defer stopSidecars()
		var apps, sidecars sync.WaitGroup
		if w.runInits(runCtx, sideCtx, &sidecars) {
			w.runApps(runCtx, &apps)
		}
		<-runCtx.Done()
		w.stopContainers(&apps, &sidecars, stopSidecars)
		vwg.Wait()
	} else {
		<-runCtx.Done()
	}
	w.finish()
}

// enforceDeadline fails the Pod once it has been active longer than spec.activeDeadlineSeconds,
// counted from its start time, as the kubelet does. The deadline is read again whenever the Pod
// changes (Update kicks): the API lets a running Pod's deadline be set or shortened.
func (w *Worker) enforceDeadline(ctx context.Context) {
	for {
		kicked := w.kickCh() // before reading the Pod, so that no change is missed
		w.mu.Lock()
		d, start := w.pod.Spec.ActiveDeadlineSeconds, w.startTime
		w.mu.Unlock()
		var expired <-chan time.Time // nil, never ready, without a deadline
		if d != nil && start != nil {
			expired = time.After(time.Until(start.Add(time.Duration(*d) * time.Second)))
		}
		select {
		case <-ctx.Done():
			return
		case <-kicked:
		case <-expired:
			w.node.Recorder.Eventf(w.currentPod(), corev1.EventTypeWarning, "DeadlineExceeded", "Pod was active on the node longer than the specified deadline")
			w.setPhase(corev1.PodFailed, "DeadlineExceeded", "Pod was active on the node longer than the specified deadline")
			return
		}
	}
}

// finish releases the Pod IP and, for a deleted Pod, deletes it for good and removes its
// directory (kept when the runner stops, for its logs).
func (w *Worker) finish() {
	w.mu.Lock()
	deleting := w.deleting
	ip := w.ip
	w.ip = netip.Addr{}
	w.mu.Unlock()
	if ip.IsValid() {
		w.node.Network.Release(ip)
	}
	if !deleting {
		return
	}
	w.flushStatus()
	w.node.FinalDelete(w.namespace, w.name, w.uid)
	w.mu.Lock()
	w.finalized = true
	w.mu.Unlock()
	if err := os.RemoveAll(w.dir); err != nil {
		w.logf("removing %s: %v", w.dir, err)
	}
	w.logf("deleted")
}

// setupSandbox allocates the Pod IP, creates the Pod's directory and its /etc/hosts.
func (w *Worker) setupSandbox(pod *corev1.Pod) error {
	if err := os.MkdirAll(w.dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", w.dir, err)
	}
	ip := runtime.NodeIP
	var addr netip.Addr
	if !pod.Spec.HostNetwork {
		a, err := w.node.Network.Allocate(string(pod.UID))
		if err != nil {
			return err
		}
		addr, ip = a, a.String()
	}
	if err := w.config.WriteHosts(pod, ip); err != nil {
		return err
	}
	now := metav1.Now()
	w.mu.Lock()
	w.ip, w.podIP, w.sandbox = addr, ip, true
	w.startTime = &now
	w.mu.Unlock()
	w.logf("sandbox ready: Pod IP %s", ip)
	return nil
}

// mountVolumes materialises the Pod's volumes, retrying (FailedMount) until they all are or the
// Pod stops; false when it stopped first.
func (w *Worker) mountVolumes(ctx context.Context) bool {
	lastErr := ""
	for {
		err := w.config.SyncVolumes(ctx, w.currentPod(), w.currentIP())
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if msg := err.Error(); msg != lastErr {
			lastErr = msg
			w.logf("volumes not ready (retrying): %v", err)
			w.node.Recorder.Eventf(w.currentPod(), corev1.EventTypeWarning, "FailedMount", "MountVolume.SetUp failed: %v", err)
		}
		if !wait.Sleep(ctx, w.node.RetryPeriod, w.kickCh()) {
			return false
		}
	}
}

// syncVolumesLoop keeps the volumes current (Secret and ConfigMap changes, token refresh,
// downward API) until ctx ends.
func (w *Worker) syncVolumesLoop(ctx context.Context) {
	for wait.Sleep(ctx, w.node.VolumeSyncPeriod, w.kickCh()) {
		if err := w.config.SyncVolumes(ctx, w.currentPod(), w.currentIP()); err != nil && ctx.Err() == nil {
			w.logf("updating volumes: %v", err)
		}
	}
}

// runInits runs the init containers in order: each to completion (restarted on failure unless
// the restart policy is Never), a sidecar (restartPolicy Always) until it has started (it then
// runs until sideCtx ends). False when the Pod stopped or failed first.
func (w *Worker) runInits(ctx, sideCtx context.Context, sidecars *sync.WaitGroup) bool {
	for _, c := range w.inits {
		if c.Sidecar() {
			sidecars.Add(1)
			go func() {
				defer sidecars.Done()
				c.Run(sideCtx)
			}()
			for !c.Started() {
				if !wait.Sleep(ctx, 100*time.Millisecond, nil) {
					return false
				}
			}
			continue
		}
		finished, code := c.Run(ctx)
		if !finished {
			return false
		}
		if code != 0 { // restart policy Never
			w.setPhase(corev1.PodFailed, "", "")
			return false
		}
	}
	w.mu.Lock()
	w.initsDone = true
	w.mu.Unlock()
	w.statusChanged()
	return true
}

// runApps starts the containers and, when they all finish for good (restart policy Never or
// OnFailure), sets the terminal phase and stops the sidecars.
func (w *Worker) runApps(ctx context.Context, wg *sync.WaitGroup) {
	var apps sync.WaitGroup
	var mu sync.Mutex
	failed := false
	for _, c := range w.apps {
		wg.Add(1)
		apps.Add(1)
		go func() {
			defer wg.Done()
			defer apps.Done()
			finished, code := c.Run(ctx)
			if finished && code != 0 {
				mu.Lock()
				failed = true
				mu.Unlock()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		apps.Wait()
		if ctx.Err() != nil {
			return
		}
		phase := corev1.PodSucceeded
		if failed {
			phase = corev1.PodFailed
		}
		w.setPhase(phase, "", "")
	}()
}

// setPhase puts the Pod into a terminal phase (with a reason and message for the status): its
// remaining containers are stopped and its IP released.
func (w *Worker) setPhase(phase corev1.PodPhase, reason, message string) {
	w.mu.Lock()
	if w.phase != "" {
		w.mu.Unlock()
		return
	}
	w.phase, w.reason, w.message = phase, reason, message
	w.mu.Unlock()
	if reason != "" {
		w.logf("%s: %s: %s", phase, reason, message)
	} else {
		w.logf("all containers finished: %s", phase)
	}
	w.statusChanged()
	// What still runs (sidecars, or everything after a deadline) stops as on a runner stop; the
	// Pod object stays until it is deleted (then the runner deletes it for good).
	w.stopOnce.Do(func() { close(w.stopCh) })
}

// stopContainers waits for every running container to stop (their context has ended; each gets
// the Pod's grace period): the app containers first, then the sidecars (stopSidecars ends
// theirs).
func (w *Worker) stopContainers(apps, sidecars *sync.WaitGroup, stopSidecars context.CancelFunc) {
	apps.Wait()
	stopSidecars()
	sidecars.Wait()
}

// Kill sends sig to the process group of the first app container (as if it crashed) and returns
// the pid it signalled.
func (w *Worker) Kill(sig syscall.Signal) (int, error) {
	if len(w.apps) == 0 {
		return 0, fmt.Errorf("runner: pod %s/%s has no containers", w.namespace, w.name)
	}
	proc := w.apps[0].Proc()
	if proc == nil {
		return 0, fmt.Errorf("runner: pod %s/%s has no running process", w.namespace, w.name)
	}
	if exited, _ := proc.Exited(); exited {
		return 0, fmt.Errorf("runner: the process of pod %s/%s has already exited", w.namespace, w.name)
	}
	return proc.Pid(), proc.Kill(sig)
}

// Processes lists the app containers' processes, in order.
func (w *Worker) Processes() []PodProcess {
	w.mu.Lock()
	ip := w.podIP
	w.mu.Unlock()
	var out []PodProcess
	for _, c := range w.apps {
		p := PodProcess{Namespace: w.namespace, Name: w.name, UID: w.uid, Container: c.Name(), IP: ip, Restarts: c.Restarts()}
		if logPaths := c.LogPaths(); len(logPaths) > 0 {
			p.LogPath = logPaths[len(logPaths)-1]
		}
		if proc := c.Proc(); proc != nil {
			if exited, _ := proc.Exited(); !exited {
				p.Pid = proc.Pid()
			}
		}
		out = append(out, p)
	}
	return out
}

// LogPath is the log of a container's current or previous instance.
func (w *Worker) LogPath(container string, previous bool) (string, error) {
	for _, c := range append(append([]*containerworker.Worker{}, w.inits...), w.apps...) {
		if c.Name() != container {
			continue
		}
		logPaths := c.LogPaths()
		n := len(logPaths)
		switch {
		case previous && n >= 2:
			return logPaths[n-2], nil
		case previous:
			return "", fmt.Errorf("previous terminated container %q in pod %q not found", container, w.name)
		case n == 0:
			return "", fmt.Errorf("container %q in pod %q is waiting to start", container, w.name)
		}
		return logPaths[n-1], nil
	}
	return "", fmt.Errorf("container %s is not valid for pod %s", container, w.name)
}

// statusWriter writes the Pod's status whenever it changed, until writerCh is closed (then it
// writes it a last time).
func (w *Worker) statusWriter() {
	defer w.writerWG.Done()
	for {
		select {
		case <-w.statusCh:
			w.flushStatus()
		case <-w.writerCh:
			w.flushStatus()
			return
		}
	}
}

// flushStatus writes the Pod's status if it differs from the last one written.
func (w *Worker) flushStatus() {
	st := w.buildStatus()
	body, err := json.Marshal(map[string]any{"status": st})
	if err != nil {
		w.logf("encoding the status: %v", err)
		return
	}
	w.mu.Lock()
	same := string(body) == string(w.lastStatus)
	w.mu.Unlock()
	if same {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for attempt := 0; ; attempt++ {
		_, err = w.node.Client.CoreV1().Pods(w.namespace).Patch(ctx, w.name, types.StrategicMergePatchType, body, metav1.PatchOptions{}, "status")
		if err == nil || apierrors.IsNotFound(err) || attempt == 4 {
			break
		}
		if !wait.Sleep(ctx, 200*time.Millisecond, nil) {
			break
		}
	}
	if err != nil && !apierrors.IsNotFound(err) {
		w.logf("writing the status: %v", err)
		return
	}
	w.mu.Lock()
	w.lastStatus = body
	w.mu.Unlock()
}

// Deleted reports whether the Pod was marked for deletion, and whether the worker deleted it for
// good (it does not when the deletion came while it was already finishing).
func (w *Worker) Deleted() (deleting, finalized bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deleting, w.finalized
}
