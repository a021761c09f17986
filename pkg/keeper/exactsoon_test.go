package keeper

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/changes"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

// faultedShard is a shard run by Run (real clock, a 30 s verify interval, and the keeper command's
// store options but that a walk's page is not retried: every kill that hits a walk fails it) over
// a database of rows, with a superuser connection to another database of the server to break it
// from.
type faultedShard struct {
	sh    *Shard
	st    *postgres.Store
	admin *pgx.Conn
	db    string
	done  chan error
}

func newFaultedShard(t *testing.T, rows int) *faultedShard {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := postgres.Open(ctx, dsn, postgres.Options{QuietCompletions: true, WalkRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	batch := make([]schedule.Row, 0, 5000)
	for i := range rows {
		batch = append(batch, srow(fmt.Sprintf("https://example.com/fault/%06d", i), time.Now().Add(-time.Hour), time.Hour))
		if len(batch) == cap(batch) || i == rows-1 {
			if _, err := st.Upsert(ctx, batch); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	settings := allSlots(24 * time.Hour)
	settings.VerifyInterval = 30 * time.Second
	sh, err := NewShard(Options{Name: "faulted", Store: st, Log: testLogger(t)}, settings)
	if err != nil {
		t.Fatal(err)
	}
	f := &faultedShard{sh: sh, st: st, done: make(chan error, 1)}
	go func() { f.done <- sh.Run(ctx, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-f.done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run stopped with %v", err)
		}
	})
	admin, err := pgtest.WithDatabase(dsn, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	if f.admin, err = pgx.Connect(ctx, admin); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.admin.Close(context.Background()) })
	if err := st.Pool().QueryRow(ctx, `SELECT current_database()`).Scan(&f.db); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the load", 30*time.Second, func() bool { return sh.Status(time.Now()).Exact })
	return f
}

// killBackends terminates every backend of the shard's database (the listener, the walk's and
// the writers' connections; the listener's only with listener) and returns how many it ended.
func (f *faultedShard) killBackends(t *testing.T, listener bool) int {
	t.Helper()
	var n int
	if err := f.admin.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
		FROM pg_stat_activity WHERE datname = $1 AND ($2 OR application_name <> $3)`,
		f.db, listener, changes.ListenerApplicationName).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// exactWithin fails the test unless the shard is exact within d of now.
func (f *faultedShard) exactWithin(t *testing.T, what string, d time.Duration) {
	t.Helper()
	from := time.Now()
	eventually(t, what, d, func() bool { return f.sh.Status(time.Now()).Exact })
	t.Logf("%s after %.1f s", what, time.Since(from).Seconds())
}

// TestExactSoonAfterBackendKills: the PostgreSQL backends of the shard are killed every 250 ms
// for 5 s — its listener, its walks, its pool; in the last second the listener happens to be
// spared — and the shard is exact again within 10 s of the last kill, with a 30 s verify interval:
// failed walks back off no further than the walk interval, and a walk the store did not answer is
// tried again as soon as the store answers (a ping, an event, a resumption). Each resumption of
// the listener starts a walk, which the kills fail; before, the back-off doubled at each failure
// up to a minute, and once the last failure came after the last resumption nothing shortened the
// wait: the shard stayed inexact for up to a minute after the kills (66 s in issue 45).
func TestExactSoonAfterBackendKills(t *testing.T) {
	f := newFaultedShard(t, 50_000)
	killed := 0
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for i := range 20 {
		<-tick.C
		killed += f.killBackends(t, i < 16)
	}
	t.Logf("%d backends killed; last walk %+v", killed, f.sh.Status(time.Now()).LastWalk)
	f.exactWithin(t, "exact again after the kills", 10*time.Second)
}

// TestExactSoonAfterOutage: the shard's database refuses connections for 20 s (every backend
// ended, ALLOW_CONNECTIONS false: as a stopped server does), and the shard is exact again within
// 10 s of it accepting connections again.
func TestExactSoonAfterOutage(t *testing.T) {
	f := newFaultedShard(t, 20_000)
	allow := func(on bool) {
		if _, err := f.admin.Exec(context.Background(), fmt.Sprintf(`ALTER DATABASE %s WITH ALLOW_CONNECTIONS %v`, pgx.Identifier{f.db}.Sanitize(), on)); err != nil {
			t.Fatal(err)
		}
	}
	allow(false)
	t.Cleanup(func() { allow(true) })
	f.killBackends(t, true)
	eventually(t, "inexact once the database is gone", 10*time.Second, func() bool { return !f.sh.Status(time.Now()).Exact })
	outage := time.NewTimer(20 * time.Second) // the outage's length, not a wait for the shard
	<-outage.C
	t.Logf("last walk before the database is back: %+v", f.sh.Status(time.Now()).LastWalk)
	allow(true)
	f.exactWithin(t, "exact again after the outage", 10*time.Second)
}
