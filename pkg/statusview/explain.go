package statusview

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/specs"
	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// Explained is what the shards of a queue said of one key: the answer of the shard that owns
// the key's slot (or of the one that answered, when the owner could not be asked), and the hops
// on the way there.
type Explained struct {
	// Row is the answer shown.
	Row *shardapi.RowExplanation
	// Hops says, in order, which shards were asked before the one that answered and what came
	// of it ("web-shard-0: slot 456 is web-shard-1's"), or why the owner could not be asked.
	Hops []string
}

// Refusal is a shard's refusal that ends an explanation at once: the key is not valid (400), no
// row has it (404), or the token is wrong (401). Its Error is the shard's message.
type Refusal struct {
	Code    int
	Message string
}

func (r *Refusal) Error() string { return r.Message }

// refusal is err as a *Refusal when it is a shard's 400, 401 or 404.
func refusal(err error) (*Refusal, bool) {
	var se *client.StatusError
	if errors.As(err, &se) && (se.Code == http.StatusNotFound || se.Code == http.StatusBadRequest || se.Code == http.StatusUnauthorized) {
		return &Refusal{Code: se.Code, Message: se.Message}, true
	}
	return nil, false
}

// ShardAsker asks one shard what it knows of a key (client.ExplainRow).
type ShardAsker struct {
	Name string
	Ask  func(ctx context.Context) (*shardapi.RowExplanation, error)
}

// ExplainFrom asks the shards in order until one answers, then the owner of the key's slot when
// that is another shard (owner gives its asker from the owner's name and URL, false when it
// cannot be asked); a key no row has, a bad key or a wrong token stop at once with the shard's
// *Refusal. `renderqueue explain` and the console's search both go this way.
func ExplainFrom(ctx context.Context, key string, order []ShardAsker, owner func(name, url string) (ShardAsker, bool)) (Explained, error) {
	if why := schedule.KeyProblem(key); why != "" {
		return Explained{}, &Refusal{Code: http.StatusBadRequest, Message: "not a valid key: " + why}
	}
	var out Explained
	var errs []error
	for _, t := range order {
		e, err := t.Ask(ctx)
		if err != nil {
			if r, ok := refusal(err); ok {
				return Explained{}, r
			}
			errs = append(errs, fmt.Errorf("%s: %w", t.Name, err))
			out.Hops = append(out.Hops, fmt.Sprintf("%s did not answer: %v", t.Name, err))
			continue
		}
		out.Row = e
		if e.Owner == "" || e.Owner == e.Shard {
			return out, nil
		}
		o, ok := owner(e.Owner, e.OwnerURL)
		if !ok {
			out.Hops = append(out.Hops, fmt.Sprintf("%s's slot %d is %s's, which could not be asked (no address known): %s answered", key, e.Slot, e.Owner, e.Shard))
			return out, nil
		}
		oe, err := o.Ask(ctx)
		if err != nil {
			if r, ok := refusal(err); ok && r.Code == http.StatusNotFound {
				return Explained{}, r
			}
			out.Hops = append(out.Hops, fmt.Sprintf("the owner %s did not answer (%v): %s answered", e.Owner, err, e.Shard))
			return out, nil
		}
		out.Hops = append(out.Hops, fmt.Sprintf("asked %s first: slot %d is %s's", e.Shard, e.Slot, e.Owner))
		out.Row = oe
		return out, nil
	}
	if len(errs) == 0 {
		return Explained{}, errors.New("no shard to ask")
	}
	return Explained{}, fmt.Errorf("no shard answered: %w", errors.Join(errs...))
}

// ExplainAt asks the shards at the base URLs urls, in order, with hc and the API token, what
// they know of key (GET /v1/rows), following the owner of the key's slot to its URL
// (`renderqueue explain --url`).
func ExplainAt(ctx context.Context, hc *http.Client, urls []string, key, token string) (Explained, error) {
	at := func(name, u string) ShardAsker {
		return ShardAsker{Name: name, Ask: func(ctx context.Context) (*shardapi.RowExplanation, error) {
			return client.ExplainRow(ctx, hc, u, token, key, false)
		}}
	}
	order := make([]ShardAsker, len(urls))
	for i, u := range urls {
		order[i] = at(u, u)
	}
	return ExplainFrom(ctx, key, order, func(name, u string) (ShardAsker, bool) { return at(name, u), u != "" })
}

// ReadQueueToken reads the API token of RenderQueue namespace/name's shards from the Secret the
// operator made for it (<name>-api-token, key "token") with cfg's credentials: the user needs
// get on that Secret.
func ReadQueueToken(ctx context.Context, cfg *rest.Config, namespace, name string) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", fmt.Errorf("building a Kubernetes client: %w", err)
	}
	secret := specs.TokenSecretName(&rqv1.RenderQueue{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}})
	sec, err := cs.CoreV1().Secrets(namespace).Get(ctx, secret, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading the shards' API token from Secret %s/%s (or give --token-file): %w", namespace, secret, err)
	}
	tok := strings.TrimSpace(string(sec.Data[specs.TokenKey]))
	if tok == "" {
		return "", fmt.Errorf("secret %s/%s has no %q", namespace, secret, specs.TokenKey)
	}
	return tok, nil
}

// ExplainInQueue asks the shards of RenderQueue namespace/name what they know of key, through
// the API server's Pod proxy with cfg's credentials (as LoadQueue reads their status) and the
// shards' API token, which the Pod proxy passes on in shardapi.ProxiedAuthorizationHeader: the
// shards in the order of the RenderQueue's status until one answers, then the owner of the key's
// slot (`kubectl renderqueue explain NAME KEY`). The user needs get on renderqueues and
// create/get on pods/proxy; token is the Secret's (ReadQueueToken). Each shard is asked within
// timeout.
func ExplainInQueue(ctx context.Context, cfg *rest.Config, namespace, name, key, token string, timeout time.Duration) (Explained, error) {
	rq, err := getRenderQueue(ctx, cfg, namespace, name)
	if err != nil {
		return Explained{}, err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return Explained{}, fmt.Errorf("building an HTTP client for the API server: %w", err)
	}
	targets := map[string]ShardAsker{}
	var order []ShardAsker
	for _, s := range rq.Status.Shards {
		base := podProxyURL(cfg.Host, namespace, s, rq.Spec.TLSEnabled())
		t := ShardAsker{Name: s.Name, Ask: func(ctx context.Context) (*shardapi.RowExplanation, error) {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			return client.ExplainRow(ctx, hc, base, token, key, true)
		}}
		targets[s.Name] = t
		order = append(order, t)
	}
	if len(order) == 0 {
		return Explained{}, fmt.Errorf("renderqueue %s/%s has no shards in its status yet", namespace, name)
	}
	return ExplainFrom(ctx, key, order, func(owner, _ string) (ShardAsker, bool) {
		t, ok := targets[owner]
		return t, ok
	})
}

// Line is one line of an explanation for people: a label, its text, and notes below it.
type Line struct {
	Label string
	Text  string
	Notes []string
}

// ExplainLines is what a shard said of a row, for people, line by line: WriteExplained prints
// them, the console shows them.
func ExplainLines(ex Explained) []Line {
	e := ex.Row
	asOf := e.AsOf
	var out []Line
	add := func(label, text string, notes ...string) {
		out = append(out, Line{Label: label, Text: text, Notes: notes})
	}
	add("key", e.Key)
	switch e.Owner {
	case e.Shard:
		add("shard", fmt.Sprintf("%s, owner of slot %d (membership epoch %d)", e.Shard, e.Slot, e.Epoch), ex.Hops...)
	case "":
		add("shard", fmt.Sprintf("%s answered; no shard owns slot %d (membership epoch %d)", e.Shard, e.Slot, e.Epoch), ex.Hops...)
	default:
		add("shard", fmt.Sprintf("%s answered; slot %d is %s's (membership epoch %d)", e.Shard, e.Slot, e.Owner, e.Epoch), ex.Hops...)
	}
	held := "not held"
	if e.Held {
		held = "held"
	}
	add("state", fmt.Sprintf("%s, %s: %s", e.State, held, e.Reason))
	r := e.Row
	due := "unscheduled (no due time)"
	if r.Due != nil {
		due = "due " + stamp(*r.Due)
	}
	from := "as held"
	if !e.Held {
		from = "in PostgreSQL"
	}
	urgent := ""
	if r.Urgent {
		urgent = ", urgent"
	}
	add("row", fmt.Sprintf("%s: %s, cadence %s, route %s, source %s%s, rev %d", from, due, Seconds(r.Cadence), orDash(r.Route), r.Source, urgent, r.Rev))
	if e.LateSeconds != nil {
		word := "late"
		late := *e.LateSeconds
		if late < 0 {
			word, late = "early (not due yet)", -late
		}
		add("lateness", fmt.Sprintf("%s %s (%.2f cadences), score %.3f", Seconds(late), word, *e.LateRelative, *e.Score))
	}
	if l := e.Lease; l != nil {
		since := "taken over with the slot (granted by its earlier owner)"
		if l.Since != nil {
			since = fmt.Sprintf("granted %s ago (%s)", Seconds(asOf.Sub(*l.Since).Seconds()), stamp(*l.Since))
		}
		text := fmt.Sprintf("%s, %s, ends in %s (%s)", l.ID, since, Seconds(l.Expires.Sub(asOf).Seconds()), stamp(l.Expires))
		if l.Completing {
			text += ", its completion being written"
		}
		add("lease", text)
	}
	if f := e.Fence; f != nil {
		until := "until its earlier owner's leases are known"
		if f.Until != nil {
			until = "until " + stamp(*f.Until)
		}
		add("fence", fmt.Sprintf("slot %s hands out nothing %s (%s)", f.Slots, until, f.Reason))
	}
	if k := e.Rank; k != nil {
		urgentAhead := ""
		if k.AheadUrgent > 0 {
			urgentAhead = fmt.Sprintf(" (%s of them urgent)", num(k.AheadUrgent))
		}
		add("rank", fmt.Sprintf("%s ahead of it%s, of the shard's %s claimable due rows", num(k.Ahead), urgentAhead, num(k.Due)), k.Note)
	}
	if c := e.Estimate; c != nil {
		rate := fmt.Sprintf("%.3g rows/s over the last %s", c.ClaimRate, Seconds(c.ClaimRateSeconds))
		if c.ClaimRateSeconds == 0 {
			rate = "none measured yet"
		}
		if c.At != nil {
			add("claim", fmt.Sprintf("in about %s (%s), at %s", Seconds(*c.InSeconds), stamp(*c.At), rate), c.Method)
		} else {
			add("claim", fmt.Sprintf("no estimate: %s (claims: %s)", c.Why, rate), c.Method)
		}
	}
	add("as of", stamp(asOf))
	return out
}

// WriteExplained prints what a shard said of a row, for people (ExplainLines).
func WriteExplained(w io.Writer, ex Explained) error {
	p := &printer{w: w}
	for _, l := range ExplainLines(ex) {
		p.f("%-8s %s\n", l.Label, l.Text)
		for _, n := range l.Notes {
			p.f("         (%s)\n", n)
		}
	}
	return p.err
}
