package httpserve

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Limits bound what the shard's HTTP server holds for its clients: how long a request may take
// to arrive and its reply to leave, how long an idle keep-alive connection is kept, and how many
// requests (and how many body bytes) the mutating endpoints handle at once. Zero fields take the
// Default* values.
type Limits struct {
	// ReadHeaderTimeout bounds reading a request's headers.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included: a stalled body is cut off and
	// its connection closed.
	ReadTimeout time.Duration
	// WriteTimeout bounds the time from the end of a request's headers to the end of its reply.
	// It must exceed the longest a completion may wait for its group commit.
	WriteTimeout time.Duration
	// IdleTimeout is how long a keep-alive connection may wait for its next request.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers.
	MaxHeaderBytes int
	// MaxInFlight is how many claim, complete and release requests are handled at once; more
	// are answered 503 with Retry-After at once, before their bodies are read.
	MaxInFlight int
	// MaxInFlightBytes bounds the body bytes of the requests handled at once: each reserves its
	// Content-Length (MaxRequestBytes when it has none) while it runs, and a request that does
	// not fit is answered 503 with Retry-After before its body is read. At least
	// MaxRequestBytes, so any single request fits.
	MaxInFlightBytes int64
	// RetryAfter is the Retry-After of those 503 replies.
	RetryAfter time.Duration
}

// Defaults of Limits.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 90 * time.Second // completions wait up to a minute for their commit
	DefaultIdleTimeout       = 30 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultMaxInFlight       = 64
	DefaultMaxInFlightBytes  = 64 << 20
	DefaultRetryAfter        = time.Second
)

func (l Limits) withDefaults() Limits {
	set := func(d *time.Duration, def time.Duration) {
		if *d <= 0 {
			*d = def
		}
	}
	set(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	set(&l.ReadTimeout, DefaultReadTimeout)
	set(&l.WriteTimeout, DefaultWriteTimeout)
	set(&l.IdleTimeout, DefaultIdleTimeout)
	set(&l.RetryAfter, DefaultRetryAfter)
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if l.MaxInFlight <= 0 {
		l.MaxInFlight = DefaultMaxInFlight
	}
	if l.MaxInFlightBytes <= 0 {
		l.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	l.MaxInFlightBytes = max(l.MaxInFlightBytes, MaxRequestBytes)
	return l
}

// Validate says what is wrong with explicitly set limits (negative values).
func (l Limits) Validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"read header timeout", l.ReadHeaderTimeout}, {"read timeout", l.ReadTimeout}, {"write timeout", l.WriteTimeout},
		{"idle timeout", l.IdleTimeout}, {"retry after", l.RetryAfter}} {
		if d.v < 0 {
			return fmt.Errorf("%s %v is negative", d.name, d.v)
		}
	}
	switch {
	case l.MaxHeaderBytes < 0:
		return fmt.Errorf("max header bytes %d is negative", l.MaxHeaderBytes)
	case l.MaxInFlight < 0:
		return fmt.Errorf("max in-flight requests %d is negative", l.MaxInFlight)
	case l.MaxInFlightBytes < 0:
		return fmt.Errorf("max in-flight bytes %d is negative", l.MaxInFlightBytes)
	}
	return nil
}

// NewServer returns an HTTP server for h (the shard's Handler built with the same limits) with
// the timeouts and header limit of l.
func NewServer(h http.Handler, l Limits) *http.Server {
	l = l.withDefaults()
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
}

// InFlight admits requests up to a count and a byte budget (Limits.MaxInFlight and
// MaxInFlightBytes).
type InFlight struct {
	l     Limits
	mu    sync.Mutex
	n     int
	bytes int64
}

// NewInFlight returns the admission of l (zero fields take the defaults).
func NewInFlight(l Limits) *InFlight { return &InFlight{l: l.withDefaults()} }

// Wrap admits a request to h when it fits, and answers 503 with Retry-After when it does not
// (413 when its declared body is over MaxRequestBytes).
func (f *InFlight) Wrap(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		size := r.ContentLength
		if size > MaxRequestBytes {
			WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body of %d bytes is over %d bytes", size, MaxRequestBytes))
			return
		}
		if size < 0 {
			size = MaxRequestBytes
		}
		f.mu.Lock()
		ok := f.n < f.l.MaxInFlight && f.bytes+size <= f.l.MaxInFlightBytes
		if ok {
			f.n++
			f.bytes += size
		}
		n, b := f.n, f.bytes
		f.mu.Unlock()
		if !ok {
			w.Header().Set("Retry-After", strconv.Itoa(int(max(1, f.l.RetryAfter.Round(time.Second)/time.Second))))
			WriteError(w, http.StatusServiceUnavailable, fmt.Sprintf(
				"busy: %d requests with %d body bytes in flight (at most %d and %d bytes); retry after %v",
				n, b, f.l.MaxInFlight, f.l.MaxInFlightBytes, f.l.RetryAfter))
			return
		}
		defer func() {
			f.mu.Lock()
			f.n--
			f.bytes -= size
			f.mu.Unlock()
		}()
		h(w, r)
	}
}
