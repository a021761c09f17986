package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// clockTicks is the kernel's USER_HZ, the unit of /proc CPU times (100 on Linux).
const clockTicks = 100

// procCPU returns the CPU time (user + system) process pid has used, from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// the command may hold spaces and parentheses: the fields follow the last ')'
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, true
}

// machineCPU returns the busy and total CPU time of the machine so far, from /proc/stat.
func machineCPU() (busy, total time.Duration, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, false
	}
	var sum, idle int64
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		if i == 7 || i == 8 { // guest time is already counted in user
			continue
		}
		sum += n
		if i == 3 || i == 4 { // idle, iowait
			idle += n
		}
	}
	return time.Duration(sum-idle) * time.Second / clockTicks, time.Duration(sum) * time.Second / clockTicks, true
}

// loadAverage returns the 1-minute load average, or -1.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// cpuSample is the CPU used so far by the processes a run is attributed to.
type cpuSample struct {
	keeper    time.Duration
	self      time.Duration
	pg        map[int]time.Duration // by PostgreSQL process
	busy, all time.Duration
	pgOK      bool
	keeperOK  bool
	machineOK bool
}

// querier runs a query: a pool, or one of its connections.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// sampleCPU reads the CPU times of the keeper process (keeperPID, 0 for none), this process, the
// PostgreSQL server's processes (found through pg_stat_activity; only when the server runs on
// this machine) and the machine.
//
// The backend that runs the query is counted too: a pool may sample through one connection
// before a run and another after it, and a backend missing from the first sample counts whole
// (from its start) in cpuBetween, so leaving the sampler out would charge the run with all the
// earlier work of the first sample's connection (loading the rows, resetting a queue).
func sampleCPU(ctx context.Context, q querier, keeperPID int) cpuSample {
	s := cpuSample{pg: map[int]time.Duration{}}
	if keeperPID > 0 {
		s.keeper, s.keeperOK = procCPU(keeperPID)
	}
	s.self, _ = procCPU(os.Getpid())
	s.busy, s.all, s.machineOK = machineCPU()
	rows, err := q.Query(ctx, "SELECT pid FROM pg_stat_activity")
	if err != nil {
		return s
	}
	defer rows.Close()
	s.pgOK = true
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) != nil {
			continue
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !strings.Contains(string(cmd), "postgres") {
			s.pgOK = false // not this machine's process: the server is elsewhere
			continue
		}
		if d, ok := procCPU(pid); ok {
			s.pg[pid] = d
		}
	}
	return s
}

// cpuUse is the CPU a run used, by whom.
type cpuUse struct {
	Keeper, Clients, Postgres time.Duration
	// Busy is the machine's busy CPU time and Total its CPU time available over the run.
	Busy, Total time.Duration
	// KeeperOK, PostgresOK and MachineOK say which figures were measured.
	KeeperOK, PostgresOK, MachineOK bool
}

func cpuBetween(a, b cpuSample) cpuUse {
	u := cpuUse{Keeper: b.keeper - a.keeper, Clients: b.self - a.self, Busy: b.busy - a.busy, Total: b.all - a.all,
		KeeperOK: a.keeperOK && b.keeperOK, PostgresOK: a.pgOK && b.pgOK, MachineOK: a.machineOK && b.machineOK}
	for pid, d := range b.pg {
		u.Postgres += d - a.pg[pid] // a process that started during the run counts whole
	}
	return u
}
