package console

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/client/clienttest"
	"github.com/renderqueue/renderqueue/pkg/console/browsertest"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// explainFixture is a RenderQueue "shop" whose two shards are real keepers (package keeper's
// handlers over an in-memory store: clienttest), with rows the tests explain: "waiting", due an
// hour ago, and "later", due after the window.
type explainFixture struct {
	ns       string
	rq       *rqv1.RenderQueue
	cluster  *clienttest.Cluster
	registry *shardRegistry
	waiting  string
	later    string
}

const explainToken = "console-explain-token"

func newExplainFixture(t *testing.T) *explainFixture {
	t.Helper()
	needAPIServer(t)
	names := []string{"shop-shard-0", "shop-shard-1"}
	cl := clienttest.NewCluster(t, clienttest.Options{Token: explainToken, Window: 2 * time.Hour}, names...)
	f := &explainFixture{ns: newNamespace(t), cluster: cl, registry: newRegistry(),
		waiting: "https://shop.example.com/p/waiting", later: "https://shop.example.com/p/later"}
	now := time.Now()
	cl.Upsert(
		schedule.Row{Key: f.waiting, Due: now.Add(-time.Hour), HasDue: true, Cadence: time.Hour, Route: "product"},
		schedule.Row{Key: "https://shop.example.com/p/other", Due: now.Add(-2 * time.Hour), HasDue: true, Cadence: time.Hour, Route: "product"},
		schedule.Row{Key: f.later, Due: now.Add(5 * time.Hour), HasDue: true, Cadence: 96 * time.Hour, Route: "product"},
	)
	clienttest.Eventually(t, "the due rows held", func() bool { return cl.Due() == 2 })
	var st rqv1.RenderQueueStatus
	for i, s := range cl.Shards() {
		st.Shards = append(st.Shards, rqv1.ShardStatus{Name: s.Name, State: "queued", Ready: true})
		createShardPod(t, f.ns, "shop", s.Name)
		f.registry.add(f.ns, s.Name, cl.URLs()[i])
	}
	f.rq = createQueue(t, f.ns, "shop", 2, 2*time.Hour, st)
	return f
}

// handler is the console over the fixture, with token as the shards' token (none: no
// ShardToken).
func (f *explainFixture) handler(t *testing.T, token ShardTokenFunc) *handler {
	t.Helper()
	h, err := newHandler(HandlerOptions{Reader: k8sClient, ShardURL: f.registry.resolve, ShardTimeout: time.Second, ShardToken: token})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func staticToken(tok string) ShardTokenFunc {
	return func(context.Context, *rqv1.RenderQueue) (string, error) { return tok, nil }
}

// TestExplainSearch: the queue page has the search box; a key asked for is explained by the
// shard that owns its slot (a waiting row with its rank, a row beyond the window), as a page and
// as JSON; a key no row has is a 404 that says so, a bad key a 400; without the shards' token
// the console says how to turn explaining on; with SecretToken it reads the token from the
// queue's Secret, and says so when there is none.
func TestExplainSearch(t *testing.T) {
	f := newExplainFixture(t)
	h := f.handler(t, staticToken(explainToken))
	base := "/queues/" + f.ns + "/shop"

	code, _, body := get(t, h, base)
	if code != http.StatusOK {
		t.Fatalf("queue page: %d", code)
	}
	mustContain(t, "the queue page", body, `<form class="explain" id="explain" method="get" action="../../queues/`+f.ns+`/shop/rows"`, `name="key"`)

	code, _, body = get(t, h, base+"/rows")
	if code != http.StatusOK || strings.Contains(body, `id="explanation"`) {
		t.Errorf("the search page without a key: %d", code)
	}
	mustContain(t, "the search page", body, `id="explain-key"`, "Give a row's key")

	code, _, body = get(t, h, base+"/rows?key="+url.QueryEscape(f.waiting))
	if code != http.StatusOK {
		t.Fatalf("explaining %s: %d\n%s", f.waiting, code, body)
	}
	mustContain(t, "the waiting row's page", body, `id="explain-state">waiting</span>`, `<tr data-line="rank">`, "claimable due rows",
		`<tr data-line="claim">`, "rough: now &#43; (rows ahead &#43; 1)", `value="`+f.waiting+`"`)

	code, _, body = get(t, h, "/api/v1/queues/"+f.ns+"/shop/rows?key="+url.QueryEscape(f.later))
	var out struct {
		Row  shardapi.RowExplanation
		Hops []string
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &out) != nil || out.Row.State != shardapi.RowBeyondWindow || out.Row.Owner != out.Row.Shard {
		t.Errorf("explaining %s as JSON: %d\n%s", f.later, code, body)
	}

	for _, tc := range []struct {
		path string
		code int
		msg  string
	}{
		{base + "/rows?key=" + url.QueryEscape("https://shop.example.com/none"), http.StatusNotFound, "no row has this key in PostgreSQL"},
		{base + "/rows?key=", http.StatusBadRequest, "not a valid key: empty key"},
		{"/api/v1/queues/" + f.ns + "/shop/rows?key=" + strings.Repeat("k", 2049), http.StatusBadRequest, "not a valid key: key is 2049 bytes"},
		{"/api/v1/queues/" + f.ns + "/shop/rows", http.StatusBadRequest, "give one key"},
		{"/queues/" + f.ns + "/nope/rows?key=a", http.StatusNotFound, `There is no RenderQueue &#34;nope&#34;`},
	} {
		if code, _, body := get(t, h, tc.path); code != tc.code || !strings.Contains(body, tc.msg) {
			t.Errorf("GET %.80s: %d, want %d with %q\n%.400s", tc.path, code, tc.code, tc.msg, body)
		}
	}

	// no token given: the console says how to have one
	if code, _, body := get(t, f.handler(t, nil), base+"/rows?key="+url.QueryEscape(f.waiting)); code != http.StatusServiceUnavailable ||
		!strings.Contains(body, "--console-explain") {
		t.Errorf("without the shards' token: %d\n%.400s", code, body)
	}
	// the token from the queue's Secret, read through the API server
	secretToken := SecretToken(k8sClient)
	if code, _, body := get(t, f.handler(t, secretToken), base+"/rows?key="+url.QueryEscape(f.waiting)); code != http.StatusServiceUnavailable ||
		!strings.Contains(body, "shop-api-token") {
		t.Errorf("without the token Secret: %d\n%.400s", code, body)
	}
	if err := k8sClient.Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "shop-api-token"},
		Data: map[string][]byte{"token": []byte(explainToken + "\n")}}); err != nil {
		t.Fatal(err)
	}
	if code, _, body := get(t, f.handler(t, secretToken), base+"/rows?key="+url.QueryEscape(f.waiting)); code != http.StatusOK ||
		!strings.Contains(body, `id="explain-state">waiting</span>`) {
		t.Errorf("with the token from the Secret: %d\n%.400s", code, body)
	}
	// a wrong token is the console's problem, not the user's key's
	if code, _, body := get(t, f.handler(t, staticToken("wrong")), base+"/rows?key="+url.QueryEscape(f.waiting)); code != http.StatusServiceUnavailable ||
		!strings.Contains(body, "bearer token") {
		t.Errorf("with a wrong token: %d\n%.400s", code, body)
	}
}

// TestBrowserExplain types a key into the queue page's search box in a real headless Chromium
// and reads the explanation the page shows; then a key no row has.
func TestBrowserExplain(t *testing.T) {
	f := newExplainFixture(t)
	browserCtx := browsertest.New(t, 1400, 900)
	dir := browsertest.ArtifactsDir(t)
	srv, err := NewServer(Options{BindAddress: "127.0.0.1:0", Refresh: time.Minute, SampleInterval: 10 * time.Second, ShardTimeout: time.Second},
		HandlerOptions{Reader: k8sClient, ShardURL: f.registry.resolve, ShardToken: staticToken(explainToken)})
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
	queueURL := "http://" + srv.Addr().String() + "/queues/" + f.ns + "/shop"
	browsertest.Do(browserCtx, t, 30*time.Second, "loading "+queueURL,
		chromedp.Navigate(queueURL),
		chromedp.WaitVisible(chromedp.ID("explain-key")))
	browsertest.Do(browserCtx, t, 30*time.Second, "explaining "+f.waiting,
		chromedp.SendKeys(chromedp.ID("explain-key"), f.waiting),
		chromedp.Click(chromedp.ID("explain-go")),
		chromedp.WaitVisible(chromedp.ID("explanation")))
	if state, err := browsertest.TextNow(browserCtx, "#explain-state"); err != nil || state != "waiting" {
		t.Errorf("the state shown is %q (%v), want waiting", state, err)
	}
	for line, want := range map[string]string{"key": f.waiting, "rank": "claimable due rows", "claim": "rows ahead + 1"} {
		if got, err := browsertest.TextNow(browserCtx, `tr[data-line="`+line+`"] td`); err != nil || !strings.Contains(got, want) {
			t.Errorf("the %s line says %q (%v), want %q in it", line, got, err, want)
		}
	}
	if loc, err := chromedp.Run(browserCtx, chromedp.Location()); err != nil || !strings.Contains(loc, "/shop/rows?key=") {
		t.Errorf("the browser is at %q (%v), want the queue's rows page", loc, err)
	}
	browsertest.Screenshot(browserCtx, t, dir, "console-explain", true)

	browsertest.Do(browserCtx, t, 30*time.Second, "explaining a key no row has",
		chromedp.Clear(chromedp.ID("explain-key")),
		chromedp.SendKeys(chromedp.ID("explain-key"), "https://shop.example.com/none"),
		chromedp.Click(chromedp.ID("explain-go")),
		chromedp.WaitVisible(chromedp.ID("explain-error")))
	if msg, err := browsertest.TextNow(browserCtx, "#explain-error"); err != nil || !strings.Contains(msg, "no row has this key") {
		t.Errorf("the error shown is %q (%v)", msg, err)
	}
}
