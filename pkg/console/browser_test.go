package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/internal/textfmt"
	"github.com/renderqueue/renderqueue/pkg/console/browsertest"
)

// waitFor polls cond every 100 ms until it holds, failing the test after timeout with the last
// reason it gave.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s; last: %s", what, timeout, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestBrowser loads the console in a real headless Chromium, under a path prefix as through the
// API server's service proxy: it signs in with the token through the form, checks that the due count shown is the RenderQueue's status.due, that the inexact
// and the unreachable shard are marked, that the figures refresh without a page reload, and that
// an unknown queue is a 404 page. Screenshots go to $ARTIFACTS (see browsertest.ArtifactsDir).
func TestBrowser(t *testing.T) {
	f := newFixture(t)
	browserCtx := browsertest.New(t, 1400, 1000)
	dir := browsertest.ArtifactsDir(t)

	token := "browser-test-token-0123456789abcdef"
	tokenPath := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenPath, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(Options{BindAddress: "127.0.0.1:0", TokenFile: tokenPath, Refresh: 500 * time.Millisecond,
		SampleInterval: 10 * time.Second, ShardTimeout: time.Second},
		HandlerOptions{Reader: k8sClient, ShardURL: f.registry.resolve, History: f.history, Now: func() time.Time { return f.now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("console server: %v", err)
		}
	})
	// The browser reaches the console the way the API server's service proxy serves it: under a
	// path prefix, with the Authorization header dropped (kube-apiserver deletes it once it has
	// authenticated the user), so the relative links, the redirect after signing in and the
	// cookie's scope are all exercised.
	const prefix = "/api/v1/namespaces/renderqueue-system/services/http:renderqueue-console:console/proxy"
	target, err := url.Parse(fmt.Sprintf("http://%s", srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target)
		r.Out.Header.Del("Authorization")
	}}
	front := httptest.NewServer(http.StripPrefix(prefix, rp))
	t.Cleanup(front.Close)
	base := front.URL + prefix + "/"
	queueURL := base + "queues/" + f.ns + "/web"

	// Signing in: the page asks for the token, then comes back to the queue.
	browsertest.Do(browserCtx, t, 30*time.Second, "loading "+queueURL,
		chromedp.Navigate(queueURL),
		chromedp.WaitVisible(chromedp.ID("token")))
	browsertest.Screenshot(browserCtx, t, dir, "console-login", false)
	browsertest.Do(browserCtx, t, 30*time.Second, "signing in",
		chromedp.SendKeys(chromedp.ID("token"), "not-the-token-at-all"),
		chromedp.Click(chromedp.ID("sign-in")),
		chromedp.WaitVisible(chromedp.ID("login-failed")),
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.ID("sign-in")),
		chromedp.WaitVisible(chromedp.ID("due")))
	if loc, err := chromedp.Run(browserCtx, chromedp.Location()); err != nil || loc != queueURL {
		t.Errorf("after signing in the browser is at %q (%v), want %q", loc, err, queueURL)
	}

	// The due count shown is status.due, and the shards are marked.
	var rq rqv1.RenderQueue
	if err := k8sClient.Get(t.Context(), clientKey(f.web), &rq); err != nil {
		t.Fatal(err)
	}
	shown, err := browsertest.TextNow(browserCtx, "#due")
	if err != nil {
		t.Fatal(err)
	}
	if want := textfmt.Thousands(rq.Status.Due); shown != want {
		t.Errorf("the console shows due %q, the RenderQueue status says %s", shown, want)
	}
	if badge, _ := browsertest.TextNow(browserCtx, "#summary .card.big .badge"); badge != "lower bound" {
		t.Errorf("the due count's badge says %q, want \"lower bound\" (status.dueExact is false)", badge)
	}
	rows := map[string]string{}
	for _, name := range []string{"web-shard-0", "web-shard-1", "web-shard-2"} {
		exact, err := browsertest.TextNow(browserCtx, `tr[data-shard="`+name+`"] td.exact .badge`)
		if err != nil {
			t.Fatal(err)
		}
		rows[name] = exact
	}
	if rows["web-shard-0"] != "exact" || rows["web-shard-1"] != "inexact" || rows["web-shard-2"] != "inexact" {
		t.Errorf("exact column = %v, want web-shard-0 exact, web-shard-1 and web-shard-2 inexact", rows)
	}
	why, _ := browsertest.TextNow(browserCtx, `tr[data-shard="web-shard-1"] ul.why`)
	if !strings.Contains(why, "last walk partial (3 segments unread)") {
		t.Errorf("web-shard-1's reasons = %q", why)
	}
	state, _ := browsertest.TextNow(browserCtx, `tr[data-shard="web-shard-2"] td:nth-child(3)`)
	note, _ := browsertest.TextNow(browserCtx, `tr[data-unreachable="web-shard-2"]`)
	if state != "unreachable" || !strings.Contains(note, "web-shard-2 did not answer the console") {
		t.Errorf("web-shard-2: state %q, note %q", state, note)
	}
	if charts, err := browsertest.Eval[int](browserCtx, `document.querySelectorAll("svg.chart").length`); err != nil || charts != 6 {
		t.Errorf("%d charts drawn (%v), want 6", charts, err)
	}
	// lateness by class: the hourly class has rows 1–2 cadences late on both answering shards
	if late, err := browsertest.Eval[string](browserCtx, `Array.from(document.querySelectorAll("#lateness svg rect.late.l3 title")).map(e => e.textContent).join("|")`); err != nil ||
		!strings.Contains(late, "1h · submitted: ") || !strings.Contains(late, "1–2 cadences late") {
		t.Errorf("lateness chart's 1–2 cadences segments = %q (%v)", late, err)
	}
	browsertest.Screenshot(browserCtx, t, dir, "console-queue", true)

	// The figures refresh without a page reload: a mark left on the page survives the update.
	if _, err := browsertest.Eval[bool](browserCtx, `window.__noReload = true`); err != nil {
		t.Fatal(err)
	}
	st := rq.Status.DeepCopy()
	st.Due, st.DueExact = 1250, true
	setStatus(t, &rq, *st)
	waitFor(t, 15*time.Second, "the page to show the new due count", func() (bool, string) {
		s, err := browsertest.TextNow(browserCtx, "#due")
		if err != nil {
			return false, err.Error()
		}
		return s == "1,250", "shows " + s
	})
	if kept, err := browsertest.Eval[bool](browserCtx, `window.__noReload === true`); err != nil || !kept {
		t.Errorf("the page was reloaded to show new figures (mark kept: %v, %v)", kept, err)
	}
	if refreshed, err := browsertest.Eval[string](browserCtx, `document.documentElement.dataset.refreshed || ""`); err != nil || refreshed == "" {
		t.Errorf("no fragment refresh recorded (%q, %v)", refreshed, err)
	}

	// The queues page.
	browsertest.Do(browserCtx, t, 30*time.Second, "loading the queues page",
		chromedp.Navigate(base),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-queue="`+f.ns+`/web"]`)))
	due, _ := browsertest.TextNow(browserCtx, `tr[data-queue="`+f.ns+`/web"] td.due`)
	if due != "1,250" {
		t.Errorf("the queues page shows due %q for web, want 1,250", due)
	}
	browsertest.Screenshot(browserCtx, t, dir, "console-queues", false)

	// An unknown queue.
	browsertest.Do(browserCtx, t, 30*time.Second, "loading an unknown queue",
		chromedp.Navigate(base+"queues/"+f.ns+"/nope"),
		chromedp.WaitVisible(chromedp.ID("not-found")))
	if msg, _ := browsertest.TextNow(browserCtx, "#not-found"); !strings.Contains(msg, `There is no RenderQueue "nope"`) {
		t.Errorf("the 404 page says %q", msg)
	}
}
