package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

// TestSeed seeds a real database and checks the rows there.
func TestSeed(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	seedArgs := []string{"seed", "--dsn", dsn, "--migrate", "--rows", "20000", "--homepages", "40", "--overdue", "500",
		"--urgent", "10", "--batch", "3000", "--seed", "3"}
	var out, errb bytes.Buffer
	if code := run(seedArgs, &out, &errb); code != 0 || !strings.Contains(out.String(), "seeded 20000 rows") {
		t.Fatalf("seed: code %d, out %q, err %q", code, out.String(), errb.String())
	}
	if !strings.Contains(errb.String(), "seed: 20000/20000 rows (100%)") {
		t.Errorf("no final progress line on stderr: %q", errb.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	count := func(where string) int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM render_schedule WHERE "+where).Scan(&n); err != nil {
			t.Fatalf("count where %s: %v", where, err)
		}
		return n
	}
	checks := []struct {
		where string
		want  int
	}{
		{"true", 20000},
		{"route = 'home' AND key LIKE 'https://shop.example.com/home/%'", 40},
		{"route = 'category'", (20000 - 40) * 30 / 1000},
		{"urgent", 10},
		{"due_at IS NULL", 0},
	}
	for _, c := range checks {
		if got := count(c.where); got != c.want {
			t.Errorf("rows where %s: %d, want %d", c.where, got, c.want)
		}
	}
	if due := count("due_at <= now()"); due < 510 || due > 2000 {
		t.Errorf("%d rows due, want the 510 overdue and urgent ones plus about 2%% of the rest", due)
	}
	if sub := count("source = 'submitted'"); sub < 9500 || sub > 10500 {
		t.Errorf("%d submitted rows, want about half", sub)
	}

	// The same seed again rewrites the same keys; another prefix adds new ones.
	out.Reset()
	errb.Reset()
	if code := run(seedArgs, &out, &errb); code != 0 {
		t.Fatalf("second seed: code %d, err %q", code, errb.String())
	}
	if got := count("true"); got != 20000 {
		t.Errorf("after reseeding: %d rows", got)
	}
	out.Reset()
	errb.Reset()
	if code := run(append(seedArgs, "--key-prefix", "https://other.example.com"), &out, &errb); code != 0 {
		t.Fatalf("third seed: code %d, err %q", code, errb.String())
	}
	if got := count("key LIKE 'https://other.example.com/%'"); got != 20000 {
		t.Errorf("after seeding another prefix: %d rows with it", got)
	}
}

func TestToolFlagErrors(t *testing.T) {
	t.Setenv("RENDERQUEUE_DSN", "")
	t.Setenv("RENDERQUEUE_SHARDS", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"seed"}, "--dsn"},
		{[]string{"seed", "--dsn", "x", "--rows", "10", "--homepages", "5", "--overdue", "11"}, "overdue 11"},
		{[]string{"worker-sim"}, "--shard"},
		{[]string{"worker-sim", "--shard", "localhost:1"}, "not an http(s) URL"},
		{[]string{"worker-sim", "--shard", "http://x", "--token-file", "/nonexistent/token"}, "API token"},
		{[]string{"worker-sim", "--shard", "http://x", "--dns", "a:1"}, "exclude each other"},
		{[]string{"worker-sim", "--renderqueue", "web", "--namespace", ""}, "needs --namespace"},
		{[]string{"worker-sim", "--dns", "web-shards"}, "HOST:PORT"},
		{[]string{"worker-sim", "--shard", "https://x", "--tls-server-name", "x.svc"}, "--tls-server-name needs --tls-ca-file"},
		{[]string{"worker-sim", "--shard", "https://x", "--tls-ca-file", "/nonexistent/ca.crt"}, "reading the TLS CA file"},
		{[]string{"status"}, "--url"},
		{[]string{"status", "a", "b"}, "unexpected arguments"},
		{[]string{"status", "web", "--url", "http://x"}, "exclude each other"},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code == 0 || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%q: code %d, stderr %q; want an error mentioning %q", tc.args, code, errb.String(), tc.want)
		}
	}
}

func TestStatusCommand(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/status" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(`{"shard":"s1","asOf":"2026-11-29T12:00:00Z","status":"empty","complete":true,"exact":true,
			"window":0,"due":0,"lastWalk":{"startedAt":"2026-11-29T11:00:00Z","finishedAt":"2026-11-29T11:00:01Z","scanned":7}}`))
	}))
	defer srv.Close()
	var out, errb bytes.Buffer
	if code := run([]string{"status", "--url", srv.URL}, &out, &errb); code != 0 {
		t.Fatalf("code %d, err %q", code, errb.String())
	}
	for _, s := range []string{"shard s1 — status EMPTY, exact yes", "edge      unbounded (window 0)", "scanned 7"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("missing %q in:\n%s", s, out.String())
		}
	}
	out.Reset()
	if code := run([]string{"status", "--json", "--url", srv.URL}, &out, &errb); code != 0 || !strings.Contains(out.String(), `"shard": "s1"`) {
		t.Errorf("--json: code %d, out %q", code, out.String())
	}
	if code := run([]string{"status", "--url", srv.URL + "/nope"}, &out, &errb); code == 0 {
		t.Error("status of a missing shard: code 0")
	}
}

func TestPluginArgs(t *testing.T) {
	for _, tc := range []struct{ argv, want []string }{
		{[]string{"/usr/local/bin/renderqueue", "status", "--url", "u"}, []string{"status", "--url", "u"}},
		{[]string{"/usr/local/bin/kubectl-renderqueue", "web", "-n", "shop"}, []string{"status", "web", "-n", "shop"}},
		{[]string{"kubectl-renderqueue", "status", "web"}, []string{"status", "web"}},
		{[]string{"kubectl-renderqueue"}, []string{"status"}},
		{[]string{"kubectl-renderqueue", "explain", "web", "https://a/", "-n", "shop"}, []string{"explain", "web", "https://a/", "-n", "shop"}},
		{[]string{"kubectl-renderqueue", "status", "explain"}, []string{"status", "explain"}}, // a queue named explain
	} {
		if got := pluginArgs(tc.argv); strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("pluginArgs(%q) = %q, want %q", tc.argv, got, tc.want)
		}
	}
}

// TestUpsert writes good and bad NDJSON lines into a real database: the good ones are written, the
// bad ones reported by line number and not written, nothing half-written.
func TestUpsert(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	var out, errb bytes.Buffer
	if code := run([]string{"schema", "migrate", "--dsn", dsn}, &out, &errb); code != 0 {
		t.Fatalf("migrate: %s", errb.String())
	}
	in := filepath.Join(t.TempDir(), "rows.ndjson")
	rows := `{"key":"https://shop.example.com/p/1","cadence":"96h","route":"product","source":"submitted","due":"2026-12-01T10:00:00Z"}
{"key":"https://shop.example.com/p/2","cadence":"1h","due":"2026-12-01T10:00:00Z","urgent":true}
{"key":"https://shop.example.com/p/3","cadence":"1h"}
{"key":"https://shop.example.com/p/4","cadence":"24h","unscheduled":true}
{"key":"https://shop.example.com/p/5","cadence":"1h","due":"2026-12-01T10:00:00Z","route":"` + strings.Repeat("r", 300) + `"}
{"key":"https://shop.example.com/p/1","cadence":"48h","route":"product","due":"2026-12-03T10:00:00Z"}
`
	if err := os.WriteFile(in, []byte(rows), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errb.Reset()
	code := run([]string{"upsert", "--dsn", dsn, "--file", in, "--batch", "2"}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "2 bad lines were not written") {
		t.Fatalf("upsert with bad lines: code %d, stderr %q", code, errb.String())
	}
	for _, s := range []string{"line 3: neither due nor", "line 5: route is 300 bytes"} {
		if !strings.Contains(errb.String(), s) {
			t.Errorf("stderr %q does not say %q", errb.String(), s)
		}
	}
	if !strings.Contains(out.String(), "read 6 lines: wrote 4 rows in 2 transactions, 2 bad lines (not written)") {
		t.Errorf("stdout %q", out.String())
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	var n, unscheduled, urgent int
	var cadence int64
	if err := conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE due_at IS NULL), count(*) FILTER (WHERE urgent),
		max(cadence_ms) FILTER (WHERE key = 'https://shop.example.com/p/1') FROM render_schedule`).Scan(&n, &unscheduled, &urgent, &cadence); err != nil {
		t.Fatal(err)
	}
	if n != 3 || unscheduled != 1 || urgent != 1 || cadence != (48*time.Hour).Milliseconds() {
		t.Fatalf("rows %d (unscheduled %d, urgent %d), p/1 cadence %d ms: want p/1 (rewritten by line 6), p/2, p/4", n, unscheduled, urgent, cadence)
	}
	// only good lines: exit 0
	out.Reset()
	errb.Reset()
	if err := os.WriteFile(in, []byte(`{"key":"https://shop.example.com/p/9","cadence":"1h","due":"2026-12-01T10:00:00Z"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := run([]string{"upsert", "--dsn", dsn, "--file", in}, &out, &errb); code != 0 || !strings.Contains(out.String(), "wrote 1 rows") {
		t.Fatalf("good upsert: code %d, out %q, err %q", code, out.String(), errb.String())
	}
}
