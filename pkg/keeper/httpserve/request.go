package httpserve

import (
	"crypto/subtle"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// MaxLease is the longest lease a claim may ask for.
const MaxLease = 24 * time.Hour

// LeaseSeconds checks a request's leaseSeconds (0 = the shard's default) and converts it.
func LeaseSeconds(sec float64) (time.Duration, error) {
	if math.IsNaN(sec) || sec < 0 || sec > MaxLease.Seconds() {
		return 0, fmt.Errorf("leaseSeconds must be within 0..%v (0 = the default), got %v", MaxLease.Seconds(), sec)
	}
	d := time.Duration(sec * float64(time.Second))
	if sec > 0 && d < time.Millisecond {
		return 0, fmt.Errorf("leaseSeconds %v is below one millisecond", sec)
	}
	return d, nil
}

// FormatLease and ParseLease convert lease tokens to and from their wire form: 16 lower-case
// hex digits (fmt's %016x).
func FormatLease(token uint64) string {
	const digits = "0123456789abcdef"
	var b [16]byte
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = digits[token&0xf]
		token >>= 4
	}
	return string(b[:])
}

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

// Bearer guards h with the bearer token token: a request without "Authorization: Bearer
// <token>" is answered 401. An empty token guards nothing (h itself).
func Bearer(token string, h http.HandlerFunc) http.HandlerFunc {
	if token == "" {
		return h
	}
	want := []byte("Bearer " + token)
	return func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			closeUnread(w) // the body is not read
			w.Header().Set("WWW-Authenticate", `Bearer realm="renderqueue"`)
			WriteError(w, http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
		h(w, r)
	}
}

// BearerOrProxied guards h like Bearer, taking the token from the Authorization header or, where
// a proxy cannot pass that header on, from proxiedHeader ("Bearer <token>" in either): the
// kube-apiserver's Pod proxy authenticates its caller with Authorization and drops it. Both are
// compared in constant time. An empty token guards nothing (h itself).
func BearerOrProxied(token, proxiedHeader string, h http.HandlerFunc) http.HandlerFunc {
	if token == "" {
		return h
	}
	want := []byte("Bearer " + token)
	return func(w http.ResponseWriter, r *http.Request) {
		direct := subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want)
		proxied := subtle.ConstantTimeCompare([]byte(r.Header.Get(proxiedHeader)), want)
		if direct|proxied != 1 {
			closeUnread(w)
			w.Header().Set("WWW-Authenticate", `Bearer realm="renderqueue"`)
			WriteError(w, http.StatusUnauthorized, "missing or wrong bearer token")
			return
		}
		h(w, r)
	}
}
