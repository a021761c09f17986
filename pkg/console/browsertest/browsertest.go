// Package browsertest drives a real headless Chromium through the DevTools protocol (chromedp)
// for the console's browser tests, in pkg/console and in the end-to-end test.
//
// Chromium is found as $CHROMIUM, else on PATH (chromium, chromium-browser, google-chrome).
// hack/test.sh installs Debian's `chromium` package when it is missing (hack/chromium.sh) and
// exports CHROMIUM, so under `make test` a missing browser fails the test; run alone without
// one, the test is skipped and says how to get it.
//
// The browser runs headless with a fresh profile in a temporary directory, no sandbox (tests run
// as root in CI), no GPU, and nothing that talks to the network on its own (background
// networking, component updates, sync, QUIC); host names other than localhost resolve to
// nothing, so a page can only reach the loopback servers the test gives it by IP.
package browsertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Chromium returns the path of the Chromium binary, failing the test when $CHROMIUM names one
// that is not there, and skipping it when there is none at all.
func Chromium(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			t.Fatalf("CHROMIUM=%s is not an executable file (hack/chromium.sh installs Chromium and prints its path)", p)
		}
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome-stable", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no Chromium found (set CHROMIUM, or run hack/chromium.sh, which installs Debian's chromium package; `make test` does both)")
	return ""
}

// New starts a headless Chromium and returns a context for chromedp actions in its first tab,
// with a 5-minute budget for the whole browser; everything is stopped when the test ends. width × height is the
// window size (screenshots of the viewport have this size).
func New(t testing.TB, width, height int) context.Context {
	t.Helper()
	path := Chromium(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(width, height),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("no-pings", true),
		chromedp.Flag("metrics-recording-only", true),
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.*, EXCLUDE 10.*"),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("font-render-hinting", "none"),
	}
	ctx, cancelTimeout := context.WithTimeout(context.Background(), 5*time.Minute)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
		cancelTimeout()
	})
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("starting Chromium (%s): %v", path, err)
	}
	return bctx
}

// ArtifactsDir is where screenshots go: $ARTIFACTS/<test name> when ARTIFACTS is set (kept),
// else a temporary directory removed after the test.
func ArtifactsDir(t testing.TB) string {
	t.Helper()
	base := os.Getenv("ARTIFACTS")
	if base == "" {
		return t.TempDir()
	}
	dir := filepath.Join(base, regexp.MustCompile(`[^A-Za-z0-9._-]+`).ReplaceAllString(t.Name(), "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("creating the artifacts directory: %v", err)
	}
	return dir
}

// Screenshot saves a PNG of the whole page (full: true) or the viewport to dir/name.png and
// logs where.
func Screenshot(ctx context.Context, t testing.TB, dir, name string, full bool) string {
	t.Helper()
	action := chromedp.CaptureScreenshot()
	if full {
		action = chromedp.FullScreenshot(100)
	}
	png, err := chromedp.Run(ctx, action)
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatalf("saving screenshot %s: %v", path, err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
	return path
}

// Do runs chromedp steps in the tab of ctx, failing the test (saying what it was doing) when
// they do not finish within timeout: a page that never shows what a step waits for fails fast.
func Do(ctx context.Context, t testing.TB, timeout time.Duration, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Text returns the text content of the first node matching the CSS selector sel, trimmed. It
// waits (within ctx) for such a node to exist. The text is read in the page in one step
// (document.querySelector), so a page that re-renders the node meanwhile (the console refreshes)
// cannot leave the read holding a node that is gone.
func Text(ctx context.Context, sel string) (string, error) {
	expr := fmt.Sprintf(`(() => { const n = document.querySelector(%s); return n === null ? null : n.textContent; })()`, strconv.Quote(sel))
	for {
		s, err := chromedp.Run(ctx, chromedp.Evaluate[*string](expr))
		switch {
		case err != nil:
			return "", fmt.Errorf("text of %s: %w", sel, err)
		case s != nil:
			return strings.TrimSpace(*s), nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("text of %s: no such node: %w", sel, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TextNow is Text for a node that should be there already: it fails after a second instead of
// waiting for one.
func TextNow(ctx context.Context, sel string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return Text(ctx, sel)
}

// Eval evaluates a JavaScript expression in the page and returns its value decoded as T.
func Eval[T any](ctx context.Context, expr string) (T, error) {
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		return v, fmt.Errorf("evaluating %q: %w", expr, err)
	}
	return v, nil
}
