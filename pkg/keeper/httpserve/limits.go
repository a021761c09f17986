package httpserve

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Limits bound what the shard's HTTP server holds for its clients: how long a request may take
// to arrive and its reply to leave, how long an idle keep-alive connection is kept, and how many
// requests (and how many body bytes) the mutating endpoints handle at once. Zero fields take the
// Default* values.
//
// Claims have a room of their own (Admission): a claim's body (at most MaxClaimBodyBytes) is read
// before it takes any room, and complete, release and extend requests, whose bodies reserve their
// declared length before they are read, cannot take the claims' room: a stalled or oversized
// upload delays other uploads at worst, never claims.
type Limits struct {
	// ReadHeaderTimeout bounds reading a request's headers.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included, on the endpoints that do not
	// set a body deadline of their own.
	ReadTimeout time.Duration
	// BodyTimeout bounds reading the body of a claim, complete, release or extend request from
	// the moment its headers have been read (capped by ReadTimeout): a body that does not arrive
	// in time is answered 408 and its connection closed. It does not depend on the idle timeout.
	BodyTimeout time.Duration
	// WriteTimeout bounds the time from the end of a request's headers to the end of its reply.
	// It must exceed the longest a completion may wait for its group commit.
	WriteTimeout time.Duration
	// IdleTimeout is how long a keep-alive connection may wait for its next request.
	IdleTimeout time.Duration
	// MaxConnectionAge retires connections: a request on a connection open that long is answered
	// with "Connection: close" (over HTTP/2, GOAWAY), so the connection closes gracefully after
	// its reply and its client opens another (NewServer).
	MaxConnectionAge time.Duration
	// MaxConnections caps the open connections: one accepted beyond it is answered 503 with
	// Retry-After and closed (Listen).
	MaxConnections int
	// MaxHeaderBytes bounds a request's headers.
	MaxHeaderBytes int
	// MaxInFlightClaims is how many claims are handled at once, once their bodies have arrived;
	// more are answered 503 with Retry-After. Other requests cannot take this room.
	MaxInFlightClaims int
	// MaxInFlight is how many complete, release and extend requests are read and handled at
	// once; more are answered 503 with Retry-After before their bodies are read.
	MaxInFlight int
	// MaxInFlightBytes bounds the body bytes of those: each reserves its Content-Length
	// (MaxRequestBytes when it has none) while it runs, and a request that does not fit is
	// answered 503 with Retry-After before its body is read. At least MaxRequestBytes, so any
	// single request fits.
	MaxInFlightBytes int64
	// RetryAfter is the Retry-After of those 503 replies.
	RetryAfter time.Duration
}

// Defaults of Limits.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultBodyTimeout       = 10 * time.Second
	DefaultWriteTimeout      = 90 * time.Second // completions wait up to a minute for their commit
	DefaultIdleTimeout       = 30 * time.Second
	DefaultMaxConnectionAge  = 5 * time.Minute
	DefaultMaxConnections    = 4096
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultMaxInFlightClaims = 64
	DefaultMaxInFlight       = 64
	DefaultMaxInFlightBytes  = 64 << 20
	DefaultRetryAfter        = time.Second
)

// MaxClaimBodyBytes bounds the body of a claim request ({"n":…,"leaseSeconds":…}: a few dozen
// bytes). A claim declaring more is refused (413) before anything is read; a claim's body is read
// before it is admitted, so what claims being read hold is bounded by the open connections (and
// HTTP/2 streams) at this size each.
const MaxClaimBodyBytes = 1 << 10

func (l Limits) withDefaults() Limits {
	set := func(d *time.Duration, def time.Duration) {
		if *d <= 0 {
			*d = def
		}
	}
	set(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	set(&l.ReadTimeout, DefaultReadTimeout)
	set(&l.BodyTimeout, DefaultBodyTimeout)
	set(&l.WriteTimeout, DefaultWriteTimeout)
	set(&l.IdleTimeout, DefaultIdleTimeout)
	set(&l.MaxConnectionAge, DefaultMaxConnectionAge)
	set(&l.RetryAfter, DefaultRetryAfter)
	setInt := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	setInt(&l.MaxHeaderBytes, DefaultMaxHeaderBytes)
	setInt(&l.MaxConnections, DefaultMaxConnections)
	setInt(&l.MaxInFlightClaims, DefaultMaxInFlightClaims)
	setInt(&l.MaxInFlight, DefaultMaxInFlight)
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
	}{{"read header timeout", l.ReadHeaderTimeout}, {"read timeout", l.ReadTimeout}, {"body timeout", l.BodyTimeout},
		{"write timeout", l.WriteTimeout}, {"idle timeout", l.IdleTimeout}, {"max connection age", l.MaxConnectionAge},
		{"retry after", l.RetryAfter}} {
		if d.v < 0 {
			return fmt.Errorf("%s %v is negative", d.name, d.v)
		}
	}
	switch {
	case l.MaxConnections < 0:
		return fmt.Errorf("max connections %d is negative", l.MaxConnections)
	case l.MaxHeaderBytes < 0:
		return fmt.Errorf("max header bytes %d is negative", l.MaxHeaderBytes)
	case l.MaxInFlight < 0:
		return fmt.Errorf("max in-flight requests %d is negative", l.MaxInFlight)
	case l.MaxInFlightClaims < 0:
		return fmt.Errorf("max in-flight claims %d is negative", l.MaxInFlightClaims)
	case l.MaxInFlightBytes < 0:
		return fmt.Errorf("max in-flight bytes %d is negative", l.MaxInFlightBytes)
	}
	return nil
}

// NewServer returns an HTTP server for h (the shard's Handler built with the same limits) with
// the timeouts and header limit of l, which retires its connections at l.MaxConnectionAge. Serve
// it a listener from Listen, which caps the open connections (and serves TLS). Over HTTP/2 a
// connection carries at most MaxConcurrentStreams requests at once.
func NewServer(h http.Handler, l Limits) *http.Server {
	l = l.withDefaults()
	return &http.Server{
		Handler:           retire(h, l.MaxConnectionAge),
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
		ConnContext:       connContext,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: MaxConcurrentStreams},
	}
}

// MaxConcurrentStreams is how many requests one HTTP/2 connection (TLS) carries at once; a client
// with more opens another connection.
const MaxConcurrentStreams = 64

// Admission admits the mutating endpoints' requests (Claim, Write) to their rooms (see Limits):
// claims by count once their bodies are in; complete, release and extend requests by count and
// declared body bytes before their bodies are read. Each endpoint has a body limit: a request
// declaring more is refused (413) before it takes anything. Every body is read under a deadline
// of its own (Limits.BodyTimeout).
type Admission struct {
	l              Limits
	mu             sync.Mutex
	claims, writes int
	bytes          int64
	bufs           sync.Pool // of *[]byte, for claims' bodies
}

// NewAdmission returns the admission of l (zero fields take the defaults).
func NewAdmission(l Limits) *Admission { return &Admission{l: l.withDefaults()} }

// Claim admits claims to h: a body of at most MaxClaimBodyBytes, read before the claim takes one
// of MaxInFlightClaims.
func (a *Admission) Claim(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !refuseDeclared(w, r, MaxClaimBodyBytes) {
			return
		}
		rc := a.bodyDeadline(w)
		bp := a.buffer()
		defer a.bufs.Put(bp)
		body, ok := readSmallBody(w, r.Body, MaxClaimBodyBytes, bp)
		if !ok {
			return
		}
		_ = rc.SetReadDeadline(time.Time{}) // the body is in: no deadline while it is handled
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		if !a.take(w, &a.claims, a.l.MaxInFlightClaims, 0, "claims") {
			return
		}
		defer a.give(&a.claims, 0)
		h(w, r)
	}
}

// Write admits complete, release and extend requests (and GET /v1/rows/{key}, without a body) to h: a body of at most MaxRequestBytes,
// whose declared length (MaxRequestBytes when undeclared) is reserved from MaxInFlightBytes with
// one of MaxInFlight before it is read.
func (a *Admission) Write(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !refuseDeclared(w, r, MaxRequestBytes) {
			return
		}
		size := r.ContentLength
		if size < 0 {
			size = MaxRequestBytes
		}
		if !a.take(w, &a.writes, a.l.MaxInFlight, size, "complete, release, extend and row requests") {
			return
		}
		defer a.give(&a.writes, size)
		r.Body = &deadlineOnEOF{ReadCloser: r.Body, rc: a.bodyDeadline(w)}
		h(w, r)
	}
}

// refuseDeclared answers 413 (and closes the connection) when r declares a body over limit.
func refuseDeclared(w http.ResponseWriter, r *http.Request, limit int64) bool {
	if r.ContentLength <= limit {
		return true
	}
	closeUnread(w)
	WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body of %d bytes is over the %d bytes this endpoint takes", r.ContentLength, limit))
	return false
}

// bodyDeadline sets the deadline of the request's body, from now (its headers have arrived). A
// ResponseWriter without a connection (a test's recorder) has none.
func (a *Admission) bodyDeadline(w http.ResponseWriter) *http.ResponseController {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(min(a.l.BodyTimeout, a.l.ReadTimeout)))
	return rc
}

// take admits a request to the room count (at most most), reserving bytes of the byte budget, or
// answers 503 with Retry-After (closing the connection when the body is left unread).
func (a *Admission) take(w http.ResponseWriter, count *int, most int, bytes int64, what string) bool {
	a.mu.Lock()
	ok := *count < most && a.bytes+bytes <= a.l.MaxInFlightBytes
	if ok {
		*count++
		a.bytes += bytes
	}
	n, b := *count, a.bytes
	a.mu.Unlock()
	if ok {
		return true
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(max(1, a.l.RetryAfter.Round(time.Second)/time.Second))))
	msg := fmt.Sprintf("busy: %d %s in flight (at most %d); retry after %v", n, what, most, a.l.RetryAfter)
	if bytes > 0 {
		closeUnread(w) // refused before its body is read
		msg = fmt.Sprintf("busy: %d %s with %d body bytes in flight (at most %d and %d bytes); retry after %v",
			n, what, b, most, a.l.MaxInFlightBytes, a.l.RetryAfter)
	}
	WriteError(w, http.StatusServiceUnavailable, msg)
	return false
}

// give returns what take took.
func (a *Admission) give(count *int, bytes int64) {
	a.mu.Lock()
	*count--
	a.bytes -= bytes
	a.mu.Unlock()
}

// closeUnread makes the reply to a request whose body is left unread close its connection. Else
// the server would read what is left of the body (up to 256 KiB) before it sends the reply, and a
// client that stalls its body would wait for its refusal until the read deadline.
func closeUnread(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
}

// buffer returns a buffer for a claim's body.
func (a *Admission) buffer() *[]byte {
	if bp, ok := a.bufs.Get().(*[]byte); ok {
		return bp
	}
	b := make([]byte, 0, MaxClaimBodyBytes+1)
	return &b
}

// readSmallBody reads a body of at most limit bytes into *bp (grown as needed) and returns it, or
// answers the request: 413 when the body is longer, 408 when it does not arrive by its deadline
// (and the connection is closed), 400 when it ends before its declared length.
func readSmallBody(w http.ResponseWriter, body io.Reader, limit int64, bp *[]byte) ([]byte, bool) {
	buf := (*bp)[:0]
	defer func() { *bp = buf[:0] }()
	for {
		if int64(len(buf)) > limit {
			closeUnread(w)
			WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over the %d bytes this endpoint takes", limit))
			return nil, false
		}
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, 4<<10)
		}
		n, err := body.Read(buf[len(buf):min(cap(buf), int(limit)+1)])
		buf = buf[:len(buf)+n]
		switch {
		case err == io.EOF:
			if int64(len(buf)) > limit {
				continue // refused above
			}
			return buf, true
		case err != nil:
			writeBodyError(w, err)
			return nil, false
		}
	}
}

// writeBodyError answers a request whose body could not be read: 408 (and the connection closed)
// when it did not arrive in time, 400 when it ended before its declared length, 413 when it is
// over the limit, 400 otherwise.
func writeBodyError(w http.ResponseWriter, err error) {
	var netErr net.Error
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &netErr) && netErr.Timeout():
		w.Header().Set("Connection", "close")
		WriteError(w, http.StatusRequestTimeout, "the request body did not arrive in time")
	case errors.Is(err, io.ErrUnexpectedEOF):
		WriteError(w, http.StatusBadRequest, "the request body ended before its Content-Length")
	case errors.As(err, &tooBig):
		WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", tooBig.Limit))
	default:
		WriteError(w, http.StatusBadRequest, "reading the request body: "+err.Error())
	}
}

// deadlineOnEOF clears the connection's read deadline once the body has been read to its end, so
// that a request waiting for its reply (a completion's commit) is not cut by the body's deadline.
type deadlineOnEOF struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (d *deadlineOnEOF) Read(p []byte) (int, error) {
	n, err := d.ReadCloser.Read(p)
	if err == io.EOF && !d.done {
		d.done = true
		_ = d.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}
