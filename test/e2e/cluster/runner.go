package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// DefaultRunnerSelector selects the Pods the Runner runs: the operator's shard Pods.
const DefaultRunnerSelector = "renderqueue.dev/queue"

// RunnerOptions configure a Runner.
type RunnerOptions struct {
	// Client reaches the API server (with rights to read Pods, Secrets and ConfigMaps, patch Pod
	// status, delete Pods and create ServiceAccount tokens).
	Client kubernetes.Interface
	// Server is the API server URL and CAData its CA, written into each Pod's kubeconfig.
	Server string
	CAData []byte
	// Binary is the program run as every Pod's container (the image's entrypoint): the
	// renderqueue binary. The container's command is ignored; its args are passed.
	Binary string
	// Selector is the label selector of the Pods to run (default DefaultRunnerSelector).
	Selector string
	// Dir holds each Pod's materialised volumes, kubeconfig and log.
	Dir string
	// Logf reports what the runner does (nil: silent).
	Logf func(format string, args ...any)
	// ProcessLog, if not nil, also receives every Pod process's output, line-prefixed.
	ProcessLog io.Writer
	// MaxRestartBackoff caps the delay between restarts of a dead process (default 10s; the
	// first restart waits 1s, doubling).
	MaxRestartBackoff time.Duration
	// MaxGrace caps the termination grace period of a deleted Pod (default 10s).
	MaxGrace time.Duration
	// ReadinessPeriod is how often the readiness probe is run (default 500ms).
	ReadinessPeriod time.Duration
}

// Runner plays kubelet for the Pods its Selector matches, with the real binary as the container
// and a loopback address as the Pod's IP. For each such Pod it:
//
//   - allocates a loopback address 127.0.0.<n> (n from 2, the lowest free) as the Pod's IP;
//   - materialises its secret and configMap volumes (and the secret/configMap sources of
//     projected volumes) into a directory of its own, and rewrites any argument or env value that
//     is a mount path, or a path under one, to the materialised directory;
//   - rewrites a listen address of the form ":PORT" or "0.0.0.0:PORT" in the args (standalone or
//     after "=") to the Pod's address, "127.0.0.<n>:PORT";
//   - resolves the env: values, secretKeyRef and configMapKeyRef (from the API server), fieldRef
//     (metadata.name/namespace/uid, status.podIP, spec.serviceAccountName), envFrom; expands $(VAR)
//     references in args as kubelet does; sets KUBECONFIG to a kubeconfig holding a token of the
//     Pod's ServiceAccount (TokenRequest bound to the Pod), so the process has exactly the rights
//     the operator gave the Pod;
//   - starts Binary with the args in its own process group, output to <dir>/<pod>/container.log;
//   - sets the Pod's status: phase Running, podIP, hostIP 127.0.0.1, container status and the
//     Ready/ContainersReady conditions from the container's HTTP readiness probe (polled every
//     ReadinessPeriod; without a probe the container is ready while it runs);
//   - when the process dies, restarts it like kubelet with restartPolicy Always: the Pod stays
//     (same name, same address), restartCount goes up, the container waits in CrashLoopBackOff
//     for 1s, 2s, 4s, ... (capped at MaxRestartBackoff) and Ready is False meanwhile. With
//     restartPolicy Never (or OnFailure and exit 0) the Pod's phase becomes Failed (Succeeded)
//     instead;
//   - when the Pod is deleted (or marked for deletion), stops the process (SIGTERM to its group,
//     SIGKILL after the grace period, capped at MaxGrace), deletes a terminating Pod for good, and
//     frees the address.
type Runner struct {
	o RunnerOptions

	mu      sync.Mutex
	workers map[types.UID]*podWorker
	ips     map[int]types.UID
	wg      sync.WaitGroup
}

// NewRunner checks o and returns a Runner; Run starts it.
func NewRunner(o RunnerOptions) (*Runner, error) {
	if o.Client == nil || o.Binary == "" || o.Dir == "" || o.Server == "" {
		return nil, errors.New("runner: Client, Binary, Server and Dir are required")
	}
	if o.Selector == "" {
		o.Selector = DefaultRunnerSelector
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.MaxRestartBackoff <= 0 {
		o.MaxRestartBackoff = 10 * time.Second
	}
	if o.MaxGrace <= 0 {
		o.MaxGrace = 10 * time.Second
	}
	if o.ReadinessPeriod <= 0 {
		o.ReadinessPeriod = 500 * time.Millisecond
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("runner: creating %s: %w", o.Dir, err)
	}
	return &Runner{o: o, workers: map[types.UID]*podWorker{}, ips: map[int]types.UID{}}, nil
}

// Run watches the Pods and runs them until ctx ends; then it stops every process it started
// and returns.
func (r *Runner) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(r.o.Client, 0,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = r.o.Selector }))
	inf := factory.Core().V1().Pods().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.observe(ctx, obj) },
		UpdateFunc: func(_, obj any) { r.observe(ctx, obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				r.stopWorkerAsync(pod.UID, false)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("runner: adding the pod handler: %w", err)
	}
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
	r.mu.Lock()
	uids := make([]types.UID, 0, len(r.workers))
	for uid := range r.workers {
		uids = append(uids, uid)
	}
	r.mu.Unlock()
	for _, uid := range uids {
		r.stopWorker(uid, false)
	}
	r.wg.Wait()
	return nil
}

// observe starts a worker for a new Pod, or stops the worker of a Pod marked for deletion.
func (r *Runner) observe(ctx context.Context, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	if pod.DeletionTimestamp != nil {
		r.stopWorkerAsync(pod.UID, true)
		return
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctx.Err() != nil {
		return
	}
	if _, ok := r.workers[pod.UID]; ok {
		return
	}
	n, err := r.allocateLocked(pod.UID)
	if err != nil {
		r.o.Logf("runner: pod %s/%s: %v", pod.Namespace, pod.Name, err)
		return
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &podWorker{
		r: r, pod: pod.DeepCopy(), ip: fmt.Sprintf("127.0.0.%d", n), ipIndex: n,
		cancel: cancel, done: make(chan struct{}),
	}
	r.workers[pod.UID] = w
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(w.done)
		w.run(wctx)
	}()
}

// stopWorkerAsync is stopWorker without blocking the informer's event handler for the grace
// period; Run waits for it.
func (r *Runner) stopWorkerAsync(uid types.UID, forceDelete bool) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.stopWorker(uid, forceDelete)
	}()
}

// stopWorker stops the worker of uid (and its process) and waits for it; with forceDelete the
// Pod, already marked for deletion, is then deleted for good (kubelet's final delete).
func (r *Runner) stopWorker(uid types.UID, forceDelete bool) {
	r.mu.Lock()
	w, ok := r.workers[uid]
	r.mu.Unlock()
	if !ok {
		return
	}
	w.cancel()
	<-w.done
	r.mu.Lock()
	if r.workers[uid] == w {
		delete(r.workers, uid)
		delete(r.ips, w.ipIndex)
	}
	r.mu.Unlock()
	if forceDelete {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := r.o.Client.CoreV1().Pods(w.pod.Namespace).Delete(ctx, w.pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &uid},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			r.o.Logf("runner: deleting pod %s/%s: %v", w.pod.Namespace, w.pod.Name, err)
		}
	}
}

// allocateLocked picks the lowest free 127.0.0.<n>, n >= 2, whose port 8080 nobody else holds.
func (r *Runner) allocateLocked(uid types.UID) (int, error) {
	for n := 2; n < 255; n++ {
		if _, used := r.ips[n]; used {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:8080", n))
		if err != nil {
			continue // something else (a leftover process?) is there
		}
		_ = ln.Close()
		r.ips[n] = uid
		return n, nil
	}
	return 0, errors.New("no free loopback address 127.0.0.2-254")
}

// PodProcess describes the process the runner runs for a Pod.
type PodProcess struct {
	Namespace, Name string
	UID             types.UID
	IP              string
	Pid             int
	LogPath         string
	Restarts        int
}

// Processes lists the Pods the runner runs, by namespace and name.
func (r *Runner) Processes() []PodProcess {
	r.mu.Lock()
	ws := make([]*podWorker, 0, len(r.workers))
	for _, w := range r.workers {
		ws = append(ws, w)
	}
	r.mu.Unlock()
	out := make([]PodProcess, 0, len(ws))
	for _, w := range ws {
		out = append(out, w.describe())
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// Process returns the process of the Pod namespace/name, if the runner runs it.
func (r *Runner) Process(namespace, name string) (PodProcess, bool) {
	for _, p := range r.Processes() {
		if p.Namespace == namespace && p.Name == name {
			return p, true
		}
	}
	return PodProcess{}, false
}

// KillPod sends sig to the process group of the Pod namespace/name (as if the container
// crashed) and returns the pid it signalled.
func (r *Runner) KillPod(namespace, name string, sig syscall.Signal) (int, error) {
	r.mu.Lock()
	var w *podWorker
	for _, x := range r.workers {
		if x.pod.Namespace == namespace && x.pod.Name == name {
			w = x
		}
	}
	r.mu.Unlock()
	if w == nil {
		return 0, fmt.Errorf("runner: no process for pod %s/%s", namespace, name)
	}
	w.mu.Lock()
	proc := w.proc
	w.mu.Unlock()
	if proc == nil {
		return 0, fmt.Errorf("runner: pod %s/%s has no running process", namespace, name)
	}
	if exited, _ := proc.Exited(); exited {
		return 0, fmt.Errorf("runner: the process of pod %s/%s has already exited", namespace, name)
	}
	return proc.Pid(), proc.Kill(sig)
}

// podWorker runs one Pod.
type podWorker struct {
	r       *Runner
	pod     *corev1.Pod // as first seen; spec is immutable where it matters
	ip      string
	ipIndex int
	cancel  context.CancelFunc
	done    chan struct{}

	mu        sync.Mutex
	proc      *Process
	restarts  int
	startedAt metav1.Time
	lastTerm  *corev1.ContainerStateTerminated
	logPath   string
}

func (w *podWorker) describe() PodProcess {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := PodProcess{Namespace: w.pod.Namespace, Name: w.pod.Name, UID: w.pod.UID, IP: w.ip, LogPath: w.logPath, Restarts: w.restarts}
	if w.proc != nil {
		if exited, _ := w.proc.Exited(); !exited {
			p.Pid = w.proc.Pid()
		}
	}
	return p
}

func (w *podWorker) logf(format string, args ...any) {
	w.r.o.Logf("runner: pod %s/%s (%s): %s", w.pod.Namespace, w.pod.Name, w.ip, fmt.Sprintf(format, args...))
}

// run is the worker's life: start, supervise, restart, until ctx ends (the Pod is gone).
func (w *podWorker) run(ctx context.Context) {
	pod := w.pod
	dir := filepath.Join(w.r.o.Dir, fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, string(pod.UID)[:8]))
	if len(pod.Spec.Containers) == 0 {
		w.logf("no containers; ignoring")
		return
	}
	c := pod.Spec.Containers[0]
	if len(pod.Spec.Containers) > 1 {
		w.logf("has %d containers; running only the first (%s)", len(pod.Spec.Containers), c.Name)
	}
	podStart := metav1.Now()
	backoff := time.Second
	for {
		if ctx.Err() != nil {
			return
		}
		spec, err := w.prepare(ctx, dir, c)
		var proc *Process
		if err == nil {
			w.mu.Lock()
			w.logPath = filepath.Join(dir, "container.log")
			w.mu.Unlock()
			proc, err = startProcess(pod.Name, w.r.o.Binary, spec.args, spec.env, filepath.Join(dir, "container.log"), w.r.o.ProcessLog)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.logf("cannot start the container: %v (retrying in %s)", err, backoff)
			w.patchStatus(ctx, podStart, c, false, &corev1.ContainerStateWaiting{Reason: "CreateContainerConfigError", Message: err.Error()})
			if !sleepCtx(ctx, backoff) {
				return
			}
			backoff = min(2*backoff, w.r.o.MaxRestartBackoff)
			continue
		}
		w.mu.Lock()
		w.proc = proc
		w.startedAt = metav1.Now()
		w.mu.Unlock()
		w.logf("started pid %d: %s %s", proc.Pid(), filepath.Base(w.r.o.Binary), strings.Join(spec.args, " "))
		started := time.Now()
		w.supervise(ctx, podStart, c, proc)
		if ctx.Err() != nil {
			grace := w.r.o.MaxGrace
			if g := pod.Spec.TerminationGracePeriodSeconds; g != nil && time.Duration(*g)*time.Second < grace {
				grace = time.Duration(*g) * time.Second
			}
			proc.Stop(grace)
			w.logf("pod gone: stopped pid %d", proc.Pid())
			return
		}
		_, werr := proc.Exited()
		code := exitCode(werr)
		w.mu.Lock()
		w.restarts++
		w.lastTerm = &corev1.ContainerStateTerminated{
			ExitCode: int32(code), Reason: "Error", Message: fmt.Sprint(werr),
			StartedAt: w.startedAt, FinishedAt: metav1.Now(),
		}
		if code == 0 {
			w.lastTerm.Reason = "Completed"
		}
		w.mu.Unlock()
		policy := pod.Spec.RestartPolicy
		if policy == corev1.RestartPolicyNever || (policy == corev1.RestartPolicyOnFailure && code == 0) {
			phase := corev1.PodFailed
			if code == 0 {
				phase = corev1.PodSucceeded
			}
			w.logf("process exited (%v); restartPolicy %s: pod %s", werr, policy, phase)
			w.patchPhase(ctx, phase)
			<-ctx.Done()
			return
		}
		if time.Since(started) > time.Minute {
			backoff = time.Second
		}
		w.logf("process exited (%v); restarting in %s (restart %d)", werr, backoff, w.restarts)
		w.patchStatus(ctx, podStart, c, false, &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
			Message: fmt.Sprintf("back-off %s restarting failed container", backoff)})
		if !sleepCtx(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, w.r.o.MaxRestartBackoff)
	}
}

// supervise reports the running container and its readiness until the process exits or ctx
// ends.
func (w *podWorker) supervise(ctx context.Context, podStart metav1.Time, c corev1.Container, proc *Process) {
	probeURL := w.readinessURL(c)
	hc := &http.Client{Timeout: time.Second}
	ready := false
	w.patchStatus(ctx, podStart, c, false, nil)
	t := time.NewTicker(w.r.o.ReadinessPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-proc.Done():
			return
		case <-t.C:
		}
		now := probeURL == ""
		if !now {
			ok, _, _ := httpOK(ctx, hc, probeURL)
			now = ok
		}
		if now != ready {
			ready = now
			w.logf("ready=%v", ready)
			w.patchStatus(ctx, podStart, c, ready, nil)
		}
	}
}

// readinessURL is the URL of the container's HTTP readiness probe on the Pod's address, or ""
// without one.
func (w *podWorker) readinessURL(c corev1.Container) string {
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil {
		return ""
	}
	g := c.ReadinessProbe.HTTPGet
	port := g.Port.IntValue()
	if g.Port.Type == intstr.String {
		for _, p := range c.Ports {
			if p.Name == g.Port.StrVal {
				port = int(p.ContainerPort)
			}
		}
	}
	path := g.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return fmt.Sprintf("http://%s%s", net.JoinHostPort(w.ip, strconv.Itoa(port)), path)
}

// patchStatus writes the Pod's status: Running with the container running (waiting == nil) or
// waiting, ready as given.
func (w *podWorker) patchStatus(ctx context.Context, podStart metav1.Time, c corev1.Container, ready bool, waiting *corev1.ContainerStateWaiting) {
	w.mu.Lock()
	cs := corev1.ContainerStatus{
		Name: c.Name, Image: c.Image, ImageID: "localrunner://" + w.r.o.Binary,
		Ready: ready, RestartCount: int32(w.restarts), Started: new(waiting == nil),
	}
	if waiting != nil {
		cs.State.Waiting = waiting
	} else {
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: w.startedAt}
		if w.proc != nil {
			cs.ContainerID = fmt.Sprintf("localrunner://%d", w.proc.Pid())
		}
	}
	if w.lastTerm != nil {
		cs.LastTerminationState.Terminated = w.lastTerm.DeepCopy()
	}
	w.mu.Unlock()
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		s := corev1.ConditionFalse
		if ok {
			s = corev1.ConditionTrue
		}
		return corev1.PodCondition{Type: t, Status: s, LastTransitionTime: metav1.Now()}
	}
	status := corev1.PodStatus{
		Phase:     corev1.PodRunning,
		HostIP:    "127.0.0.1",
		HostIPs:   []corev1.HostIP{{IP: "127.0.0.1"}},
		PodIP:     w.ip,
		PodIPs:    []corev1.PodIP{{IP: w.ip}},
		StartTime: &podStart,
		Conditions: []corev1.PodCondition{
			cond(corev1.PodScheduled, true), cond(corev1.PodInitialized, true),
			cond(corev1.ContainersReady, ready), cond(corev1.PodReady, ready),
		},
		ContainerStatuses: []corev1.ContainerStatus{cs},
	}
	w.patch(ctx, map[string]any{"status": status})
}

// patchPhase sets the Pod's phase (Succeeded, Failed) and clears readiness.
func (w *podWorker) patchPhase(ctx context.Context, phase corev1.PodPhase) {
	w.patch(ctx, map[string]any{"status": map[string]any{
		"phase": phase,
		"conditions": []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.Now()},
			{Type: corev1.ContainersReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.Now()},
		},
	}})
}

func (w *podWorker) patch(ctx context.Context, body map[string]any) {
	b, err := json.Marshal(body)
	if err != nil {
		w.logf("encoding a status patch: %v", err)
		return
	}
	for attempt := 0; attempt < 5 && ctx.Err() == nil; attempt++ {
		_, err = w.r.o.Client.CoreV1().Pods(w.pod.Namespace).Patch(ctx, w.pod.Name, types.MergePatchType, b, metav1.PatchOptions{}, "status")
		if err == nil || apierrors.IsNotFound(err) {
			return
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return
		}
	}
	if err != nil && ctx.Err() == nil {
		w.logf("patching status: %v", err)
	}
}

// containerSpec is what a container start needs: its args and environment.
type containerSpec struct {
	args []string
	env  []string
}

// prepare materialises volumes and a kubeconfig into dir and resolves the container's args and
// env.
func (w *podWorker) prepare(ctx context.Context, dir string, c corev1.Container) (containerSpec, error) {
	pod := w.pod
	cs := w.r.o.Client.CoreV1()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return containerSpec{}, fmt.Errorf("creating %s: %w", dir, err)
	}

	// Volumes.
	volDirs := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		vdir := filepath.Join(dir, "volumes", v.Name)
		files, known, err := w.volumeFiles(ctx, v)
		if err != nil {
			return containerSpec{}, err
		}
		if !known {
			continue
		}
		if err := os.RemoveAll(vdir); err != nil {
			return containerSpec{}, fmt.Errorf("clearing %s: %w", vdir, err)
		}
		for name, data := range files {
			p := filepath.Join(vdir, filepath.Clean("/"+name))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return containerSpec{}, fmt.Errorf("creating %s: %w", filepath.Dir(p), err)
			}
			if err := os.WriteFile(p, data, 0o600); err != nil {
				return containerSpec{}, fmt.Errorf("writing %s: %w", p, err)
			}
		}
		if err := os.MkdirAll(vdir, 0o755); err != nil {
			return containerSpec{}, fmt.Errorf("creating %s: %w", vdir, err)
		}
		volDirs[v.Name] = vdir
	}
	mounts := map[string]string{} // mount path -> local dir
	for _, m := range c.VolumeMounts {
		if d, ok := volDirs[m.Name]; ok {
			mounts[m.MountPath] = filepath.Join(d, m.SubPath)
		}
	}

	// Kubeconfig with a token of the Pod's ServiceAccount, bound to the Pod.
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tr, err := cs.ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: new(int64(3600 * 6)),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return containerSpec{}, fmt.Errorf("requesting a token of ServiceAccount %s/%s: %w", pod.Namespace, sa, err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(kubeconfig, w.r.o.Server, w.r.o.CAData, func(a *clientcmdapi.AuthInfo) {
		a.Token = tr.Status.Token
	}); err != nil {
		return containerSpec{}, err
	}

	// Env.
	envMap := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := envMap[k]; !ok {
			order = append(order, k)
		}
		envMap[k] = v
	}
	for _, ef := range c.EnvFrom {
		data, err := w.envFromData(ctx, ef)
		if err != nil {
			return containerSpec{}, err
		}
		keys := make([]string, 0, len(data))
		for k := range data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			set(ef.Prefix+k, data[k])
		}
	}
	for _, e := range c.Env {
		v, ok, err := w.envValue(ctx, e, envMap)
		if err != nil {
			return containerSpec{}, err
		}
		if ok {
			set(e.Name, rewritePaths(v, mounts))
		}
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + dir,
		"TMPDIR=" + os.TempDir(),
		"KUBECONFIG=" + kubeconfig,
		"POD_NAME=" + pod.Name,
		"POD_NAMESPACE=" + pod.Namespace,
		"POD_IP=" + w.ip,
	}
	for _, k := range order {
		env = append(env, k+"="+envMap[k])
	}

	// Args.
	args := make([]string, 0, len(c.Args))
	for _, a := range c.Args {
		a = expandVars(a, envMap)
		a = rewriteListen(a, w.ip)
		a = rewritePaths(a, mounts)
		args = append(args, a)
	}
	return containerSpec{args: args, env: env}, nil
}

// volumeFiles returns the files of a secret, configMap or projected volume (known = false for
// other kinds, which are not materialised).
func (w *podWorker) volumeFiles(ctx context.Context, v corev1.Volume) (map[string][]byte, bool, error) {
	files := map[string][]byte{}
	addItems := func(data map[string][]byte, items []corev1.KeyToPath, what string, optional bool) error {
		if len(items) == 0 {
			for k, d := range data {
				files[k] = d
			}
			return nil
		}
		for _, it := range items {
			d, ok := data[it.Key]
			if !ok {
				if optional {
					continue
				}
				return fmt.Errorf("volume %s: %s has no key %q", v.Name, what, it.Key)
			}
			files[it.Path] = d
		}
		return nil
	}
	secret := func(name string, items []corev1.KeyToPath, optional bool) error {
		s, err := w.r.o.Client.CoreV1().Secrets(w.pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && optional {
			return nil
		}
		if err != nil {
			return fmt.Errorf("volume %s: reading Secret %s/%s: %w", v.Name, w.pod.Namespace, name, err)
		}
		return addItems(s.Data, items, "Secret "+name, optional)
	}
	configMap := func(name string, items []corev1.KeyToPath, optional bool) error {
		cm, err := w.r.o.Client.CoreV1().ConfigMaps(w.pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && optional {
			return nil
		}
		if err != nil {
			return fmt.Errorf("volume %s: reading ConfigMap %s/%s: %w", v.Name, w.pod.Namespace, name, err)
		}
		data := map[string][]byte{}
		for k, s := range cm.Data {
			data[k] = []byte(s)
		}
		for k, b := range cm.BinaryData {
			data[k] = b
		}
		return addItems(data, items, "ConfigMap "+name, optional)
	}
	switch {
	case v.Secret != nil:
		return files, true, secret(v.Secret.SecretName, v.Secret.Items, v.Secret.Optional != nil && *v.Secret.Optional)
	case v.ConfigMap != nil:
		return files, true, configMap(v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional != nil && *v.ConfigMap.Optional)
	case v.Projected != nil:
		for _, src := range v.Projected.Sources {
			var err error
			switch {
			case src.Secret != nil:
				err = secret(src.Secret.Name, src.Secret.Items, src.Secret.Optional != nil && *src.Secret.Optional)
			case src.ConfigMap != nil:
				err = configMap(src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.Optional != nil && *src.ConfigMap.Optional)
			}
			if err != nil {
				return nil, true, err
			}
		}
		return files, true, nil
	}
	return nil, false, nil
}

// envFromData reads the Secret or ConfigMap of an envFrom entry.
func (w *podWorker) envFromData(ctx context.Context, ef corev1.EnvFromSource) (map[string]string, error) {
	out := map[string]string{}
	switch {
	case ef.SecretRef != nil:
		s, err := w.r.o.Client.CoreV1().Secrets(w.pod.Namespace).Get(ctx, ef.SecretRef.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && ef.SecretRef.Optional != nil && *ef.SecretRef.Optional {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("envFrom: reading Secret %s: %w", ef.SecretRef.Name, err)
		}
		for k, v := range s.Data {
			out[k] = string(v)
		}
	case ef.ConfigMapRef != nil:
		cm, err := w.r.o.Client.CoreV1().ConfigMaps(w.pod.Namespace).Get(ctx, ef.ConfigMapRef.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && ef.ConfigMapRef.Optional != nil && *ef.ConfigMapRef.Optional {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("envFrom: reading ConfigMap %s: %w", ef.ConfigMapRef.Name, err)
		}
		maps := cm.Data
		for k, v := range maps {
			out[k] = v
		}
	}
	return out, nil
}

// envValue resolves one env var (ok = false for an optional reference that is missing).
func (w *podWorker) envValue(ctx context.Context, e corev1.EnvVar, defined map[string]string) (string, bool, error) {
	if e.ValueFrom == nil {
		return expandVars(e.Value, defined), true, nil
	}
	vf := e.ValueFrom
	switch {
	case vf.SecretKeyRef != nil:
		ref := vf.SecretKeyRef
		optional := ref.Optional != nil && *ref.Optional
		s, err := w.r.o.Client.CoreV1().Secrets(w.pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && optional {
			return "", false, nil
		}
		if err != nil {
			return "", false, fmt.Errorf("env %s: reading Secret %s/%s: %w", e.Name, w.pod.Namespace, ref.Name, err)
		}
		v, ok := s.Data[ref.Key]
		if !ok {
			if optional {
				return "", false, nil
			}
			return "", false, fmt.Errorf("env %s: Secret %s/%s has no key %q", e.Name, w.pod.Namespace, ref.Name, ref.Key)
		}
		return string(v), true, nil
	case vf.ConfigMapKeyRef != nil:
		ref := vf.ConfigMapKeyRef
		optional := ref.Optional != nil && *ref.Optional
		cm, err := w.r.o.Client.CoreV1().ConfigMaps(w.pod.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && optional {
			return "", false, nil
		}
		if err != nil {
			return "", false, fmt.Errorf("env %s: reading ConfigMap %s/%s: %w", e.Name, w.pod.Namespace, ref.Name, err)
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			if optional {
				return "", false, nil
			}
			return "", false, fmt.Errorf("env %s: ConfigMap %s/%s has no key %q", e.Name, w.pod.Namespace, ref.Name, ref.Key)
		}
		return v, true, nil
	case vf.FieldRef != nil:
		switch vf.FieldRef.FieldPath {
		case "metadata.name":
			return w.pod.Name, true, nil
		case "metadata.namespace":
			return w.pod.Namespace, true, nil
		case "metadata.uid":
			return string(w.pod.UID), true, nil
		case "status.podIP":
			return w.ip, true, nil
		case "status.hostIP":
			return "127.0.0.1", true, nil
		case "spec.serviceAccountName":
			return w.pod.Spec.ServiceAccountName, true, nil
		case "spec.nodeName":
			return w.pod.Spec.NodeName, true, nil
		}
		return "", false, fmt.Errorf("env %s: fieldRef %s is not supported by the local runner", e.Name, vf.FieldRef.FieldPath)
	}
	return "", false, fmt.Errorf("env %s: this kind of valueFrom is not supported by the local runner", e.Name)
}

// rewriteListen turns a listen address on all interfaces (":PORT", "0.0.0.0:PORT"), alone or as
// a flag's "=value", into one on ip.
func rewriteListen(arg, ip string) string {
	prefix, val := "", arg
	if strings.HasPrefix(arg, "-") {
		if i := strings.IndexByte(arg, '='); i >= 0 {
			prefix, val = arg[:i+1], arg[i+1:]
		} else {
			return arg
		}
	}
	host, port, err := net.SplitHostPort(val)
	if err != nil || (host != "" && host != "0.0.0.0") {
		return arg
	}
	if _, err := strconv.Atoi(port); err != nil {
		return arg
	}
	return prefix + net.JoinHostPort(ip, port)
}

// rewritePaths replaces a mount path (or a path under it) in arg, alone or as a flag's "=value",
// with the directory the volume was materialised in; the longest mount path wins.
func rewritePaths(arg string, mounts map[string]string) string {
	prefix, val := "", arg
	if strings.HasPrefix(arg, "-") {
		if i := strings.IndexByte(arg, '='); i >= 0 {
			prefix, val = arg[:i+1], arg[i+1:]
		}
	}
	best := ""
	for mp := range mounts {
		mp = strings.TrimSuffix(mp, "/")
		if (val == mp || strings.HasPrefix(val, mp+"/")) && len(mp) > len(best) {
			best = mp
		}
	}
	if best == "" {
		return arg
	}
	local := mounts[best]
	if local == "" {
		local = mounts[best+"/"]
	}
	return prefix + local + strings.TrimPrefix(val, best)
}

// expandVars expands $(NAME) references to defined variables, as kubelet does in args and env
// values: undefined references stay as they are, and $$ escapes a dollar.
func expandVars(s string, defined map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteByte(s[i])
				continue
			}
			name := s[i+2 : i+2+end]
			if v, ok := defined[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// exitCode is the exit code in a Wait error (0 for nil, -1 when unknown).
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()) // as container runtimes report it
		}
		return ee.ExitCode()
	}
	return -1
}

// sleepCtx waits d or until ctx ends; false when ctx ended.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
