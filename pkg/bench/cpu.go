package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/renderqueue/renderqueue/internal/procstat"
)

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
	machine   procstat.Times
	pgOK      bool
	keeperOK  bool
	machineOK bool
	// at is when the sample was taken.
	at time.Time
	// placement is where the processes sampled may run.
	placement Placement
}

// querier runs a query: a pool, or one of its connections.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// sampleCPU reads the CPU times of the keeper process (keeperPID, 0 for none), this process, the
// PostgreSQL server's processes (found through pg_stat_activity; only when the server runs on
// this machine) and the machine, and where those processes may run.
//
// The backend that runs the query is counted too: a pool may sample through one connection
// before a run and another after it, and a backend missing from the first sample counts whole
// (from its start) in cpuBetween, so leaving the sampler out would charge the run with all the
// earlier work of the first sample's connection (loading the rows, resetting a queue).
func sampleCPU(ctx context.Context, q querier, keeperPID int) (s cpuSample) {
	s.pg = map[int]time.Duration{}
	s.at = time.Now()
	defer func() { s.placement = samplePlacement(keeperPID, s.pg) }()
	if keeperPID > 0 {
		s.keeper, s.keeperOK = procstat.CPU(keeperPID)
	}
	s.self, _ = procstat.CPU(os.Getpid())
	s.machine, s.machineOK = procstat.Machine()
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
		if !localPostgres(pid) {
			s.pgOK = false // not this machine's process: the server is elsewhere
			continue
		}
		if d, ok := procstat.CPU(pid); ok {
			s.pg[pid] = d
		}
	}
	return s
}

// localPostgres says whether pid, a server process's pid as PostgreSQL reports it, is a postgres
// process on this machine.
func localPostgres(pid int) bool {
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(cmd), "postgres")
}

// cpuUse is the CPU a run used, by whom.
type cpuUse struct {
	Keeper, Clients, Postgres time.Duration
	// Machine is the machine's CPU time over the run: busy, stolen by the hypervisor, in all.
	Machine procstat.Times
	// Wall is the time between the samples the figures come from.
	Wall time.Duration
	// KeeperOK, PostgresOK and MachineOK say which figures were measured.
	KeeperOK, PostgresOK, MachineOK bool
}

func cpuBetween(a, b cpuSample) cpuUse {
	u := cpuUse{Keeper: b.keeper - a.keeper, Clients: b.self - a.self, Machine: b.machine.Sub(a.machine), Wall: b.at.Sub(a.at),
		KeeperOK: a.keeperOK && b.keeperOK, PostgresOK: a.pgOK && b.pgOK, MachineOK: a.machineOK && b.machineOK}
	for pid, d := range b.pg {
		u.Postgres += d - a.pg[pid] // a process that started during the run counts whole
	}
	return u
}
