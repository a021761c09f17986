package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/specs"
	rqclient "github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/logkeys"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/statusview"
)

// Explaining a row: the search box of a queue's page asks the queue's shards what they know of
// one key (GET /v1/rows/{key}, as `kubectl renderqueue explain` does), with the shards' API
// token, which the console has only when it is given a ShardTokenFunc (the operator's
// --console-explain: the operator then reads each queue's token Secret).

// ShardTokenFunc gives the API token of rq's shards (GET /v1/rows needs it).
type ShardTokenFunc func(ctx context.Context, rq *rqv1.RenderQueue) (string, error)

// SecretToken reads the token of a queue's shards from the Secret the operator made for it
// (<name>-api-token, key "token") with r, when asked: r is the manager's API reader, which reads
// without a cache, so the operator watches and keeps no Secret.
func SecretToken(r client.Reader) ShardTokenFunc {
	return func(ctx context.Context, rq *rqv1.RenderQueue) (string, error) {
		var sec corev1.Secret
		name := specs.TokenSecretName(rq)
		if err := r.Get(ctx, client.ObjectKey{Namespace: rq.Namespace, Name: name}, &sec); err != nil {
			return "", fmt.Errorf("reading Secret %s/%s: %w", rq.Namespace, name, err)
		}
		tok := strings.TrimSpace(string(sec.Data[specs.TokenKey]))
		if tok == "" {
			return "", fmt.Errorf("secret %s/%s has no %q", rq.Namespace, name, specs.TokenKey)
		}
		return tok, nil
	}
}

// minExplainTimeout bounds a shard's answer about a row at least: one it does not hold is read
// from PostgreSQL (within 5 s).
const minExplainTimeout = 6 * time.Second

// errExplainOff: the console was not given the shards' token.
var errExplainOff = errors.New("explaining a row needs the shards' API token, which this console is not given: " +
	"start the operator with --console-explain and let it read the Secret <queue>-api-token (docs/console.md, \"Explaining a row\"); " +
	"or run `kubectl renderqueue explain NAME KEY`")

// explainError is an explanation that could not be had, with the HTTP status that says why.
type explainError struct {
	code int
	msg  string
}

func (e *explainError) Error() string { return e.msg }

// explain asks rq's shards about key, directly at their Pod addresses with the token: the shards
// in order until one answers, then the owner of the key's slot (statusview.ExplainFrom).
func (s *source) explain(ctx context.Context, rq *rqv1.RenderQueue, key string) (statusview.Explained, error) {
	if why := schedule.KeyProblem(key); why != "" {
		return statusview.Explained{}, &explainError{code: http.StatusBadRequest, msg: "not a valid key: " + why}
	}
	if s.shardToken == nil {
		return statusview.Explained{}, &explainError{code: http.StatusServiceUnavailable, msg: errExplainOff.Error()}
	}
	token, err := s.shardToken(ctx, rq)
	if err != nil {
		return statusview.Explained{}, &explainError{code: http.StatusServiceUnavailable, msg: "the shards' API token: " + err.Error()}
	}
	hc := s.hc
	if s.shardClient != nil {
		if hc, err = s.shardClient(ctx, rq); err != nil {
			return statusview.Explained{}, &explainError{code: http.StatusServiceUnavailable, msg: "no client for the shards: " + err.Error()}
		}
	}
	var pods corev1.PodList
	if err := s.reader.List(ctx, &pods, client.InNamespace(rq.Namespace), client.MatchingLabels{rqv1.LabelQueue: rq.Name}); err != nil {
		return statusview.Explained{}, &explainError{code: http.StatusServiceUnavailable, msg: "listing the shard Pods: " + err.Error()}
	}
	byName := map[string]*corev1.Pod{}
	for i := range pods.Items {
		byName[pods.Items[i].Name] = &pods.Items[i]
	}
	timeout := max(s.timeout, minExplainTimeout)
	askers := map[string]statusview.ShardAsker{}
	var order []statusview.ShardAsker
	var unasked []string
	for _, name := range shardNames(rq) {
		pod := byName[name]
		if pod == nil || pod.DeletionTimestamp != nil {
			unasked = append(unasked, name+": no Pod")
			continue
		}
		base, err := s.shardURL(pod)
		if err != nil {
			unasked = append(unasked, name+": "+err.Error())
			continue
		}
		a := statusview.ShardAsker{Name: name, Ask: func(ctx context.Context) (*shardapi.RowExplanation, error) {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			return rqclient.ExplainRow(ctx, hc, base, token, key, false)
		}}
		askers[name] = a
		order = append(order, a)
	}
	if len(order) == 0 {
		return statusview.Explained{}, &explainError{code: http.StatusServiceUnavailable, msg: "no shard can be asked: " + strings.Join(unasked, "; ")}
	}
	ex, err := statusview.ExplainFrom(ctx, key, order, func(owner, _ string) (statusview.ShardAsker, bool) {
		a, ok := askers[owner]
		return a, ok
	})
	if err != nil {
		code := http.StatusServiceUnavailable
		var r *statusview.Refusal
		if errors.As(err, &r) && r.Code != http.StatusUnauthorized {
			code = r.Code // a bad key, or no row has it; a refused token is the console's problem
		}
		return statusview.Explained{}, &explainError{code: code, msg: err.Error()}
	}
	return ex, nil
}

// rowPage is the data of the row page.
type rowPage struct {
	Namespace, Name string
	// Key is the key asked for ("" before one is).
	Key string
	// Lines are the explanation (statusview.ExplainLines); State its state.
	Lines []statusview.Line
	State string
	// Error says why there is no explanation.
	Error string
}

// explainRow explains key in rq (when one is given) for the page and the JSON: the HTTP status,
// the explanation and the page's data.
func (h *handler) explainRow(ctx context.Context, rq *rqv1.RenderQueue, key string) (int, *statusview.Explained, rowPage) {
	p := rowPage{Namespace: rq.Namespace, Name: rq.Name, Key: key}
	ex, err := h.src.explain(ctx, rq, key)
	if err != nil {
		var ee *explainError
		code := http.StatusServiceUnavailable
		if errors.As(err, &ee) {
			code = ee.code
		}
		if code == http.StatusServiceUnavailable {
			h.log.Error(err, "Explaining a row failed", logkeys.Namespace, rq.Namespace, logkeys.RenderQueue, rq.Name)
		}
		p.Error = err.Error()
		return code, nil, p
	}
	p.Lines, p.State = statusview.ExplainLines(ex), ex.Row.State
	return http.StatusOK, &ex, p
}

// rowsPage is GET /queues/{namespace}/{name}/rows?key=KEY: the search box and what the shards
// know of the key.
func (h *handler) rowsPage(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	p := page{Title: "Explain a row · RenderQueue " + ns + "/" + name, Root: "../../../", Now: h.now().UTC(), Interval: h.interval}
	rq, err := h.src.queue(r.Context(), ns, name)
	switch {
	case errors.Is(err, errQueueNotFound):
		h.render(w, http.StatusNotFound, "notfound", page{Title: "Not found", Root: p.Root, Now: p.Now,
			Data: fmt.Sprintf("There is no RenderQueue %q in namespace %q (or the operator cannot see it).", name, ns)})
		return
	case err != nil:
		h.unavailable(w, r, p.Root, err)
		return
	}
	if !r.URL.Query().Has("key") {
		p.Data = rowPage{Namespace: ns, Name: name}
		h.render(w, http.StatusOK, "row", p)
		return
	}
	code, _, data := h.explainRow(r.Context(), rq, r.URL.Query().Get("key"))
	p.Data = data
	h.render(w, code, "row", p)
}

// rowsJSON is GET /api/v1/queues/{namespace}/{name}/rows?key=KEY: the owner's answer
// (shardapi.RowExplanation) and the shards asked on the way, or {"error": ...}.
func (h *handler) rowsJSON(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	rq, err := h.src.queue(r.Context(), ns, name)
	switch {
	case errors.Is(err, errQueueNotFound):
		writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("RenderQueue %s/%s not found", ns, name)})
		return
	case err != nil:
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	key := r.URL.Query()["key"]
	if len(key) != 1 {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "give one key: ?key=KEY"})
		return
	}
	code, ex, data := h.explainRow(r.Context(), rq, key[0])
	if ex == nil {
		writeJSON(w, code, map[string]string{"error": data.Error})
		return
	}
	writeJSON(w, code, struct {
		Row  *shardapi.RowExplanation `json:"row"`
		Hops []string                 `json:"hops,omitempty"`
	}{ex.Row, ex.Hops})
}
