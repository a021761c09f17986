package console

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/renderqueue/renderqueue/pkg/console/view"
	"github.com/renderqueue/renderqueue/pkg/logkeys"
)

// Defaults of the console's timing.
const (
	// DefaultRefresh is how often an open page fetches fresh fragments.
	DefaultRefresh = 5 * time.Second
	// DefaultSampleInterval is how often status.due is sampled into the history.
	DefaultSampleInterval = 10 * time.Second
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// HandlerOptions configure the console's HTTP handler.
type HandlerOptions struct {
	// Reader reads RenderQueues and Pods (the operator manager's cached client). Required.
	Reader client.Reader
	// ShardURL gives the base URL of a shard from its Pod. Required.
	ShardURL ShardURLFunc
	// HTTPClient asks the shards (http.DefaultClient when nil) unless ShardClient is set.
	HTTPClient *http.Client
	// ShardClient, if set, gives the client to ask a RenderQueue's shards with (shards serving
	// HTTPS are verified with their RenderQueue's CA and server name).
	ShardClient ShardClientFunc
	// ShardToken, if set, gives the API token of a RenderQueue's shards: the queue page's search
	// box then explains rows (GET /v1/rows/{key}); without it the search says how to turn it on.
	ShardToken ShardTokenFunc
	// ShardTimeout bounds one shard's /v1/status (DefaultShardTimeout when 0).
	ShardTimeout time.Duration
	// Refresh is how often an open page refreshes its data (DefaultRefresh when 0).
	Refresh time.Duration
	// History holds status.due over the last hour; nil shows no history.
	History *History
	// SampleInterval is the History's sampling interval, for the chart's gaps and captions
	// (DefaultSampleInterval when 0).
	SampleInterval time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Logger receives errors reading RenderQueues.
	Logger logr.Logger
}

// handler serves the console's pages, fragments and JSON.
type handler struct {
	src      *source
	history  *History
	interval time.Duration
	refresh  time.Duration
	now      func() time.Time
	log      logr.Logger
	pages    map[string]*template.Template
	mux      *http.ServeMux
}

// pageNames are the page templates; each is parsed with layout.html and fragments.html.
var pageNames = []string{"queues", "queue", "row", "notfound", "error", "login"}

// NewHandler returns the console's HTTP handler (without authentication; see Server):
//
//	GET /                                    the queues page
//	GET /queues/{namespace}/{name}           one queue (404 page when there is none)
//	GET /queues/{namespace}/{name}/rows?key= what the queue's shards know of one row
//	GET /api/v1/queues                       the queues as JSON
//	GET /api/v1/queues/{namespace}/{name}    one queue as JSON
//	GET /api/v1/queues/{namespace}/{name}/rows?key=  the same of one row as JSON
//	GET /static/...                          the embedded stylesheet and script
//
// A page asked with ?format=fragments answers JSON {"now": …, "fragments": {id: html}}: what
// the page's script swaps in every Refresh. Every link is relative, so the console works under
// any path prefix (kubectl port-forward, the API server's service proxy).
func NewHandler(o HandlerOptions) (http.Handler, error) {
	h, err := newHandler(o)
	if err != nil {
		return nil, err
	}
	return h, nil
}

func newHandler(o HandlerOptions) (*handler, error) {
	if o.Reader == nil || o.ShardURL == nil {
		return nil, errors.New("console: HandlerOptions.Reader and ShardURL are required")
	}
	h := &handler{
		src: &source{reader: o.Reader, shardURL: o.ShardURL, hc: o.HTTPClient, shardClient: o.ShardClient, shardToken: o.ShardToken,
			timeout: o.ShardTimeout},
		history:  o.History,
		interval: o.SampleInterval,
		refresh:  o.Refresh,
		now:      o.Now,
		log:      o.Logger,
		pages:    map[string]*template.Template{},
		mux:      http.NewServeMux(),
	}
	if h.src.hc == nil {
		h.src.hc = http.DefaultClient
	}
	if h.src.timeout <= 0 {
		h.src.timeout = DefaultShardTimeout
	}
	if h.interval <= 0 {
		h.interval = DefaultSampleInterval
	}
	if h.refresh <= 0 {
		h.refresh = DefaultRefresh
	}
	if h.now == nil {
		h.now = time.Now
	}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(view.TemplateFuncs()).ParseFS(templateFS,
			"templates/layout.html", "templates/fragments.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: parsing the %s page: %w", name, err)
		}
		h.pages[name] = t
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, fmt.Errorf("console: static files: %w", err)
	}
	files := http.StripPrefix("/static/", http.FileServerFS(static))
	h.mux.Handle("GET /static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	}))
	h.mux.HandleFunc("GET /{$}", h.queuesPage)
	h.mux.HandleFunc("GET /queues/{namespace}/{name}", h.queuePage)
	h.mux.HandleFunc("GET /queues/{namespace}/{name}/rows", h.rowsPage)
	h.mux.HandleFunc("GET /api/v1/queues", h.queuesJSON)
	h.mux.HandleFunc("GET /api/v1/queues/{namespace}/{name}", h.queueJSON)
	h.mux.HandleFunc("GET /api/v1/queues/{namespace}/{name}/rows", h.rowsJSON)
	h.mux.HandleFunc("/", h.notFound)
	return h, nil
}

// ServeHTTP sets the security headers and routes the request.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	setSecurityHeaders(w)
	h.mux.ServeHTTP(w, r)
}

// setSecurityHeaders forbids anything but the console's own script and styles, framing and
// caching of pages.
func setSecurityHeaders(w http.ResponseWriter) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cache-Control", "no-store")
}

// page is what every page template gets.
type page struct {
	// Title of the page.
	Title string
	// Root is the relative path from the page to the console's root ("./", "../../").
	Root string
	// Refresh is the refresh interval in milliseconds; 0 for a page that does not refresh.
	Refresh int64
	Now     time.Time
	// Interval is the history's sampling interval.
	Interval time.Duration
	// Data is the page's own data.
	Data any
}

// render executes a page template into a buffer first, so that a template error is a clean 500
// rather than half a page.
func (h *handler) render(w http.ResponseWriter, status int, name string, p page) {
	var buf bytes.Buffer
	if err := h.pages[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		h.log.Error(err, "Rendering a console page failed", "page", name)
		http.Error(w, "rendering the page failed: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// renderFragments answers the JSON of a page's fragments.
func (h *handler) renderFragments(w http.ResponseWriter, name string, ids []string, p page) {
	out := struct {
		Now       time.Time         `json:"now"`
		Fragments map[string]string `json:"fragments"`
	}{Now: p.Now, Fragments: map[string]string{}}
	for _, id := range ids {
		var buf bytes.Buffer
		if err := h.pages[name].ExecuteTemplate(&buf, "frag-"+id, p); err != nil {
			h.log.Error(err, "Rendering a console fragment failed", "page", name, "fragment", id)
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "rendering fragment " + id + " failed: " + err.Error()})
			return
		}
		out.Fragments[id] = buf.String()
	}
	writeJSON(w, http.StatusOK, out)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		http.Error(w, "encoding the reply failed: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// Fragment ids of each page, in the order they appear.
var (
	queuesFragments = []string{"queues"}
	queueFragments  = []string{"summary", "shards", "coming", "history", "classes", "lateness", "membership"}
)

func (h *handler) queuesPage(w http.ResponseWriter, r *http.Request) {
	p := page{Title: "RenderQueues", Root: "./", Now: h.now().UTC(), Refresh: h.refresh.Milliseconds(), Interval: h.interval}
	rqs, err := h.src.queues(r.Context())
	if err != nil {
		h.unavailable(w, r, p.Root, err)
		return
	}
	list := make([]view.QueueSummary, 0, len(rqs))
	for i := range rqs {
		list = append(list, view.Summarize(&rqs[i]))
	}
	p.Data = list
	if r.URL.Query().Get("format") == "fragments" {
		h.renderFragments(w, "queues", queuesFragments, p)
		return
	}
	h.render(w, http.StatusOK, "queues", p)
}

// detail builds the one-queue view: the RenderQueue, every shard asked now, the history.
func (h *handler) detail(ctx context.Context, namespace, name string) (*view.QueueView, error) {
	rq, err := h.src.queue(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	reports := h.src.shards(ctx, rq)
	now := h.now().UTC()
	var hist []view.Sample
	if h.history != nil {
		hist = h.history.Samples(namespace, name, now)
	}
	return view.NewQueueView(view.Detail(rq, reports, hist, now), h.interval), nil
}

func (h *handler) queuePage(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	p := page{Title: "RenderQueue " + ns + "/" + name, Root: "../../", Now: h.now().UTC(), Refresh: h.refresh.Milliseconds(), Interval: h.interval}
	v, err := h.detail(r.Context(), ns, name)
	switch {
	case errors.Is(err, errQueueNotFound):
		if r.URL.Query().Get("format") == "fragments" {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("RenderQueue %s/%s not found", ns, name)})
			return
		}
		h.render(w, http.StatusNotFound, "notfound", page{Title: "Not found", Root: p.Root, Now: p.Now,
			Data: fmt.Sprintf("There is no RenderQueue %q in namespace %q (or the operator cannot see it).", name, ns)})
		return
	case err != nil:
		h.unavailable(w, r, p.Root, err)
		return
	}
	p.Now = v.Now
	p.Data = v
	if r.URL.Query().Get("format") == "fragments" {
		h.renderFragments(w, "queue", queueFragments, p)
		return
	}
	h.render(w, http.StatusOK, "queue", p)
}

func (h *handler) queuesJSON(w http.ResponseWriter, r *http.Request) {
	rqs, err := h.src.queues(r.Context())
	if err != nil {
		h.log.Error(err, "Reading RenderQueues for the console failed")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	out := struct {
		Now    time.Time           `json:"now"`
		Queues []view.QueueSummary `json:"queues"`
	}{Now: h.now().UTC(), Queues: make([]view.QueueSummary, 0, len(rqs))}
	for i := range rqs {
		out.Queues = append(out.Queues, view.Summarize(&rqs[i]))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *handler) queueJSON(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	v, err := h.detail(r.Context(), ns, name)
	switch {
	case errors.Is(err, errQueueNotFound):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("RenderQueue %s/%s not found", ns, name)})
	case err != nil:
		h.log.Error(err, "Reading a RenderQueue for the console failed", logkeys.Namespace, ns, logkeys.RenderQueue, name)
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
	default:
		writeJSON(w, http.StatusOK, v.QueueDetail)
	}
}

// notFound answers every path the console does not serve.
func (h *handler) notFound(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.Path) >= 5 && r.URL.Path[:5] == "/api/" {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such endpoint: " + r.URL.Path})
		return
	}
	h.render(w, http.StatusNotFound, "notfound", page{Title: "Not found", Root: rootOf(r.URL.Path), Now: h.now().UTC(),
		Data: fmt.Sprintf("The console has no page %s.", r.URL.Path)})
}

// unavailable answers a page whose RenderQueues could not be read (the cache is not synced, the
// API server is away): 503, saying so.
func (h *handler) unavailable(w http.ResponseWriter, r *http.Request, root string, err error) {
	h.log.Error(err, "Reading RenderQueues for the console failed", "path", r.URL.Path)
	if r.URL.Query().Get("format") == "fragments" {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	h.render(w, http.StatusServiceUnavailable, "error", page{Title: "Unavailable", Root: root, Now: h.now().UTC(),
		Data: "The console cannot read RenderQueues right now: " + err.Error()})
}

// rootOf is the relative path from a request path to the console root: "/" → "./",
// "/a/b" → "../", "/a/b/c" → "../../".
func rootOf(path string) string {
	depth := 0
	for i := 1; i < len(path); i++ {
		if path[i] == '/' {
			depth++
		}
	}
	if depth == 0 {
		return "./"
	}
	root := ""
	for range depth {
		root += "../"
	}
	return root
}
