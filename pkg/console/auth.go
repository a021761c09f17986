package console

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"
)

// MinTokenLength is the shortest bearer token the console accepts (in bytes, after trimming
// surrounding whitespace): `openssl rand -hex 32` gives 64.
const MinTokenLength = 16

// sessionCookie is the cookie a browser gets after signing in with the token: an HMAC of a fixed
// label keyed by the token, so it carries no token and turns invalid when the token changes.
const sessionCookie = "renderqueue_console"

// sessionMaxAge is how long a sign-in lasts.
const sessionMaxAge = 12 * time.Hour

// tokenFile is the console's bearer token, read from a file (a mounted Secret) and read again
// whenever the file changes, so that a rotated Secret takes effect without a restart.
type tokenFile struct {
	path string

	mu      sync.Mutex
	token   []byte
	modTime time.Time
	size    int64
}

// readToken reads and checks a token file.
func readToken(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the console token file: %w", err)
	}
	tok := bytes.TrimSpace(b)
	switch {
	case len(tok) == 0:
		return nil, fmt.Errorf("the console token file %s is empty", path)
	case len(tok) < MinTokenLength:
		return nil, fmt.Errorf("the console token in %s is %d bytes long; it must be at least %d (e.g. `openssl rand -hex 32`)", path, len(tok), MinTokenLength)
	case bytes.ContainsAny(tok, " \t\r\n"):
		return nil, fmt.Errorf("the console token in %s contains whitespace", path)
	}
	return tok, nil
}

// newTokenFile reads path once, failing when it is missing, empty or too short.
func newTokenFile(path string) (*tokenFile, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("reading the console token file: %w", err)
	}
	tok, err := readToken(path)
	if err != nil {
		return nil, err
	}
	return &tokenFile{path: path, token: tok, modTime: fi.ModTime(), size: fi.Size()}, nil
}

// current returns the token, reading the file again when it changed. A file that became
// unreadable or invalid is an error: every request is refused until it is fixed.
func (t *tokenFile) current() ([]byte, error) {
	fi, err := os.Stat(t.path)
	if err != nil {
		return nil, fmt.Errorf("reading the console token file: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !fi.ModTime().Equal(t.modTime) || fi.Size() != t.size {
		tok, err := readToken(t.path)
		if err != nil {
			return nil, err
		}
		t.token, t.modTime, t.size = tok, fi.ModTime(), fi.Size()
	}
	return t.token, nil
}

// sessionValue is the sign-in cookie's value for token.
func sessionValue(token []byte) string {
	m := hmac.New(sha256.New, token)
	m.Write([]byte("renderqueue-console-session-v1"))
	return hex.EncodeToString(m.Sum(nil))
}

// authorized reports whether r carries the token (Authorization: Bearer) or a valid sign-in
// cookie. Both comparisons take constant time.
func authorized(r *http.Request, token []byte) bool {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, cred, ok := strings.Cut(h, " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(cred)), token) == 1
		}
		return false
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		return subtle.ConstantTimeCompare([]byte(c.Value), []byte(sessionValue(token))) == 1
	}
	return false
}

// safeNext matches the relative paths a sign-in may return to.
var safeNext = regexp.MustCompile(`^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$`)

// nextOf is the page to return to after signing in, relative to the console root ("" for the
// root); anything but a plain relative path is dropped.
func nextOf(s string) string {
	s = strings.TrimPrefix(s, "/")
	if !safeNext.MatchString(s) || strings.Contains(s, "..") {
		return ""
	}
	return s
}

// loginData is the login page's data.
type loginData struct {
	Next   string
	Failed bool
}

// withToken requires the token on every request but the static files and the sign-in itself.
// Browsers get a sign-in form (401) that sets a cookie; API clients get 401 JSON with
// WWW-Authenticate. The API server's service proxy consumes the Authorization header, so the
// sign-in cookie is how a browser gets through it.
func (h *handler) withToken(tf *tokenFile, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		setSecurityHeaders(w)
		if strings.HasPrefix(r.URL.Path, "/static/") {
			next.ServeHTTP(w, r)
			return
		}
		token, err := tf.current()
		if err != nil {
			h.log.Error(err, "The console token cannot be read; refusing every request")
			http.Error(w, "the console cannot read its token, so it refuses every request", http.StatusServiceUnavailable)
			return
		}
		if r.URL.Path == "/login" {
			h.login(w, r, token)
			return
		}
		if authorized(r, token) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="renderqueue-console"`)
		if wantsJSON(r) {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "the console requires its bearer token: Authorization: Bearer <token>"})
			return
		}
		h.render(w, http.StatusUnauthorized, "login", page{Title: "Sign in", Root: rootOf(r.URL.Path), Now: h.now().UTC(),
			Data: loginData{Next: nextOf(r.URL.Path)}})
	})
}

// wantsJSON says whether r is a machine's request (the JSON API, a fragment refresh).
func wantsJSON(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/api/") || r.URL.Query().Get("format") == "fragments" ||
		(strings.Contains(r.Header.Get("Accept"), "application/json") && !strings.Contains(r.Header.Get("Accept"), "text/html"))
}

// login serves GET /login (the form) and POST /login (check the token, set the cookie, go back).
func (h *handler) login(w http.ResponseWriter, r *http.Request, token []byte) {
	root := "./"
	switch r.Method {
	case http.MethodGet:
		h.render(w, http.StatusOK, "login", page{Title: "Sign in", Root: root, Now: h.now().UTC(), Data: loginData{Next: nextOf(r.URL.Query().Get("next"))}})
	case http.MethodPost:
		r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
		if err := r.ParseForm(); err != nil {
			var tooBig *http.MaxBytesError
			status := http.StatusBadRequest
			if errors.As(err, &tooBig) {
				status = http.StatusRequestEntityTooLarge
			}
			http.Error(w, "bad sign-in form: "+err.Error(), status)
			return
		}
		nextPage := nextOf(r.PostForm.Get("next"))
		given := strings.TrimSpace(r.PostForm.Get("token"))
		if subtle.ConstantTimeCompare([]byte(given), token) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="renderqueue-console"`)
			h.render(w, http.StatusUnauthorized, "login", page{Title: "Sign in", Root: root, Now: h.now().UTC(),
				Data: loginData{Next: nextPage, Failed: true}})
			return
		}
		// No Path: the cookie is scoped to the directory of /login, which is the console's root
		// under any prefix (port-forward, the API server's service proxy).
		http.SetCookie(w, &http.Cookie{
			Name: sessionCookie, Value: sessionValue(token), MaxAge: int(sessionMaxAge.Seconds()),
			HttpOnly: true, SameSite: http.SameSiteStrictMode,
			Secure: r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https"),
		})
		// A relative Location (http.Redirect would make it absolute, losing any path prefix).
		w.Header().Set("Location", root+nextPage)
		w.WriteHeader(http.StatusSeeOther)
	default:
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}
