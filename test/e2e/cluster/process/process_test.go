package process

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestStartLogsAndStops(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	var tee strings.Builder
	p, err := Start("hello", sh, []string{"-c", "echo one; echo two"}, nil, filepath.Join(dir, "hello.log"), &tee) // read once it exited: Wait has copied everything
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if exited, werr := p.Exited(); !exited || werr != nil {
		t.Errorf("exited %v, %v", exited, werr)
	}
	if got := p.Tail(1); got != "two" {
		t.Errorf("Tail(1) = %q", got)
	}
	if got := tee.String(); got != "hello | one\nhello | two\n" {
		t.Errorf("tee got %q", got)
	}

	long, err := Start("sleeper", sh, []string{"-c", "sleep 30"}, nil, filepath.Join(dir, "sleeper.log"), nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	long.Stop(10 * time.Second)
	_, werr := long.Exited()
	var ee *exec.ExitError
	if !errors.As(werr, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM || time.Since(start) > 5*time.Second {
		t.Errorf("Stop: %v after %s, want ended by SIGTERM at once", werr, time.Since(start))
	}
}
