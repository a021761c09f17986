package podworker

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// noteIgnored logs (and records as an event of the Pod) that something of the Pod is not
// honoured, once per key.
func (w *Worker) noteIgnored(key, format string, args ...any) {
	w.mu.Lock()
	seen := w.ignored[key]
	w.ignored[key] = true
	pod := w.pod
	w.mu.Unlock()
	if seen {
		return
	}
	msg := fmt.Sprintf(format, args...)
	w.logf("not honoured: %s", msg)
	w.node.Recorder.Eventf(pod, corev1.EventTypeNormal, "LocalRunner", "Not honoured by the local pod runner: %s", msg)
}

// logIgnored notes every field the Pod sets that the runner does not honour.
func (w *Worker) logIgnored(pod *corev1.Pod) {
	s := pod.Spec
	var out []string
	if s.DNSConfig != nil || (s.DNSPolicy != "" && s.DNSPolicy != corev1.DNSClusterFirst) {
		out = append(out, "dnsPolicy/dnsConfig")
	}
	if s.HostUsers != nil && !*s.HostUsers {
		out = append(out, "hostUsers: false (no user namespace)")
	}
	if s.RuntimeClassName != nil {
		out = append(out, "runtimeClassName")
	}
	if s.OS != nil && s.OS.Name != corev1.Linux {
		out = append(out, fmt.Sprintf("os %s (runs on linux)", s.OS.Name))
	}
	if len(s.ResourceClaims) > 0 {
		out = append(out, "resourceClaims")
	}
	if s.Resources != nil {
		out = append(out, "resources (Pod-level)")
	}
	if psc := s.SecurityContext; psc != nil {
		if len(psc.Sysctls) > 0 {
			out = append(out, "securityContext.sysctls")
		}
		if psc.SeccompProfile != nil {
			out = append(out, "securityContext.seccompProfile")
		}
		if psc.AppArmorProfile != nil {
			out = append(out, "securityContext.appArmorProfile")
		}
		if psc.SELinuxOptions != nil || psc.SELinuxChangePolicy != nil {
			out = append(out, "securityContext.seLinuxOptions")
		}
		if psc.WindowsOptions != nil {
			out = append(out, "securityContext.windowsOptions")
		}
	}
	all := append(append([]corev1.Container{}, s.InitContainers...), s.Containers...)
	for _, c := range all {
		var cs []string
		if len(c.Resources.Requests) > 0 || len(c.Resources.Limits) > 0 {
			cs = append(cs, "resources")
		}
		if c.Lifecycle != nil && c.Lifecycle.PostStart != nil {
			cs = append(cs, "lifecycle.postStart")
		}
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
			cs = append(cs, "lifecycle.preStop")
		}
		if c.Lifecycle != nil && c.Lifecycle.StopSignal != nil {
			cs = append(cs, "lifecycle.stopSignal (SIGTERM is sent)")
		}
		if c.Stdin || c.TTY {
			cs = append(cs, "stdin/tty")
		}
		for _, p := range c.Ports {
			if p.HostPort != 0 || p.HostIP != "" {
				cs = append(cs, "ports[].hostPort")
				break
			}
		}
		if len(c.RestartPolicyRules) > 0 {
			cs = append(cs, "restartPolicyRules")
		}
		if len(c.VolumeDevices) > 0 {
			cs = append(cs, "volumeDevices")
		}
		if len(c.ResizePolicy) > 0 {
			cs = append(cs, "resizePolicy")
		}
		if sc := c.SecurityContext; sc != nil {
			if sc.SeccompProfile != nil {
				cs = append(cs, "securityContext.seccompProfile")
			}
			if sc.AppArmorProfile != nil {
				cs = append(cs, "securityContext.appArmorProfile")
			}
			if sc.SELinuxOptions != nil {
				cs = append(cs, "securityContext.seLinuxOptions")
			}
			if sc.ProcMount != nil && *sc.ProcMount != corev1.DefaultProcMount {
				cs = append(cs, "securityContext.procMount")
			}
			if sc.Privileged != nil && *sc.Privileged {
				cs = append(cs, "privileged (every capability is kept, but no host devices)")
			}
		}
		if len(cs) > 0 {
			out = append(out, fmt.Sprintf("container %s: %s", c.Name, strings.Join(cs, ", ")))
		}
	}
	if len(out) > 0 {
		w.noteIgnored("pod", "%s", strings.Join(out, "; "))
	}
}
