package keeper

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// MaxRequestBytes bounds the body of every API request. It is sized so that a complete or
// release of a full claim batch (shardapi.MaxClaim items) fits with keys of the longest length
// (schedule.MaxKeyBytes) and a nextDue each: about 2,150 bytes per item.
const MaxRequestBytes = 24 << 20

// MaxLease is the longest lease a claim may ask for.
const MaxLease = 24 * time.Hour

// HandlerOptions configure the shard's HTTP API.
type HandlerOptions struct {
	// Token is the bearer token required on the mutating endpoints (/v1/claim, /v1/complete,
	// /v1/release, /v1/extend). Empty means no authentication (only with --insecure-no-auth).
	Token string
	// Gatherer serves /metrics; nil serves no metrics.
	Gatherer prometheus.Gatherer
	// Limits bound the requests the mutating endpoints handle at once; zero fields take the
	// defaults (see Limits).
	Limits Limits
}

// Handler returns the shard's HTTP API: POST /v1/claim, /v1/complete, /v1/release, /v1/extend,
// GET /v1/status, /metrics, /healthz, /readyz.
func (s *Shard) Handler(opts HandlerOptions) http.Handler {
	mux := http.NewServeMux()
	lim := newInFlight(opts.Limits.withDefaults())
	// auth guards a mutating endpoint: the bearer token first, then the in-flight limits.
	auth := func(h http.HandlerFunc) http.HandlerFunc {
		h = lim.wrap(h)
		if opts.Token == "" {
			return h
		}
		want := []byte("Bearer " + opts.Token)
		return func(w http.ResponseWriter, r *http.Request) {
			got := []byte(r.Header.Get("Authorization"))
			if subtle.ConstantTimeCompare(got, want) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="renderqueue"`)
				writeError(w, http.StatusUnauthorized, "missing or wrong bearer token")
				return
			}
			h(w, r)
		}
	}
	mux.HandleFunc("POST /v1/claim", auth(s.serveClaim))
	mux.HandleFunc("POST /v1/complete", auth(s.serveComplete))
	mux.HandleFunc("POST /v1/release", auth(s.serveRelease))
	mux.HandleFunc("POST /v1/extend", auth(s.serveExtend))
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.RecentStatus(StatusMaxAge))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.Ready() {
			writeError(w, http.StatusServiceUnavailable, "loading: the first walk has not finished")
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	if opts.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{}))
	}
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(v); err != nil {
		http.Error(w, `{"error":"encoding the reply failed"}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, shardapi.Error{Error: msg})
}

// decode reads a JSON body strictly: size-limited, no unknown fields, one value. A request
// whose "items" array holds more than shardapi.MaxClaim items is refused as soon as the item
// after the last allowed one starts, without reading or decoding the rest of the body.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	body := http.MaxBytesReader(w, r.Body, MaxRequestBytes)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	var err error
	if items, ok := itemsField(v); ok {
		err = decodeWithItems(dec, v, items)
	} else {
		err = dec.Decode(v)
	}
	if err != nil {
		var tooBig *http.MaxBytesError
		var tooMany errTooManyItems
		var netErr net.Error
		switch {
		case errors.As(err, &tooBig):
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", MaxRequestBytes))
		case errors.As(err, &tooMany):
			writeError(w, http.StatusRequestEntityTooLarge, err.Error())
		case errors.As(err, &netErr) && netErr.Timeout():
			writeError(w, http.StatusRequestTimeout, "the request body did not arrive in time")
		case errors.Is(err, io.EOF):
			writeError(w, http.StatusBadRequest, "empty request body: want a JSON object")
		default:
			writeError(w, http.StatusBadRequest, "malformed JSON body: "+err.Error())
		}
		return false
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "malformed JSON body: more than one JSON value")
		return false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, "malformed JSON body: trailing data after the JSON object")
		return false
	}
	return true
}

// errTooManyItems refuses a request whose items array is longer than shardapi.MaxClaim.
type errTooManyItems struct{}

func (errTooManyItems) Error() string {
	return fmt.Sprintf("more than %d items: a request carries at most %d (the largest claim)", shardapi.MaxClaim, shardapi.MaxClaim)
}

// itemsField returns the field of the struct *v that holds the "items" array, if it has one.
func itemsField(v any) (reflect.Value, bool) {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.Elem().Kind() != reflect.Struct {
		return reflect.Value{}, false
	}
	st := rv.Elem().Type()
	for i := range st.NumField() {
		name, _, _ := strings.Cut(st.Field(i).Tag.Get("json"), ",")
		if name == "items" && st.Field(i).Type.Kind() == reflect.Slice {
			return rv.Elem().Field(i), true
		}
	}
	return reflect.Value{}, false
}

// decodeWithItems decodes one JSON object into v, reading the array of its "items" member
// element by element into items (at most shardapi.MaxClaim of them) and every other member as
// encoding/json would (strictly: dec's settings apply to both).
func decodeWithItems(dec *json.Decoder, v any, items reflect.Value) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("want a JSON object, got %v", tok)
	}
	rest := []byte{'{'}
	seenItems := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		name := tok.(string) // object keys are strings; the decoder checks the syntax
		var raw json.RawMessage
		if !strings.EqualFold(name, "items") {
			if err := dec.Decode(&raw); err != nil {
				return err
			}
			if len(rest) > 1 {
				rest = append(rest, ',')
			}
			key, _ := json.Marshal(name)
			rest = append(append(append(rest, key...), ':'), raw...)
			continue
		}
		if seenItems {
			return errors.New(`"items" given twice`)
		}
		seenItems = true
		if err := decodeItems(dec, items); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return err
	}
	// the other members, strictly; Decode leaves items alone (it is not among them)
	rest = append(rest, '}')
	strict := json.NewDecoder(bytes.NewReader(rest))
	strict.DisallowUnknownFields()
	return strict.Decode(v)
}

// decodeItems reads a JSON array (or null) element by element into the slice items.
func decodeItems(dec *json.Decoder, items reflect.Value) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok == nil {
		items.SetZero()
		return nil
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return fmt.Errorf(`"items" must be an array, got %v`, tok)
	}
	out := reflect.MakeSlice(items.Type(), 0, 16)
	elem := items.Type().Elem()
	for dec.More() {
		if out.Len() == shardapi.MaxClaim {
			return errTooManyItems{}
		}
		p := reflect.New(elem)
		if err := dec.Decode(p.Interface()); err != nil {
			return fmt.Errorf("item %d: %w", out.Len(), err)
		}
		out = reflect.Append(out, p.Elem())
	}
	if _, err := dec.Token(); err != nil { // the closing ']'
		return err
	}
	items.Set(out)
	return nil
}

func (s *Shard) serveClaim(w http.ResponseWriter, r *http.Request) {
	var req shardapi.ClaimRequest
	if !decode(w, r, &req) {
		return
	}
	if req.N < 1 || req.N > shardapi.MaxClaim {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("n must be within 1..%d, got %d", shardapi.MaxClaim, req.N))
		return
	}
	leaseFor, err := leaseSeconds(req.LeaseSeconds)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	rows, err := s.Claim(s.clock(), req.N, leaseFor)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	resp := shardapi.ClaimResponse{Items: make([]shardapi.ClaimedRow, len(rows))}
	for i, c := range rows {
		resp.Items[i] = shardapi.ClaimedRow{
			Key: c.Key, Due: c.Due, Cadence: c.Cadence.Seconds(), Route: c.Route, Source: c.Source.String(),
			Urgent: c.Urgent, Lease: FormatLease(c.Lease), LeaseExpires: c.LeaseExpires,
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

// leaseSeconds checks a request's leaseSeconds (0 = the shard's default) and converts it.
func leaseSeconds(sec float64) (time.Duration, error) {
	if math.IsNaN(sec) || sec < 0 || sec > MaxLease.Seconds() {
		return 0, fmt.Errorf("leaseSeconds must be within 0..%v (0 = the default), got %v", MaxLease.Seconds(), sec)
	}
	d := time.Duration(sec * float64(time.Second))
	if sec > 0 && d < time.Millisecond {
		return 0, fmt.Errorf("leaseSeconds %v is below one millisecond", sec)
	}
	return d, nil
}

// FormatLease and ParseLease convert lease tokens to and from their wire form.
func FormatLease(token uint64) string { return fmt.Sprintf("%016x", token) }

// ParseLease parses a lease token's wire form.
func ParseLease(s string) (uint64, error) {
	if len(s) != 16 {
		return 0, fmt.Errorf("lease %q is not 16 hex digits", s)
	}
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("lease %q is not 16 hex digits", s)
	}
	return v, nil
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
		tok, err := ParseLease(leases[i])
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
		} else {
			ok++
		}
	}
	return out, ok
}

func (s *Shard) serveComplete(w http.ResponseWriter, r *http.Request) {
	var req shardapi.CompleteRequest
	if !decode(w, r, &req) {
		return
	}
	keys, leases, dues := make([]string, len(req.Items)), make([]string, len(req.Items)), make([]*time.Time, len(req.Items))
	for i, it := range req.Items {
		keys[i], leases[i], dues[i] = it.Key, it.Lease, it.NextDue
	}
	items, err := parseItems(keys, leases, dues)
	if err != nil {
		writeError(w, http.StatusBadRequest, "nothing completed: "+err.Error())
		return
	}
	errs, err := s.Complete(r.Context(), items)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	res, ok := itemResults(items, errs)
	writeJSON(w, http.StatusOK, shardapi.CompleteResponse{Completed: ok, Results: res})
}

// parseLeases validates the items of a release or extend request.
func parseLeases(in []shardapi.Lease) ([]CompleteItem, error) {
	keys, leases := make([]string, len(in)), make([]string, len(in))
	for i, it := range in {
		keys[i], leases[i] = it.Key, it.Lease
	}
	return parseItems(keys, leases, nil)
}

func (s *Shard) serveRelease(w http.ResponseWriter, r *http.Request) {
	var req shardapi.ReleaseRequest
	if !decode(w, r, &req) {
		return
	}
	items, err := parseLeases(req.Items)
	if err != nil {
		writeError(w, http.StatusBadRequest, "nothing released: "+err.Error())
		return
	}
	res, ok := itemResults(items, s.Release(s.clock(), items))
	writeJSON(w, http.StatusOK, shardapi.ReleaseResponse{Released: ok, Results: res})
}

func (s *Shard) serveExtend(w http.ResponseWriter, r *http.Request) {
	var req shardapi.ExtendRequest
	if !decode(w, r, &req) {
		return
	}
	leaseFor, err := leaseSeconds(req.LeaseSeconds)
	if err != nil {
		writeError(w, http.StatusBadRequest, "nothing extended: "+err.Error())
		return
	}
	items, err := parseLeases(req.Items)
	if err != nil {
		writeError(w, http.StatusBadRequest, "nothing extended: "+err.Error())
		return
	}
	expires, errs := s.Extend(s.clock(), items, leaseFor)
	resp := shardapi.ExtendResponse{Results: make([]shardapi.ExtendResult, len(items))}
	for i := range items {
		resp.Results[i].Key = items[i].Key
		if errs[i] != nil {
			resp.Results[i].Error = errs[i].Error()
			continue
		}
		resp.Results[i].LeaseExpires = &expires[i]
		resp.Extended++
	}
	writeJSON(w, http.StatusOK, resp)
}
