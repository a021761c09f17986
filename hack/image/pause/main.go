//go:build linux

// Command pause is the sandbox ("pause") container of the test node's Pods, built into the image
// localhost/renderqueue/pause by `make pause-image`: it holds the Pod's namespaces open and does
// nothing else. It waits until SIGTERM or SIGINT and then exits 0; as PID 1 of a Pod's PID
// namespace it reaps the orphans it inherits whenever SIGCHLD arrives. It prints one line when it
// is waiting (so that a test can tell that the signal handlers are in place) and one when it exits.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(run(os.Stderr))
}

// run waits for SIGTERM or SIGINT, reaping children on SIGCHLD, and returns the exit code.
func run(stderr io.Writer) int {
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	_, _ = fmt.Fprintf(stderr, "pause: pid %d waiting for SIGTERM or SIGINT\n", os.Getpid())
	// Children that exited before the handler was in place.
	_, _ = reap()
	for s := range sigs {
		if s == syscall.SIGCHLD {
			if _, err := reap(); err != nil {
				_, _ = fmt.Fprintln(stderr, "pause:", err)
			}
			continue
		}
		_, _ = fmt.Fprintf(stderr, "pause: %v, exiting\n", s)
		return 0
	}
	return 0
}

// reap collects every child that has exited, without blocking, and returns their PIDs.
func reap() ([]int, error) {
	var pids []int
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.ECHILD):
			return pids, nil
		case err != nil:
			return pids, fmt.Errorf("reaping children: %w", err)
		case pid <= 0:
			return pids, nil
		}
		pids = append(pids, pid)
	}
}
