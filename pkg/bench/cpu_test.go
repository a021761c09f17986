package bench

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/renderqueue/renderqueue/internal/procstat"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

// testPool connects to the test server (pgtest.DSN): a context of a minute, a pool closed when the
// test ends, and the DSN.
func testPool(t *testing.T) (context.Context, *pgxpool.Pool, string) {
	t.Helper()
	dsn := pgtest.DSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return ctx, pool, dsn
}

// TestSampleCPUCountsOnlyTheRun samples PostgreSQL's CPU through one connection before and
// another after, with nothing run in between: a connection that did a second of work before the
// first sample must not be charged to the run (it was, while the sampling backend left itself out
// of the sample).
func TestSampleCPUCountsOnlyTheRun(t *testing.T) {
	ctx, pool, _ := testPool(t)
	busy, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Release()
	other, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	pid := int(busy.Conn().PgConn().PID()) // the backend serving this connection
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
		t.Skipf("PostgreSQL does not run on this machine: %v", err)
	}
	// about a second of CPU in the busy backend, before the run
	start, _ := procstat.CPU(pid)
	for spent := time.Duration(0); spent < time.Second; {
		if _, err := busy.Exec(ctx, "SELECT count(*) FROM generate_series(1, 2000000)"); err != nil {
			t.Fatal(err)
		}
		now, _ := procstat.CPU(pid)
		spent = now - start
	}
	before := sampleCPU(ctx, busy, 0)
	after := sampleCPU(ctx, other, 0)
	use := cpuBetween(before, after)
	if !use.PostgresOK {
		t.Skip("PostgreSQL's processes were not readable")
	}
	if use.Postgres > 500*time.Millisecond {
		t.Fatalf("PostgreSQL CPU between two samples with nothing run in between: %v (the busy backend's earlier work was charged to the run)", use.Postgres)
	}
}
