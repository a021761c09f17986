//go:build linux

package main

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReap starts two children, waits until both have exited without collecting them (waitid
// with WNOWAIT leaves them zombies), and checks that reap collects exactly those two and that
// nothing is left to collect.
func TestReap(t *testing.T) {
	var pids []int
	for range 2 {
		pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{})
		if err != nil {
			t.Skipf("cannot start /bin/true: %v", err)
		}
		pids = append(pids, pid)
	}
	for _, pid := range pids {
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
			t.Fatalf("waiting for %d to exit: %v", pid, err)
		}
	}
	got, err := reap()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	slices.Sort(pids)
	if !slices.Equal(got, pids) {
		t.Errorf("reap collected %v, want %v", got, pids)
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); !errors.Is(err, syscall.ECHILD) {
		t.Errorf("after reap, wait4 says %v, want ECHILD (no children left)", err)
	}
	if again, err := reap(); err != nil || len(again) != 0 {
		t.Errorf("reap with no children: %v, %v", again, err)
	}
}

// TestPauseExitsOnSignal builds pause and runs it: after SIGTERM or SIGINT it exits 0.
func TestPauseExitsOnSignal(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "pause")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd := exec.Command(bin)
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// pause prints its first line once its signal handlers are in place.
		r := bufio.NewReader(stderr)
		line, err := r.ReadString('\n')
		if err != nil || !strings.Contains(line, "waiting") {
			_ = cmd.Process.Kill()
			t.Fatalf("pause's first line: %q, %v", line, err)
		}
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		rest, _ := io.ReadAll(r)
		if err := cmd.Wait(); err != nil {
			t.Errorf("pause after %v: %v", sig, err)
		}
		if !strings.Contains(string(rest), sig.String()) {
			t.Errorf("pause's last words after %v: %q", sig, rest)
		}
	}
}
