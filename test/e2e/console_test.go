//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/renderqueue/renderqueue/pkg/console/browsertest"
)

// The console in the end-to-end test: config/console (a kustomize Component) turns the operator's
// web console on at :8090 with a bearer token from the Secret renderqueue-console-token.
const (
	consoleSecret  = "renderqueue-console-token"
	consoleService = "renderqueue-console"
	consolePort    = 8090
)

// consoleOverlay writes, into a new temporary directory, a kustomization of config/default with
// the config/console component, and returns the directory: what `kubectl apply -k` takes to
// install the operator with its console. (Paths are relative: kustomize refuses absolute ones.)
func consoleOverlay(t *testing.T, root string) string {
	t.Helper()
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, filepath.Join(root, "config"))
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s/default\ncomponents:\n  - %s/console\n",
		filepath.ToSlash(rel), filepath.ToSlash(rel))
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestKustomizeConsole renders config/default with the config/console component and checks that
// it turns the console on with a token, mounts the Secret where --console-token-file points, and
// puts a Service in front of the operator's console port — and that config/default alone leaves
// the console off.
func TestKustomizeConsole(t *testing.T) {
	kubectl := filepath.Join(assets(t), "kubectl")
	root := repoRoot(t)
	operatorArgs := func(objs []*unstructured.Unstructured) (corev1.PodSpec, bool) {
		for _, o := range objs {
			if o.GetKind() == "Deployment" && o.GetName() == "renderqueue-operator" {
				var d struct {
					Spec struct{ Template struct{ Spec corev1.PodSpec } }
				}
				b, _ := json.Marshal(o.Object)
				if err := json.Unmarshal(b, &d); err != nil {
					t.Fatal(err)
				}
				return d.Spec.Template.Spec, true
			}
		}
		return corev1.PodSpec{}, false
	}
	plain, ok := operatorArgs(kustomizeObjects(t, kubectl, filepath.Join(root, "config", "default")))
	if !ok {
		t.Fatal("config/default has no operator Deployment")
	}
	if slices.Contains(plain.Containers[0].Args, "--console") {
		t.Errorf("config/default turns the console on; it must be off by default: %q", plain.Containers[0].Args)
	}

	objs := kustomizeObjects(t, kubectl, consoleOverlay(t, root))
	spec, ok := operatorArgs(objs)
	if !ok {
		t.Fatal("the console overlay has no operator Deployment")
	}
	c := spec.Containers[0]
	for _, want := range []string{"--console", "--console-bind-address=:8090", "--console-token-file=/var/run/renderqueue-console/token", "--metrics-api"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("operator args %q lack %s", c.Args, want)
		}
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.MountPath == "/var/run/renderqueue-console" && m.ReadOnly {
			for _, v := range spec.Volumes {
				if v.Name == m.Name && v.Secret != nil && v.Secret.SecretName == consoleSecret {
					mounted = true
				}
			}
		}
	}
	if !mounted {
		t.Errorf("the Secret %s is not mounted read-only at /var/run/renderqueue-console: mounts %+v, volumes %+v", consoleSecret, c.VolumeMounts, spec.Volumes)
	}
	hasPort := false
	for _, p := range c.Ports {
		hasPort = hasPort || (p.Name == "console" && p.ContainerPort == consolePort)
	}
	if !hasPort {
		t.Errorf("the operator container has no port named console (%d): %+v", consolePort, c.Ports)
	}
	var svc *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Service" && o.GetName() == consoleService {
			svc = o
		}
	}
	if svc == nil || svc.GetNamespace() != operatorNS {
		t.Fatalf("no Service %s in %s", consoleService, operatorNS)
	}
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	if len(ports) != 1 || ports[0].(map[string]any)["targetPort"] != "console" {
		t.Errorf("Service %s ports = %v, want one targeting the port named console", consoleService, ports)
	}
}

// ensureConsoleToken creates the console's token Secret unless it exists, and returns the token.
func (e *env) ensureConsoleToken(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := e.c.Client.CoreV1().Secrets(operatorNS).Get(ctx, consoleSecret, metav1.GetOptions{})
	if err == nil {
		return strings.TrimSpace(string(s.Data["token"]))
	}
	if !apierrors.IsNotFound(err) {
		t.Fatalf("reading Secret %s: %v", consoleSecret, err)
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	token := hex.EncodeToString(b)
	_, err = e.c.Client.CoreV1().Secrets(operatorNS).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: consoleSecret, Namespace: operatorNS},
		StringData: map[string]string{"token": token},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Secret %s: %v", consoleSecret, err)
	}
	return token
}

// enableConsole creates the token Secret and applies config/default with config/console, unless
// the operator Deployment already runs with --console (the install step may do both itself).
// Returns the token.
func (e *env) enableConsole(t *testing.T) string {
	t.Helper()
	token := e.ensureConsoleToken(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := e.c.Client.AppsV1().Deployments(operatorNS).Get(ctx, "renderqueue-operator", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading the operator Deployment: %v", err)
	}
	if !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--console") {
		out := e.kubectl("apply", "--server-side", "-k", consoleOverlay(t, e.root))
		t.Logf("kubectl apply -k (config/default + config/console):\n%s", out)
	}
	return token
}

// consoleURL waits for a Running, Ready operator Pod whose spec turns the console on and returns
// the console's base URL at the Pod's IP. The e2e's runner (playing kubelet) must run the
// operator's Pods for this: with the operator as a local process (Deployment scaled to 0) there
// is no such Pod, and the step says so.
func (e *env) consoleURL(t *testing.T) string {
	t.Helper()
	var base string
	e.eventually(t, 3*time.Minute, time.Second, "a Ready operator Pod serving the console", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d, err := e.c.Client.AppsV1().Deployments(operatorNS).Get(ctx, "renderqueue-operator", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if d.Spec.Replicas != nil && *d.Spec.Replicas == 0 {
			return false, "the operator Deployment has 0 replicas (the operator runs as a local process?): the console step needs the operator as the Deployment's Pod, run by the e2e's runner"
		}
		pods, err := e.c.Client.CoreV1().Pods(operatorNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=operator"})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, p := range pods.Items {
			ready := false
			for _, c := range p.Status.Conditions {
				ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
			}
			on := len(p.Spec.Containers) > 0 && slices.Contains(p.Spec.Containers[0].Args, "--console")
			seen = append(seen, fmt.Sprintf("%s(phase %s, ready %v, ip %q, console %v, deleting %v)", p.Name, p.Status.Phase, ready, p.Status.PodIP, on, p.DeletionTimestamp != nil))
			if ready && on && p.DeletionTimestamp == nil && p.Status.PodIP != "" {
				base = fmt.Sprintf("http://%s/", net.JoinHostPort(p.Status.PodIP, strconv.Itoa(consolePort)))
				return true, ""
			}
		}
		return false, "operator Pods: " + strings.Join(seen, ", ")
	})
	// The console answers (401: it wants its token) once the Pod's process has bound it.
	e.eventually(t, time.Minute, 500*time.Millisecond, "the console to answer at "+base, func() (bool, string) {
		resp, err := http.Get(base + "api/v1/queues")
		if err != nil {
			return false, err.Error()
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusUnauthorized, fmt.Sprintf("HTTP %d", resp.StatusCode)
	})
	return base
}

// formatCount formats n as the console does (thousands separators).
func formatCount(n int64) string {
	s := strconv.FormatInt(n, 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// stepConsole loads the operator's web console in headless Chromium against the running stack:
// it signs in with the token, checks that the due count shown is the RenderQueue's status.due
// (exact), then stops PostgreSQL and checks that the shards that lose their exactness are marked
// inexact on the page and the count a lower bound, and brings PostgreSQL back. Screenshots are
// saved as test artifacts ($ARTIFACTS).
//
// It needs the operator to run as the Deployment's Pod (run by the e2e's runner) with
// config/console applied (enableConsole does that when the install step has not).
func (e *env) stepConsole(t *testing.T) {
	token := e.enableConsole(t)
	base := e.consoleURL(t)
	t.Logf("console at %s", base)

	// Without the token nothing is shown; with it the JSON API answers.
	req, _ := http.NewRequest(http.MethodGet, base+"api/v1/queues", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %sapi/v1/queues with the token = %d, want 200", base, resp.StatusCode)
	}

	ctx := browsertest.New(t, 1400, 1000)
	dir := browsertest.ArtifactsDir(t)
	queueURL := base + "queues/" + namespace + "/" + queueName
	browsertest.Do(ctx, t, time.Minute, "signing in to the console at "+queueURL,
		chromedp.Navigate(queueURL),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.ID("sign-in")),
		chromedp.WaitVisible(chromedp.ID("due")))

	// The due count shown is status.due, and it is exact.
	shownDue := func() (string, string) {
		due, _ := browsertest.TextNow(ctx, "#due")
		badge, _ := browsertest.TextNow(ctx, "#summary .card.big .badge")
		return due, badge
	}
	e.eventually(t, 30*time.Second, 500*time.Millisecond, "the console to show the exact status.due", func() (bool, string) {
		st := e.queue().Status
		due, badge := shownDue()
		return st.DueExact && due == formatCount(st.Due) && badge == "exact",
			fmt.Sprintf("page: %q (%s); status: due %d, exact %v", due, badge, st.Due, st.DueExact)
	})
	browsertest.Screenshot(ctx, t, dir, "console-e2e-queue", true)

	// PostgreSQL stops: shards lose their exactness; the page marks them and the count.
	pgCtx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := e.c.Postgres.Pause(pgCtx); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = e.c.Postgres.Resume(context.Background())
		}
	}()
	t.Log("PostgreSQL stopped")
	e.eventually(t, 90*time.Second, 500*time.Millisecond, "the console to mark an inexact shard and the count a lower bound", func() (bool, string) {
		st := e.queue().Status
		inexact, err := browsertest.Eval[[]string](ctx,
			`Array.from(document.querySelectorAll('tr[data-shard][data-exact="false"] td.exact .badge')).map(b => b.closest("tr").dataset.shard + ":" + b.textContent.trim())`)
		if err != nil {
			return false, err.Error()
		}
		due, badge := shownDue()
		return len(inexact) > 0 && !st.DueExact && badge == "lower bound" && due == formatCount(st.Due),
			fmt.Sprintf("page: inexact shards %v, due %q (%s); status: due %d, exact %v", inexact, due, badge, st.Due, st.DueExact)
	})
	for _, sel := range []string{`tr[data-shard][data-exact="false"] td.exact .badge`} {
		if s, _ := browsertest.TextNow(ctx, sel); s != "inexact" {
			t.Errorf("%s says %q, want inexact", sel, s)
		}
	}
	browsertest.Screenshot(ctx, t, dir, "console-e2e-inexact", true)
	browsertest.Do(ctx, t, time.Minute, "loading the queues page",
		chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS(`tr[data-queue="`+namespace+`/`+queueName+`"]`)))
	browsertest.Screenshot(ctx, t, dir, "console-e2e-queues", false)

	if err := e.c.Postgres.Resume(pgCtx); err != nil {
		t.Fatal(err)
	}
	resumed = true
	t.Log("PostgreSQL back")
	e.exactAndTrue(2*time.Minute, int(e.queue().Status.CurrentShards))
}
