package bench

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sys/unix"
)

func TestParseCPUList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int // nil: refused
	}{
		{"0", []int{0}},
		{"0-1", []int{0, 1}},
		{"3,0-1", []int{0, 1, 3}},
		{" 1 , 1 ", []int{1}}, // spaces and repeats
		{"", nil},
		{"a", nil},
		{"-1", nil},
		{"2-1", nil},     // a backward range
		{"0-", nil},      // an open range
		{"1,,2", nil},    // an empty item
		{"4096", nil},    // past what a CPU set holds
		{"0-99999", nil}, // the same, as a range (refused before it is listed)
	} {
		got, err := parseCPUList(tc.in)
		if tc.want == nil {
			if err == nil {
				t.Errorf("parseCPUList(%q) = %v, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("parseCPUList(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestSplitCPUs(t *testing.T) {
	var two unix.CPUSet
	two.Set(0)
	two.Set(1)
	pg, rest, err := splitCPUs([]int{0}, two)
	if err != nil || pg.Count() != 1 || !pg.IsSet(0) || rest.Count() != 1 || !rest.IsSet(1) {
		t.Fatalf("splitCPUs([0], {0,1}) = %v, %v, %v; want {0}, {1}", pg, rest, err)
	}
	if _, _, err := splitCPUs([]int{0, 1}, two); err == nil {
		t.Error("every CPU given to PostgreSQL: want an error (nothing left for the keeper)")
	}
	if _, _, err := splitCPUs([]int{5}, two); err == nil {
		t.Error("a CPU this process may not use: want an error")
	}
}

// TestPinCPUs places a real server on CPU 0 and this process on the rest: a backend started
// afterwards (the postmaster's child) must be on CPU 0, this process off it; restore must undo
// both, and give the backend started meanwhile, still connected, the postmaster's CPUs back.
func TestPinCPUs(t *testing.T) {
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil || allowed.Count() < 2 || !allowed.IsSet(0) {
		t.Skipf("needs CPU 0 and another CPU (%v, %v)", allowed, err)
	}
	ctx, pool, dsn := testPool(t)
	selfBefore := allowedCPUs(os.Getpid())
	postmaster, err := postmasterPID(ctx, pool)
	if err != nil {
		t.Skipf("the server's processes are not readable here: %v", err)
	}
	postmasterBefore := allowedCPUs(postmaster)
	p, err := pinCPUs(ctx, pool, []int{0})
	if errors.Is(err, unix.EPERM) {
		t.Skipf("not allowed to set the server's CPUs: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	restored := false
	defer func() {
		if !restored {
			_ = p.restore()
		}
	}()
	// a new pool: a backend started after the placement, kept connected past the restore
	later, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer later.Close()
	var backend int
	if err := later.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		t.Fatal(err)
	}
	if got := allowedCPUs(backend); got != "0" {
		t.Errorf("a backend started after the placement may use CPUs %q, want 0", got)
	}
	if got := allowedCPUs(postmaster); got != "0" {
		t.Errorf("the postmaster may use CPUs %q after the placement, want 0", got)
	}
	self := allowedCPUs(os.Getpid())
	if set, err := parseCPUList(self); err != nil || slices.Contains(set, 0) {
		t.Errorf("this process may use CPUs %q after the placement, want not 0", self)
	}
	// threads started during the placement (as the keeper's and the workers' are): goroutines
	// that hold their thread while they wait, more than this process has threads, make the
	// runtime start new ones
	threadsBefore := threadsOf(os.Getpid())
	release := make(chan struct{})
	var held sync.WaitGroup
	for range len(threadsBefore) + 2 {
		held.Add(1)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			held.Done()
			<-release
		}()
	}
	held.Wait()
	defer close(release)
	var started []int
	for _, tid := range threadsOf(os.Getpid()) {
		if !slices.Contains(threadsBefore, tid) {
			started = append(started, tid)
		}
	}
	if len(started) == 0 {
		t.Fatal("no thread was started during the placement: the test cannot check their restore")
	}
	for _, tid := range started {
		if got := allowedCPUs(tid); got != self {
			t.Errorf("thread %d started during the placement may use CPUs %q, want this process's %q", tid, got, self)
		}
	}
	if err := p.restore(); err != nil {
		t.Fatal(err)
	}
	restored = true
	for _, tid := range threadsOf(os.Getpid()) { // the threads started during the placement too: still held
		if got := allowedCPUs(tid); got != selfBefore {
			t.Errorf("after restore thread %d of this process may use CPUs %q, want %q as before", tid, got, selfBefore)
		}
	}
	if got := allowedCPUs(postmaster); got != postmasterBefore {
		t.Errorf("after restore the postmaster may use CPUs %q, want %q as before", got, postmasterBefore)
	}
	if got := allowedCPUs(backend); got != postmasterBefore {
		t.Errorf("after restore the backend started during the placement may use CPUs %q, want the postmaster's %q", got, postmasterBefore)
	}
}

// TestPinCPUsFromAThreadOnFewerCPUs: a placement asked for from a thread of this process that is
// on fewer CPUs than the process (as one left behind by an earlier placement was, before restore
// gave back threads started while it ran) splits the process's CPUs, not the thread's.
func TestPinCPUsFromAThreadOnFewerCPUs(t *testing.T) {
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(os.Getpid(), &mine); err != nil || mine.Count() < 2 || !mine.IsSet(0) || !mine.IsSet(1) {
		t.Skipf("needs CPUs 0 and 1 (%v, %v)", mine, err)
	}
	ctx, pool, _ := testPool(t)
	if _, err := postmasterPID(ctx, pool); err != nil {
		t.Skipf("the server's processes are not readable here: %v", err)
	}
	// the process's CPUs, all its threads': the goroutine below may run on the main thread, which
	// then keeps CPU 1 after it ends
	before, err := processCPUs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// threads the runtime started from the one on CPU 1 have its CPUs: all back as they were
	defer func() {
		for _, tid := range threadsOf(os.Getpid()) {
			_ = unix.SchedSetaffinity(tid, &mine)
		}
	}()
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // the thread ends with the goroutine: its CPUs need no undoing
		var one unix.CPUSet
		one.Set(1)
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			done <- err
			return
		}
		p, err := pinCPUs(ctx, pool, []int{0})
		if errors.Is(err, unix.EPERM) {
			done <- nil
			return
		}
		if err != nil {
			done <- fmt.Errorf("pinCPUs from a thread on CPU 1 only: %w", err)
			return
		}
		done <- p.restore()
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, err := processCPUs(os.Getpid()); err != nil || got != before {
		t.Errorf("after restore this process may use CPUs %v (%v), want %v", got, err, before)
	}
}

// TestRestoreReportsFailures: a thread that is gone is skipped, a CPU set the kernel refuses is
// an error naming the thread.
func TestRestoreReportsFailures(t *testing.T) {
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		t.Fatal(err)
	}
	ended := exec.Command("true")
	if err := ended.Run(); err != nil {
		t.Skipf("cannot run a process: %v", err)
	}
	gone := ended.Process.Pid // ended and reaped
	p := &pinned{old: map[int]unix.CPUSet{
		gone:        mine, // ended: skipped
		os.Getpid(): {},   // no CPU at all: EINVAL, nothing changes
	}, postmaster: gone}
	mainBefore := allowedCPUs(os.Getpid())
	err := p.restore()
	if err == nil {
		t.Fatal("restore with an empty CPU set: want an error")
	}
	if !errors.Is(err, unix.EINVAL) || !strings.Contains(err.Error(), fmt.Sprintf("thread %d", os.Getpid())) {
		t.Errorf("restore: %v, want EINVAL naming thread %d", err, os.Getpid())
	}
	if strings.Contains(err.Error(), fmt.Sprintf("thread %d", gone)) {
		t.Errorf("restore: %v, want the ended thread %d skipped", err, gone)
	}
	if got := allowedCPUs(os.Getpid()); got != mainBefore {
		t.Errorf("after a refused restore the main thread may use CPUs %q, want %q as before", got, mainBefore)
	}
}
