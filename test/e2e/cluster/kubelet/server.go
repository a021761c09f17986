package kubelet

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"
)

// Server serves the one part of the kubelet API the API server proxies to that the local
// runner supports: container logs (GET /containerLogs/NS/POD/CONTAINER, which `kubectl logs`
// reaches through the API server), with tailLines, limitBytes, previous and follow. exec,
// attach, port-forward, metrics and stats answer 501. It listens on 127.0.0.1 with TLS and
// accepts only clients with a certificate of the cluster CA (the API server's kubelet client
// certificate).
type Server struct {
	ln  net.Listener
	srv *http.Server

	mu     sync.Mutex
	runner *Runner
}

// NewServer listens on a free port of 127.0.0.1 with cert, accepting client certificates
// signed by clientCAs, and serves until Close.
func NewServer(cert tls.Certificate, clientCAs *x509.CertPool) (*Server, error) {
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{cert}, ClientCAs: clientCAs, ClientAuth: tls.RequireAndVerifyClientCert,
		MinVersion: tls.VersionTLS12,
	})
	if err != nil {
		return nil, fmt.Errorf("kubelet API: listening: %w", err)
	}
	k := &Server{ln: ln}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", k.containerLogs)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, fmt.Sprintf("%s is not supported by the local pod runner (only /containerLogs is)", r.URL.Path), http.StatusNotImplemented)
	})
	k.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = k.srv.Serve(ln) }()
	return k, nil
}

// Port is the port the server listens on (the Node's kubeletEndpoint).
func (k *Server) Port() int { return k.ln.Addr().(*net.TCPAddr).Port }

// Close stops the server.
func (k *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return k.srv.Shutdown(ctx)
}

func (k *Server) setRunner(r *Runner) {
	k.mu.Lock()
	k.runner = r
	k.mu.Unlock()
}

func (k *Server) containerLogs(w http.ResponseWriter, req *http.Request) {
	k.mu.Lock()
	r := k.runner
	k.mu.Unlock()
	if r == nil {
		http.Error(w, "the runner is not running yet", http.StatusServiceUnavailable)
		return
	}
	ns, pod, container := req.PathValue("namespace"), req.PathValue("pod"), req.PathValue("container")
	q := req.URL.Query()
	previous := q.Get("previous") == "true"
	follow := q.Get("follow") == "true" && !previous
	path, err := r.LogPath(ns, pod, container, previous)
	if err != nil {
		code := http.StatusBadRequest // as kubelet: no such container, or no (previous) instance yet
		if r.worker(ns, pod) == nil {
			code = http.StatusNotFound
		}
		http.Error(w, err.Error(), code)
		return
	}
	b, err := os.ReadFile(path)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	if s := q.Get("tailLines"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			http.Error(w, "bad tailLines", http.StatusBadRequest)
			return
		}
		b = tailLines(b, n)
	}
	limit := int64(-1)
	if s := q.Get("limitBytes"); s != "" {
		if limit, err = strconv.ParseInt(s, 10, 64); err != nil || limit < 1 {
			http.Error(w, "bad limitBytes", http.StatusBadRequest)
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain")
	out := io.Writer(w)
	if limit > 0 {
		out = &limitWriter{w: w, n: limit}
	}
	if _, err := out.Write(b); err != nil || !follow {
		return
	}
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	k.follow(req.Context(), r, ns, pod, container, path, int64(len(b)), out, w)
}

// follow streams what is appended to path until the client goes away, the container's instance
// changes or the Pod is gone.
func (k *Server) follow(ctx context.Context, r *Runner, ns, pod, container, path string, offset int64, out io.Writer, w http.ResponseWriter) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return
	}
	// offset counted the bytes written, which after a tail is less than the file: start at the end
	if _, err := f.Seek(max(fi.Size(), offset), io.SeekStart); err != nil {
		return
	}
	rd := bufio.NewReader(f)
	buf := make([]byte, 32*1024)
	for {
		n, err := rd.Read(buf)
		if n > 0 {
			if _, werr := out.Write(buf[:n]); werr != nil {
				return
			}
			if fl, ok := w.(http.Flusher); ok {
				fl.Flush()
			}
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return
		}
		if cur, err := r.LogPath(ns, pod, container, false); err != nil || cur != path {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tailLines is the last n lines of b.
func tailLines(b []byte, n int) []byte {
	if n == 0 {
		return nil
	}
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end--
	}
	count := 0
	for i := end - 1; i >= 0; i-- {
		if b[i] == '\n' {
			count++
			if count == n {
				return b[i+1:]
			}
		}
	}
	return b
}

// limitWriter writes at most n bytes, then fails.
type limitWriter struct {
	w io.Writer
	n int64
}

var errLimit = errors.New("limitBytes reached")

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errLimit
	}
	short := false
	if int64(len(p)) > l.n {
		p, short = p[:l.n], true
	}
	n, err := l.w.Write(p)
	l.n -= int64(n)
	if err == nil && short {
		err = errLimit
	}
	return n, err
}
