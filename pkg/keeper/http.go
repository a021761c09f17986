package keeper

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/renderqueue/renderqueue/pkg/keeper/core"
	"github.com/renderqueue/renderqueue/pkg/keeper/httpserve"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// HandlerOptions configure the shard's HTTP API.
type HandlerOptions struct {
	// Token is the bearer token required on the mutating endpoints (/v1/claim, /v1/complete,
	// /v1/release, /v1/extend), on /v1/handover and on /v1/rows/{key}. Empty means no authentication (only with --insecure-no-auth).
	Token string
	// Gatherer serves /metrics; nil serves no metrics.
	Gatherer prometheus.Gatherer
	// Limits bound the requests the mutating endpoints handle at once; zero fields take the
	// defaults (see httpserve.Limits).
	Limits httpserve.Limits
}

// Handler returns the shard's HTTP API: POST /v1/claim, /v1/complete, /v1/release, /v1/extend,
// /v1/handover (for the other shards of the queue), GET /v1/rows/{key} (or /v1/rows?key=),
// /v1/status, /metrics, /healthz, /readyz.
func (s *Shard) Handler(opts HandlerOptions) http.Handler {
	mux := http.NewServeMux()
	adm := httpserve.NewAdmission(opts.Limits)
	a := &api{s: s}
	// auth guards a mutating endpoint: the bearer token first, then the admission (claims in a
	// room of their own, which writes and uploads cannot take).
	auth := func(h http.HandlerFunc) http.HandlerFunc { return httpserve.Bearer(opts.Token, adm.Write(h)) }
	mux.HandleFunc("POST /v1/claim", httpserve.Bearer(opts.Token, adm.Claim(a.serveClaim)))
	mux.HandleFunc("POST /v1/complete", auth(a.serveComplete))
	mux.HandleFunc("POST /v1/release", auth(a.serveRelease))
	mux.HandleFunc("POST /v1/extend", auth(a.serveExtend))
	mux.HandleFunc("POST /v1/handover", auth(a.serveHandover))
	// explaining a row reads no body but may read the store: the writes' room, and the token in
	// either header (the Pod proxy of `kubectl renderqueue explain` drops Authorization)
	rows := httpserve.BearerOrProxied(opts.Token, shardapi.ProxiedAuthorizationHeader, adm.Write(a.serveRow))
	mux.HandleFunc("GET /v1/rows/{key}", rows)
	mux.HandleFunc("GET /v1/rows/{$}", rows) // an empty key: refused with a reason
	mux.HandleFunc("GET /v1/rows", rows)
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) {
		a.codec.WriteJSON(w, http.StatusOK, s.RecentStatus(StatusMaxAge))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		a.codec.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.Ready() {
			httpserve.WriteError(w, http.StatusServiceUnavailable, "loading: the first walk has not finished")
			return
		}
		a.codec.WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	if opts.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{}))
	}
	return mux
}

// api serves the shard's endpoints of one Handler, whose requests share codec's buffers.
type api struct {
	s     *Shard
	codec httpserve.Codec
}

func (a *api) serveClaim(w http.ResponseWriter, r *http.Request) {
	s := a.s
	var req shardapi.ClaimRequest
	if !a.codec.Decode(w, r, &req) {
		return
	}
	if req.N < 1 || req.N > shardapi.MaxClaim {
		httpserve.WriteError(w, http.StatusBadRequest, fmt.Sprintf("n must be within 1..%d, got %d", shardapi.MaxClaim, req.N))
		return
	}
	leaseFor, err := httpserve.LeaseSeconds(req.LeaseSeconds)
	if err != nil {
		httpserve.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	rows, err := s.Claim(s.clock(), req.N, leaseFor)
	if err != nil {
		httpserve.WriteError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	resp := shardapi.ClaimResponse{Items: make([]shardapi.ClaimedRow, len(rows))}
	for i, c := range rows {
		resp.Items[i] = shardapi.ClaimedRow{
			Key: c.Key, Due: c.Due, Cadence: c.Cadence.Seconds(), Route: c.Route, Source: c.Source.String(),
			Urgent: c.Urgent, Lease: httpserve.FormatLease(c.Lease), LeaseExpires: c.LeaseExpires,
		}
	}
	a.codec.WriteJSON(w, http.StatusOK, resp)
}

// parseItems validates the items of a complete or release request.
func parseItems(keys []string, leases []string, nextDue []*time.Time) ([]CompleteItem, error) {
	if len(keys) == 0 {
		return nil, errors.New("items is empty")
	}
	if len(keys) > shardapi.MaxClaim {
		return nil, fmt.Errorf("%d items, over the limit of %d", len(keys), shardapi.MaxClaim)
	}
	seen := make(map[string]int, len(keys))
	items := make([]CompleteItem, len(keys))
	var problems []string
	for i, k := range keys {
		if why := schedule.KeyProblem(k); why != "" {
			problems = append(problems, fmt.Sprintf("item %d: %s", i, why))
		}
		if j, dup := seen[k]; dup {
			problems = append(problems, fmt.Sprintf("item %d: same key as item %d", i, j))
		}
		seen[k] = i
		tok, err := httpserve.ParseLease(leases[i])
		if err != nil {
			problems = append(problems, fmt.Sprintf("item %d: %v", i, err))
		}
		items[i] = CompleteItem{Key: k, Lease: tok}
		if nextDue != nil && nextDue[i] != nil {
			d := *nextDue[i]
			if why := schedule.DueProblem(d); why != "" {
				problems = append(problems, fmt.Sprintf("item %d: nextDue: %s", i, why))
			}
			items[i].NextDue = &d
		}
	}
	if len(problems) > 0 {
		if len(problems) > 10 {
			problems = append(problems[:10], fmt.Sprintf("and %d more", len(problems)-10))
		}
		return nil, errors.New(strings.Join(problems, "; "))
	}
	return items, nil
}

func itemResults(items []CompleteItem, errs []error) ([]shardapi.ItemResult, int) {
	out := make([]shardapi.ItemResult, len(items))
	ok := 0
	for i := range items {
		out[i].Key = items[i].Key
		if errs[i] != nil {
			out[i].Error = errs[i].Error()
			out[i].MovedTo = movedURL(errs[i])
		} else {
			ok++
		}
	}
	return out, ok
}

// movedURL is the URL an item's lease moved to (MovedError), or "".
func movedURL(err error) string {
	var moved *MovedError
	if errors.As(err, &moved) {
		return moved.URL
	}
	return ""
}

// writeLeaseError answers a complete, release or extend request that was not handled: 503 with
// Retry-After when it may be sent again (a handover this shard awaits, a write that failed).
func writeLeaseError(w http.ResponseWriter, err error) {
	if errors.Is(err, ErrHandoverPending) || errors.Is(err, core.ErrRowNotRead) {
		w.Header().Set("Retry-After", "1")
	}
	httpserve.WriteError(w, http.StatusServiceUnavailable, err.Error())
}

func (a *api) serveComplete(w http.ResponseWriter, r *http.Request) {
	s := a.s
	var req shardapi.CompleteRequest
	if !a.codec.Decode(w, r, &req) {
		return
	}
	keys, leases, dues := make([]string, len(req.Items)), make([]string, len(req.Items)), make([]*time.Time, len(req.Items))
	for i, it := range req.Items {
		keys[i], leases[i], dues[i] = it.Key, it.Lease, it.NextDue
	}
	items, err := parseItems(keys, leases, dues)
	if err != nil {
		httpserve.WriteError(w, http.StatusBadRequest, "nothing completed: "+err.Error())
		return
	}
	errs, err := s.Complete(r.Context(), items)
	if err != nil {
		writeLeaseError(w, err)
		return
	}
	res, ok := itemResults(items, errs)
	a.codec.WriteJSON(w, http.StatusOK, shardapi.CompleteResponse{Completed: ok, Results: res})
}

// parseLeases validates the items of a release or extend request.
func parseLeases(in []shardapi.Lease) ([]CompleteItem, error) {
	keys, leases := make([]string, len(in)), make([]string, len(in))
	for i, it := range in {
		keys[i], leases[i] = it.Key, it.Lease
	}
	return parseItems(keys, leases, nil)
}

func (a *api) serveRelease(w http.ResponseWriter, r *http.Request) {
	s := a.s
	var req shardapi.ReleaseRequest
	if !a.codec.Decode(w, r, &req) {
		return
	}
	items, err := parseLeases(req.Items)
	if err != nil {
		httpserve.WriteError(w, http.StatusBadRequest, "nothing released: "+err.Error())
		return
	}
	errs, err := s.Release(s.clock(), items)
	if err != nil {
		writeLeaseError(w, err)
		return
	}
	res, ok := itemResults(items, errs)
	a.codec.WriteJSON(w, http.StatusOK, shardapi.ReleaseResponse{Released: ok, Results: res})
}

// serveHandover answers another shard's ask for the leases of slots it took over (Handover).
func (a *api) serveHandover(w http.ResponseWriter, r *http.Request) {
	s := a.s
	var req shardapi.HandoverRequest
	if !a.codec.Decode(w, r, &req) {
		return
	}
	resp, err := s.Handover(s.clock(), req)
	if err != nil {
		httpserve.WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	a.codec.WriteJSON(w, http.StatusOK, resp)
}

func (a *api) serveExtend(w http.ResponseWriter, r *http.Request) {
	s := a.s
	var req shardapi.ExtendRequest
	if !a.codec.Decode(w, r, &req) {
		return
	}
	leaseFor, err := httpserve.LeaseSeconds(req.LeaseSeconds)
	if err != nil {
		httpserve.WriteError(w, http.StatusBadRequest, "nothing extended: "+err.Error())
		return
	}
	items, err := parseLeases(req.Items)
	if err != nil {
		httpserve.WriteError(w, http.StatusBadRequest, "nothing extended: "+err.Error())
		return
	}
	expires, errs, err := s.Extend(s.clock(), items, leaseFor)
	if err != nil {
		writeLeaseError(w, err)
		return
	}
	resp := shardapi.ExtendResponse{Results: make([]shardapi.ExtendResult, len(items))}
	for i := range items {
		resp.Results[i].Key = items[i].Key
		if errs[i] != nil {
			resp.Results[i].Error = errs[i].Error()
			resp.Results[i].MovedTo = movedURL(errs[i])
			continue
		}
		resp.Results[i].LeaseExpires = &expires[i]
		resp.Extended++
	}
	a.codec.WriteJSON(w, http.StatusOK, resp)
}

// serveRow explains one row: GET /v1/rows/{key}, the key escaped as one path segment, or GET
// /v1/rows?key=KEY (for proxies that unescape paths, as the kube-apiserver's Pod proxy does).
func (a *api) serveRow(w http.ResponseWriter, r *http.Request) {
	key, inPath := r.PathValue("key"), r.URL.Path != "/v1/rows"
	q, inQuery := r.URL.Query()["key"]
	switch {
	case inPath && inQuery:
		httpserve.WriteError(w, http.StatusBadRequest, "give the key in the path or as ?key=, not both")
		return
	case !inPath && len(q) != 1:
		httpserve.WriteError(w, http.StatusBadRequest, "give one key: GET /v1/rows/{key} (escaped as one path segment) or /v1/rows?key=")
		return
	case !inPath:
		key = q[0]
	}
	if why := schedule.KeyProblem(key); why != "" {
		httpserve.WriteError(w, http.StatusBadRequest, "not a valid key: "+why)
		return
	}
	e, err := a.s.ExplainRow(r.Context(), key)
	var noRow *NoRowError
	switch {
	case errors.As(err, &noRow):
		httpserve.WriteError(w, http.StatusNotFound, err.Error())
	case err != nil:
		httpserve.WriteError(w, http.StatusServiceUnavailable, err.Error())
	default:
		a.codec.WriteJSON(w, http.StatusOK, e)
	}
}
