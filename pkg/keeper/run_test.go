package keeper

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"

	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRunRepairsAfterGap runs the whole service loop on the real clock: it loads, loses its
// listener while a write is made, turns inexact, and by itself walks after the resumption and is
// exact again with the write held and counted as a repair.
func TestRunRepairsAfterGap(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := postgres.Open(ctx, dsn, postgres.Options{ReconnectMin: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	sh, err := NewShard(Options{Name: "run", Store: st, Log: logr.Discard()}, allSlots(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sh.Run(ctx, nil) }()
	eventually(t, "the load", 10*time.Second, sh.Ready)
	if !sh.Status(time.Now()).Exact {
		t.Fatal("not exact after load")
	}

	admin, err := pgtest.WithDatabase(dsn, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	ac, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ac.Close(context.Background()) }()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	var db string
	if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	allow := func(on bool) {
		if _, err := ac.Exec(context.Background(), fmt.Sprintf(`ALTER DATABASE %s WITH ALLOW_CONNECTIONS %v`, pgx.Identifier{db}.Sanitize(), on)); err != nil {
			t.Fatal(err)
		}
	}
	allow(false)
	defer allow(true)
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, postgres.ListenerApplicationName); err != nil {
		t.Fatal(err)
	}
	eventually(t, "inexact after the listener is cut off", 10*time.Second, func() bool { return !sh.Status(time.Now()).Exact })
	if _, err := conn.Exec(ctx, `INSERT INTO render_schedule (key, due_at, cadence_ms) VALUES ('missed', now() - interval '1 hour', 3600000)`); err != nil {
		t.Fatal(err)
	}
	allow(true)
	eventually(t, "exact again after the repair walk", 20*time.Second, func() bool {
		s := sh.Status(time.Now())
		return s.Exact && s.Due == 1
	})
	if w := sh.Status(time.Now()).LastWalk; w == nil || w.Repaired != 1 {
		t.Fatalf("last walk %+v, want one repair", w)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run stopped with %v", err)
	}
}
