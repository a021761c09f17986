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

// TestParent: this process's parent is read; a process that does not exist has none.
func TestParent(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	if got, ok := Parent(os.Getpid()); !ok || got != os.Getppid() {
		t.Errorf("Parent(this process) = %d, %v; want %d", got, ok, os.Getppid())
	}
	if _, ok := Parent(-1); ok {
		t.Error("Parent(-1): want false")
	}
}

// TestMachine: the machine's times are read, and busy and stolen time are parts of the total.
func TestMachine(t *testing.T) {
	m, ok := Machine()
	if !ok {
		t.Skip("no /proc/stat here")
	}
	if m.Total <= 0 || m.Busy < 0 || m.Steal < 0 || m.Busy+m.Steal > m.Total {
		t.Errorf("busy %v and steal %v of %v", m.Busy, m.Steal, m.Total)
	}
}

// TestParseStat reads /proc/stat's first line field by field: steal is its own, guest time is
// not counted twice, and a line that is not the machine's is refused.
func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		stat string
		want Times // in ticks of 10 ms
		ok   bool
	}{
		// user nice system idle iowait irq softirq steal guest guest_nice
		{"cpu  100 20 30 400 50 6 7 80 9 1\ncpu0 1 2 3 4 5 6 7 8 9 1\n", Times{Busy: 163, Steal: 80, Total: 693}, true},
		// an older kernel: no steal or guest fields
		{"cpu 100 20 30 400 50\n", Times{Busy: 150, Total: 600}, true},
		{"cpu0 100 20 30 400 50 6 7 80 9 1\n", Times{}, false}, // one CPU's line, not the machine's
		{"cpu 100 20\n", Times{}, false},                       // too short
		{"cpu 100 20 x 400 50\n", Times{}, false},              // not a number
		{"", Times{}, false},
	} {
		got, ok := parseStat(tc.stat)
		want := Times{Busy: tc.want.Busy * 10 * time.Millisecond, Steal: tc.want.Steal * 10 * time.Millisecond,
			Total: tc.want.Total * 10 * time.Millisecond}
		if ok != tc.ok || (ok && got != want) {
			t.Errorf("parseStat(%q) = %+v, %v; want %+v, %v", tc.stat, got, ok, want, tc.ok)
		}
	}
	a, b := Times{Busy: 1, Steal: 2, Total: 10}, Times{Busy: 3, Steal: 5, Total: 20}
	if a.Add(b).Sub(b) != a || b.Sub(a) != (Times{Busy: 2, Steal: 3, Total: 10}) {
		t.Errorf("Add and Sub: %+v, %+v", a.Add(b), b.Sub(a))
	}
	if s := (Times{Steal: time.Second, Total: 4 * time.Second}).StealShare(); s != 0.25 {
		t.Errorf("StealShare = %v, want 0.25", s)
	}
	if s := (Times{Busy: 3 * time.Second, Total: 4 * time.Second}).BusyShare(); s != 0.75 {
		t.Errorf("BusyShare = %v, want 0.75", s)
	}
	if s := (Times{}).BusyShare(); s != 0 {
		t.Errorf("BusyShare of no time = %v, want 0", s)
	}
}

// TestHugePageBytes sums PostgreSQL's shared memory on huge pages from a maps text and nothing
// else: not ordinary shared memory, not huge pages of another kind, not malformed lines.
func TestHugePageBytes(t *testing.T) {
	maps := `55d6a6e00000-55d6a7400000 r-xp 00000000 fe:01 1234                       /usr/lib/postgresql/15/bin/postgres
7fcf07400000-7fcf2a000000 rw-s 00000000 00:11 1416412                    /anon_hugepage (deleted)
7fcf2c61d000-7fcf2c61e000 rw-s 00000000 00:01 196671                     /SYSV00a12155 (deleted)
7fda20951000-7fda433a7000 rw-s 00000000 00:01 24266                      /dev/zero (deleted)
7fcf00000000-7fcf00200000 rw-s 00000000 00:11 99                         /anon_hugepage
zzzz-7fcf00200000 rw-s 00000000 00:11 99                                 /anon_hugepage
7fcf00400000-7fcf00200000 rw-s 00000000 00:11 99                         /anon_hugepage
7fff0000 rw-s 00000000 00:11 99                                          /anon_hugepage
`
	want := int64(0x7fcf2a000000-0x7fcf07400000) + 0x200000
	if got := hugePageBytes(maps); got != want {
		t.Errorf("hugePageBytes = %d, want %d", got, want)
	}
	if got := hugePageBytes(""); got != 0 {
		t.Errorf("hugePageBytes(\"\") = %d", got)
	}
}
