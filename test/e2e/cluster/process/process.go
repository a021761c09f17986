// Package process starts the local cluster's programs — etcd, kube-apiserver,
// kube-controller-manager, the processes a caller adds (Cluster.StartProcess) and, through
// package runtime, the containers — as child processes: each in its own process group (so a
// stop reaches its children too), killed when this process dies (parent-death signal), its
// stdout and stderr appended to a log file and optionally copied, line-prefixed, to a writer.
// Stop sends SIGTERM to the group, then SIGKILL after a grace period.
package process

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is a child process started in its own process group, its output appended to a log
// file (and copied to an optional writer).
type Process struct {
	// Name is how the process is called in logs and errors.
	Name string
	// LogPath is the file its stdout and stderr go to.
	LogPath string

	cmd  *exec.Cmd
	done chan struct{}

	mu      sync.Mutex
	waitErr error
	logFile *os.File
}

// Start starts bin with args and env (appended to nothing: the child sees only env) in its own
// process group, logging to logPath (and to tee when not nil).
func Start(name, bin string, args, env []string, logPath string, tee io.Writer) (*Process, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	return StartCmd(name, cmd, logPath, tee, 0)
}

// StartCmd starts cmd in its own process group (and in new namespaces per cloneflags, e.g.
// syscall.CLONE_NEWNS), killed when this process dies, with stdout and stderr appended to logPath
// (and copied to tee, each line prefixed with name). name is how the process is called in logs
// and errors.
func StartCmd(name string, cmd *exec.Cmd, logPath string, tee io.Writer, cloneflags uintptr) (*Process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: opening its log %s: %w", name, logPath, err)
	}
	var out io.Writer = f
	if tee != nil {
		out = io.MultiWriter(f, &prefixWriter{prefix: name + " | ", w: tee})
	}
	cmd.Stdout, cmd.Stderr = out, out
	// Own process group (so Stop reaches its children too); killed if this process dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Cloneflags: cloneflags}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, cmd.Path, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{}), logFile: f}
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		_ = p.logFile.Close()
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id (and process group id).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited, and its exit error.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return true, p.waitErr
	default:
		return false, nil
	}
}

// Kill sends sig to the process's whole group without waiting.
func (p *Process) Kill(sig syscall.Signal) error {
	if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signalling %s (pgid %d): %w", p.Name, p.cmd.Process.Pid, err)
	}
	return nil
}

// Stop sends SIGTERM to the process group, waits up to grace for the process to exit, then sends
// SIGKILL and waits for it.
func (p *Process) Stop(grace time.Duration) {
	if exited, _ := p.Exited(); exited {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // stray children of the group
		return
	}
	_ = p.Kill(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// prefixWriter prefixes every line written through it.
type prefixWriter struct {
	mu     sync.Mutex
	prefix string
	w      io.Writer
	midLn  bool
}

func (pw *prefixWriter) Write(b []byte) (int, error) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	buf := make([]byte, 0, len(b)+len(pw.prefix)*2)
	for _, c := range b {
		if !pw.midLn {
			buf = append(buf, pw.prefix...)
			pw.midLn = true
		}
		buf = append(buf, c)
		if c == '\n' {
			pw.midLn = false
		}
	}
	if _, err := pw.w.Write(buf); err != nil {
		return 0, err
	}
	return len(b), nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free loopback port: %w", err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Tail returns the last n lines of the process's log.
func (p *Process) Tail(n int) string { return TailFile(p.LogPath, n) }

// TailFile returns the last n lines of a file ("" when unreadable).
func TailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
