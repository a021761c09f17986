package procstat

import (
	"os"
	"testing"
	"time"
)

// TestCPUOfThisProcess: the test's own CPU time is read, grows with work, and a process that does
// not exist is refused.
func TestCPUOfThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	before, ok := CPU(os.Getpid())
	if !ok {
		t.Fatal("cannot read this process's CPU time")
	}

	for start := time.Now(); ; {
		if after, _ := CPU(os.Getpid()); after >= before+50*time.Millisecond {
			break
		}
		if time.Since(start) > time.Minute {
			t.Fatal("the CPU time did not grow in a minute of work")
		}
	}
	if _, ok := CPU(1 << 30); ok {
		t.Error("a process that does not exist has a CPU time")
	}

}

// TestMachine: the machine's busy time is at most its total, and both are read.
func TestMachine(t *testing.T) {
	busy, total, ok := Machine()
	if !ok {
		t.Skip("no /proc/stat here")
	}
	if total <= 0 || busy < 0 || busy > total {
		t.Errorf("busy %v of %v", busy, total)
	}
}
