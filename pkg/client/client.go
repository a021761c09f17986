package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/renderqueue/renderqueue/pkg/client/clientmetrics"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/shardapi/wire"
)

// MaxReplyBytes bounds every reply body the client reads. The largest replies are a claim of
// shardapi.MaxClaim rows with the longest keys and routes (about 26 MB) and a status (tens of
// kilobytes, more with many routes).
const MaxReplyBytes = 32 << 20

// DefaultBackoff is the per-shard back-off after an empty claim, a 503 or an error: 100 ms,
// doubling up to 5 s, each wait up to 50% longer at random.
var DefaultBackoff = Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: math.MaxInt32, Cap: 5 * time.Second}

// Options configure a Client. Discovery is required; the zero value of the others gives the
// defaults.
type Options struct {
	// Discovery finds the shards (package discovery: Static, DNS, RenderQueue).
	Discovery Discovery
	// Token is the bearer token of the shards' API (the Secret <name>-api-token, key "token");
	// empty sends none (shards run with --insecure-no-auth).
	Token string
	// HTTPClient makes the requests. Default: a client with a 30 s timeout (NewHTTPClient with
	// TLS when it is set).
	HTTPClient *http.Client
	// TLS says how shards that serve HTTPS (https:// URLs) are verified, when HTTPClient is
	// nil. Without it, https:// URLs are verified against the system's roots.
	TLS *TLSOptions
	// Batch is the most rows one claim asks for (1..shardapi.MaxClaim). Default 10. Run claims
	// no more than it has idle handlers.
	Batch int
	// Lease is the lease asked for with every claim and extension; 0 takes the shard's default
	// (the RenderQueue's spec.leaseDuration).
	Lease time.Duration
	// Backoff is the per-shard back-off (see DefaultBackoff, the default when Duration is 0).
	Backoff Backoff
	// DrainTimeout is how long Run lets rows in progress finish once its context is cancelled;
	// then their handlers' contexts are cancelled (cause ErrShutdown). Default 30 s.
	DrainTimeout time.Duration
	// StopTimeout bounds the completions and releases Run sends once its handlers finished after
	// a cancellation. Default 10 s.
	StopTimeout time.Duration
	// Metrics, when set, receives the worker's Prometheus metrics (clientmetrics.New).
	Metrics *clientmetrics.Metrics
	// Log receives the client's log lines (discovery changes, errors). Default: discarded.
	Log logr.Logger
}

// Shard is one keeper shard as a Discovery sees it.
type Shard struct {
	// Name of the shard (<rq>-shard-<i>), or its address when the discovery knows no name.
	Name string
	// URL is the base URL of the shard's HTTP API, e.g. http://10.0.0.7:8080.
	URL string
	// Due is the shard's due count when DueKnown (kube.RenderQueue); claims favour shards with
	// more due rows.
	Due      int64
	DueKnown bool
}

// Item is one claimed row and its lease.
type Item struct {
	Key     string
	Due     time.Time
	Cadence time.Duration
	Route   string
	Source  string
	Urgent  bool
	// Lease identifies the claim; the shard refuses a completion, release or extension without it.
	Lease string
	// LeaseExpires is when the lease lapses (by the shard's clock) unless extended.
	LeaseExpires time.Time
	// Shard is the base URL of the shard that leased the row: completions, releases and
	// extensions go there.
	Shard string

	claimedAt time.Time     // local time the claim was sent
	leaseFor  time.Duration // the lease's length as the shard granted it
}

// Completion is one rendered row for Client.Complete.
type Completion struct {
	Item Item
	// NextDue overrides the row's next render time; zero leaves it to the RenderQueue's
	// reschedule policy (by default the row's own schedule: due + whole cadences).
	NextDue time.Time
}

// Client talks to the keeper shards of one RenderQueue. Create it with New and Close it when done.
// Its methods are safe for concurrent use.
type Client struct {
	opts    Options
	hc      *http.Client
	log     logr.Logger
	cancel  context.CancelFunc
	stopped chan struct{}

	mu      sync.Mutex
	shards  map[string]*shardState // by URL, the current set
	known   bool                   // the discovery delivered a first set
	discErr error                  // the discovery stopped with this error
	changed chan struct{}          // closed (and replaced) when the set changes
	rng     *rand.Rand

	st stats
}

// shardState is a shard and its back-off.
type shardState struct {
	Shard
	backoff   Backoff
	notBefore time.Time // left alone until then
}

// New validates opts and starts following the discovery.
func New(opts Options) (*Client, error) {
	if opts.Discovery == nil {
		return nil, errors.New("client: Options.Discovery is required")
	}
	if opts.Batch == 0 {
		opts.Batch = 10
	}
	if opts.Batch < 1 || opts.Batch > shardapi.MaxClaim {
		return nil, fmt.Errorf("client: batch %d is not within 1..%d", opts.Batch, shardapi.MaxClaim)
	}
	if opts.Lease < 0 || opts.Lease > 24*time.Hour {
		return nil, fmt.Errorf("client: lease %v is not within 0..24h", opts.Lease)
	}
	if opts.Backoff.Duration == 0 {
		opts.Backoff = DefaultBackoff
	}
	if opts.Backoff.Duration < 0 || opts.Backoff.Factor < 0 || opts.Backoff.Jitter < 0 {
		return nil, fmt.Errorf("client: backoff %+v has a negative field", opts.Backoff)
	}
	if opts.DrainTimeout < 0 || opts.StopTimeout < 0 {
		return nil, errors.New("client: negative drain or stop timeout")
	}
	if opts.DrainTimeout == 0 {
		opts.DrainTimeout = 30 * time.Second
	}
	if opts.StopTimeout == 0 {
		opts.StopTimeout = 10 * time.Second
	}
	hc := opts.HTTPClient
	switch {
	case hc != nil:
	case opts.TLS != nil:
		var err error
		if hc, err = NewHTTPClient(*opts.TLS); err != nil {
			return nil, err
		}
	default:
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{
		opts: opts, hc: hc, log: opts.Log, cancel: cancel, stopped: make(chan struct{}),
		shards: map[string]*shardState{}, changed: make(chan struct{}),
		rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
	}
	go func() {
		defer close(c.stopped)
		err := opts.Discovery.Run(ctx, c.setShards)
		if err != nil && ctx.Err() == nil {
			c.log.Error(err, "Shard discovery stopped")
			c.mu.Lock()
			c.discErr = fmt.Errorf("shard discovery stopped: %w", err)
			c.broadcastLocked()
			c.mu.Unlock()
		}
	}()
	return c, nil
}

// Close stops following the discovery. Items already claimed can still be completed or released.
func (c *Client) Close() error {
	c.cancel()
	<-c.stopped
	return nil
}

// setShards is the discovery's callback: the new complete shard set.
func (c *Client) setShards(list []Shard) {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := make(map[string]*shardState, len(list))
	var added, removed []string
	for _, s := range list {
		st, ok := c.shards[s.URL]
		if !ok {
			st = &shardState{backoff: c.opts.Backoff}
			added = append(added, s.URL)
		}
		st.Shard = s
		next[s.URL] = st
	}
	for u := range c.shards {
		if _, ok := next[u]; !ok {
			removed = append(removed, u)
		}
	}
	c.shards = next
	if !c.known || len(added) > 0 || len(removed) > 0 {
		c.log.Info("Shard set changed", "shards", len(next), "added", added, "removed", removed)
	}
	c.known = true
	c.broadcastLocked()
}

func (c *Client) broadcastLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Shards returns the current shard set, by name.
func (c *Client) Shards() []Shard {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Shard, 0, len(c.shards))
	for _, s := range c.shards {
		out = append(out, s.Shard)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Name < out[j].Name || out[i].Name == out[j].Name && out[i].URL < out[j].URL
	})
	return out
}

// waitKnown waits until the discovery delivered a first shard set.
func (c *Client) waitKnown(ctx context.Context) error {
	for {
		c.mu.Lock()
		known, err, ch := c.known, c.discErr, c.changed
		c.mu.Unlock()
		if err != nil {
			return err
		}
		if known {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for the shard discovery: %w", ctx.Err())
		}
	}
}

// candidates returns the shards not backing off at now, in the order to try them: a weighted
// random order (weight due+1 where the due count is known, the mean of the known ones
// otherwise) with the better of the first two first.
func (c *Client) candidates(now time.Time) []*shardState {
	c.mu.Lock()
	defer c.mu.Unlock()
	var sum float64
	var nKnown int
	for _, s := range c.shards {
		if s.DueKnown {
			sum += float64(s.Due) + 1
			nKnown++
		}
	}
	fallback := 1.0
	if nKnown > 0 {
		fallback = sum / float64(nKnown)
	}
	type cand struct {
		s      *shardState
		w, key float64
	}
	var cs []cand
	for _, s := range c.shards {
		if s.notBefore.After(now) {
			continue
		}
		w := fallback
		if s.DueKnown {
			w = float64(s.Due) + 1
		}
		// Efraimidis-Spirakis: sorting by u^(1/w) descending draws a weighted random order
		cs = append(cs, cand{s: s, w: w, key: math.Pow(c.rng.Float64(), 1/w)})
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].key > cs[j].key })
	if len(cs) >= 2 && cs[1].w > cs[0].w {
		cs[0], cs[1] = cs[1], cs[0]
	}
	out := make([]*shardState, len(cs))
	for i := range cs {
		out[i] = cs[i].s
	}
	return out
}

// backOff leaves shard u alone for its next back-off step, or for at least the Retry-After of
// err when the shard gave one.
func (c *Client) backOff(u string, now time.Time, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.shards[u]; ok {
		d := s.backoff.Step()
		if se := (*StatusError)(nil); errors.As(err, &se) {
			d = max(d, se.RetryAfter)
		}
		s.notBefore = now.Add(d)
	}
}

// claimedFrom resets shard u's back-off after it handed out rows.
func (c *Client) claimedFrom(u string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.shards[u]; ok {
		s.backoff, s.notBefore = c.opts.Backoff, time.Time{}
	}
}

// nextTry returns when the first shard backing off may be tried again and a channel closed
// when the shard set changes; ok is false when there is no shard at all.
func (c *Client) nextTry() (at time.Time, changed <-chan struct{}, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.shards {
		if !ok || s.notBefore.Before(at) {
			at, ok = s.notBefore, true
		}
	}
	return at, c.changed, ok
}

// Claim asks the shards for up to n due rows (1..shardapi.MaxClaim) and returns the first
// non-empty answer. Shards are tried in the candidates order; each one that answers with no
// rows, a 503 or an error backs off. It returns no items and no error when every shard it
// asked had nothing due (or all are backing off), no items and an error when no shard answered;
// an answer that retrying cannot fix (400, 401, 403, 404, 405) is returned at once as a
// *StatusError. Claim does not wait; Run does.
func (c *Client) Claim(ctx context.Context, n int) ([]Item, error) {
	if n < 1 || n > shardapi.MaxClaim {
		return nil, fmt.Errorf("claim: n %d is not within 1..%d", n, shardapi.MaxClaim)
	}
	if err := c.waitKnown(ctx); err != nil {
		return nil, err
	}
	cands := c.candidates(time.Now())
	var errs []error
	answered := false
	for _, s := range cands {
		items, err := c.claimFrom(ctx, s.URL, n)
		if ctx.Err() != nil {
			// a claim answered after the caller gave up: hand its rows back at once
			if len(items) > 0 {
				c.releaseAbandoned(ctx, items)
			}
			return nil, ctx.Err()
		}
		if err != nil {
			var se *StatusError
			if errors.As(err, &se) && se.Fatal() {
				c.st.errored(err)
				c.opts.Metrics.Claim("error")
				return nil, err
			}
			if errors.As(err, &se) && se.Code == http.StatusServiceUnavailable {
				c.st.unavailable.Add(1)
				c.opts.Metrics.Claim("unavailable")
			} else {
				c.st.errored(err)
				c.opts.Metrics.Claim("error")
			}
			errs = append(errs, err)
			c.backOff(s.URL, time.Now(), err)
			continue
		}
		answered = true
		c.st.claims.Add(1)
		if len(items) == 0 {
			c.st.empty.Add(1)
			c.opts.Metrics.Claim("empty")
			c.backOff(s.URL, time.Now(), nil)
			continue
		}
		c.st.claimed.Add(int64(len(items)))
		c.opts.Metrics.Claim("rows")
		c.opts.Metrics.Claimed(len(items))
		c.claimedFrom(s.URL)
		return items, nil
	}
	if !answered && len(errs) > 0 {
		return nil, fmt.Errorf("claim: no shard answered: %w", errors.Join(errs...))
	}
	return nil, nil
}

// releaseAbandoned releases rows whose claim answered after its caller had gone.
func (c *Client) releaseAbandoned(ctx context.Context, items []Item) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.StopTimeout)
	defer cancel()
	if _, err := c.Release(rctx, items); err != nil {
		c.log.Error(err, "Releasing rows of an abandoned claim", "rows", len(items))
	}
}

func (c *Client) claimFrom(ctx context.Context, base string, n int) ([]Item, error) {
	var resp shardapi.ClaimResponse
	sent := time.Now()
	hdr, err := c.post(ctx, base, "/v1/claim", shardapi.ClaimRequest{N: n, LeaseSeconds: c.opts.Lease.Seconds()}, &resp)
	if err != nil {
		return nil, err
	}
	// the lease's length by the shard's clock: its expiry minus the reply's Date (a whole
	// second, so rounded up); Options.Lease when set, unless the shard gave less (its longest
	// lease)
	serverNow, derr := http.ParseTime(hdr.Get("Date"))
	items := make([]Item, len(resp.Items))
	for i, r := range resp.Items {
		granted := r.LeaseExpires.Sub(sent)
		if derr == nil {
			granted = r.LeaseExpires.Sub(serverNow) - time.Second
		}
		leaseFor := c.opts.Lease
		if leaseFor == 0 || granted+time.Second < leaseFor {
			leaseFor = granted
		}
		items[i] = Item{
			Key: r.Key, Due: r.Due, Cadence: time.Duration(r.Cadence * float64(time.Second)), Route: r.Route,
			Source: r.Source, Urgent: r.Urgent, Lease: r.Lease, LeaseExpires: r.LeaseExpires, Shard: base,
			claimedAt: sent, leaseFor: max(leaseFor, 0),
		}
	}
	return items, nil
}

// ErrLeaseLost is what an ItemError is: the shard refused the item because its lease is no
// longer current (it expired, was released or completed, or the row left the shard). Nothing was
// done for it; another worker may hold the row now.
var ErrLeaseLost = errors.New("lease is no longer current")

// ItemError is one item a shard refused.
type ItemError struct {
	Key string
	// Reason is the shard's word for it.
	Reason string
	// MovedTo is the base URL of the shard the item's lease moved to with its slot (a handoff
	// committed after the claim), when the shard said so. Complete, Release and Extend send such
	// an item there once themselves; this is set when that shard refused it too, or was the same.
	MovedTo string
}

func (e *ItemError) Error() string { return fmt.Sprintf("%s: %s", e.Key, e.Reason) }

// Is makes errors.Is(err, ErrLeaseLost) true.
func (e *ItemError) Is(target error) bool { return target == ErrLeaseLost }

func itemErrors(results []shardapi.ItemResult) []error {
	out := make([]error, len(results))
	for i, r := range results {
		if r.Error != "" {
			out[i] = &ItemError{Key: r.Key, Reason: r.Error, MovedTo: r.MovedTo}
		}
	}
	return out
}

// byShard groups item indexes by the shard that leased them.
func byShard(n int, shard func(i int) string) map[string][]int {
	groups := map[string][]int{}
	for i := range n {
		s := shard(i)
		groups[s] = append(groups[s], i)
	}
	return groups
}

// maxMoveHops is how many times route follows an item's lease from shard to shard (MovedTo).
const maxMoveHops = 3

// route sends n items, each to the shard that leased it (shardOf), with send, which returns one
// result per item it was given (nil, an *ItemError, or the error of a request that was not
// answered) and the request's error. Then:
//   - an item refused because its lease moved with its slot to another shard (a handoff
//     committed after the claim; ItemError.MovedTo) is sent there, and on from there when it
//     moved again, up to maxMoveHops times;
//   - an item whose shard could not be asked and is no longer one of the queue's (a shard
//     removed after its slots moved away, its leases with them) is sent to the shards the client
//     knows: only the one holding its lease accepts it (to the others the row is not theirs, and
//     nothing is done). Refused by all of them, its lease is lost (an *ItemError).
//
// It returns each item's result and the errors of the requests that left items unanswered.
func (c *Client) route(n int, shardOf func(i int) string, send func(base string, idx []int) []error) ([]error, error) {
	out := make([]error, n)
	sentTo := make([]string, n)
	round := func(groups map[string][]int) {
		for base, idx := range groups {
			res := send(base, idx)
			for j, i := range idx {
				out[i], sentTo[i] = res[j], base
			}
		}
	}
	round(byShard(n, shardOf))
	// A lease can move more than once before its worker completes (two handoffs in a row, the
	// first giver answering with the owner it knows, which has given the slot on again): follow
	// it up to maxMoveHops times, never back to a shard the item was sent to.
	visited := make([][]string, n)
	for i := range visited {
		visited[i] = []string{sentTo[i]}
	}
	for hop := 0; hop < maxMoveHops; hop++ {
		moved := map[string][]int{}
		for i, err := range out {
			var ie *ItemError
			if errors.As(err, &ie) && ie.MovedTo != "" && !slices.Contains(visited[i], ie.MovedTo) {
				moved[ie.MovedTo] = append(moved[ie.MovedTo], i)
				visited[i] = append(visited[i], ie.MovedTo)
			}
		}
		if len(moved) == 0 {
			break
		}
		c.log.V(1).Info("Sending items to the shards their leases moved to", "shards", len(moved), "hop", hop+1)
		round(moved)
	}
	known := map[string]bool{}
	for _, s := range c.Shards() {
		known[s.URL] = true
	}
	var lost []int
	for i, err := range out {
		var ie *ItemError
		if err != nil && !errors.As(err, &ie) && !known[sentTo[i]] {
			lost = append(lost, i)
		}
	}
	if len(lost) > 0 {
		c.log.V(1).Info("Items of a shard that left the queue: asking the shards it knows", "items", len(lost), "shards", len(known))
		refused := make(map[int]error, len(lost)) // the first refusal of each; missing: some shard did not answer
		unanswered := map[int]bool{}
		for base := range known {
			if len(lost) == 0 {
				break
			}
			res := send(base, lost)
			var still []int
			for j, i := range lost {
				var ie *ItemError
				switch {
				case res[j] == nil:
					out[i] = nil
					continue
				case errors.As(res[j], &ie):
					if refused[i] == nil {
						refused[i] = res[j]
					}
				default:
					unanswered[i] = true
				}
				still = append(still, i)
			}
			lost = still
		}
		for _, i := range lost {
			if !unanswered[i] && refused[i] != nil {
				out[i] = refused[i]
			}
		}
	}
	var errs []error
	seen := map[error]bool{}
	for _, err := range out {
		var ie *ItemError
		if err != nil && !errors.As(err, &ie) && !seen[err] {
			seen[err] = true
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

// Complete reports rendered rows, each to the shard that leased it (see route: a lease that
// moved with its slot is followed to its new shard). It returns one error per item (nil:
// completed; an *ItemError: refused) and an error when a shard could not be asked (then its
// items' errors say so too).
func (c *Client) Complete(ctx context.Context, done []Completion) ([]error, error) {
	out, err := c.route(len(done), func(i int) string { return done[i].Item.Shard }, func(base string, idx []int) []error {
		res := make([]error, len(idx))
		req := shardapi.CompleteRequest{Items: make([]shardapi.Completion, len(idx))}
		for j, i := range idx {
			req.Items[j] = shardapi.Completion{Key: done[i].Item.Key, Lease: done[i].Item.Lease}
			if !done[i].NextDue.IsZero() {
				d := done[i].NextDue.UTC()
				req.Items[j].NextDue = &d
			}
		}
		var resp shardapi.CompleteResponse
		_, err := c.post(ctx, base, "/v1/complete", req, &resp)
		if err == nil && len(resp.Results) != len(idx) {
			err = fmt.Errorf("POST %s/v1/complete: %d results for %d items", base, len(resp.Results), len(idx))
		}
		if err != nil {
			for j := range res {
				res[j] = err
			}
			c.st.errored(err)
			c.opts.Metrics.Completion("error", len(idx))
			return res
		}
		copy(res, itemErrors(resp.Results))
		c.st.completed.Add(int64(resp.Completed))
		c.opts.Metrics.Completion("completed", resp.Completed)
		return res
	})
	rejected := 0
	for _, e := range out {
		var ie *ItemError
		if errors.As(e, &ie) {
			rejected++
		}
	}
	c.st.rejected.Add(int64(rejected))
	c.opts.Metrics.Completion("rejected", rejected)
	return out, err
}

// Release hands rows back unrendered, each to the shard that leased it (see route): they can be
// claimed again at once. Errors as for Complete.
func (c *Client) Release(ctx context.Context, items []Item) ([]error, error) {
	return c.route(len(items), func(i int) string { return items[i].Shard }, func(base string, idx []int) []error {
		res := make([]error, len(idx))
		req := shardapi.ReleaseRequest{Items: make([]shardapi.Lease, len(idx))}
		for j, i := range idx {
			req.Items[j] = shardapi.Lease{Key: items[i].Key, Lease: items[i].Lease}
		}
		var resp shardapi.ReleaseResponse
		_, err := c.post(ctx, base, "/v1/release", req, &resp)
		if err == nil && len(resp.Results) != len(idx) {
			err = fmt.Errorf("POST %s/v1/release: %d results for %d items", base, len(resp.Results), len(idx))
		}
		if err != nil {
			for j := range res {
				res[j] = err
			}
			c.st.errored(err)
			return res
		}
		copy(res, itemErrors(resp.Results))
		c.st.released.Add(int64(resp.Released))
		c.opts.Metrics.Release(resp.Released)
		return res
	})
}

// Extend sets the leases of items to expire d from now (0: the shard's default lease; a shard
// gives at most its longest lease, as LeaseExpires says), each on the shard that leased it (see
// route: the returned item's Shard is the shard that extended it, where its lease is now). It
// returns the items with their new LeaseExpires (unchanged where refused) and errors as for
// Complete: an *ItemError means the lease is no longer current and was not extended.
func (c *Client) Extend(ctx context.Context, items []Item, d time.Duration) ([]Item, []error, error) {
	if d < 0 || d > 24*time.Hour {
		return nil, nil, fmt.Errorf("extend: lease %v is not within 0..24h", d)
	}
	out := append([]Item(nil), items...)
	errOut, err := c.route(len(items), func(i int) string { return items[i].Shard }, func(base string, idx []int) []error {
		res := make([]error, len(idx))
		req := shardapi.ExtendRequest{Items: make([]shardapi.Lease, len(idx)), LeaseSeconds: d.Seconds()}
		for j, i := range idx {
			req.Items[j] = shardapi.Lease{Key: items[i].Key, Lease: items[i].Lease}
		}
		var resp shardapi.ExtendResponse
		_, err := c.post(ctx, base, "/v1/extend", req, &resp)
		if err == nil && len(resp.Results) != len(idx) {
			err = fmt.Errorf("POST %s/v1/extend: %d results for %d items", base, len(resp.Results), len(idx))
		}
		if err != nil {
			for j := range res {
				res[j] = err
			}
			c.st.errored(err)
			c.opts.Metrics.Extension("error", len(idx))
			return res
		}
		for j, i := range idx {
			r := resp.Results[j]
			if r.Error != "" || r.LeaseExpires == nil {
				res[j] = &ItemError{Key: r.Key, Reason: r.Error, MovedTo: r.MovedTo}
				continue
			}
			out[i].LeaseExpires, out[i].Shard = *r.LeaseExpires, base
			c.st.extended.Add(1)
			c.opts.Metrics.Extension("extended", 1)
		}
		return res
	})
	for _, e := range errOut {
		var ie *ItemError
		if errors.As(e, &ie) {
			c.opts.Metrics.Extension("refused", 1)
		}
	}
	return out, errOut, err
}

// StatusError is a reply other than 2xx.
type StatusError struct {
	Method, URL string
	Code        int
	// Message is the shard's {"error": ...} (or the start of the body).
	Message string
	// RetryAfter is the reply's Retry-After (a shard over its request limits says how long to
	// wait); 0 when it has none.
	RetryAfter time.Duration
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s %s: %d %s: %s", e.Method, e.URL, e.Code, http.StatusText(e.Code), e.Message)
}

// Fatal reports whether retrying cannot help: the request or the client's setup is wrong (bad
// request, wrong token, wrong URL, a body over the shard's limit).
func (e *StatusError) Fatal() bool {
	switch e.Code {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed,
		http.StatusRequestEntityTooLarge:
		return true
	}
	return false
}

// retryAfter parses a Retry-After header: delay-seconds or an HTTP date (0 when absent or
// malformed, or in the past).
func retryAfter(h string, now time.Time) time.Duration {
	if h == "" {
		return 0
	}
	if n, err := strconv.Atoi(h); err == nil {
		return time.Duration(max(n, 0)) * time.Second
	}
	if t, err := http.ParseTime(h); err == nil {
		return max(t.Sub(now), 0)
	}
	return 0
}

// post sends body as JSON to base+path with the token and decodes a 2xx reply into out. The
// complete and release requests and the claim, complete and release replies take package
// wire's codecs (json.Marshal's and json.Unmarshal's results without reflection).
func (c *Client) post(ctx context.Context, base, path string, body, out any) (http.Header, error) {
	b, err := wire.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encoding the %s request: %w", path, err)
	}
	return do(ctx, c.hc, http.MethodPost, base+path, c.opts.Token, b, out)
}

// do makes one request and decodes a 2xx JSON reply into out.
func do(ctx context.Context, hc *http.Client, method, u, token string, body []byte, out any) (http.Header, error) {
	return doAuth(ctx, hc, method, u, "Authorization", token, body, out)
}

// doAuth is do with the bearer token in header authHeader.
func doAuth(ctx context.Context, hc *http.Client, method, u, authHeader, token string, body []byte, out any) (http.Header, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("building %s %s: %w", method, u, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set(authHeader, "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, u, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := readReply(resp)
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading the reply: %w", method, u, err)
	}
	if len(data) > MaxReplyBytes {
		return nil, fmt.Errorf("%s %s: reply over %d bytes", method, u, MaxReplyBytes)
	}
	if resp.StatusCode/100 != 2 {
		msg := strings.TrimSpace(string(data))
		var e shardapi.Error
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		if len(msg) > 300 {
			msg = msg[:300] + "..."
		}
		return nil, &StatusError{Method: method, URL: u, Code: resp.StatusCode, Message: msg,
			RetryAfter: retryAfter(resp.Header.Get("Retry-After"), time.Now())}
	}
	if err := wire.Unmarshal(data, out); err != nil {
		what := "reply"
		if strings.HasSuffix(u, "/v1/status") {
			what = "status"
		}
		return nil, fmt.Errorf("%s %s: %w the %s: %w", method, u, errDecoding, what, err)
	}
	return resp.Header, nil
}

// readReply reads a reply's body, up to one byte more than MaxReplyBytes, into a buffer sized by
// its Content-Length when it has one.
func readReply(resp *http.Response) ([]byte, error) {
	size := resp.ContentLength + 1
	if size <= 0 || size > MaxReplyBytes+1 {
		size = 512
	}
	b := make([]byte, 0, size)
	r := io.LimitReader(resp.Body, MaxReplyBytes+1)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// GetStatus reads GET <baseURL>/v1/status with hc (no token needed). baseURL may carry a path,
// e.g. the API server's Pod proxy https://apiserver/api/v1/namespaces/NS/pods/NAME:8080/proxy.
func GetStatus(ctx context.Context, hc *http.Client, baseURL string) (*shardapi.Status, error) {
	var st shardapi.Status
	if _, err := do(ctx, hc, http.MethodGet, strings.TrimRight(baseURL, "/")+"/v1/status", "", nil, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// ExplainRow reads what the shard at baseURL knows of key: GET <baseURL>/v1/rows?key=KEY with hc
// and the API token, in the Authorization header or, with proxied, in
// shardapi.ProxiedAuthorizationHeader — through the kube-apiserver's Pod proxy, which drops
// Authorization (baseURL may carry the proxy's path). The key goes in the query, which proxies
// pass on as it is (a path segment's escaped slashes they may unescape). A key no row has is a
// *StatusError of code 404 whose Message says so; a bad key one of code 400.
func ExplainRow(ctx context.Context, hc *http.Client, baseURL, token, key string, proxied bool) (*shardapi.RowExplanation, error) {
	header := "Authorization"
	if proxied {
		header = shardapi.ProxiedAuthorizationHeader
	}
	u := strings.TrimRight(baseURL, "/") + "/v1/rows?key=" + url.QueryEscape(key)
	var e shardapi.RowExplanation
	if _, err := doAuth(ctx, hc, http.MethodGet, u, header, token, nil, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// errDecoding marks a reply that does not decode.
var errDecoding = errors.New("decoding")

// GetShardStatus is GetStatus, checked to come from the shard named name (a Pod IP now used by
// another shard answers for that one). A shard that could not be asked or did not answer (no
// connection, a timeout) is an error starting with "unreachable: "; a reply that is not a status
// of that shard says what it is.
func GetShardStatus(ctx context.Context, hc *http.Client, baseURL, name string) (*shardapi.Status, error) {
	st, err := GetStatus(ctx, hc, baseURL)
	var se *StatusError
	switch {
	case err != nil && (errors.As(err, &se) || errors.Is(err, errDecoding)):
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("unreachable: %w", err)
	case st.Shard != name:
		return nil, fmt.Errorf("%s/v1/status reports shard %q, not %q", strings.TrimRight(baseURL, "/"), st.Shard, name)
	}
	return st, nil
}

// Stats counts what a Client did so far.
type Stats struct {
	// Claims is the claims answered, Claimed the rows they handed out, Empty those with none.
	Claims, Claimed, Empty int64
	// Unavailable counts 503 replies (a shard still loading, or its store down).
	Unavailable int64
	// Completed and Rejected count rows the shards completed and refused to complete.
	Completed, Rejected int64
	// Released counts rows handed back; Extended lease extensions granted.
	Released, Extended int64
	// LeaseLost counts rows whose lease was refused while rendering.
	LeaseLost int64
	// Errors counts failed requests; LastError is the last one.
	Errors    int64
	LastError string
}

type stats struct {
	claims, claimed, empty, unavailable     atomic.Int64
	completed, rejected, released, extended atomic.Int64
	leaseLost, errors                       atomic.Int64
	lastMu                                  sync.Mutex
	last                                    string
}

func (s *stats) errored(err error) {
	s.errors.Add(1)
	s.lastMu.Lock()
	s.last = err.Error()
	s.lastMu.Unlock()
}

// Stats returns the counts so far.
func (c *Client) Stats() Stats {
	c.st.lastMu.Lock()
	last := c.st.last
	c.st.lastMu.Unlock()
	return Stats{
		Claims: c.st.claims.Load(), Claimed: c.st.claimed.Load(), Empty: c.st.empty.Load(),
		Unavailable: c.st.unavailable.Load(), Completed: c.st.completed.Load(), Rejected: c.st.rejected.Load(),
		Released: c.st.released.Load(), Extended: c.st.extended.Load(), LeaseLost: c.st.leaseLost.Load(),
		Errors: c.st.errors.Load(), LastError: last,
	}
}
