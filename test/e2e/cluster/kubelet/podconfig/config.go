package podconfig

import (
	"fmt"
	"net"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/runtime"
)

// ConfigError is a container that cannot be configured yet (kubelet's
// CreateContainerConfigError: a missing Secret, ConfigMap or key; runAsNonRoot with a root user):
// the container waits with Reason and Message, and is tried again later.
type ConfigError struct{ Reason, Message string }

func (e *ConfigError) Error() string { return e.Reason + ": " + e.Message }

func configErrorf(format string, args ...any) error {
	return &ConfigError{Reason: "CreateContainerConfigError", Message: fmt.Sprintf(format, args...)}
}

// defaultCaps is the capability set container runtimes give a container (containerd's and
// CRI-O's default), as setpriv names them.
var defaultCaps = []string{"chown", "dac_override", "fsetid", "fowner", "mknod", "net_raw", "setgid", "setuid",
	"setfcap", "setpcap", "net_bind_service", "sys_chroot", "kill", "audit_write"}

// knownCaps are the Linux capabilities setpriv knows.
var knownCaps = map[string]bool{}

func init() {
	for _, c := range strings.Fields(`chown dac_override dac_read_search fowner fsetid kill setgid setuid setpcap
		linux_immutable net_bind_service net_broadcast net_admin net_raw ipc_lock ipc_owner sys_module sys_rawio
		sys_chroot sys_ptrace sys_pacct sys_admin sys_boot sys_nice sys_resource sys_time sys_tty_config mknod
		lease audit_write audit_control setfcap mac_override mac_admin syslog wake_alarm block_suspend audit_read
		perfmon bpf checkpoint_restore`) {
		knownCaps[c] = true
	}
}

// capName turns a Kubernetes capability ("NET_ADMIN", "CAP_NET_ADMIN") into setpriv's name.
func capName(c corev1.Capability) string {
	return strings.TrimPrefix(strings.ToLower(string(c)), "cap_")
}

// boundingSet is setpriv's --bounding-set for the runtime default set with the container's add
// and drop applied as containerd applies them: "ALL" in add, then "ALL" in drop, then the other
// adds, then the other drops. "" for privileged (every capability).
func boundingSet(caps *corev1.Capabilities, privileged bool) (string, error) {
	if privileged {
		return "", nil
	}
	set := map[string]bool{}
	for _, c := range defaultCaps {
		set[c] = true
	}
	if caps != nil {
		has := func(list []corev1.Capability) bool {
			for _, c := range list {
				if capName(c) == "all" {
					return true
				}
			}
			return false
		}
		if has(caps.Add) {
			for k := range knownCaps {
				set[k] = true
			}
		}
		if has(caps.Drop) {
			set = map[string]bool{}
		}
		for _, c := range caps.Add {
			n := capName(c)
			if n == "all" {
				continue
			}
			if !knownCaps[n] {
				return "", fmt.Errorf("unknown capability %q to add", c)
			}
			set[n] = true
		}
		for _, c := range caps.Drop {
			delete(set, capName(c))
		}
	}
	names := make([]string, 0, len(set))
	for k := range set {
		names = append(names, "+"+k)
	}
	sort.Strings(names)
	return strings.Join(append([]string{"-all"}, names...), ","), nil
}

// Container resolves everything an instance of the container spec of pod (its latest version),
// whose IP is podIP, starts with from the image img: argv, environment, user and groups,
// capabilities, mounts (the volumes', the image's program, the hosts files of WriteHosts). A
// *ConfigError means it cannot start yet.
func (pc *Pod) Container(pod *corev1.Pod, podIP string, spec corev1.Container, img runtime.Image) (*runtime.ContainerConfig, error) {

	// Security context: the container's over the Pod's.
	psc := pod.Spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	sc := spec.SecurityContext
	if sc == nil {
		sc = &corev1.SecurityContext{}
	}
	uid, gid := img.UID, img.GID
	if psc.RunAsUser != nil {
		uid = *psc.RunAsUser
	}
	if sc.RunAsUser != nil {
		uid = *sc.RunAsUser
	}
	if psc.RunAsGroup != nil {
		gid = *psc.RunAsGroup
	}
	if sc.RunAsGroup != nil {
		gid = *sc.RunAsGroup
	}
	nonRoot := psc.RunAsNonRoot
	if sc.RunAsNonRoot != nil {
		nonRoot = sc.RunAsNonRoot
	}
	if nonRoot != nil && *nonRoot && uid == 0 {
		return nil, configErrorf("container has runAsNonRoot and image will run as root (pod: %q, container: %s)", fmt.Sprintf("%s_%s(%s)", pod.Name, pod.Namespace, pod.UID), spec.Name)
	}
	groups := []int64{gid}
	if psc.FSGroup != nil {
		groups = append(groups, *psc.FSGroup)
	}
	groups = append(groups, psc.SupplementalGroups...)
	groups = dedupe(groups)
	privileged := sc.Privileged != nil && *sc.Privileged
	bounding, err := boundingSet(sc.Capabilities, privileged)
	if err != nil {
		return nil, err
	}

	// Environment.
	env, err := pc.containerEnv(pod, spec, img, podIP)
	if err != nil {
		return nil, err
	}
	defined := map[string]string{}
	for _, kv := range env.k8s {
		k, v, _ := strings.Cut(kv, "=")
		defined[k] = v
	}

	// argv: $(VAR) expansion, then listen addresses on all interfaces moved to the Pod IP.
	command := make([]string, len(spec.Command))
	for i, a := range spec.Command {
		command[i] = expandVars(a, defined)
	}
	args := make([]string, len(spec.Args))
	for i, a := range spec.Args {
		args[i] = expandVars(a, defined)
	}
	argv, err := runtime.ResolveArgv(img, command, args)
	if err != nil {
		return nil, err
	}
	if !pod.Spec.HostNetwork {
		var rewritten []string
		for i := 1; i < len(argv); i++ {
			if a := rewriteListen(argv[i], podIP); a != argv[i] {
				rewritten = append(rewritten, argv[i]+" → "+a)
				argv[i] = a
			}
		}
		if len(rewritten) > 0 {
			pc.ignored("listen:"+spec.Name, "container %s: no network namespace per Pod: listen addresses on all interfaces in its args moved to the Pod IP: %s",
				spec.Name, strings.Join(rewritten, ", "))
		}
	}

	// Mounts.
	mounts, err := pc.containerMounts(pod, spec, defined)
	if err != nil {
		return nil, err
	}
	mounts = append(mounts, runtime.BindMount{Src: img.Binary, Dst: img.Entrypoint[0], File: true, Mode: runtime.ReadOnlyExec})
	if !pod.Spec.HostNetwork {
		mounted := map[string]bool{}
		for _, m := range mounts {
			mounted[m.Dst] = true
		}
		for _, f := range [][2]string{{hostsFileName, "/etc/hosts"}, {hostnameFileName, "/etc/hostname"}} {
			if !mounted[f[1]] {
				mounts = append(mounts, runtime.BindMount{Src: filepath.Join(pc.dir, f[0]), Dst: f[1], File: true, Mode: runtime.ReadWrite})
			}
		}
	}

	workdir := spec.WorkingDir
	if workdir == "" {
		workdir = img.WorkingDir
	}
	if workdir == "" {
		workdir = "/"
	}
	return &runtime.ContainerConfig{
		Argv: argv, Binary: img.Binary, BinaryArgs: img.BinaryArgs, Env: env.all,
		UID: uid, GID: gid, Groups: groups,
		NoNewPrivs:   sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation,
		Bounding:     bounding,
		ReadOnlyRoot: sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem,
		HostIPC:      pod.Spec.HostIPC,
		Hostname:     podHostname(pod),
		WorkingDir:   path.Clean("/" + workdir),
		Mounts:       mounts,
	}, nil
}

func dedupe(xs []int64) []int64 {
	seen := map[int64]bool{}
	out := xs[:0:0]
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// containerEnvironment is a container's environment: all (image ENV, HOSTNAME, HOME, the
// kubernetes Service variables, envFrom, env; later names win) and k8s (the part Kubernetes
// defines, which $(VAR) in command and args refers to).
type containerEnvironment struct {
	all []string
	k8s []string
}

// orderedEnv is an environment in first-definition order where a later value replaces an
// earlier one.
type orderedEnv struct {
	names []string
	vals  map[string]string
}

func (e *orderedEnv) set(k, v string) {
	if e.vals == nil {
		e.vals = map[string]string{}
	}
	if _, ok := e.vals[k]; !ok {
		e.names = append(e.names, k)
	}
	e.vals[k] = v
}

func (e *orderedEnv) list() []string {
	out := make([]string, 0, len(e.names))
	for _, k := range e.names {
		out = append(out, k+"="+e.vals[k])
	}
	return out
}

// containerEnv resolves a container's environment as kubelet does: the service variables of the
// kubernetes Service (pointing at the real API server: there is no kube-proxy), envFrom (Secrets
// and ConfigMaps, with prefix), env (values with $(VAR) expansion, secretKeyRef,
// configMapKeyRef, fieldRef); on top of the image's ENV, HOSTNAME and HOME=/.
func (pc *Pod) containerEnv(pod *corev1.Pod, spec corev1.Container, img runtime.Image, podIP string) (containerEnvironment, error) {
	var k8s orderedEnv
	host, port := pc.src.APIHost, pc.src.APIPort
	hostPort := net.JoinHostPort(host, port)
	for _, kv := range [][2]string{
		{"KUBERNETES_SERVICE_HOST", host}, {"KUBERNETES_SERVICE_PORT", port}, {"KUBERNETES_SERVICE_PORT_HTTPS", port},
		{"KUBERNETES_PORT", "tcp://" + hostPort}, {"KUBERNETES_PORT_" + port + "_TCP", "tcp://" + hostPort},
		{"KUBERNETES_PORT_" + port + "_TCP_PROTO", "tcp"}, {"KUBERNETES_PORT_" + port + "_TCP_PORT", port},
		{"KUBERNETES_PORT_" + port + "_TCP_ADDR", host},
	} {
		k8s.set(kv[0], kv[1])
	}
	for _, ef := range spec.EnvFrom {
		data, err := pc.envFromData(ef)
		if err != nil {
			return containerEnvironment{}, err
		}
		keys := make([]string, 0, len(data))
		for k := range data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var invalid []string
		for _, k := range keys {
			name := ef.Prefix + k
			if !validEnvName(name) {
				invalid = append(invalid, name)
				continue
			}
			k8s.set(name, data[k])
		}
		if len(invalid) > 0 {
			pc.src.Recorder.Eventf(pod, corev1.EventTypeWarning, "InvalidEnvironmentVariableNames",
				"Keys [%s] from the EnvFrom configMap/secret were skipped since they are invalid environment variable names.", strings.Join(invalid, ", "))
		}
	}
	for _, e := range spec.Env {
		v, ok, err := pc.envValue(pod, spec, e, k8s.vals, podIP)
		if err != nil {
			return containerEnvironment{}, err
		}
		if ok {
			k8s.set(e.Name, v)
		}
	}
	var all orderedEnv
	for _, kv := range img.Env {
		k, v, _ := strings.Cut(kv, "=")
		all.set(k, v)
	}
	all.set("HOSTNAME", podHostname(pod))
	if _, ok := all.vals["HOME"]; !ok {
		all.set("HOME", "/")
	}
	for _, k := range k8s.names {
		all.set(k, k8s.vals[k])
	}
	return containerEnvironment{all: all.list(), k8s: k8s.list()}, nil
}

// validEnvName: any printable ASCII but '=' (RelaxedEnvironmentVariableValidation, GA).
func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < ' ' || r > '~' || r == '=' {
			return false
		}
	}
	return true
}

// secretData reads a Secret of the Pod's namespace from the cache.
func (pc *Pod) secretData(name string) (map[string][]byte, error) {
	s, err := pc.src.Secrets.Secrets(pc.namespace).Get(name)
	if err != nil {
		return nil, err
	}
	return s.Data, nil
}

// configMapData reads a ConfigMap (data and binaryData) of the Pod's namespace from the cache.
func (pc *Pod) configMapData(name string) (map[string][]byte, error) {
	cm, err := pc.src.ConfigMaps.ConfigMaps(pc.namespace).Get(name)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]byte, len(cm.Data)+len(cm.BinaryData))
	for k, v := range cm.Data {
		out[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		out[k] = v
	}
	return out, nil
}

// envFromData reads the Secret or ConfigMap of an envFrom entry.
func (pc *Pod) envFromData(ef corev1.EnvFromSource) (map[string]string, error) {
	out := map[string]string{}
	var data map[string][]byte
	var err error
	var what, name string
	var optional bool
	switch {
	case ef.SecretRef != nil:
		what, name, optional = "secret", ef.SecretRef.Name, ef.SecretRef.Optional != nil && *ef.SecretRef.Optional
		data, err = pc.secretData(name)
	case ef.ConfigMapRef != nil:
		what, name, optional = "configmap", ef.ConfigMapRef.Name, ef.ConfigMapRef.Optional != nil && *ef.ConfigMapRef.Optional
		data, err = pc.configMapData(name)
	default:
		return out, nil
	}
	if apierrors.IsNotFound(err) {
		if optional {
			return out, nil
		}
		return nil, configErrorf("%s %q not found", what, name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s %s/%s: %w", what, pc.namespace, name, err)
	}
	for k, v := range data {
		out[k] = string(v)
	}
	return out, nil
}

// envValue resolves one env var (ok = false for an optional reference that is missing, or a
// source the runner does not honour).
func (pc *Pod) envValue(pod *corev1.Pod, spec corev1.Container, e corev1.EnvVar, defined map[string]string, podIP string) (string, bool, error) {
	if e.ValueFrom == nil {
		return expandVars(e.Value, defined), true, nil
	}
	vf := e.ValueFrom
	keyRef := func(what, kind, name, key string, optional bool, read func(string) (map[string][]byte, error)) (string, bool, error) {
		data, err := read(name)
		if apierrors.IsNotFound(err) {
			if optional {
				return "", false, nil
			}
			return "", false, configErrorf("%s %q not found", what, name)
		}
		if err != nil {
			return "", false, fmt.Errorf("reading %s %s/%s: %w", what, pc.namespace, name, err)
		}
		v, ok := data[key]
		if !ok {
			if optional {
				return "", false, nil
			}
			return "", false, configErrorf("couldn't find key %s in %s %s/%s", key, kind, pc.namespace, name)
		}
		return string(v), true, nil
	}
	switch {
	case vf.SecretKeyRef != nil:
		r := vf.SecretKeyRef
		return keyRef("secret", "Secret", r.Name, r.Key, r.Optional != nil && *r.Optional, pc.secretData)
	case vf.ConfigMapKeyRef != nil:
		r := vf.ConfigMapKeyRef
		return keyRef("configmap", "ConfigMap", r.Name, r.Key, r.Optional != nil && *r.Optional, pc.configMapData)
	case vf.FieldRef != nil:
		v, err := podFieldValue(pod, vf.FieldRef.FieldPath, podIP)
		if err != nil {
			return "", false, configErrorf("env %s: %v", e.Name, err)
		}
		return v, true, nil
	case vf.ResourceFieldRef != nil:
		pc.ignored("resourceFieldRef:"+spec.Name+":"+e.Name, "container %s: env %s: resourceFieldRef not honoured (no resource accounting): left unset", spec.Name, e.Name)
		return "", false, nil
	}
	pc.ignored("valueFrom:"+spec.Name+":"+e.Name, "container %s: env %s: this kind of valueFrom is not honoured: left unset", spec.Name, e.Name)
	return "", false, nil
}

// podFieldValue is a downward API field of the Pod.
func podFieldValue(pod *corev1.Pod, fieldPath, podIP string) (string, error) {
	switch fieldPath {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return runtime.NodeIP, nil
	case "status.podIP", "status.podIPs":
		return podIP, nil
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels": pod.Labels, "metadata.annotations": pod.Annotations} {
		if rest, ok := strings.CutPrefix(fieldPath, prefix+"["); ok && strings.HasSuffix(rest, "]") {
			key, err := strconv.Unquote(strings.Replace(strings.TrimSuffix(rest, "]"), "'", `"`, 2))
			if err != nil {
				return "", fmt.Errorf("fieldRef %s: %w", fieldPath, err)
			}
			return m[key], nil
		}
	}
	return "", fmt.Errorf("fieldRef %s is not supported", fieldPath)
}

// formatMap is the downward API's format of labels and annotations: key="value" lines, sorted.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	lines := make([]string, 0, len(keys))
	for _, k := range keys {
		lines = append(lines, fmt.Sprintf("%s=%q", k, m[k]))
	}
	return strings.Join(lines, "\n")
}

// containerMounts are the bind mounts of a container's volumeMounts (subPath and subPathExpr
// included): secret, configMap, downwardAPI and projected volumes are always read-only, as
// kubelet mounts them.
func (pc *Pod) containerMounts(pod *corev1.Pod, spec corev1.Container, defined map[string]string) ([]runtime.BindMount, error) {
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	var out []runtime.BindMount
	for _, m := range spec.VolumeMounts {
		v, ok := vols[m.Name]
		if !ok {
			return nil, configErrorf("cannot find volume %q to mount into container %q", m.Name, spec.Name)
		}
		src, err := pc.volumeSource(v)
		if err != nil {
			return nil, err
		}
		sub := m.SubPath
		if m.SubPathExpr != "" {
			sub = expandVars(m.SubPathExpr, defined)
		}
		file := false
		if sub != "" {
			clean := path.Clean("/" + sub)
			if strings.Contains(sub, "..") || path.IsAbs(sub) {
				return nil, configErrorf("failed to prepare subPath for volumeMount %q of container %q: %q escapes the volume", m.Name, spec.Name, sub)
			}
			src = filepath.Join(src, clean)
			if file, err = prepareSubPath(src, v); err != nil {
				return nil, configErrorf("failed to prepare subPath for volumeMount %q of container %q: %v", m.Name, spec.Name, err)
			}
		} else if v.HostPath != nil {
			file = isFile(src)
		}
		mode := runtime.ReadWrite
		if m.ReadOnly || v.Secret != nil || v.ConfigMap != nil || v.DownwardAPI != nil || v.Projected != nil {
			mode = runtime.ReadOnly
		}
		if m.MountPropagation != nil && *m.MountPropagation != corev1.MountPropagationNone {
			pc.ignored("propagation:"+spec.Name+":"+m.MountPath, "container %s: mountPropagation %s of %s not honoured (private)", spec.Name, *m.MountPropagation, m.MountPath)
		}
		out = append(out, runtime.BindMount{Src: src, Dst: path.Clean("/" + m.MountPath), File: file, Mode: mode})
	}
	return out, nil
}

// rewriteListen turns a listen address on all interfaces (":PORT", "0.0.0.0:PORT"), alone or as
// a flag's "=value", into one on ip.
func rewriteListen(arg, ip string) string {
	prefix, val := "", arg
	if strings.HasPrefix(arg, "-") {
		i := strings.IndexByte(arg, '=')
		if i < 0 {
			return arg
		}
		prefix, val = arg[:i+1], arg[i+1:]
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

// expandVars expands $(NAME) references to defined variables, as kubelet does in command, args
// and env values: undefined references stay as they are, and $$ escapes a dollar.
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
