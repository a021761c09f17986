// Command probe is the program of the local cluster's test image (localhost/renderqueue/e2e-probe,
// hack/images.sh): a static binary that tests run in a Pod, or with `kubectl exec`, to see what a
// Pod of the node sees.
//
//	probe sleep [DURATION]        block until SIGTERM or SIGINT (or DURATION, a Go duration, has
//	                              passed), then exit 0
//	probe dial HOST:PORT          open a TCP connection (5 s at most); print "connected" or the
//	                              error, exit 0 or 1
//	probe dns NAME                ask the first nameserver of /etc/resolv.conf for NAME's A
//	                              records over UDP; print "rcode=RCODE answers=N" (exit 0 whatever
//	                              the rcode; 1 when no answer came)
//	probe get URL                 GET URL (5 s at most); print the status line, exit 0 or 1
//	probe serve ADDR              serve HTTP on ADDR: every path answers 200 "probe"; exit 0 on
//	                              SIGTERM
//	probe alloc MIB               allocate MIB MiB, touching every page, then sleep (an OOM kill
//	                              ends it when that is above the container's memory limit)
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: probe sleep | dial HOST:PORT | dns NAME | get URL")
	}
	switch os.Args[1] {
	case "sleep":
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		if len(os.Args) > 2 {
			d, err := time.ParseDuration(os.Args[2])
			if err != nil {
				fail("sleep %s: %v", os.Args[2], err)
			}
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
		}
		<-ctx.Done()
	case "dial":
		need(3)
		c, err := net.DialTimeout("tcp", os.Args[2], 5*time.Second)
		if err != nil {
			fail("dial %s: %v", os.Args[2], err)
		}
		_ = c.Close()
		fmt.Println("connected")
	case "dns":
		need(3)
		rcode, answers, err := query(os.Args[2])
		if err != nil {
			fail("dns %s: %v", os.Args[2], err)
		}
		fmt.Printf("rcode=%s answers=%d\n", rcode, answers)
	case "get":
		need(3)
		hc := &http.Client{Timeout: 5 * time.Second}
		resp, err := hc.Get(os.Args[2])
		if err != nil {
			fail("get %s: %v", os.Args[2], err)
		}
		_ = resp.Body.Close()
		fmt.Println(resp.Status)
	case "serve":
		need(3)
		srv := &http.Server{Addr: os.Args[2], ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = fmt.Fprint(w, "probe")
		})}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		go func() {
			<-ctx.Done()
			_ = srv.Close()
		}()
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fail("serve %s: %v", os.Args[2], err)
		}
	case "alloc":
		need(3)
		mib, err := strconv.Atoi(os.Args[2])
		if err != nil || mib <= 0 {
			fail("alloc %q: want a number of MiB", os.Args[2])
		}
		held := make([][]byte, 0, mib)
		for i := 0; i < mib; i++ {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = 1
			}
			held = append(held, b)
		}
		fmt.Printf("allocated %d MiB\n", len(held))
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		<-ctx.Done()
		runtime.KeepAlive(held)
	default:
		fail("unknown command %q", os.Args[1])
	}
}

func need(n int) {
	if len(os.Args) < n {
		fail("%s: missing argument", os.Args[1])
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "probe: "+format+"\n", args...)
	os.Exit(1)
}

// query sends one A query for name (as given, fully qualified) to the first nameserver of
// /etc/resolv.conf and returns the response's rcode and number of answers.
func query(name string) (dnsmessage.RCode, int, error) {
	conf, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		return 0, 0, fmt.Errorf("reading /etc/resolv.conf: %w", err)
	}
	server := ""
	for _, line := range strings.Split(string(conf), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			server = f[1]
			break
		}
	}
	if server == "" {
		return 0, 0, errors.New("no nameserver in /etc/resolv.conf")
	}
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	qname, err := dnsmessage.NewName(name)
	if err != nil {
		return 0, 0, fmt.Errorf("name %q: %w", name, err)
	}
	msg := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: 4242, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: qname, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}},
	}
	packed, err := msg.Pack()
	if err != nil {
		return 0, 0, fmt.Errorf("packing the query: %w", err)
	}
	c, err := net.Dial("udp", net.JoinHostPort(server, "53"))
	if err != nil {
		return 0, 0, fmt.Errorf("dialing %s: %w", server, err)
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(packed); err != nil {
		return 0, 0, fmt.Errorf("sending to %s: %w", server, err)
	}
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		return 0, 0, fmt.Errorf("reading from %s: %w", server, err)
	}
	var resp dnsmessage.Message
	if err := resp.Unpack(buf[:n]); err != nil {
		return 0, 0, fmt.Errorf("unpacking the answer: %w", err)
	}
	return resp.RCode, len(resp.Answers), nil
}
