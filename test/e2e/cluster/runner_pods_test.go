package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/kubelet"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/process"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/runtime"
	"github.com/renderqueue/renderqueue/test/e2e/cluster/wait"
)

// podtestReport mirrors testdata/podtest's Report.
type podtestReport struct {
	Argv      []string          `json:"argv"`
	UID       int               `json:"uid"`
	GID       int               `json:"gid"`
	Groups    []int             `json:"groups"`
	Hostname  string            `json:"hostname"`
	WriteRoot string            `json:"writeRoot"`
	WriteTmp  string            `json:"writeTmp"`
	WriteDir  string            `json:"writeDir"`
	Reads     map[string]string `json:"reads"`
	Writes    map[string]string `json:"writes"`
	Status    map[string]string `json:"status"`
	Env       map[string]string `json:"env"`
	Files     map[string]struct {
		Content string `json:"content"`
		Mode    string `json:"mode"`
		GID     int    `json:"gid"`
	} `json:"files"`
	User      string `json:"user"`
	UserError string `json:"userError"`
	Namespace string `json:"namespace"`
	CA        string `json:"ca"`
}

const testNS = "default"

// runnerTestCluster starts a control plane and the runner with testdata/podtest as the image
// "podtest" (fast back-offs), or skips the test when that cannot work here.
func runnerTestCluster(t *testing.T) *Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("runner test: skipped with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("runner test: needs root (mount namespaces, an overlay root filesystem per container, a local route for the pod CIDR)")
	}
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		t.Skip("runner test: KUBEBUILDER_ASSETS is not set (hack/setup-envtest.sh prints it)")
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			t.Skipf("runner test: %s is not in KUBEBUILDER_ASSETS (%s); run hack/setup-envtest.sh", b, assets)
		}
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "podtest")
	if out, err := exec.Command("go", "build", "-o", bin, "./testdata/podtest").CombinedOutput(); err != nil {
		t.Fatalf("building testdata/podtest: %v\n%s", err, out)
	}
	// podtest runs as the renderqueue image does (user 65532:65532, distroless ENV), at /podtest.
	podtest := runtime.RenderqueueImage(bin).Image
	podtest.Entrypoint = []string{"/podtest"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{
		Assets: assets, Dir: filepath.Join(dir, "cluster"), SkipPostgres: true,
		Images: []runtime.ImageMapping{{
			Name:  "podtest",
			Match: func(ref string) bool { return runtime.RepositoryName(ref) == "podtest" },
			Image: podtest,
		}},
		CrashLoopBackOff: time.Second, MaxCrashLoopBackOff: 2 * time.Second, RetryPeriod: time.Second, MaxGrace: 5 * time.Second,
		Logf: t.Logf,
	})
	if err != nil {
		t.Fatalf("starting the cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range c.Runner.Processes() {
				t.Logf("pod %s/%s container %s (pid %d, restarts %d) log:\n%s", p.Namespace, p.Name, p.Container, p.Pid, p.Restarts, process.TailFile(p.LogPath, 30))
			}
		}
		c.Stop()
	})
	return c
}

// eventuallyPod polls the Pod until cond holds.
func eventuallyPod(t *testing.T, c *Cluster, name string, timeout time.Duration, what string, cond func(*corev1.Pod) (bool, string)) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := wait.Poll(context.Background(), timeout, 200*time.Millisecond, "pod "+name+": "+what, func(ctx context.Context) (bool, string, error) {
		p, err := c.Client.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		pod = p
		ok, why := cond(p)
		return ok, why, nil
	})
	if err != nil {
		b, _ := json.MarshalIndent(pod.Status, "", "  ")
		t.Fatalf("%v\nstatus: %s", err, b)
	}
	return pod
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func waiting(p *corev1.Pod) *corev1.ContainerStateWaiting {
	if len(p.Status.ContainerStatuses) == 0 {
		return nil
	}
	return p.Status.ContainerStatuses[0].State.Waiting
}

func podtestContainer(name string, args ...string) corev1.Container {
	return corev1.Container{Name: name, Image: "registry.example.com/team/podtest:v1", Args: args,
		Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}
}

func create(t *testing.T, c *Cluster, obj any) {
	t.Helper()
	ctx := context.Background()
	var err error
	switch o := obj.(type) {
	case *corev1.Pod:
		_, err = c.Client.CoreV1().Pods(testNS).Create(ctx, o, metav1.CreateOptions{})
	case *corev1.Secret:
		_, err = c.Client.CoreV1().Secrets(testNS).Create(ctx, o, metav1.CreateOptions{})
	case *corev1.ConfigMap:
		_, err = c.Client.CoreV1().ConfigMaps(testNS).Create(ctx, o, metav1.CreateOptions{})
	case *corev1.Service:
		_, err = c.Client.CoreV1().Services(testNS).Create(ctx, o, metav1.CreateOptions{})
	case *appsv1.Deployment:
		_, err = c.Client.AppsV1().Deployments(testNS).Create(ctx, o, metav1.CreateOptions{})
	default:
		t.Fatalf("create: %T", obj)
	}
	if err != nil {
		t.Fatalf("creating %T: %v", obj, err)
	}
}

// TestRunnerPods shows each Pod field the runner honours doing its job, with real Pods on a real
// control plane: security context, volumes, env, ServiceAccount token, Pod IP and EndpointSlice,
// probes, restarts, back-off, termination messages, config errors, unmapped images,
// Deployments, deletion.
func TestRunnerPods(t *testing.T) {
	c := runnerTestCluster(t)
	ctx := context.Background()

	// Objects the Pods use.
	create(t, c, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "files"}, Data: map[string][]byte{"key": []byte("secret-value"), "other": []byte("o")}})
	create(t, c, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "conf"}, Data: map[string]string{"greeting": "hello"}})
	create(t, c, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "envs"}, Data: map[string][]byte{"A": []byte("1"), "B": []byte("2")}})
	create(t, c, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "secure"}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": "secure"},
		Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
	}})

	// secure: the restricted security context, volumes, env, a readiness probe.
	secure := podtestContainer("main", "serve", "--listen", ":8080", "--files", "/etc/files", "--read", "/etc/greeting.txt",
		"--read", "/etc/hostname", "--write", "/data/$(POD_NAME)/other", "--read", "/tmp/secure-data")
	secure.Env = []corev1.EnvVar{
		{Name: "GREETING", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "conf"}, Key: "greeting"}}},
		{Name: "MESSAGE", Value: "$(GREETING) from $(POD_NAME)"},
		{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "LATE", Value: "$(POD_NAME)"},
		{Name: "MISSING_OPTIONAL", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Key: "x", Optional: ptr.To(true)}}},
	}
	secure.EnvFrom = []corev1.EnvFromSource{{Prefix: "S_", SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "envs"}}}}
	secure.VolumeMounts = []corev1.VolumeMount{
		{Name: "files", MountPath: "/etc/files"},
		{Name: "tmp", MountPath: "/tmp"},
		{Name: "conf", MountPath: "/etc/greeting.txt", SubPath: "greeting"},
		{Name: "tmp", MountPath: "/data/secure", SubPathExpr: "$(POD_NAME)-data", ReadOnly: true},
	}
	secure.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("http")}},
		PeriodSeconds: 1}
	secure.SecurityContext = &corev1.SecurityContext{
		RunAsUser: ptr.To[int64](1234), AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
		RunAsNonRoot: ptr.To(true), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	create(t, c, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "secure", Labels: map[string]string{"app": "secure"}},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{RunAsGroup: ptr.To[int64](2345), FSGroup: ptr.To[int64](3456)},
			Containers:      []corev1.Container{secure},
			Volumes: []corev1.Volume{
				{Name: "files", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "files", DefaultMode: ptr.To[int32](0o440),
					Items: []corev1.KeyToPath{{Key: "key", Path: "sub/key"}}}}},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "conf", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "conf"}}}},
			},
		},
	})

	// needs-secret: env from a Secret that does not exist yet.
	ns := podtestContainer("main", "serve", "--listen", ":8080")
	ns.Env = []corev1.EnvVar{{Name: "DSN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "later"}, Key: "dsn"}}}}
	create(t, c, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "needs-secret"}, Spec: corev1.PodSpec{Containers: []corev1.Container{ns}}})

	// liveness: /healthz fails 2s after start; the liveness probe kills it.
	live := podtestContainer("main", "serve", "--listen", ":8080", "--unhealthy-after", "2s")
	live.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}},
		PeriodSeconds: 1, FailureThreshold: 2}
	create(t, c, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "liveness"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{live}, TerminationGracePeriodSeconds: ptr.To[int64](2)}})

	// crash: 100 lines, exit 3: CrashLoopBackOff with the end of the log as termination message.
	crash := podtestContainer("main", "crash", "--lines", "100", "--code", "3")
	crash.TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
	create(t, c, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "crash"}, Spec: corev1.PodSpec{Containers: []corev1.Container{crash}}})

	// message: writes its termination message file and succeeds (restartPolicy Never).
	create(t, c, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "message"}, Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{podtestContainer("main", "message", "bye", "now")}}})

	// root: runAsNonRoot with user 0.
	root := podtestContainer("main", "serve")
	root.SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](0), RunAsNonRoot: ptr.To(true)}
	create(t, c, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "root"}, Spec: corev1.PodSpec{Containers: []corev1.Container{root}}})

	// unmapped image.
	create(t, c, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "unmapped"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "main", Image: "docker.io/library/nginx:1.27"}}}})

	// A Deployment of pause Pods: kube-controller-manager creates them, the runner binds them.
	create(t, c, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "pause"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "pause"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "pause"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10"}}},
			},
		},
	})

	// multi: an init container, then two containers on two ports of the Pod IP.
	a := podtestContainer("a", "serve", "--listen", ":8080")
	a.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("http")}}, PeriodSeconds: 1}
	b := podtestContainer("b", "serve", "--listen", "0.0.0.0:8081")
	b.Ports = nil
	b.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromInt32(8081)}}, PeriodSeconds: 1}
	sidecar := podtestContainer("sidecar", "serve", "--listen", ":8082")
	sidecar.Ports = nil
	sidecar.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
	create(t, c, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "multi"}, Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{podtestContainer("init", "crash", "--lines", "1", "--code", "0"), sidecar},
		Containers:     []corev1.Container{a, b},
	}})

	// deadline: activeDeadlineSeconds ends it. It is set once the Pod is Ready (podtest serves, so
	// has installed its SIGTERM handler: a SIGTERM before that ends it with 143): a deadline set on
	// a running Pod applies, as with a kubelet.
	deadline := podtestContainer("main", "serve", "--listen", ":8080", "--term-delay", "1s")
	deadline.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("http")}},
		PeriodSeconds: 1}
	create(t, c, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "deadline"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{deadline}}})

	t.Run("secure", func(t *testing.T) {
		p := eventuallyPod(t, c, "secure", 30*time.Second, "Ready", func(p *corev1.Pod) (bool, string) { return podReady(p), string(p.Status.Phase) })
		if p.Spec.NodeName != kubelet.DefaultNodeName || p.Status.Phase != corev1.PodRunning || p.Status.HostIP != "127.0.0.1" {
			t.Errorf("nodeName %q phase %s hostIP %s", p.Spec.NodeName, p.Status.Phase, p.Status.HostIP)
		}
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil || !c.Network.CIDR.Contains(ip) {
			t.Fatalf("Pod IP %q is not in the pod CIDR %s", p.Status.PodIP, c.Network.CIDR)
		}
		resp, err := http.Get("http://" + p.Status.PodIP + ":8080/report")
		if err != nil {
			t.Fatalf("reaching the Pod at its IP: %v", err)
		}
		var rep podtestReport
		err = json.NewDecoder(resp.Body).Decode(&rep)
		_ = resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if rep.UID != 1234 || rep.GID != 2345 || !containsInt(rep.Groups, 3456) {
			t.Errorf("runs as uid %d gid %d groups %v, want 1234, 2345 and fsGroup 3456 among the groups", rep.UID, rep.GID, rep.Groups)
		}
		if !strings.Contains(rep.WriteRoot, "read-only file system") {
			t.Errorf("writing to / under readOnlyRootFilesystem: %q, want a read-only file system error", rep.WriteRoot)
		}
		if rep.WriteTmp != "" {
			t.Errorf("writing to the emptyDir at /tmp: %s", rep.WriteTmp)
		}
		if !strings.Contains(rep.WriteDir, "read-only file system") {
			t.Errorf("writing into the secret volume: %q, want a read-only file system error", rep.WriteDir)
		}
		// the subPathExpr directory was made in the emptyDir (a directory: reading it fails so)
		if rep.Reads["/etc/greeting.txt"] != "hello" || rep.Reads["/etc/hostname"] != "secure\n" || !strings.Contains(rep.Reads["/tmp/secure-data"], "is a directory") {
			t.Errorf("the subPath file, /etc/hostname, the subPathExpr directory in the emptyDir: %q", rep.Reads)
		}
		if !strings.Contains(rep.Writes["/data/secure/other"], "read-only file system") {
			t.Errorf("a write through the read-only subPathExpr mount: %q", rep.Writes)
		}
		if rep.Status["NoNewPrivs"] != "1" || rep.Status["CapBnd"] != "0000000000000000" || rep.Status["CapEff"] != "0000000000000000" {
			t.Errorf("no_new_privs and capabilities: %v", rep.Status)
		}
		if rep.Hostname != "secure" || len(rep.Argv) == 0 || rep.Argv[0] != "/podtest" {
			t.Errorf("hostname %q argv %q", rep.Hostname, rep.Argv)
		}
		f, ok := rep.Files["sub/key"]
		if !ok || f.Content != "secret-value" || f.Mode != "-r--r-----" || f.GID != 3456 {
			t.Errorf("secret volume item sub/key: %+v (files %v), want secret-value, -r--r-----, group 3456", f, rep.Files)
		}
		if len(rep.Files) != 1 {
			t.Errorf("secret volume with one item holds %v", rep.Files)
		}
		apiServer, err := url.Parse(c.RESTConfig.Host)
		if err != nil {
			t.Fatal(err)
		}
		wantEnv := map[string]string{
			"GREETING": "hello", "MESSAGE": "hello from $(POD_NAME)", "POD_NAME": "secure", "POD_IP": p.Status.PodIP,
			"LATE": "secure", "S_A": "1", "S_B": "2", "HOSTNAME": "secure", "HOME": "/",
			"KUBERNETES_SERVICE_HOST": apiServer.Hostname(), "KUBERNETES_SERVICE_PORT": apiServer.Port(),
		}
		for k, v := range wantEnv {
			if rep.Env[k] != v {
				t.Errorf("env %s = %q, want %q", k, rep.Env[k], v)
			}
		}
		for _, k := range []string{"MISSING_OPTIONAL", "KUBECONFIG", "POD_NAMESPACE"} {
			if v, ok := rep.Env[k]; ok {
				t.Errorf("env %s = %q is set", k, v)
			}
		}
		clusterCA, err := os.ReadFile(c.RESTConfig.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		if rep.User != "system:serviceaccount:default:default" || rep.Namespace != testNS || rep.CA != string(clusterCA) {
			t.Errorf("in-cluster config: user %q (%s), namespace %q, ca.crt is the cluster CA: %v", rep.User, rep.UserError, rep.Namespace, rep.CA == string(clusterCA))
		}
		// The Service's EndpointSlice lists the Pod IP, ready.
		err = wait.Poll(ctx, 30*time.Second, 200*time.Millisecond, "an EndpointSlice of Service secure with the Pod IP", func(ctx context.Context) (bool, string, error) {
			l, err := c.Client.DiscoveryV1().EndpointSlices(testNS).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=secure"})
			if err != nil {
				return false, err.Error(), nil
			}
			for _, s := range l.Items {
				for _, e := range s.Endpoints {
					if len(e.Addresses) > 0 && e.Addresses[0] == p.Status.PodIP && e.Conditions.Ready != nil && *e.Conditions.Ready {
						return true, "", nil
					}
				}
			}
			return false, fmt.Sprintf("%d slices", len(l.Items)), nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("missing-secret", func(t *testing.T) {
		eventuallyPod(t, c, "needs-secret", 30*time.Second, "CreateContainerConfigError for the missing Secret", func(p *corev1.Pod) (bool, string) {
			w := waiting(p)
			return w != nil && w.Reason == "CreateContainerConfigError" && w.Message == `secret "later" not found` && p.Status.Phase == corev1.PodPending, fmt.Sprintf("%+v", w)
		})
		create(t, c, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "later"}, Data: map[string][]byte{"other": []byte("x")}})
		eventuallyPod(t, c, "needs-secret", 30*time.Second, "CreateContainerConfigError for the missing key", func(p *corev1.Pod) (bool, string) {
			w := waiting(p)
			return w != nil && w.Reason == "CreateContainerConfigError" && w.Message == "couldn't find key dsn in Secret default/later", fmt.Sprintf("%+v", w)
		})
		if _, err := c.Client.CoreV1().Secrets(testNS).Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "later"},
			Data: map[string][]byte{"dsn": []byte("postgres://x")}}, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventuallyPod(t, c, "needs-secret", 30*time.Second, "running once the Secret has the key", func(p *corev1.Pod) (bool, string) {
			return p.Status.Phase == corev1.PodRunning && podReady(p), string(p.Status.Phase)
		})
	})

	t.Run("liveness", func(t *testing.T) {
		p := eventuallyPod(t, c, "liveness", 40*time.Second, "restarted by its liveness probe", func(p *corev1.Pod) (bool, string) {
			if len(p.Status.ContainerStatuses) == 0 {
				return false, "no status"
			}
			s := p.Status.ContainerStatuses[0]
			return s.RestartCount >= 1 && s.LastTerminationState.Terminated != nil, fmt.Sprintf("restarts %d", s.RestartCount)
		})
		s := p.Status.ContainerStatuses[0]
		term := s.LastTerminationState.Terminated
		if term.FinishedAt.Sub(term.StartedAt.Time) < 2*time.Second {
			t.Errorf("killed %s after it started, before /healthz failed", term.FinishedAt.Sub(term.StartedAt.Time))
		}
		if term.ExitCode != 143 {
			t.Errorf("killed with exit code %d, want 143 (SIGTERM first; podtest does not catch it)", term.ExitCode)
		}
		evs, err := c.Client.CoreV1().Events(testNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=liveness"})
		if err != nil {
			t.Fatal(err)
		}
		var reasons []string
		for _, e := range evs.Items {
			reasons = append(reasons, e.Reason)
		}
		if !strings.Contains(strings.Join(reasons, ","), "Unhealthy") || !strings.Contains(strings.Join(reasons, ","), "Killing") {
			t.Errorf("events %v lack Unhealthy and Killing", reasons)
		}
	})

	t.Run("crash-loop", func(t *testing.T) {
		p := eventuallyPod(t, c, "crash", 30*time.Second, "in CrashLoopBackOff", func(p *corev1.Pod) (bool, string) {
			w := waiting(p)
			return w != nil && w.Reason == "CrashLoopBackOff" && p.Status.ContainerStatuses[0].RestartCount >= 1, fmt.Sprintf("%+v", w)
		})
		s := p.Status.ContainerStatuses[0]
		term := s.LastTerminationState.Terminated
		if term == nil || term.ExitCode != 3 || term.Reason != "Error" {
			t.Fatalf("lastState %+v, want terminated with exit code 3 (Error)", s.LastTerminationState)
		}
		if !strings.HasPrefix(term.Message, "line 21\n") || !strings.HasSuffix(term.Message, "line 100\n") || len(term.Message) > 2048 {
			t.Errorf("termination message (the last 80 lines of the log) = %q", term.Message)
		}
		if p.Status.Phase != corev1.PodRunning || podReady(p) {
			t.Errorf("a crash-looping Pod is %s, ready %v; want Running, not ready", p.Status.Phase, podReady(p))
		}
		// kubectl logs through the API server and the runner's kubelet API
		// The Pod keeps crash-looping meanwhile: a new instance's log is empty for the moment
		// between its start and its first write, so each read is polled until it shows the
		// expected lines (it must, within a few restarts).
		logsEqual := func(what string, opts *corev1.PodLogOptions, want string) {
			t.Helper()
			if err := wait.Poll(ctx, 10*time.Second, 50*time.Millisecond, what, func(ctx context.Context) (bool, string, error) {
				b, err := c.Client.CoreV1().Pods(testNS).GetLogs("crash", opts).DoRaw(ctx)
				return err == nil && string(b) == want, fmt.Sprintf("%q, %v", b, err), nil
			}); err != nil {
				t.Error(err)
			}
		}
		for _, previous := range []bool{false, true} {
			logsEqual(fmt.Sprintf("logs --tail=2 --previous=%v", previous),
				&corev1.PodLogOptions{TailLines: ptr.To[int64](2), Previous: previous}, "line 99\nline 100\n")
		}
		logsEqual("logs --limit-bytes=7", &corev1.PodLogOptions{LimitBytes: ptr.To[int64](7)}, "line 1\n")
		if _, err := c.Client.CoreV1().Pods(testNS).GetLogs("crash", &corev1.PodLogOptions{Container: "nope"}).DoRaw(ctx); err == nil {
			t.Error("logs of a container the Pod does not have: no error")
		}
	})

	t.Run("termination-message", func(t *testing.T) {
		p := eventuallyPod(t, c, "message", 30*time.Second, "Succeeded", func(p *corev1.Pod) (bool, string) {
			return p.Status.Phase == corev1.PodSucceeded, string(p.Status.Phase)
		})
		term := p.Status.ContainerStatuses[0].State.Terminated
		if term == nil || term.ExitCode != 0 || term.Reason != "Completed" || term.Message != "bye now" {
			t.Errorf("state %+v, want terminated Completed with message %q", p.Status.ContainerStatuses[0].State, "bye now")
		}
		// A finished Pod is deleted for good once marked for deletion.
		if err := c.Client.CoreV1().Pods(testNS).Delete(ctx, "message", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := wait.Poll(ctx, 30*time.Second, 200*time.Millisecond, "pod message deleted for good", func(ctx context.Context) (bool, string, error) {
			_, err := c.Client.CoreV1().Pods(testNS).Get(ctx, "message", metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprint(err), nil
		}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("run-as-non-root", func(t *testing.T) {
		eventuallyPod(t, c, "root", 30*time.Second, "CreateContainerConfigError", func(p *corev1.Pod) (bool, string) {
			w := waiting(p)
			return w != nil && w.Reason == "CreateContainerConfigError" && strings.HasPrefix(w.Message, "container has runAsNonRoot and image will run as root"), fmt.Sprintf("%+v", w)
		})
	})

	t.Run("unmapped-image", func(t *testing.T) {
		eventuallyPod(t, c, "unmapped", 30*time.Second, "ImagePullBackOff", func(p *corev1.Pod) (bool, string) {
			w := waiting(p)
			return w != nil && w.Reason == "ImagePullBackOff" && strings.Contains(w.Message, "not mapped") && p.Status.Phase == corev1.PodPending, fmt.Sprintf("%+v", w)
		})
	})

	t.Run("init-and-two-containers", func(t *testing.T) {
		p := eventuallyPod(t, c, "multi", 30*time.Second, "Ready", func(p *corev1.Pod) (bool, string) { return podReady(p), string(p.Status.Phase) })
		if len(p.Status.InitContainerStatuses) != 2 || p.Status.InitContainerStatuses[0].State.Terminated == nil ||
			p.Status.InitContainerStatuses[0].State.Terminated.Reason != "Completed" || p.Status.InitContainerStatuses[1].State.Running == nil {
			t.Errorf("init container statuses %+v, want the first terminated Completed, the sidecar running", p.Status.InitContainerStatuses)
		}
		// kubectl logs -f: the stream starts with what is there and stays open
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		stream, err := c.Client.CoreV1().Pods(testNS).GetLogs("multi", &corev1.PodLogOptions{Container: "b", Follow: true}).Stream(fctx)
		if err != nil {
			t.Fatalf("logs -f: %v", err)
		}
		line, err := bufio.NewReader(stream).ReadString('\n')
		_ = stream.Close()
		if err != nil || !strings.HasPrefix(line, "report ") {
			t.Errorf("logs -f of container b: first line %q, %v", line, err)
		}
		for _, port := range []string{"8080", "8081", "8082"} {
			resp, err := http.Get("http://" + p.Status.PodIP + ":" + port + "/readyz")
			if err != nil {
				t.Errorf("container on port %s: %v", port, err)
				continue
			}
			_ = resp.Body.Close()
		}
	})

	t.Run("active-deadline", func(t *testing.T) {
		eventuallyPod(t, c, "deadline", 30*time.Second, "Ready", func(p *corev1.Pod) (bool, string) { return podReady(p), string(p.Status.Phase) })
		if _, err := c.Client.CoreV1().Pods(testNS).Patch(ctx, "deadline", types.StrategicMergePatchType,
			[]byte(`{"spec":{"activeDeadlineSeconds":1}}`), metav1.PatchOptions{}); err != nil {
			t.Fatalf("setting the running Pod's deadline: %v", err)
		}
		// The phase turns Failed when the deadline passes; the container's own status follows once
		// it has stopped, so wait for both.
		p := eventuallyPod(t, c, "deadline", 30*time.Second, "Failed with DeadlineExceeded, the container stopped", func(p *corev1.Pod) (bool, string) {
			stopped := len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Terminated != nil
			return p.Status.Phase == corev1.PodFailed && p.Status.Reason == "DeadlineExceeded" && stopped,
				fmt.Sprintf("%s %s stopped=%v", p.Status.Phase, p.Status.Reason, stopped)
		})
		// SIGTERM, then the grace period (30 s by default) in which podtest exits 42 after 1 s
		if s := p.Status.ContainerStatuses[0]; s.State.Terminated == nil || s.Ready || s.State.Terminated.ExitCode != 42 {
			t.Errorf("container after the deadline: %+v, want stopped by SIGTERM with a grace period (exit 42), not ready", s)
		}
	})

	t.Run("deployment", func(t *testing.T) {
		err := wait.Poll(ctx, 30*time.Second, 200*time.Millisecond, "Deployment pause available", func(ctx context.Context) (bool, string, error) {
			d, err := c.Client.AppsV1().Deployments(testNS).Get(ctx, "pause", metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			return d.Status.AvailableReplicas == 2, fmt.Sprintf("available %d", d.Status.AvailableReplicas), nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("delete", func(t *testing.T) {
		before, ok := c.Runner.Process(testNS, "secure")
		if !ok || before.Pid == 0 {
			t.Fatalf("no process for secure: %+v", before)
		}
		if err := c.Client.CoreV1().Pods(testNS).Delete(ctx, "secure", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		err := wait.Poll(ctx, 30*time.Second, 200*time.Millisecond, "pod secure deleted for good", func(ctx context.Context) (bool, string, error) {
			_, err := c.Client.CoreV1().Pods(testNS).Get(ctx, "secure", metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprint(err), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", before.Pid)); err == nil {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", before.Pid)); strings.Contains(string(b), "podtest") {
				t.Errorf("the deleted Pod's process %d still runs", before.Pid)
			}
		}
	})
}

func containsInt(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
