package httpserve

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// ConnObserver is told about the server's connections: opened and closed (the open ones), refused
// (over Limits.MaxConnections) and retired (told to close after their reply, past
// Limits.MaxConnectionAge). shardmetrics.Metrics is one; its methods are safe for concurrent use,
// as an observer's must be.
type ConnObserver interface {
	ConnOpened()
	ConnClosed()
	ConnRefused()
	ConnRetired()
}

// Listen wraps ln so that at most l.MaxConnections connections are open at once: a connection
// accepted beyond that is answered at once with 503, Retry-After and a JSON error naming the
// limit, and closed (over TLS when tlsConfig is set: the refusal is sent after the handshake, so
// the client can read it; at most maxRefusing refusals are sent at once, the connections beyond
// those are closed unanswered). With tlsConfig the listener serves TLS, offering HTTP/2 and
// HTTP/1.1 unless tlsConfig names its protocols; serve it with http.Server.Serve. obs (nil: none)
// is told about every connection. A server that serves the listener (NewServer) retires its
// connections at l.MaxConnectionAge and tells obs.
func Listen(ln net.Listener, tlsConfig *tls.Config, l Limits, obs ConnObserver) net.Listener {
	l = l.withDefaults()
	if tlsConfig != nil {
		tlsConfig = tlsConfig.Clone()
		if len(tlsConfig.NextProtos) == 0 {
			tlsConfig.NextProtos = []string{"h2", "http/1.1"}
		}
	}
	cl := &connLimiter{Listener: ln, max: int64(l.MaxConnections), tls: tlsConfig, obs: obs,
		refusing: make(chan struct{}, maxRefusing), retry: l.RetryAfter}
	if tlsConfig != nil {
		return tls.NewListener(cl, tlsConfig)
	}
	return cl
}

// maxRefusing bounds the refusals (connections over the cap) being answered at once.
const maxRefusing = 64

// refusalTimeout bounds answering one refused connection (its TLS handshake, the reply, reading
// what it sent meanwhile).
const refusalTimeout = 2 * time.Second

// connLimiter is Listen's listener before TLS.
type connLimiter struct {
	net.Listener
	max      int64
	open     atomic.Int64
	tls      *tls.Config
	obs      ConnObserver
	refusing chan struct{}
	retry    time.Duration
}

// Accept returns the next connection within the cap, answering those beyond it.
func (cl *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := cl.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if cl.open.Add(1) > cl.max {
			cl.open.Add(-1)
			cl.refuse(c)
			continue
		}
		if cl.obs != nil {
			cl.obs.ConnOpened()
		}
		return &trackedConn{Conn: c, cl: cl, accepted: time.Now()}, nil
	}
}

// refuse answers a connection over the cap with 503 and closes it, in the background.
func (cl *connLimiter) refuse(c net.Conn) {
	if cl.obs != nil {
		cl.obs.ConnRefused()
	}
	select {
	case cl.refusing <- struct{}{}:
	default:
		_ = c.Close() // too many refusals at once: closed unanswered
		return
	}
	go func() {
		defer func() { <-cl.refusing }()
		_ = c.SetDeadline(time.Now().Add(refusalTimeout))
		if cl.tls != nil {
			c = tls.Server(c, cl.tls)
		}
		defer func() { _ = c.Close() }()
		body := fmt.Sprintf(`{"error":"too many connections: the shard serves at most %d at once; retry after %v"}`+"\n", cl.max, cl.retry)
		if _, err := fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: %d\r\n"+
			"Connection: close\r\nContent-Length: %d\r\n\r\n%s", int(max(1, cl.retry.Round(time.Second)/time.Second)), len(body), body); err != nil {
			return
		}
		// a lingering close: stop sending, then read what the client sent, so that closing with
		// unread data does not reset the connection before the client read the refusal
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
	}()
}

// trackedConn is an open connection within the cap.
type trackedConn struct {
	net.Conn
	cl       *connLimiter
	accepted time.Time
	closed   sync.Once
	retired  atomic.Bool
}

// Close closes the connection and gives its place back.
func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.closed.Do(func() {
		c.cl.open.Add(-1)
		if c.cl.obs != nil {
			c.cl.obs.ConnClosed()
		}
	})
	return err
}

// connInfo is what a request knows of its connection (NewServer's ConnContext).
type connInfo struct {
	accepted time.Time
	tracked  *trackedConn // nil when the listener is not Listen's
}

type connInfoKey struct{}

// connContext records the connection's accept time (its tracked one, else now) for retire.
func connContext(ctx context.Context, c net.Conn) context.Context {
	info := &connInfo{accepted: time.Now()}
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if t, ok := c.(*trackedConn); ok {
		info.accepted, info.tracked = t.accepted, t
	}
	return context.WithValue(ctx, connInfoKey{}, info)
}

// retire wraps h: a request on a connection open for maxAge or longer is answered with
// "Connection: close", so the connection closes after its reply (over HTTP/2, the server sends
// GOAWAY and closes it once its streams are done) and the client opens another.
func retire(h http.Handler, maxAge time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if info, ok := r.Context().Value(connInfoKey{}).(*connInfo); ok && time.Since(info.accepted) >= maxAge {
			w.Header().Set("Connection", "close")
			if t := info.tracked; t != nil && t.retired.CompareAndSwap(false, true) && t.cl.obs != nil {
				t.cl.obs.ConnRetired()
			}
		}
		h.ServeHTTP(w, r)
	})
}
