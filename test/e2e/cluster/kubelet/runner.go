package kubelet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/kubelet/containerworker"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/kubelet/podconfig"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/kubelet/podworker"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/runtime"
)

// DefaultNodeName is the name of the one Node the Runner registers.
const DefaultNodeName = "local"

// Kubelet's defaults, which the Runner uses unless RunnerOptions say otherwise.
const (
	// DefaultCrashLoopBackOff is kubelet's initial container restart back-off (it doubles per
	// restart up to DefaultMaxCrashLoopBackOff and resets after a container ran twice that long).
	DefaultCrashLoopBackOff = 10 * time.Second
	// DefaultMaxCrashLoopBackOff is kubelet's maximum restart back-off.
	DefaultMaxCrashLoopBackOff = 5 * time.Minute
	// DefaultRetryPeriod is how often a Pod that cannot start yet (a missing Secret or
	// ConfigMap) is retried, besides right after any Secret or ConfigMap of its namespace
	// changes (kubelet's pod worker back-off).
	DefaultRetryPeriod = 10 * time.Second
	// DefaultVolumeSyncPeriod is how often the secret, configMap, downwardAPI and projected
	// volumes of a running Pod are brought up to date (and their ServiceAccount tokens checked
	// for refresh); changes of Secrets and ConfigMaps are also picked up at once.
	DefaultVolumeSyncPeriod = 10 * time.Second
)

// RunnerOptions configure a Runner.
type RunnerOptions struct {
	// Client reaches the API server with rights to everything a kubelet and the scheduler do
	// (an admin client): read Pods, Secrets, ConfigMaps; bind Pods; patch Pod status; delete
	// Pods; create Nodes, events and ServiceAccount tokens.
	Client kubernetes.Interface
	// Server is the API server's URL (https://127.0.0.1:PORT): a Pod's KUBERNETES_SERVICE_HOST
	// and KUBERNETES_SERVICE_PORT (there is no kube-proxy to make the kubernetes Service's
	// cluster IP reachable).
	Server string
	// Network is the pod network the Pod IPs come from (runtime.AddPodNetwork). Required.
	Network *runtime.PodNetwork
	// Images maps image references to local programs; the first match wins. Images no mapping
	// matches cannot be "pulled" (the container waits in ErrImagePull / ImagePullBackOff).
	// NewRunner appends runtime.RenderqueueImage(Binary) when Binary is set, and
	// runtime.PauseImage().
	Images []runtime.ImageMapping
	// Binary is the renderqueue binary (see runtime.RenderqueueImage); may be empty.
	Binary string
	// NodeName is the name of the Node registered and run (default DefaultNodeName).
	NodeName string
	// Dir holds each Pod's directory: volumes, container logs, termination messages, the
	// containers' root filesystem mount points. Created with mode 0700.
	Dir string
	// Logf reports what the runner does (nil: silent).
	Logf func(format string, args ...any)
	// ProcessLog, if not nil, also receives every container's output, line-prefixed.
	ProcessLog io.Writer
	// CrashLoopBackOff and MaxCrashLoopBackOff are the container restart back-off (defaults:
	// kubelet's, DefaultCrashLoopBackOff and DefaultMaxCrashLoopBackOff).
	CrashLoopBackOff, MaxCrashLoopBackOff time.Duration
	// RetryPeriod: see DefaultRetryPeriod.
	RetryPeriod time.Duration
	// VolumeSyncPeriod: see DefaultVolumeSyncPeriod.
	VolumeSyncPeriod time.Duration
	// MaxGrace caps a Pod's termination grace period (0: no cap; the Pod's own period).
	MaxGrace time.Duration
	// Kubelet, if set, serves the kubelet API's container logs (kubectl logs) for the Node.
	Kubelet *Server
}

// Runner plays kubelet (and the scheduler) for one Node: it registers the Node, binds every
// unscheduled Pod to it and runs every Pod bound to it, with the containers' processes built
// from RunnerOptions.Images. What it honours of a Pod, and what it does instead where a
// container runtime would do more, is in the package documentation (and
// docs/local-cluster.md); every field it does not honour is logged once per Pod, and also shown
// as an event of the Pod.
type Runner struct {
	o         RunnerOptions
	recorder  record.EventRecorder
	scheduler record.EventRecorder
	// node is what the Pods' workers share (complete once Run has synced the caches).
	node podworker.Node

	mu      sync.Mutex
	workers map[types.UID]*podworker.Worker
	noted   map[types.UID]string // what was logged about a Pod that is not run (binding, other node)
	// finished holds the Pods whose worker ended (terminal phase, or the runner stopped them):
	// they are never run again, only deleted for good once marked for deletion.
	finished map[types.UID]string // the Pod's directory
	binding  map[types.UID]bool
	wg       sync.WaitGroup
}

// NewRunner checks o and returns a Runner; Run starts it.
func NewRunner(o RunnerOptions) (*Runner, error) {
	if o.Client == nil || o.Dir == "" || o.Server == "" || o.Network == nil {
		return nil, errors.New("runner: Client, Server, Network and Dir are required")
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("runner: must run as root (mount namespaces, overlay root filesystems, changing users)")
	}
	for _, tool := range []string{"bash", "mount", "umount", "pivot_root", "setpriv", "env", "mknod"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("runner: %s is needed (util-linux, coreutils, bash): %w", tool, err)
		}
	}
	u, err := url.Parse(o.Server)
	if err != nil || u.Hostname() == "" || u.Port() == "" {
		return nil, fmt.Errorf("runner: Server %q is not https://HOST:PORT", o.Server)
	}
	if o.NodeName == "" {
		o.NodeName = DefaultNodeName
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.CrashLoopBackOff <= 0 {
		o.CrashLoopBackOff = DefaultCrashLoopBackOff
	}
	if o.MaxCrashLoopBackOff <= 0 {
		o.MaxCrashLoopBackOff = DefaultMaxCrashLoopBackOff
	}
	if o.MaxCrashLoopBackOff < o.CrashLoopBackOff {
		o.MaxCrashLoopBackOff = o.CrashLoopBackOff
	}
	if o.RetryPeriod <= 0 {
		o.RetryPeriod = DefaultRetryPeriod
	}
	if o.VolumeSyncPeriod <= 0 {
		o.VolumeSyncPeriod = DefaultVolumeSyncPeriod
	}
	if o.Binary != "" {
		o.Images = append(o.Images, runtime.RenderqueueImage(o.Binary))
	}
	pause, err := runtime.PauseImage()
	if err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	o.Images = append(o.Images, pause)
	if strings.ContainsAny(o.Dir, ",:\\") {
		return nil, fmt.Errorf("runner: Dir %q must not contain ',', ':' or '\\' (overlay mount options)", o.Dir)
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("runner: creating %s: %w", o.Dir, err)
	}
	if err := os.Chmod(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("runner: %w", err)
	}
	return &Runner{
		o: o,
		node: podworker.Node{
			Client: o.Client, Network: o.Network, Logf: o.Logf,
			RetryPeriod: o.RetryPeriod, VolumeSyncPeriod: o.VolumeSyncPeriod,
			Config: podconfig.Sources{Client: o.Client, APIHost: u.Hostname(), APIPort: u.Port()},
			Containers: containerworker.Node{
				Images:      o.Images,
				Backoff:     flowcontrol.NewBackOff(o.CrashLoopBackOff, o.MaxCrashLoopBackOff),
				RetryPeriod: o.RetryPeriod, MaxGrace: o.MaxGrace, ProcessLog: o.ProcessLog,
			},
		},
		workers: map[types.UID]*podworker.Worker{}, noted: map[types.UID]string{}, binding: map[types.UID]bool{},
		finished: map[types.UID]string{},
	}, nil
}

// NodeName is the name of the Node the runner plays kubelet for.
func (r *Runner) NodeName() string { return r.o.NodeName }

// Run registers the Node, then schedules and runs Pods until ctx ends; then it stops every
// container it started (each with its Pod's grace period, capped by MaxGrace) and returns.
func (r *Runner) Run(ctx context.Context) error {
	if err := r.registerNode(ctx); err != nil {
		return err
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: r.o.Client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	r.recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: r.o.NodeName})
	r.scheduler = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "default-scheduler"})

	factory := informers.NewSharedInformerFactory(r.o.Client, 0)
	r.node.Recorder, r.node.Config.Recorder, r.node.Containers.Recorder = r.recorder, r.recorder, r.recorder
	r.node.Config.Secrets = factory.Core().V1().Secrets().Lister()
	r.node.Config.ConfigMaps = factory.Core().V1().ConfigMaps().Lister()
	kickNamespace := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if m, ok := obj.(metav1.Object); ok {
			r.kick(m.GetNamespace())
		}
	}
	for _, inf := range []cache.SharedIndexInformer{factory.Core().V1().Secrets().Informer(), factory.Core().V1().ConfigMaps().Informer()} {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: kickNamespace, UpdateFunc: func(_, obj any) { kickNamespace(obj) }, DeleteFunc: kickNamespace,
		}); err != nil {
			return fmt.Errorf("runner: adding a handler: %w", err)
		}
	}
	pods := factory.Core().V1().Pods().Informer()
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.observe(ctx, obj) },
		UpdateFunc: func(_, obj any) { r.observe(ctx, obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				r.gone(pod)
			}
		},
	}); err != nil {
		return fmt.Errorf("runner: adding the pod handler: %w", err)
	}
	factory.Start(ctx.Done())
	// Pods are only run once the Secret and ConfigMap caches are complete (a missing Secret
	// must mean missing, not not-yet-listed).
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok && ctx.Err() == nil {
			return fmt.Errorf("runner: the %v cache did not sync", typ)
		}
	}
	if r.o.Kubelet != nil {
		r.o.Kubelet.setRunner(r)
	}
	r.o.Logf("runner: differences from a kubelet and a container runtime, for every Pod: %s", strings.Join(GeneralDeviations, "; "))
	<-ctx.Done()
	factory.Shutdown()
	r.mu.Lock()
	ws := make([]*podworker.Worker, 0, len(r.workers))
	for _, w := range r.workers {
		ws = append(ws, w)
	}
	r.mu.Unlock()
	for _, w := range ws {
		w.Stop(false)
	}
	for _, w := range ws {
		<-w.Done()
	}
	r.wg.Wait()
	return nil
}

// registerNode creates (or takes over) the Node: Ready, the pod CIDR, 127.0.0.1 as its address,
// this machine's CPUs and memory as capacity.
func (r *Runner) registerNode(ctx context.Context) error {
	nodes := r.o.Client.CoreV1().Nodes()
	cidr := r.o.Network.CIDR.String()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: r.o.NodeName, Labels: map[string]string{
			"kubernetes.io/hostname": r.o.NodeName, "kubernetes.io/os": "linux", "kubernetes.io/arch": goruntime.GOARCH,
		}},
		Spec: corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}},
	}
	created, err := nodes.Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = nodes.Get(ctx, r.o.NodeName, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("runner: registering Node %s: %w", r.o.NodeName, err)
	}
	now := metav1.Now()
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(goruntime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(memTotal(), resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(110, resource.DecimalSI),
	}
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	created.Status = corev1.NodeStatus{
		Capacity: capacity, Allocatable: capacity,
		Phase: corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "not checked by the local runner"),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "not checked by the local runner"),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "not checked by the local runner"),
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "the local pod runner (test/e2e/cluster) is running"),
		},
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: runtime.NodeIP}, {Type: corev1.NodeHostName, Address: r.o.NodeName}},
		NodeInfo: corev1.NodeSystemInfo{
			KubeletVersion: "local-runner", ContainerRuntimeVersion: "local-runner://0", OperatingSystem: "linux",
			Architecture: goruntime.GOARCH, KernelVersion: kernelRelease(), OSImage: "this machine's root filesystem",
		},
	}
	if r.o.Kubelet != nil {
		created.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(r.o.Kubelet.Port())
	}
	if _, err := nodes.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("runner: writing the status of Node %s: %w", r.o.NodeName, err)
	}
	r.o.Logf("runner: registered Node %s (pod CIDR %s, Ready)", r.o.NodeName, cidr)
	return nil
}

func memTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		var kb int64
		if _, err := fmt.Sscanf(line, "MemTotal: %d kB", &kb); err == nil {
			return kb * 1024
		}
	}
	return 0
}

func kernelRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

// observe reacts to a Pod: binds it when it is unscheduled, starts a worker for a new Pod of this
// Node, and passes updates (deletion included) to the Pod's worker.
func (r *Runner) observe(ctx context.Context, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || ctx.Err() != nil {
		return
	}
	if pod.Spec.NodeName == "" {
		r.schedule(ctx, pod)
		return
	}
	if pod.Spec.NodeName != r.o.NodeName {
		r.noteOnce(pod, "other-node", "runner: pod %s/%s is bound to Node %q, not %q: not run", pod.Namespace, pod.Name, pod.Spec.NodeName, r.o.NodeName)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.workers[pod.UID]; ok {
		w.Update(pod)
		return
	}
	dir, finished := r.finished[pod.UID]
	if pod.DeletionTimestamp != nil {
		// Never started here, or finished: kubelet's final delete.
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.node.FinalDelete(pod.Namespace, pod.Name, pod.UID)
			if dir != "" {
				if err := os.RemoveAll(dir); err != nil {
					r.o.Logf("runner: removing %s: %v", dir, err)
				}
			}
		}()
		return
	}
	if finished || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return
	}
	w := podworker.New(&r.node, pod, r.podDir(pod))
	r.workers[pod.UID] = w
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		w.Run(ctx)
		r.mu.Lock()
		if r.workers[pod.UID] == w {
			delete(r.workers, pod.UID)
		}
		// Updates pass through observe under r.mu: a deletion that reached the worker is
		// seen here, one that comes later finds no worker and is deleted for good there.
		deleting, finalized := w.Deleted()
		if !deleting {
			r.finished[pod.UID] = w.Dir()
		}
		r.mu.Unlock()
		if deleting && !finalized && ctx.Err() == nil {
			r.node.FinalDelete(pod.Namespace, pod.Name, pod.UID)
			if err := os.RemoveAll(w.Dir()); err != nil {
				r.o.Logf("runner: removing %s: %v", w.Dir(), err)
			}
		}
	}()
}

// gone handles a Pod removed from the API server (deleted for good, by its final delete or a
// forced one): its containers are stopped.
func (r *Runner) gone(pod *corev1.Pod) {
	r.mu.Lock()
	w := r.workers[pod.UID]
	delete(r.noted, pod.UID)
	delete(r.binding, pod.UID)
	delete(r.finished, pod.UID)
	r.mu.Unlock()
	if w != nil {
		w.Stop(false)
	}
}

// kick wakes the workers of namespace's Pods waiting for a Secret or ConfigMap.
func (r *Runner) kick(namespace string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.workers {
		if w.Namespace() == namespace {
			w.Kick()
		}
	}
}

// noteOnce logs a message about a Pod once per key.
func (r *Runner) noteOnce(pod *corev1.Pod, key, format string, args ...any) {
	r.mu.Lock()
	seen := r.noted[pod.UID] == key
	r.noted[pod.UID] = key
	r.mu.Unlock()
	if !seen {
		r.o.Logf(format, args...)
	}
}

// schedule binds an unscheduled Pod to the Node (the scheduler's Binding), unless it waits for
// scheduling gates or names another scheduler. Nothing of the Pod's scheduling constraints is
// checked: they are logged as not honoured.
func (r *Runner) schedule(ctx context.Context, pod *corev1.Pod) {
	if pod.DeletionTimestamp != nil {
		return
	}
	if len(pod.Spec.SchedulingGates) > 0 {
		r.noteOnce(pod, "gated", "runner: pod %s/%s waits for its scheduling gates %v", pod.Namespace, pod.Name, pod.Spec.SchedulingGates)
		return
	}
	if s := pod.Spec.SchedulerName; s != "" && s != corev1.DefaultSchedulerName {
		r.noteOnce(pod, "scheduler", "runner: pod %s/%s names scheduler %q: not bound (only %s Pods are)", pod.Namespace, pod.Name, s, corev1.DefaultSchedulerName)
		return
	}
	r.mu.Lock()
	if r.binding[pod.UID] {
		r.mu.Unlock()
		return
	}
	r.binding[pod.UID] = true
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer func() {
			r.mu.Lock()
			delete(r.binding, pod.UID)
			r.mu.Unlock()
		}()
		if ignored := schedulingIgnored(pod); len(ignored) > 0 {
			r.o.Logf("runner: pod %s/%s: not honoured when scheduling (one Node, everything fits): %s", pod.Namespace, pod.Name, strings.Join(ignored, "; "))
		}
		b := &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
			Target:     corev1.ObjectReference{Kind: "Node", Name: r.o.NodeName},
		}
		bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		err := r.o.Client.CoreV1().Pods(pod.Namespace).Bind(bctx, b, metav1.CreateOptions{})
		switch {
		case err == nil:
			r.scheduler.Eventf(pod, corev1.EventTypeNormal, "Scheduled", "Successfully assigned %s/%s to %s", pod.Namespace, pod.Name, r.o.NodeName)
		case apierrors.IsConflict(err), apierrors.IsNotFound(err), ctx.Err() != nil:
			// bound meanwhile, or gone
		default:
			r.o.Logf("runner: binding pod %s/%s to %s: %v", pod.Namespace, pod.Name, r.o.NodeName, err)
		}
	}()
}

// GeneralDeviations are what the Runner does differently from a kubelet and a container runtime
// for every Pod; Run logs them once. Fields a Pod sets that the runner does not honour are logged
// per Pod (and shown as a LocalRunner event of the Pod).
var GeneralDeviations = []string{
	"no network namespace per Pod: containers share this machine's network; each Pod gets an address of the pod CIDR (a local route on lo) and listen addresses on all interfaces in args are moved to it",
	"no kube-proxy: Service cluster IPs are unreachable; KUBERNETES_SERVICE_HOST/PORT are the API server's real address; no other Service environment variables (enableServiceLinks)",
	"no cluster DNS: /etc/resolv.conf is this machine's (dnsPolicy, dnsConfig)",
	"no PID namespace per Pod (hostPID is always in effect); no cgroups (resources, QoS)",
	"a container's image is this machine's root filesystem, read-only as the lower layer of an overlay, with the mapped program at the entrypoint path",
}

// schedulingIgnored lists the scheduling constraints a Pod sets, which the runner does not check.
func schedulingIgnored(pod *corev1.Pod) []string {
	var out []string
	s := pod.Spec
	if len(s.NodeSelector) > 0 {
		out = append(out, fmt.Sprintf("nodeSelector %v", s.NodeSelector))
	}
	if s.Affinity != nil {
		out = append(out, "affinity")
	}
	var tolerations int
	for _, t := range s.Tolerations {
		// The DefaultTolerationSeconds admission plugin adds these two to every Pod; they only
		// matter to taint-based eviction, which nothing does here.
		if t.Effect == corev1.TaintEffectNoExecute && (t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable) {
			continue
		}
		tolerations++
	}
	if tolerations > 0 {
		out = append(out, fmt.Sprintf("%d tolerations (the Node has no taints)", tolerations))
	}
	if len(s.TopologySpreadConstraints) > 0 {
		out = append(out, "topologySpreadConstraints")
	}
	if s.PriorityClassName != "" || (s.Priority != nil && *s.Priority != 0) {
		out = append(out, "priority (no preemption)")
	}
	for _, c := range append(append([]corev1.Container{}, s.InitContainers...), s.Containers...) {
		if len(c.Resources.Requests) > 0 || len(c.Resources.Limits) > 0 {
			out = append(out, "resource requests/limits (no fit check)")
			break
		}
	}
	if len(s.Overhead) > 0 {
		out = append(out, "overhead")
	}
	return out
}

// Processes lists the app containers the runner runs (init containers are left out), by
// namespace, Pod name and container order.
func (r *Runner) Processes() []podworker.PodProcess {
	r.mu.Lock()
	ws := make([]*podworker.Worker, 0, len(r.workers))
	for _, w := range r.workers {
		ws = append(ws, w)
	}
	r.mu.Unlock()
	var out []podworker.PodProcess
	for _, w := range ws {
		out = append(out, w.Processes()...)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// Process returns the first app container of the Pod namespace/name, if the runner runs it.
func (r *Runner) Process(namespace, name string) (podworker.PodProcess, bool) {
	for _, p := range r.Processes() {
		if p.Namespace == namespace && p.Name == name {
			return p, true
		}
	}
	return podworker.PodProcess{}, false
}

// worker returns the worker of the Pod namespace/name.
func (r *Runner) worker(namespace, name string) *podworker.Worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.workers {
		if w.Namespace() == namespace && w.Name() == name && !w.Stopping() {
			return w
		}
	}
	return nil
}

// KillPod sends sig to the process group of the first app container of the Pod namespace/name
// (as if it crashed) and returns the pid it signalled.
func (r *Runner) KillPod(namespace, name string, sig syscall.Signal) (int, error) {
	w := r.worker(namespace, name)
	if w == nil {
		return 0, fmt.Errorf("runner: no pod %s/%s", namespace, name)
	}
	return w.Kill(sig)
}

// LogPath returns the log file of a container's current (previous=false) or previous instance.
func (r *Runner) LogPath(namespace, name, container string, previous bool) (string, error) {
	w := r.worker(namespace, name)
	if w == nil {
		return "", fmt.Errorf("pod %s/%s is not run by this runner", namespace, name)
	}
	return w.LogPath(container, previous)
}

// podDirName is the directory of a Pod under RunnerOptions.Dir.
func podDirName(pod *corev1.Pod) string {
	return fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID)
}

// podDir is the directory of a Pod.
func (r *Runner) podDir(pod *corev1.Pod) string { return filepath.Join(r.o.Dir, podDirName(pod)) }
