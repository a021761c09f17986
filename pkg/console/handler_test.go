package console

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/console/view"
)

// get serves one GET through h and returns the status, content type and body.
func get(t *testing.T, h http.Handler, path string) (int, string, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	b, _ := io.ReadAll(rec.Body)
	return rec.Code, rec.Header().Get("Content-Type"), string(b)
}

func mustContain(t *testing.T, what, body string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(body, w) {
			t.Errorf("%s does not contain %q", what, w)
		}
	}
}

func TestQueuesPage(t *testing.T) {
	f := newFixture(t)
	h := f.handler(t, time.Second)
	code, ctype, body := get(t, h, "/")
	if code != http.StatusOK || !strings.HasPrefix(ctype, "text/html") {
		t.Fatalf("GET / = %d %s\n%s", code, ctype, body)
	}
	mustContain(t, "the queues page", body,
		`data-queue="`+f.ns+`/web"`, `data-queue="`+f.ns+`/images"`,
		`href="./queues/`+f.ns+`/web"`, // relative: works under any prefix
		`data-due="1194">1,194<`, `data-due="0">0<`,
		`data-exact="false"`, `lower bound`, `data-exact="true"`,
		`class="badge bad" data-condition="Exact" data-status="False"`,
		`class="badge ok" data-condition="Ready" data-status="True"`,
		`Exact · ShardInexact`, `Progressing · Settled`,
		`3 / 3`, `static/console.css`, `data-refresh="5000"`)

	code, ctype, body = get(t, h, "/?format=fragments")
	if code != http.StatusOK || ctype != "application/json" {
		t.Fatalf("GET /?format=fragments = %d %s\n%s", code, ctype, body)
	}
	var frags struct {
		Now       time.Time         `json:"now"`
		Fragments map[string]string `json:"fragments"`
	}
	if err := json.Unmarshal([]byte(body), &frags); err != nil {
		t.Fatalf("decoding the fragments: %v\n%s", err, body)
	}
	if !frags.Now.Equal(f.now) || !strings.Contains(frags.Fragments["queues"], `data-due="1194"`) {
		t.Errorf("fragments: now %s, queues fragment:\n%s", frags.Now, frags.Fragments["queues"])
	}
}

func TestQueuesJSON(t *testing.T) {
	f := newFixture(t)
	code, _, body := get(t, f.handler(t, time.Second), "/api/v1/queues")
	if code != http.StatusOK {
		t.Fatalf("GET /api/v1/queues = %d\n%s", code, body)
	}
	var out struct{ Queues []view.QueueSummary }
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatal(err)
	}
	byName := map[string]view.QueueSummary{}
	for _, q := range out.Queues {
		if q.Namespace == f.ns {
			byName[q.Name] = q
		}
	}
	web, images := byName["web"], byName["images"]
	if web.Due != fixtureWebDue || web.DueExact || web.ReadyShards != 3 || web.Shards != 3 || web.DueAsOf == nil {
		t.Errorf("web = %+v", web)
	}
	if len(web.Conditions) != 5 || web.Conditions[0].Type != rqv1.ConditionReady || web.Conditions[1].Tone != "bad" ||
		web.Conditions[4].Type != rqv1.ConditionProgressing || web.Conditions[4].Tone != "ok" {
		t.Errorf("web conditions (order Ready, Exact, EdgeHealthy, WalksComplete, Progressing; tones) = %+v", web.Conditions)
	}
	if images.Due != 0 || !images.DueExact {
		t.Errorf("images = %+v", images)
	}
}

func TestQueuePage(t *testing.T) {
	f := newFixture(t)
	code, _, body := get(t, f.handler(t, time.Second), "/queues/"+f.ns+"/web")
	if code != http.StatusOK {
		t.Fatalf("GET queue page = %d\n%s", code, body)
	}
	mustContain(t, "the queue page", body,
		`href="../../static/console.css"`, `href="../../"`,
		`<span id="due" data-due="1194" data-exact="false">1,194</span>`,
		// the shard table
		`data-shard="web-shard-0" data-exact="true" data-reachable="true"`,
		`data-shard="web-shard-1" data-exact="false" data-reachable="true"`,
		`data-shard="web-shard-2" data-exact="false" data-reachable="false"`,
		`last walk partial (3 segments unread)`, `change-event gap at `, `partial · 3 unread`,
		`web-shard-2 did not answer the console: unreachable:`, `connection refused`,
		`web-shard-1 reports: walk: 3 segments unread`,
		`0.42`, `11h52m`,
		// the charts
		`aria-label="Held rows coming due by hour over the next 24 hours"`, `window 12h`,
		`Only 2 of 3 shards answered: these bars are a lower bound.`,
		`aria-label="status.due over the last hour"`, `class="inexact"`,
		`aria-label="Due and held rows by class"`, `4d · discovered`, `1h · submitted`,
		`aria-label="Slot ownership, slots 0 to 1023"`, `web-shard-2: slots 682-1023 (342)`,
		`id="handoff-state">Committed<`, `prepare (epoch 5 → 6)`, `commit (epoch 7)`,
		`web-shard-0 → web-shard-2: slots 682-852`)
	if strings.Contains(body, "<no value>") || strings.Contains(body, "NaN") {
		t.Errorf("the page shows an unset value:\n%s", body)
	}
}

func TestQueueJSON(t *testing.T) {
	f := newFixture(t)
	code, _, body := get(t, f.handler(t, time.Second), "/api/v1/queues/"+f.ns+"/web")
	if code != http.StatusOK {
		t.Fatalf("GET /api/v1/queues/.../web = %d\n%s", code, body)
	}
	var d view.QueueDetail
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatal(err)
	}
	if d.Due != fixtureWebDue || d.DueExact || d.Reachable != 2 || len(d.Shard) != 3 {
		t.Fatalf("detail: due %d exact %v reachable %d shards %d", d.Due, d.DueExact, d.Reachable, len(d.Shard))
	}
	s0, s1, s2 := d.Shard[0], d.Shard[1], d.Shard[2]
	if !s0.Reachable || !s0.Exact || s0.Due != 412 || len(s0.Inexact) != 0 {
		t.Errorf("web-shard-0 = %+v", s0)
	}
	if !s1.Reachable || s1.Exact || s1.Due != 377 || s1.LastWalk == nil || !s1.LastWalk.Partial || len(s1.Inexact) != 2 {
		t.Errorf("web-shard-1 = %+v", s1)
	}
	if s2.Reachable || s2.State != "unreachable" || !strings.Contains(s2.Error, "connection refused") || s2.Due != 405 {
		t.Errorf("web-shard-2 (unreachable; operator's last poll due 405) = %+v", s2)
	}
	s0st, s1st := f.shards["web-shard-0"].status, f.shards["web-shard-1"].status
	if got, want := d.Coming.ByHour[0].Rows, s0st.Coming.ByHour[0]+s1st.Coming.ByHour[0]; got != want {
		t.Errorf("coming in the first hour = %d, want the sum of the reachable shards %d", got, want)
	}
	if d.Coming.Shards != 2 || d.Coming.Of != 3 || d.Coming.ByHour[11].BeyondWindow || !d.Coming.ByHour[12].BeyondWindow {
		t.Errorf("coming: shards %d of %d, hour 11 beyond %v, hour 12 beyond %v", d.Coming.Shards, d.Coming.Of,
			d.Coming.ByHour[11].BeyondWindow, d.Coming.ByHour[12].BeyondWindow)
	}
	if len(d.Classes) != 4 || d.Classes[0].CadenceSeconds != 3600 || d.Classes[0].Due != 412/4+377/4 {
		t.Errorf("classes = %+v", d.Classes)
	}
	if c := d.Classes[0]; sum(c.LateBy) != c.Due || c.LateBy[3] != s0st.Classes[0].LateBy[3]+s1st.Classes[0].LateBy[3] ||
		c.MaxLateSeconds != 5400 || c.LateUnknown != 0 {
		t.Errorf("class lateness = %+v (want the shards' buckets summed, summing to due)", c)
	}
	if len(d.History) != 361 || d.History[0].At.After(d.History[360].At) || d.History[360].Exact {
		t.Errorf("history: %d samples (want 361, oldest first, the last inexact)", len(d.History))
	}
	h := d.Membership.Handoff
	if h == nil || len(h.Events) != 2 || h.Events[0].Kind != "prepare" || h.Events[1].Kind != "commit" {
		t.Errorf("handoff = %+v", h)
	}
	if len(d.Membership.Assignment) != 3 || d.Membership.Assignment[2].Count != 342 {
		t.Errorf("assignment = %+v", d.Membership.Assignment)
	}
}

func TestQueuePageFragments(t *testing.T) {
	f := newFixture(t)
	h := f.handler(t, time.Second)
	code, ctype, body := get(t, h, "/queues/"+f.ns+"/web?format=fragments")
	if code != http.StatusOK || ctype != "application/json" {
		t.Fatalf("fragments = %d %s\n%s", code, ctype, body)
	}
	var frags struct{ Fragments map[string]string }
	if err := json.Unmarshal([]byte(body), &frags); err != nil {
		t.Fatal(err)
	}
	for _, id := range queueFragments {
		if frags.Fragments[id] == "" {
			t.Errorf("fragment %q is missing or empty", id)
		}
	}
	// Each fragment is what the page shows in the element of the same id.
	_, _, page := get(t, h, "/queues/"+f.ns+"/web")
	for _, id := range queueFragments {
		want := `<div id="` + id + `" data-fragment>` + frags.Fragments[id] + `</div>`
		if !strings.Contains(page, want) {
			t.Errorf("the page's #%s differs from its fragment", id)
		}
	}
}

func TestUnknownQueue(t *testing.T) {
	f := newFixture(t)
	h := f.handler(t, time.Second)
	code, ctype, body := get(t, h, "/queues/"+f.ns+"/nope")
	if code != http.StatusNotFound || !strings.HasPrefix(ctype, "text/html") {
		t.Fatalf("unknown queue page = %d %s", code, ctype)
	}
	mustContain(t, "the 404 page", body, `id="not-found"`, `There is no RenderQueue &#34;nope&#34; in namespace &#34;`+f.ns+`&#34;`, `href="../../"`)
	if code, ctype, body = get(t, h, "/api/v1/queues/"+f.ns+"/nope"); code != http.StatusNotFound || ctype != "application/json" ||
		!strings.Contains(body, "not found") {
		t.Errorf("unknown queue JSON = %d %s %s", code, ctype, body)
	}
	if code, ctype, _ = get(t, h, "/queues/"+f.ns+"/nope?format=fragments"); code != http.StatusNotFound || ctype != "application/json" {
		t.Errorf("unknown queue fragments = %d %s", code, ctype)
	}
	if code, _, body = get(t, h, "/no/such/page"); code != http.StatusNotFound || !strings.Contains(body, "The console has no page /no/such/page.") {
		t.Errorf("unknown path = %d\n%s", code, body)
	}
	if code, ctype, _ = get(t, h, "/api/v2/whatever"); code != http.StatusNotFound || ctype != "application/json" {
		t.Errorf("unknown API path = %d %s", code, ctype)
	}
}

// TestShardFailures: every way a shard can fail to answer is said on the page, never a 500.
func TestShardFailures(t *testing.T) {
	f := newFixture(t)
	h := f.handler(t, 300*time.Millisecond)
	s0 := f.shards["web-shard-0"]
	cases := []struct {
		name string
		set  func(*fakeShard)
		want string
	}{
		{"HTTP 500", func(s *fakeShard) { s.fail = http.StatusInternalServerError }, "500 Internal Server Error"},
		{"garbage", func(s *fakeShard) { s.raw = "{not json" }, "decoding the status"},
		{"another shard", func(s *fakeShard) { s.status.Shard = "web-shard-9" }, `reports shard &#34;web-shard-9&#34;, not &#34;web-shard-0&#34;`},
		{"no answer within the timeout", func(s *fakeShard) { s.hang = true }, "context deadline exceeded"},
	}
	orig := s0.status
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s0.set(func(s *fakeShard) { s.status, s.fail, s.raw, s.hang = orig, 0, "", false; c.set(s) })
			code, _, body := get(t, h, "/queues/"+f.ns+"/web")
			if code != http.StatusOK {
				t.Fatalf("page = %d, want 200 with the shard marked", code)
			}
			mustContain(t, "the page", body, `data-shard="web-shard-0" data-exact="false" data-reachable="false"`,
				`web-shard-0 did not answer the console`, c.want)
			code, _, body = get(t, h, "/api/v1/queues/"+f.ns+"/web")
			var d view.QueueDetail
			if code != http.StatusOK || json.Unmarshal([]byte(body), &d) != nil || d.Reachable != 1 || d.Shard[0].Reachable {
				t.Errorf("JSON = %d, reachable %d", code, d.Reachable)
			}
		})
	}
	// A shard whose Pod is gone is said as such too.
	s0.set(func(s *fakeShard) { s.status, s.fail, s.raw, s.hang = orig, 0, "", false })
	pod := f.shardPod(t, "web-shard-1")
	if err := k8sClient.Delete(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	// And a shard whose Pod is being deleted (held by a finalizer here) is not asked.
	pod = f.shardPod(t, "web-shard-0")
	pod.Finalizers = append(pod.Finalizers, "test.renderqueue.dev/hold")
	if err := k8sClient.Update(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	if err := k8sClient.Delete(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p := f.shardPod(t, "web-shard-0")
		p.Finalizers = nil
		if err := k8sClient.Update(context.Background(), p); err != nil {
			t.Errorf("releasing the Pod: %v", err)
		}
	})
	_, _, body := get(t, h, "/queues/"+f.ns+"/web")
	mustContain(t, "the page", body, `web-shard-1 did not answer the console: no Pod.`,
		`web-shard-0 did not answer the console: the Pod is being deleted.`)
}

// TestReaderUnavailable: when RenderQueues cannot be read at all, pages say so with 503.
func TestReaderUnavailable(t *testing.T) {
	needAPIServer(t)
	dead := httptest.NewServer(nil)
	dead.Close()
	cfg := rest.CopyConfig(restCfg)
	cfg.Host = dead.URL
	c, err := client.New(cfg, client.Options{Scheme: k8sClient.Scheme(), Mapper: k8sClient.RESTMapper()})
	if err != nil {
		t.Fatal(err)
	}
	h, err := newHandler(HandlerOptions{Reader: c, ShardURL: newRegistry().resolve})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/", "/queues/default/web", "/api/v1/queues", "/api/v1/queues/default/web", "/?format=fragments"} {
		code, _, body := get(t, h, path)
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "connection refused") {
			t.Errorf("GET %s = %d, want 503 naming the error\n%s", path, code, body)
		}
	}
}

func TestStaticAndHeaders(t *testing.T) {
	needAPIServer(t)
	h, err := newHandler(HandlerOptions{Reader: k8sClient, ShardURL: newRegistry().resolve})
	if err != nil {
		t.Fatal(err)
	}
	for path, ctype := range map[string]string{"/static/console.css": "text/css", "/static/console.js": "text/javascript"} {
		code, got, body := get(t, h, path)
		if code != http.StatusOK || !strings.HasPrefix(got, ctype) || len(body) < 100 {
			t.Errorf("GET %s = %d %s (%d bytes)", path, code, got, len(body))
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	csp := rec.Header().Get("Content-Security-Policy")
	if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") || rec.Header().Get("X-Frame-Options") != "DENY" {
		t.Errorf("security headers: CSP %q, X-Frame-Options %q", csp, rec.Header().Get("X-Frame-Options"))
	}
	// Nothing on any page points off the console: no absolute URL but the SVG namespace.
	_, _, body := get(t, h, "/")
	for _, m := range regexp.MustCompile(`(?:href|src|action)="([^"]*)"`).FindAllStringSubmatch(body, -1) {
		if strings.Contains(m[1], "//") || strings.HasPrefix(m[1], "/") {
			t.Errorf("absolute link %q: the console must work under any path prefix and fetch nothing else", m[1])
		}
	}
}
