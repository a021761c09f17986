package client_test

import (
	"context"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/client/clienttest"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

var (
	membershipParse = schedule.ParseSlots
	memstoreHash    = clienttest.Hash
)

func waitBackoff(first time.Duration, factor float64, limit time.Duration) client.Backoff {
	return client.Backoff{Duration: first, Factor: factor, Jitter: 0.5, Steps: math.MaxInt32, Cap: limit}
}

// roundTrip adapts a function to http.RoundTripper.
type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// countClaims counts the claim requests going through the default transport.
func countClaims(n *atomic.Int64) http.RoundTripper {
	return roundTrip(func(r *http.Request) (*http.Response, error) {
		if strings.HasSuffix(r.URL.Path, "/v1/claim") {
			n.Add(1)
		}
		return http.DefaultTransport.RoundTrip(r)
	})
}

// afterClaim calls cancel once the first claim has been answered (before its caller sees it).
func afterClaim(cancel context.CancelFunc) http.RoundTripper {
	var once atomic.Bool
	return roundTrip(func(r *http.Request) (*http.Response, error) {
		resp, err := http.DefaultTransport.RoundTrip(r)
		if strings.HasSuffix(r.URL.Path, "/v1/claim") && once.CompareAndSwap(false, true) {
			cancel()
		}
		return resp, err
	})
}

func portOf(t *testing.T, base string) int {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatal(err)
	}
	return p
}
