package console

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// startServer runs a console Server on a loopback port with the given token file (none when
// empty) and returns its base URL.
func startServer(t *testing.T, f *fixture, tokenPath string) string {
	t.Helper()
	srv, err := NewServer(Options{BindAddress: "127.0.0.1:0", TokenFile: tokenPath, Refresh: time.Second, SampleInterval: 10 * time.Second, ShardTimeout: time.Second},
		HandlerOptions{Reader: k8sClient, ShardURL: f.registry.resolve, History: f.history})
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
	return fmt.Sprintf("http://%s", srv.Addr())
}

// noRedirect is an HTTP client that shows redirects instead of following them.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func do(t *testing.T, method, u string, hdr map[string]string, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func writeToken(t *testing.T, path, token string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestTokenRequired: with a token file every request but the static files needs the token —
// 401 without it or with a wrong one, 200 with it as a bearer token or as the sign-in cookie; a
// rotated token takes effect at once; an unreadable token file refuses everything.
func TestTokenRequired(t *testing.T) {
	f := newFixture(t)
	tokenPath := filepath.Join(t.TempDir(), "token")
	const token = "0123456789abcdef0123456789abcdef"
	writeToken(t, tokenPath, token)
	base := startServer(t, f, tokenPath)
	queue := "/queues/" + f.ns + "/web"
	bearer := func(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }

	for _, path := range []string{"/", queue, "/api/v1/queues", "/api/v1/queues/" + f.ns + "/web", queue + "?format=fragments", "/nope"} {
		resp, body := do(t, http.MethodGet, base+path, nil, "")
		if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("GET %s without a token = %d (WWW-Authenticate %q), want 401", path, resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
		}
		if strings.Contains(body, "1,194") || strings.Contains(body, "web-shard") {
			t.Errorf("GET %s without a token shows queue data:\n%s", path, body)
		}
		if resp, _ := do(t, http.MethodGet, base+path, bearer(token+"x"), ""); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong token = %d, want 401", path, resp.StatusCode)
		}
	}
	_, body := do(t, http.MethodGet, base+queue, nil, "")
	mustContain(t, "the sign-in page", body, `<form method="post" action="../../login"`, `name="next" value="queues/`+f.ns+`/web"`)
	resp, body := do(t, http.MethodGet, base+"/api/v1/queues", nil, "")
	if resp.Header.Get("Content-Type") != "application/json" ||
		!strings.Contains(body, "Authorization: Bearer") {
		t.Errorf("API 401 = %s %s", resp.Header.Get("Content-Type"), body)
	}
	if resp, _ = do(t, http.MethodGet, base+"/static/console.css", nil, ""); resp.StatusCode != http.StatusOK {
		t.Errorf("the stylesheet without a token = %d, want 200 (the sign-in page needs it)", resp.StatusCode)
	}
	for _, scheme := range []string{"Bearer ", "bearer "} {
		if resp, body = do(t, http.MethodGet, base+queue, map[string]string{"Authorization": scheme + token}, ""); resp.StatusCode != http.StatusOK ||
			!strings.Contains(body, `data-due="1194"`) {
			t.Errorf("GET %s with %q token = %d", queue, scheme, resp.StatusCode)
		}
	}
	if resp, _ = do(t, http.MethodGet, base+queue, map[string]string{"Authorization": "Basic " + token}, ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("Basic auth = %d, want 401", resp.StatusCode)
	}

	// Signing in with the form.
	form := func(tok, next string) string { return url.Values{"token": {tok}, "next": {next}}.Encode() }
	formHdr := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	resp, body = do(t, http.MethodPost, base+"/login", formHdr, form("wrong-token-wrong-token", "queues/"+f.ns+"/web"))
	if resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 || !strings.Contains(body, `id="login-failed"`) {
		t.Errorf("sign-in with a wrong token = %d, cookies %v", resp.StatusCode, resp.Cookies())
	}
	resp, _ = do(t, http.MethodPost, base+"/login", formHdr, form(token, "queues/"+f.ns+"/web"))
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "./queues/"+f.ns+"/web" {
		t.Fatalf("sign-in = %d, Location %q; want 303 to the relative ./queues/%s/web", resp.StatusCode, resp.Header.Get("Location"), f.ns)
	}
	var session *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == sessionCookie {
			session = c
		}
	}
	if session == nil || !session.HttpOnly || session.SameSite != http.SameSiteStrictMode || session.Path != "" ||
		strings.Contains(session.Value, token) {
		t.Fatalf("sign-in cookie = %+v: want HttpOnly, SameSite=Strict, no Path (scoped to the console's root), not the token itself", session)
	}
	withCookie := map[string]string{"Cookie": session.Name + "=" + session.Value}
	if resp, _ = do(t, http.MethodGet, base+queue, withCookie, ""); resp.StatusCode != http.StatusOK {
		t.Errorf("GET with the sign-in cookie = %d, want 200", resp.StatusCode)
	}
	if resp, _ = do(t, http.MethodGet, base+queue, map[string]string{"Cookie": session.Name + "=" + strings.Repeat("0", 64)}, ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET with a forged cookie = %d, want 401", resp.StatusCode)
	}
	if resp, _ = do(t, http.MethodPost, base+"/login", formHdr, form(token, "//evil.example/")); resp.Header.Get("Location") != "./" {
		t.Errorf("sign-in with next=//evil.example/ goes to %q, want ./", resp.Header.Get("Location"))
	}

	// Rotating the token: the old token and cookie stop working at once.
	const rotated = "fedcba9876543210fedcba9876543210"
	writeToken(t, tokenPath, rotated)
	future := time.Now().Add(2 * time.Second) // a different mtime even on a coarse clock
	if err := os.Chtimes(tokenPath, future, future); err != nil {
		t.Fatal(err)
	}
	if resp, _ = do(t, http.MethodGet, base+queue, bearer(token), ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the old token after rotation = %d, want 401", resp.StatusCode)
	}
	if resp, _ = do(t, http.MethodGet, base+queue, withCookie, ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the old cookie after rotation = %d, want 401", resp.StatusCode)
	}
	if resp, _ = do(t, http.MethodGet, base+queue, bearer(rotated), ""); resp.StatusCode != http.StatusOK {
		t.Errorf("the new token = %d, want 200", resp.StatusCode)
	}

	// A token file that goes bad refuses every request.
	if err := os.WriteFile(tokenPath, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if resp, _ = do(t, http.MethodGet, base+queue, bearer(rotated), ""); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("with a bad token file = %d, want 503", resp.StatusCode)
	}
}

// TestNoTokenOnLoopback: without a token file (loopback only) the console answers directly.
func TestNoTokenOnLoopback(t *testing.T) {
	f := newFixture(t)
	base := startServer(t, f, "")
	resp, body := do(t, http.MethodGet, base+"/queues/"+f.ns+"/web", nil, "")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `data-due="1194"`) {
		t.Errorf("GET on loopback without a token = %d", resp.StatusCode)
	}
}

func TestOptionsValidate(t *testing.T) {
	ok := func(addr, token string) Options {
		return Options{BindAddress: addr, TokenFile: token, Refresh: time.Second, SampleInterval: 10 * time.Second, ShardTimeout: time.Second}
	}
	for _, o := range []Options{ok("127.0.0.1:8090", ""), ok("localhost:8090", ""), ok("[::1]:8090", ""), ok("127.0.0.5:8090", ""),
		ok(":8090", "/run/secrets/token"), ok("10.1.2.3:8090", "/run/secrets/token")} {
		if err := o.Validate(); err != nil {
			t.Errorf("Validate(%s, token %q) = %v, want nil", o.BindAddress, o.TokenFile, err)
		}
	}
	bad := map[string]Options{
		"all interfaces without a token": ok(":8090", ""),
		"0.0.0.0 without a token":        ok("0.0.0.0:8090", ""),
		"a pod IP without a token":       ok("10.1.2.3:8090", ""),
		"a host name without a token":    ok("console.example:8090", ""),
		"no port":                        ok("127.0.0.1", ""),
	}
	o := ok("127.0.0.1:8090", "")
	o.Refresh = 0
	bad["zero refresh"] = o
	o = ok("127.0.0.1:8090", "")
	o.ShardTimeout = -time.Second
	bad["negative shard timeout"] = o
	o = ok("127.0.0.1:8090", "")
	o.SampleInterval = 2 * time.Hour
	bad["sample interval beyond the hour shown"] = o
	for name, o := range bad {
		if err := o.Validate(); err == nil {
			t.Errorf("%s: Validate(%+v) = nil, want an error", name, o)
		}
	}
	exposed := ok(":8090", "")
	if err := exposed.Validate(); err == nil || !strings.Contains(err.Error(), "--console-token-file") {
		t.Errorf("the error for an exposed console without a token does not say what to do: %v", err)
	}
}

func TestNewServerRejectsBadTokenFiles(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{"empty": "", "short": "abc", "spaces": "0123456789 abcdef0123", "blank": "   \n"}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	files["missing"] = ""
	for name := range files {
		_, err := NewServer(Options{BindAddress: "127.0.0.1:0", TokenFile: filepath.Join(dir, name), Refresh: time.Second,
			SampleInterval: time.Minute, ShardTimeout: time.Second},
			HandlerOptions{}) // the token is checked before anything else
		if err == nil {
			t.Errorf("token file %s: NewServer succeeded, want an error", name)
		}
	}
}

func TestBindFlags(t *testing.T) {
	var o Options
	fs := flag.NewFlagSet("operator", flag.ContinueOnError)
	o.BindFlags(fs)
	if o.Enabled || o.BindAddress != DefaultBindAddress || o.Refresh != DefaultRefresh || o.SampleInterval != DefaultSampleInterval ||
		o.ShardTimeout != DefaultShardTimeout {
		t.Errorf("defaults = %+v", o)
	}
	if err := fs.Parse([]string{"--console", "--console-bind-address=:9000", "--console-token-file=/t", "--console-refresh=3s",
		"--console-sample-interval=30s", "--console-shard-timeout=1s"}); err != nil {
		t.Fatal(err)
	}
	if !o.Enabled || o.BindAddress != ":9000" || o.TokenFile != "/t" || o.Refresh != 3*time.Second || o.SampleInterval != 30*time.Second ||
		o.ShardTimeout != time.Second {
		t.Errorf("parsed = %+v", o)
	}
}

func TestNextOf(t *testing.T) {
	for in, want := range map[string]string{
		"queues/default/web": "queues/default/web", "/queues/default/web": "queues/default/web", "": "", "/": "",
		"//evil.example/x": "", "https://evil.example/": "", "../../etc": "", "queues/a/../b": "", "a b": "", "queues//x": "",
	} {
		if got := nextOf(in); got != want {
			t.Errorf("nextOf(%q) = %q, want %q", in, got, want)
		}
	}
}
