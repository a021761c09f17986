package containerworker

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/renderqueue/renderqueue/test/e2e/cluster/wait"
)

type probeKind string

const (
	probeStartup   probeKind = "Startup"
	probeReadiness probeKind = "Readiness"
	probeLiveness  probeKind = "Liveness"
)

// startProbes starts the container instance's probes (started at start), as kubelet's probe
// workers run them: one every periodSeconds (the first one period after the container started,
// none before initialDelaySeconds), each with timeoutSeconds; successThreshold consecutive
// successes and failureThreshold consecutive failures flip the result. Readiness and liveness
// wait for the startup probe to succeed. A failed liveness probe, or a startup probe that
// failed failureThreshold times, asks for the container to be killed (and restarted per the
// restart policy).
func (c *Worker) startProbes(ctx context.Context, wg *sync.WaitGroup, start time.Time) {
	for _, p := range []struct {
		kind  probeKind
		probe *corev1.Probe
	}{{probeStartup, c.spec.StartupProbe}, {probeReadiness, c.spec.ReadinessProbe}, {probeLiveness, c.spec.LivenessProbe}} {
		if p.probe == nil {
			if p.kind == probeReadiness {
				// no readiness probe: ready once started
				wg.Add(1)
				go func() {
					defer wg.Done()
					c.readyWhenStarted(ctx)
				}()
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.probeLoop(ctx, p.kind, p.probe, start)
		}()
	}
}

// readyWhenStarted makes a container without a readiness probe ready once it has started.
func (c *Worker) readyWhenStarted(ctx context.Context) {
	for {
		c.mu.Lock()
		started := c.started
		if started {
			c.ready = true
		}
		c.mu.Unlock()
		if started {
			c.pod.StatusChanged()
			return
		}
		if !wait.Sleep(ctx, 100*time.Millisecond, nil) {
			return
		}
	}
}

func (c *Worker) probeLoop(ctx context.Context, kind probeKind, p *corev1.Probe, start time.Time) {
	period := time.Duration(max(p.PeriodSeconds, 1)) * time.Second
	success, failure := int(max(p.SuccessThreshold, 1)), int(max(p.FailureThreshold, 1))
	initialDelay := time.Duration(p.InitialDelaySeconds) * time.Second
	t := time.NewTicker(period)
	defer t.Stop()
	successes, failures := 0, 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if time.Since(start) < initialDelay {
			continue
		}
		c.mu.Lock()
		started := c.started
		c.mu.Unlock()
		if kind == probeStartup && started {
			return
		}
		if kind != probeStartup && !started {
			continue
		}
		ok, out := c.probeOnce(ctx, kind, p)
		if ctx.Err() != nil {
			return
		}
		if ok {
			successes, failures = successes+1, 0
		} else {
			successes, failures = 0, failures+1
			c.event(corev1.EventTypeWarning, "Unhealthy", "%s probe failed: %s", kind, out)
		}
		switch kind {
		case probeStartup:
			if ok {
				c.mu.Lock()
				c.started = true
				c.mu.Unlock()
				c.pod.StatusChanged()
				return
			}
			if failures >= failure {
				c.askKill("failed startup probe", p)
				return
			}
		case probeReadiness:
			c.mu.Lock()
			changed := false
			if ok && successes >= success && !c.ready {
				c.ready, changed = true, true
			} else if !ok && failures >= failure && c.ready {
				c.ready, changed = false, true
			}
			c.mu.Unlock()
			if changed {
				c.pod.StatusChanged()
			}
		case probeLiveness:
			if failures >= failure {
				c.askKill("failed liveness probe", p)
				return
			}
		}
	}
}

func (c *Worker) askKill(why string, p *corev1.Probe) {
	select {
	case c.killCh <- killRequest{why: why, probe: p}:
	default:
	}
}

// probeOnce runs one probe: httpGet (http or https, without certificate verification, as
// kubelet) or tcpSocket. exec and grpc probes are not honoured: they count as successes (noted
// once per Pod).
func (c *Worker) probeOnce(ctx context.Context, kind probeKind, p *corev1.Probe) (bool, string) {
	timeout := time.Duration(max(p.TimeoutSeconds, 1)) * time.Second
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	podIP := c.pod.IP()
	switch {
	case p.HTTPGet != nil:
		g := p.HTTPGet
		port, err := c.probePort(g.Port)
		if err != nil {
			return false, err.Error()
		}
		host := g.Host
		if host == "" {
			host = podIP
		}
		scheme := strings.ToLower(string(g.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		u := &url.URL{Scheme: scheme, Host: net.JoinHostPort(host, strconv.Itoa(port))}
		pathQuery := g.Path
		if pathQuery == "" {
			pathQuery = "/"
		}
		ref, err := url.Parse(pathQuery)
		if err != nil {
			return false, err.Error()
		}
		u = u.ResolveReference(ref)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return false, err.Error()
		}
		req.Header.Set("User-Agent", "kube-probe/1.37")
		req.Header.Set("Accept", "*/*")
		for _, h := range g.HTTPHeaders {
			if strings.EqualFold(h.Name, "Host") {
				req.Host = h.Value
				continue
			}
			req.Header.Add(h.Name, h.Value)
		}
		hc := &http.Client{Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // kubelet does not verify probe certificates
			DisableKeepAlives: true,
		}}
		resp, err := hc.Do(req)
		if err != nil {
			return false, fmt.Sprintf("Get %q: %v", u.String(), err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 10*1024))
		if resp.StatusCode >= 200 && resp.StatusCode < 400 {
			return true, ""
		}
		return false, fmt.Sprintf("HTTP probe failed with statuscode: %d (%s)", resp.StatusCode, strings.TrimSpace(string(body)))
	case p.TCPSocket != nil:
		port, err := c.probePort(p.TCPSocket.Port)
		if err != nil {
			return false, err.Error()
		}
		host := p.TCPSocket.Host
		if host == "" {
			host = podIP
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return false, err.Error()
		}
		_ = conn.Close()
		return true, ""
	}
	what := "exec"
	if p.GRPC != nil {
		what = "grpc"
	}
	c.pod.NoteIgnored(fmt.Sprintf("probe:%s:%s", c.spec.Name, kind), "container %s: %s %s probe not honoured: counted as succeeding", c.spec.Name, kind, what)
	return true, ""
}

// probePort resolves a probe's port: a number, or the name of a container port.
func (c *Worker) probePort(p intstr.IntOrString) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	for _, cp := range c.spec.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("port %q not found in the container's ports", p.StrVal)
}
