package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"

	"github.com/renderqueue/renderqueue/internal/procstat"
)

// Placement is where a run's processes were allowed to run, as Linux lists CPUs ("0-1", "1"):
// the Cpus_allowed_list of each, read from /proc when the run ended. A field is empty when it
// could not be read (no keeper in the run; a PostgreSQL server on another machine).
type Placement struct {
	// Postgres lists the CPUs of the server's processes; several lists joined by " / " when they
	// differ.
	Postgres string
	// Keeper is the keeper process's; Clients this process's (its workers').
	Keeper, Clients string
}

// String describes the placement for the report.
func (p Placement) String() string {
	or := func(s string) string {
		if s == "" {
			return "n/a"
		}
		return s
	}
	return fmt.Sprintf("PostgreSQL %s; keeper %s; workers %s", or(p.Postgres), or(p.Keeper), or(p.Clients))
}

// samplePlacement reads where the keeper (keeperPID, 0 for none), this process and the server's
// processes (the keys of postgres) may run.
func samplePlacement(keeperPID int, postgres map[int]time.Duration) Placement {
	var p Placement
	if keeperPID > 0 {
		p.Keeper = allowedCPUs(keeperPID)
	}
	p.Clients = allowedCPUs(os.Getpid())
	var lists []string
	for pid := range postgres {
		if l := allowedCPUs(pid); l != "" && !slices.Contains(lists, l) {
			lists = append(lists, l)
		}
	}
	slices.Sort(lists)
	p.Postgres = strings.Join(lists, " / ")
	return p
}

// allowedCPUs returns the Cpus_allowed_list of process pid, or "".
func allowedCPUs(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// cpuSetSize is how many CPUs a unix.CPUSet holds.
const cpuSetSize = int(unsafe.Sizeof(unix.CPUSet{})) * 8

// parseCPUList parses a Linux CPU list ("0", "0-1", "0,2-3") into its CPUs, ascending.
func parseCPUList(s string) ([]int, error) {
	var cpus []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		lo, hi, isRange := strings.Cut(f, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("CPU list %q: %q is not a CPU number or range", s, f)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("CPU list %q: %q is not a range of CPUs", s, f)
			}
		}
		for c := a; c <= b; c++ {
			if c >= cpuSetSize {
				return nil, fmt.Errorf("CPU list %q: CPU %d is past the last a CPU set holds (%d)", s, c, cpuSetSize-1)
			}
			cpus = append(cpus, c)
		}
	}
	slices.Sort(cpus)
	return slices.Compact(cpus), nil
}

// splitCPUs returns the CPU sets of a split placement: the server's (postgres, which must all be
// among the CPUs this process may use, allowed) and the rest's (allowed less postgres, which must
// not be empty).
func splitCPUs(postgres []int, allowed unix.CPUSet) (pg, rest unix.CPUSet, err error) {
	rest = allowed
	for _, c := range postgres {
		if !allowed.IsSet(c) {
			return pg, rest, fmt.Errorf("CPU %d is not among the CPUs this process may use", c)
		}
		pg.Set(c)
		rest.Clear(c)
	}
	if pg.Count() == 0 {
		return pg, rest, errors.New("no CPU for PostgreSQL")
	}
	if rest.Count() == 0 {
		return pg, rest, errors.New("no CPU is left for the keeper and the workers")
	}
	return pg, rest, nil
}

// pinned is a placement set by pinCPUs, to be undone.
type pinned struct {
	old map[int]unix.CPUSet // by thread id: the CPU set it had
	// postmaster is the server's postmaster; the processes it started after the placement get its
	// old CPU set back too, as this process's threads started since get this process's.
	postmaster int
}

// restore gives every thread pinCPUs moved its CPU set back (threads gone since are skipped), and
// the server's processes started since (backends still connected) the postmaster's.
func (p *pinned) restore() error {
	var errs []error
	put := func(tid int, set unix.CPUSet) {
		if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("restoring the CPUs of thread %d: %w", tid, err))
		}
	}
	for tid, set := range p.old {
		put(tid, set)
	}
	if set, ok := p.old[p.postmaster]; ok {
		for _, pid := range childrenOf(p.postmaster) {
			if _, moved := p.old[pid]; !moved {
				put(pid, set) // PostgreSQL's processes have one thread each
			}
		}
	}
	if set, ok := p.old[os.Getpid()]; ok {
		// a thread started since has the placement of the thread that started it, and the
		// runtime may start one while this runs, from a thread not given back yet: until a pass
		// finds no thread it has not seen (most likely how a thread was left on the keeper's
		// CPUs once, and the next round's placement, then reading that thread's CPUs, failed)
		seen := map[int]bool{}
		for again := true; again; {
			again = false
			for _, tid := range threadsOf(os.Getpid()) {
				if _, moved := p.old[tid]; moved || seen[tid] {
					continue
				}
				seen[tid], again = true, true
				put(tid, set)
			}
		}
	}
	return errors.Join(errs...)
}

// threadsOf lists the threads of process pid (none when it is gone).
func threadsOf(pid int) []int {
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	var tids []int
	for _, t := range tasks {
		if tid, err := strconv.Atoi(t.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids
}

// set moves every thread of process pid to set, remembering what each had.
func (p *pinned) set(pid int, set unix.CPUSet) error {
	for _, tid := range threadsOf(pid) { // none when it ended meanwhile (a backend disconnecting)
		var old unix.CPUSet
		if err := unix.SchedGetaffinity(tid, &old); err != nil {
			if errors.Is(err, unix.ESRCH) {
				continue // the thread ended meanwhile
			}
			return fmt.Errorf("reading the CPUs of process %d: %w", pid, err)
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			if errors.Is(err, unix.ESRCH) {
				continue
			}
			return fmt.Errorf("setting the CPUs of process %d: %w", pid, err)
		}
		if _, seen := p.old[tid]; !seen {
			p.old[tid] = old
		}
	}
	return nil
}

// pinCPUs places the PostgreSQL server that q is connected to (its postmaster and every process
// it has started, so also the backends it starts later) on the CPUs listed in postgres, and this
// process (and so the keeper it starts) on the other CPUs it may use. The server must run on this
// machine, and this process must be allowed to set its processes' CPUs (root, or the server's
// user). On an error, nothing stays changed.
func pinCPUs(ctx context.Context, q querier, postgres []int) (*pinned, error) {
	allowed, err := processCPUs(os.Getpid())
	if err != nil {
		return nil, err
	}
	pgSet, rest, err := splitCPUs(postgres, allowed)
	if err != nil {
		return nil, err
	}
	postmaster, err := postmasterPID(ctx, q)
	if err != nil {
		return nil, err
	}
	p := &pinned{old: map[int]unix.CPUSet{}, postmaster: postmaster}
	fail := func(err error) (*pinned, error) {
		return nil, errors.Join(err, p.restore())
	}
	// twice: a process the postmaster started while the first pass ran is moved by the second
	for range 2 {
		for _, pid := range append([]int{postmaster}, childrenOf(postmaster)...) {
			if err := p.set(pid, pgSet); err != nil {
				return fail(fmt.Errorf("placing PostgreSQL on CPUs %v: %w", postgres, err))
			}
		}
		if err := p.set(os.Getpid(), rest); err != nil {
			return fail(fmt.Errorf("placing this process: %w", err))
		}
	}
	return p, nil
}

// processCPUs is the CPUs any thread of process pid may use. Not one thread's: the calling thread
// is any of the runtime's, and it — or the main thread, which a goroutine locked to its thread
// may be on — may have been placed on fewer CPUs than the process has.
func processCPUs(pid int) (unix.CPUSet, error) {
	var all unix.CPUSet
	var firstErr error
	for _, tid := range threadsOf(pid) { // the main thread among them (its id is pid)
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(tid, &set); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue // a thread that ended since it was listed
		}
		for c := range cpuSetSize {
			if set.IsSet(c) {
				all.Set(c)
			}
		}
	}
	if all.Count() == 0 {
		if firstErr == nil {
			firstErr = errors.New("no thread has a CPU")
		}
		return all, fmt.Errorf("reading this process's CPUs: %w", firstErr)
	}
	return all, nil
}

// postmasterPID finds the server's postmaster: the parent of the backend serving q, which must be
// a postgres process on this machine.
func postmasterPID(ctx context.Context, q querier) (int, error) {
	rows, err := q.Query(ctx, "SELECT pg_backend_pid()")
	if err != nil {
		return 0, fmt.Errorf("finding the server's processes: %w", err)
	}
	backend, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[int])
	if err != nil {
		return 0, fmt.Errorf("finding the server's processes: %w", err)
	}
	if !localPostgres(backend) {
		return 0, errors.New("PostgreSQL does not run on this machine (its backend is not a process here): its CPUs cannot be set")
	}
	ppid, ok := procstat.Parent(backend)
	if !ok || ppid <= 1 {
		return 0, fmt.Errorf("finding the postmaster: backend %d has no parent", backend)
	}
	return ppid, nil
}

// sharedMemory describes the server's shared buffers for the report: their size, and whether
// they are on huge pages, which PostgreSQL 15 does not say (with huge_pages = try it falls back to
// ordinary pages when the kernel has none reserved): read from the postmaster's memory maps when
// the server runs on this machine. A random page of a large buffer pool costs a TLB miss on
// ordinary pages, and both queues' statements read such pages for every row.
func sharedMemory(ctx context.Context, q querier) (string, error) {
	rows, err := q.Query(ctx, "SELECT current_setting('shared_buffers'), current_setting('huge_pages')")
	if err != nil {
		return "", fmt.Errorf("reading the server's shared memory settings: %w", err)
	}
	type settings struct{ Buffers, Huge string }
	set, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[settings])
	if err != nil {
		return "", fmt.Errorf("reading the server's shared memory settings: %w", err)
	}
	desc := fmt.Sprintf("shared_buffers %s, huge_pages = %s", set.Buffers, set.Huge)
	var (
		n  int64
		ok bool // the server runs here and its maps were read
	)
	if pm, err := postmasterPID(ctx, q); err == nil {
		n, ok = procstat.HugePageShared(pm)
	}
	switch {
	case !ok:
		return desc + ": whether on huge pages is not known here", nil
	case n == 0:
		return desc + ": not on huge pages", nil
	}
	return fmt.Sprintf("%s: on huge pages (%d MiB)", desc, n>>20), nil
}

// childrenOf returns the processes whose parent is pid.
func childrenOf(pid int) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var out []int
	for _, d := range dirs {
		c, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if ppid, ok := procstat.Parent(c); ok && ppid == pid {
			out = append(out, c)
		}
	}
	return out
}
