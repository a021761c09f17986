package postgres

import (
	"context"
	"fmt"
	"github.com/jackc/pgx/v5"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
)

// TestConcurrentGroupCommits completes overlapping sets of keys, in different orders, from many
// callers at once with several group commits in flight: no call fails (groups that share a key
// never commit together, so their row locks cannot deadlock), and every key ends as its write
// with the highest rev left it.
func TestConcurrentGroupCommits(t *testing.T) {
	s, _ := openTestStore(t, Options{CommitConns: 4, FlushRows: 40, FlushDelay: 200 * time.Microsecond})
	ctx := context.Background()
	const nKeys = 120
	rows := make([]schedule.Row, nKeys)
	base := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for i := range rows {
		rows[i] = schedule.Row{Key: fmt.Sprintf("https://example.com/c/%d", i), Due: base, HasDue: true, Cadence: time.Hour}
	}
	if _, err := s.Upsert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	type write struct {
		due time.Time
		rev int64
	}
	var mu sync.Mutex
	last := map[string]write{}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 3))
			for call := range 25 {
				perm := rng.Perm(nKeys)[:30]
				items := make([]store.Completion, len(perm))
				for i, k := range perm {
					items[i] = store.Completion{Key: rows[k].Key, Due: base.Add(time.Duration(w*1000+call) * time.Second)}
				}
				res, err := s.Complete(ctx, items)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for i, r := range res {
					if !r.Found || !r.Row.Due.Equal(items[i].Due) {
						mu.Unlock()
						errs <- fmt.Errorf("%s: found %v, due %v, want %v", items[i].Key, r.Found, r.Row.Due, items[i].Due)
						return
					}
					if r.Row.Rev > last[r.Row.Key].rev {
						last[r.Row.Key] = write{r.Row.Due, r.Row.Rev}
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a completion failed: %v", err)
	}
	stored, err := s.Pool().Query(ctx, "SELECT key, due_at, rev FROM render_schedule")
	if err != nil {
		t.Fatal(err)
	}
	defer stored.Close()
	n := 0
	for stored.Next() {
		var key string
		var due time.Time
		var rev int64
		if err := stored.Scan(&key, &due, &rev); err != nil {
			t.Fatal(err)
		}
		if w, ok := last[key]; ok && (rev != w.rev || !due.Equal(w.due)) {
			t.Errorf("%s stored rev %d due %v; its last write was rev %d due %v", key, rev, due, w.rev, w.due)
		}
		n++
	}
	if n != nKeys {
		t.Fatalf("%d rows stored, want %d", n, nKeys)
	}
}

// TestUnixSendBuffer checks that the store's connections over a Unix socket ask for
// unixSendBuffer: the kernel gives twice the request, capped at net.core.wmem_max.
func TestUnixSendBuffer(t *testing.T) {
	s, _ := openTestStore(t, Options{})
	if !strings.HasPrefix(s.pool.Config().ConnConfig.Host, "/") {
		t.Skip("the test database is not on a Unix socket")
	}
	b, err := os.ReadFile("/proc/sys/net/core/wmem_max")
	if err != nil {
		t.Skipf("the kernel's cap is not known: %v", err)
	}
	wmemMax, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	u, ok := c.Conn().PgConn().Conn().(*net.UnixConn)
	if !ok {
		t.Fatalf("the connection is a %T, not a Unix socket", c.Conn().PgConn().Conn())
	}
	raw, err := u.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var got int
	var serr error
	if err := raw.Control(func(fd uintptr) { got, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	if want := 2 * min(unixSendBuffer, wmemMax); got != want {
		t.Errorf("send buffer %d bytes, want %d (twice the smaller of %d and net.core.wmem_max %d)", got, want, unixSendBuffer, wmemMax)
	}
}

// TestTCPUserTimeout checks that the store's TCP connections carry Options.TCPUserTimeout as
// TCP_USER_TIMEOUT (15s by default; a negative value leaves the kernel's default, 0), so that a
// write sent into a partition cannot land after the kernel gave up on it, and that the server
// side of each connection has keepalives and the same user timeout (withServerKeepalives).
func TestTCPUserTimeout(t *testing.T) {
	for _, tc := range []struct {
		opt  time.Duration // Options.TCPUserTimeout
		want int           // the socket's TCP_USER_TIMEOUT in milliseconds
	}{
		{0, 15000},
		{3 * time.Second, 3000},
		{-1, 0},
	} {
		_, dsn := openTestStore(t, Options{})
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(cfg.Host, "/") {
			// hack/postgres.sh's cluster listens on its Unix socket and on the loopback address
			dsn += " host=127.0.0.1"
		}
		s, err := Open(context.Background(), dsn, Options{TCPUserTimeout: tc.opt})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		c, err := s.pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		tcp, ok := c.Conn().PgConn().Conn().(*net.TCPConn)
		if !ok {
			c.Release()
			t.Fatalf("the connection is a %T, not TCP", c.Conn().PgConn().Conn())
		}
		raw, err := tcp.SyscallConn()
		if err != nil {
			c.Release()
			t.Fatal(err)
		}
		var got int
		var serr error
		if err := raw.Control(func(fd uintptr) {
			got, serr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, 0x12 /* TCP_USER_TIMEOUT */)
		}); err != nil {
			t.Fatal(err)
		}
		// the server's side: keepalives that drop a connection whose client stopped answering
		// within about a minute, and the same user timeout
		var settings string
		err = c.QueryRow(context.Background(), `SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings
			WHERE name IN ('tcp_keepalives_idle', 'tcp_keepalives_interval', 'tcp_keepalives_count', 'tcp_user_timeout')`).Scan(&settings)
		c.Release()
		if err != nil {
			t.Fatal(err)
		}
		if serr != nil {
			t.Fatal(serr)
		}
		if got != tc.want {
			t.Errorf("TCPUserTimeout %v: TCP_USER_TIMEOUT %dms, want %d", tc.opt, got, tc.want)
		}
		if want := fmt.Sprintf("tcp_keepalives_count=3 tcp_keepalives_idle=30 tcp_keepalives_interval=10 tcp_user_timeout=%d", tc.want); settings != want {
			t.Errorf("TCPUserTimeout %v: the server's settings for the connection are %q, want %q", tc.opt, settings, want)
		}
	}
}
