package httpserve_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/renderqueue/renderqueue/pkg/certs"
	"github.com/renderqueue/renderqueue/pkg/keeper/httpserve"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// connCounts is a ConnObserver that counts.
type connCounts struct{ open, refused, retired atomic.Int64 }

func (c *connCounts) ConnOpened()  { c.open.Add(1) }
func (c *connCounts) ConnClosed()  { c.open.Add(-1) }
func (c *connCounts) ConnRefused() { c.refused.Add(1) }
func (c *connCounts) ConnRetired() { c.retired.Add(1) }

// serveConns serves an "ok" handler with limits l through Listen (over TLS with tlsConfig) and
// returns the address and the observer.
func serveConns(t *testing.T, l httpserve.Limits, tlsConfig *tls.Config) (string, *connCounts) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	obs := &connCounts{}
	srv := httpserve.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		httpserve.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}), l)
	srv.ErrorLog = log.New(io.Discard, "", 0)
	served := httpserve.Listen(ln, tlsConfig, l, obs)
	go func() { _ = srv.Serve(served) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String(), obs
}

// waitFor polls cond every 10 ms until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// get sends GET /healthz on the connection and reads the reply.
func get(t *testing.T, c net.Conn, br *bufio.Reader) (*http.Response, []byte) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: shard\r\n\r\n"); err != nil {
		t.Fatalf("sending a request: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the reply: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	return resp, b
}

// TestConnectionsRetire: a keep-alive connection that keeps sending requests (more often than the
// idle timeout) is retired once it is MaxConnectionAge old: its next reply says "Connection:
// close", the server closes it after the reply, and it is counted as retired; until then its
// replies keep it open.
func TestConnectionsRetire(t *testing.T) {
	addr, obs := serveConns(t, httpserve.Limits{MaxConnectionAge: 300 * time.Millisecond, IdleTimeout: time.Minute}, nil)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	br := bufio.NewReader(c)
	opened := time.Now()
	if resp, _ := get(t, c, br); resp.Close {
		t.Fatal("the first reply of a new connection closes it")
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var retired time.Duration
	for i := 0; retired == 0; i++ {
		if i == 200 {
			t.Fatalf("a connection open %v was not retired", time.Since(opened))
		}
		<-tick.C
		asked := time.Since(opened)
		resp, _ := get(t, c, br)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("reply %d", resp.StatusCode)
		}
		switch {
		case resp.Close && asked < 300*time.Millisecond:
			t.Fatalf("retired at %v, before its maximum age", asked)
		case resp.Close:
			retired = asked
		}
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the retiring reply the connection is still open: %v", err)
	}
	if obs.retired.Load() != 1 {
		t.Fatalf("%d retired, want 1", obs.retired.Load())
	}
	waitFor(t, "no connection open", func() bool { return obs.open.Load() == 0 })
	t.Logf("retired at %v", retired.Round(time.Millisecond))
}

// TestConnectionCap: with MaxConnections open, one more connection is answered 503 with
// Retry-After and an error naming the limit, and closed — over TLS as well, after the handshake —
// and counted as refused; once one closes, a new connection is served.
func TestConnectionCap(t *testing.T) {
	ca, _, err := certs.RenewCA(nil, "shard-ca", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.Bundle)
	dir := t.TempDir()
	const name = "web-shards.team-a.svc"
	writeServing(t, ca, dir, name)
	cf, err := httpserve.LoadCertFiles(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		tls  *tls.Config
	}{{"plain", nil}, {"tls", cf.TLSConfig()}} {
		t.Run(tc.name, func(t *testing.T) {
			const most = 4
			addr, obs := serveConns(t, httpserve.Limits{MaxConnections: most}, tc.tls)
			dial := func() net.Conn {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				if tc.tls != nil {
					c = tls.Client(c, &tls.Config{RootCAs: roots, ServerName: name, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}})
				}
				t.Cleanup(func() { _ = c.Close() })
				return c
			}
			var open []net.Conn
			for range most {
				c := dial()
				if resp, _ := get(t, c, bufio.NewReader(c)); resp.StatusCode != http.StatusOK {
					t.Fatalf("connection %d: %d", len(open), resp.StatusCode)
				}
				open = append(open, c)
			}
			if obs.open.Load() != most {
				t.Fatalf("%d open, want %d", obs.open.Load(), most)
			}
			extra := dial()
			br := bufio.NewReader(extra)
			resp, body := get(t, extra, br)
			var eb shardapi.Error
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" || !resp.Close ||
				json.Unmarshal(body, &eb) != nil || !strings.Contains(eb.Error, "too many connections: the shard serves at most 4") {
				t.Fatalf("a connection over the cap: %d %v %s", resp.StatusCode, resp.Header, body)
			}
			if _, err := br.ReadByte(); err == nil {
				t.Fatal("the refused connection is still open")
			}
			if obs.refused.Load() != 1 || obs.open.Load() != most {
				t.Fatalf("refused %d open %d, want 1 and %d", obs.refused.Load(), obs.open.Load(), most)
			}
			_ = open[0].Close()
			waitFor(t, "a connection's place given back", func() bool { return obs.open.Load() == most-1 })
			c := dial()
			if resp, _ := get(t, c, bufio.NewReader(c)); resp.StatusCode != http.StatusOK {
				t.Fatalf("after one closed: %d", resp.StatusCode)
			}
		})
	}
}
