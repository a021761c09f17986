package policy

import (
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/controllers/specs"
)

// Blocker is what stops the operator from making the shards what a RenderQueue's spec asks: the
// Reconciled condition's reason and message while it lasts.
type Blocker struct {
	// Reason is the condition's CamelCase reason (InvalidSpec, ImageNotAllowed, ChildConflict,
	// ShardPodRefused).
	Reason string
	// Message says what is wrong and what the operator leaves alone until it is fixed.
	Message string
}

// reconciledCondition is the Reconciled condition for b (nil: nothing blocks).
func reconciledCondition(b *Blocker) Condition {
	if b == nil {
		return Condition{Status: metav1.ConditionTrue, Reason: rqv1.ReasonReconcileSucceeded,
			Message: "the shards' children and Pods are what the spec asks for, or on their way"}
	}
	return Condition{Status: metav1.ConditionFalse, Reason: b.Reason, Message: b.Message}
}

// SpecBlocker is the reason rq must not be acted on at all, nil when it may: the object does not
// decode or breaks a rule of the API (stored before the rule), or its image is neither
// operatorImage (the operator's own, the default) nor allowed. Such a RenderQueue gets no
// children, Pods or membership changes; its existing shards keep running and are still polled,
// so its status stays true.
func SpecBlocker(rq *rqv1.RenderQueue, operatorImage string, allowed ImageAllowlist) *Blocker {
	if err := rq.Validate(); err != nil {
		return &Blocker{Reason: rqv1.ReasonInvalidSpec, Message: fmt.Sprintf(
			"the operator leaves this RenderQueue and its shards as they are until the spec is fixed: %v", err)}
	}
	if img := specs.KeeperImage(rq, operatorImage); img != operatorImage && !allowed.Allows(img) {
		return &Blocker{Reason: rqv1.ReasonImageNotAllowed, Message: fmt.Sprintf(
			"spec.image %q is not among the images the operator runs (--allowed-images %s); no shard Pod is created or replaced until it is",
			img, allowed)}
	}
	return nil
}

// RefusedByAPIServer reports whether err is the API server refusing a request as it is (a
// missing PriorityClass, a quota, an admission policy, an invalid field), which retrying the same
// request will not change, rather than failing to answer it.
func RefusedByAPIServer(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) ||
		apierrors.IsRequestEntityTooLargeError(err)
}

// ImageAllowlist is the set of keeper images the operator runs (--allowed-images). The zero
// value allows every image. An entry is an image reference, compared with spec.image as written
// (no registry or tag is filled in), or a prefix ending in "/*", ":*" or "@*": every image under
// a registry path ("registry.example.com/team/*"), every tag of a repository
// ("registry.example.com/renderqueue:*") or every digest of it ("...renderqueue@*"). A bare
// trailing "*" is refused: "registry.example.com/render*" would also allow
// registry.example.com/renderer-of-someone-else.
type ImageAllowlist struct {
	entries []string
}

// ParseImageAllowlist parses the entries of --allowed-images; none gives the zero value.
func ParseImageAllowlist(entries []string) (ImageAllowlist, error) {
	var a ImageAllowlist
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if strings.ContainsAny(e, " \t\n") {
			return ImageAllowlist{}, fmt.Errorf("allowed image %q contains whitespace", e)
		}
		if i := strings.Index(e, "*"); i >= 0 {
			if i != len(e)-1 || len(e) < 3 || !strings.ContainsAny(e[len(e)-2:len(e)-1], "/:@") {
				return ImageAllowlist{}, fmt.Errorf("allowed image %q: a wildcard may only end an entry, after '/', ':' or '@' "+
					"(e.g. registry.example.com/team/* or registry.example.com/renderqueue:*)", e)
			}
		}
		a.entries = append(a.entries, e)
	}
	return a, nil
}

// Allows reports whether image may run: always when the allowlist is empty.
func (a ImageAllowlist) Allows(image string) bool {
	if len(a.entries) == 0 {
		return true
	}
	for _, e := range a.entries {
		if prefix, ok := strings.CutSuffix(e, "*"); ok {
			if strings.HasPrefix(image, prefix) && len(image) > len(prefix) {
				return true
			}
		} else if image == e {
			return true
		}
	}
	return false
}

// String lists the entries, comma-separated ("(any)" when empty).
func (a ImageAllowlist) String() string {
	if len(a.entries) == 0 {
		return "(any)"
	}
	return strings.Join(a.entries, ",")
}
