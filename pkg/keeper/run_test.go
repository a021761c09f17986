package keeper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/changes"
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
	st, err := postgres.Open(ctx, dsn, postgres.Options{ReconnectMin: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond, QuietCompletions: true})
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
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, changes.ListenerApplicationName); err != nil {
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

// TestRunOpensTheStoreWhenItCan: with Options.Open, Run serves an unready, inexact status with
// Open's error while Open fails, adopts settings meanwhile, and loads once Open succeeds.
func TestRunOpensTheStoreWhenItCan(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu     sync.Mutex
		reach  bool
		tries  int
		opened *postgres.Store
	)
	open := func(ctx context.Context) (store.Store, error) {
		mu.Lock()
		defer mu.Unlock()
		tries++
		if !reach {
			return nil, errors.New("connecting to the database: connection refused")
		}
		st, err := postgres.Open(ctx, dsn, postgres.Options{})
		if err != nil {
			return nil, err
		}
		if err := st.Migrate(ctx); err != nil {
			_ = st.Close()
			return nil, err
		}
		opened = st
		return st, nil
	}
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		if opened != nil {
			_ = opened.Close()
		}
	}()
	if _, err := NewShard(Options{Name: "x", Log: logr.Discard()}, allSlots(time.Hour)); err == nil {
		t.Fatal("a shard without Store or Open was accepted")
	}
	sh, err := NewShard(Options{Name: "lazy", Open: open, Log: logr.Discard(),
		ConnectBackoffMin: 10 * time.Millisecond, ConnectBackoffMax: 20 * time.Millisecond}, allSlots(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	updates := make(chan Settings, 1)
	done := make(chan error, 1)
	go func() { done <- sh.Run(ctx, updates) }()
	eventually(t, "a few failed opens", 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return tries >= 3
	})
	st := sh.Status(time.Now())
	if st.Status != shardapi.StatusUnready || st.Exact || st.Complete || st.Error != "connecting to the database: connection refused" || sh.Ready() {
		t.Fatalf("status while the store cannot be opened: %+v", st)
	}
	if _, err := sh.Claim(time.Now(), 10, 0); !errors.Is(err, ErrLoading) {
		t.Fatalf("claim while the store cannot be opened: %v", err)
	}
	// settings arrive meanwhile and are adopted
	next := allSlots(2 * time.Hour)
	next.Epoch = 2
	updates <- next
	eventually(t, "the new settings", 10*time.Second, func() bool { return sh.Status(time.Now()).Window == 7200 })

	mu.Lock()
	reach = true
	mu.Unlock()
	eventually(t, "the load once the store opens", 10*time.Second, sh.Ready)
	st = sh.Status(time.Now())
	if !st.Exact || st.Error != "" || st.Membership.Epoch != 2 {
		t.Fatalf("status once open: %+v", st)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run stopped with %v", err)
	}
}
