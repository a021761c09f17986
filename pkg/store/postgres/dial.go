package postgres

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// unixSendBuffer is the send buffer the pool's connections ask for on a Unix socket.
//
// Over a Unix socket the sender's buffer is all that may be in flight, 208 KiB by default
// (net.core.wmem_default), and a group commit's UPDATE of 5,000 completions is ~460 KB of
// parameters. Its write then stops twice or more until the backend has read what was sent, and
// each time this process's goroutine must be woken to send the rest. In a busy process that
// wake-up waits for the scheduler (Go polls the network only when it has nothing else to run, or
// from its monitor every 10 ms), and PostgreSQL, which cannot start the statement before it has
// all of it, waits too: in `renderqueue bench` both group-commit backends were waiting on this
// process 4.5–6.5% of the time, most often for the rest of a statement's parameters
// (docs/benchmarks.md, "A group's statement in one write"). The kernel caps the request at twice
// net.core.wmem_max. Over TCP the kernel sizes the buffers itself (setting one would stop that).
const unixSendBuffer = 4 << 20

// dialer returns the DialFunc of the store's connections (the pool's and the subscriptions'):
// Unix-socket connections ask for unixSendBuffer; TCP connections get userTimeout as
// TCP_USER_TIMEOUT (Linux), set before they connect, when it is positive.
//
// TCP_USER_TIMEOUT bounds how long data sent to the database may stay unacknowledged — a
// connection attempt, a statement, a group commit — before the kernel drops the connection. Without
// it a write sent into a network that drops packets (a partition, a dead host) is retransmitted
// for up to about 15 minutes (net.ipv4.tcp_retries2), even after this process gave up on it and
// closed the socket, and may commit long after its caller was answered 503: a completion a worker
// saw fail would then land, unannounced, whenever the network came back. With it, a write either
// reaches the database within userTimeout or never does, and the statement fails with a
// connection error, which the store treats as an outcome it does not know (a group commit signals
// a gap, so the keeper walks).
func dialer(userTimeout time.Duration) pgconn.DialFunc {
	d := &net.Dialer{KeepAlive: 5 * time.Minute} // pgconn's default dialer, plus the option
	if userTimeout > 0 {
		ms := int(userTimeout / time.Millisecond)
		d.Control = func(network, _ string, rc syscall.RawConn) error {
			if network != "tcp" && network != "tcp4" && network != "tcp6" {
				return nil
			}
			var serr error
			if err := rc.Control(func(fd uintptr) { serr = setTCPUserTimeout(fd, ms) }); err != nil {
				return fmt.Errorf("setting TCP_USER_TIMEOUT: %w", err)
			}
			if serr != nil {
				return fmt.Errorf("setting TCP_USER_TIMEOUT to %dms: %w", ms, serr)
			}
			return nil
		}
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if u, ok := c.(*net.UnixConn); ok {
			// a hint, like the kernel's cap on it: a connection that cannot have it works as well,
			// only slower under load
			_ = u.SetWriteBuffer(unixSendBuffer)
		}
		return c, nil
	}
}

// serverKeepalives are the settings withServerKeepalives asks the server to use for a
// connection's socket, unless the DSN names them (PostgreSQL's own defaults are the kernel's:
// the first keepalive probe after 2 hours).
var serverKeepalives = [][2]string{
	{"tcp_keepalives_idle", "30"},     // seconds without traffic before the first probe
	{"tcp_keepalives_interval", "10"}, // seconds between probes
	{"tcp_keepalives_count", "3"},     // probes unanswered before the connection is dropped
}

// withServerKeepalives adds to the startup parameters of the store's connections the keepalive
// settings of serverKeepalives and, when userTimeout is positive, tcp_user_timeout: the server's
// side of what dialer sets on ours. A client cut off by a partition cannot close its connections
// (its FIN and RST are dropped too), and without these the server keeps each one's backend, and
// its slot of max_connections, for about 2 hours 11 minutes: the chaos test's keeper, cut from
// PostgreSQL for 30 s ten times in ten minutes, left 25 such backends behind. With them, the
// server drops a connection whose client stopped answering within about a minute. PostgreSQL
// ignores them on a Unix socket. A connection pooler in between that refuses startup
// parameters it does not know needs them allowed (PgBouncer: ignore_startup_parameters).
func withServerKeepalives(params map[string]string, userTimeout time.Duration) {
	for _, kv := range serverKeepalives {
		if _, set := params[kv[0]]; !set {
			params[kv[0]] = kv[1]
		}
	}
	if _, set := params["tcp_user_timeout"]; !set && userTimeout > 0 {
		params["tcp_user_timeout"] = strconv.Itoa(int(userTimeout / time.Millisecond))
	}
}
