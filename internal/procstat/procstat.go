// Package procstat reads a process's and the machine's CPU time (and a process's parent) from
// Linux's /proc, for the benchmarks that say where CPU goes and how much of it the hypervisor took
// (pkg/bench, the store's statement benchmark, the keeper's load and latency benchmarks).
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTicks is the kernel's USER_HZ, the unit of /proc CPU times (100 on Linux).
const clockTicks = 100

// statFields returns the fields of /proc/<pid>/stat that follow the command (the first is the
// state), or false when they cannot be read (no such process here, or not Linux).
func statFields(pid int) ([]string, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, false
	}
	// the command may hold spaces and parentheses: the fields follow the last ')'
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, false
	}
	return strings.Fields(s[i+1:]), true
}

// CPU returns the CPU time (user + system) process pid has used, from /proc/<pid>/stat, and
// false when that cannot be read (no such process here, or not Linux).
func CPU(pid int) (time.Duration, bool) {
	f, ok := statFields(pid)
	if !ok || len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, true
}

// Parent returns the parent of process pid, from /proc/<pid>/stat, and false when that cannot be
// read.
func Parent(pid int) (int, bool) {
	f, ok := statFields(pid)
	if !ok || len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// Times is the machine's CPU time so far, summed over its CPUs.
type Times struct {
	// Busy is the time the CPUs ran something: user, nice, system, irq and softirq (a guest's
	// time is counted within user and nice).
	Busy time.Duration
	// Steal is the time the CPUs were ready to run but the hypervisor ran something else (the
	// virtual machine's host is busy): waits that no code here can avoid, which show as latency.
	Steal time.Duration
	// Total is all of it: busy, idle, iowait and steal.
	Total time.Duration
}

// Sub returns the times between an earlier reading a and t.
func (t Times) Sub(a Times) Times {
	return Times{Busy: t.Busy - a.Busy, Steal: t.Steal - a.Steal, Total: t.Total - a.Total}
}

// Add returns the times of t and d together (two spans of a run).
func (t Times) Add(d Times) Times {
	return Times{Busy: t.Busy + d.Busy, Steal: t.Steal + d.Steal, Total: t.Total + d.Total}
}

// StealShare returns the share of Total that was stolen, 0..1 (0 for no time).
func (t Times) StealShare() float64 {
	if t.Total <= 0 {
		return 0
	}
	return float64(t.Steal) / float64(t.Total)
}

// BusyShare returns the share of Total the CPUs were busy, 0..1 (0 for no time).
func (t Times) BusyShare() float64 {
	if t.Total <= 0 {
		return 0
	}
	return float64(t.Busy) / float64(t.Total)
}

// Machine returns the machine's CPU times so far, from /proc/stat (false when it cannot be
// read).
func Machine() (Times, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return Times{}, false
	}
	return parseStat(string(b))
}

// parseStat reads the first line of /proc/stat: "cpu" and, in USER_HZ ticks, user nice system
// idle iowait irq softirq steal guest guest_nice (older kernels stop earlier).
func parseStat(stat string) (Times, bool) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return Times{}, false
	}
	var busy, steal, total int64
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return Times{}, false
		}
		switch i {
		case 3, 4: // idle, iowait
		case 7: // steal
			steal += n
		case 8, 9: // guest, guest_nice: already counted in user and nice
			continue
		default:
			busy += n
		}
		total += n
	}
	tick := func(n int64) time.Duration { return time.Duration(n) * time.Second / clockTicks }
	return Times{Busy: tick(busy), Steal: tick(steal), Total: tick(total)}, true
}

// HugePageShared returns how many bytes of shared memory process pid has mapped on huge pages
// (MAP_HUGETLB: "/anon_hugepage" in /proc/<pid>/maps, as PostgreSQL maps its shared buffers when
// huge_pages allows and the kernel has them reserved), and false when the maps cannot be read.
func HugePageShared(pid int) (int64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return 0, false
	}
	return hugePageBytes(string(b)), true
}

// hugePageBytes sums the sizes of the "/anon_hugepage" mappings in the text of a
// /proc/<pid>/maps.
func hugePageBytes(maps string) int64 {
	var n int64
	for _, line := range strings.Split(maps, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[5] != "/anon_hugepage" {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		a, err1 := strconv.ParseUint(lo, 16, 64)
		z, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 == nil && err2 == nil && z > a {
			n += int64(z - a)
		}
	}
	return n
}
