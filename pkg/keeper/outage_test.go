package keeper

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/jackc/pgx/v5"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

// TestSettingsDuringOutage: while PostgreSQL refuses connections, settings changes (slots leave,
// then come back with the window changed) are taken at once — the run loop never waits for the
// subscription — and the shard keeps serving its status and claims of what it holds, inexact;
// once the database is back the subscription follows the last slot set, the shard walks and is
// exact under the new settings, and a write to a slot that came back is delivered.
func TestSettingsDuringOutage(t *testing.T) {
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
	rows := make([]schedule.Row, 200)
	for i := range rows {
		rows[i] = srow(fmt.Sprintf("https://example.com/o/%d", i), time.Now().Add(-time.Hour), time.Hour)
	}
	if rows, err = st.Upsert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	sh, err := NewShard(Options{Name: "outage", Store: st, Log: testLogger(t)}, allSlots(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	updates := make(chan Settings) // unbuffered: a send completes only when Run takes it
	done := make(chan error, 1)
	go func() { done <- sh.Run(ctx, updates) }()
	eventually(t, "the load", 10*time.Second, func() bool { return sh.Status(time.Now()).Exact })

	admin, err := pgtest.WithDatabase(dsn, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	ac, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ac.Close(context.Background()) }()
	var db string
	if err := st.Pool().QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	allow := func(on bool) {
		if _, err := ac.Exec(context.Background(), fmt.Sprintf(`ALTER DATABASE %s WITH ALLOW_CONNECTIONS %v`, pgx.Identifier{db}.Sanitize(), on)); err != nil {
			t.Fatal(err)
		}
	}
	allow(false)
	defer allow(true)
	if _, err := ac.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, db); err != nil {
		t.Fatal(err)
	}
	eventually(t, "inexact once the listener is cut off", 10*time.Second, func() bool { return !sh.Status(time.Now()).Exact })

	// the slots of the first half of the hash space leave; then they come back, with a new window
	var half schedule.SlotSet
	for sl := schedule.NumSlots / 2; sl < schedule.NumSlots; sl++ {
		half.Add(sl)
	}
	s2 := allSlots(24 * time.Hour)
	s2.Epoch, s2.Owned = 2, half
	s3 := allSlots(48 * time.Hour)
	s3.Epoch = 3
	for _, s := range []Settings{s2, s3} {
		select {
		case updates <- s:
		case <-time.After(10 * time.Second):
			t.Fatalf("the run loop did not take the settings of epoch %d while the database was down", s.Epoch)
		}
		eventually(t, fmt.Sprintf("epoch %d in the status", s.Epoch), 10*time.Second, func() bool {
			return sh.Status(time.Now()).Membership.Epoch == s.Epoch
		})
	}
	status := sh.Status(time.Now())
	if status.Exact || status.Window != (48*time.Hour).Seconds() || status.Rows.Held == 0 {
		t.Fatalf("status during the outage: exact %v window %v held %d", status.Exact, status.Window, status.Rows.Held)
	}
	claimed, err := sh.Claim(time.Now(), 5, time.Minute)
	if err != nil || len(claimed) != 5 {
		t.Fatalf("claim during the outage: %d rows, %v", len(claimed), err)
	}

	allow(true)
	eventually(t, "exact under the new settings", 30*time.Second, func() bool {
		s := sh.Status(time.Now())
		return s.Exact && s.Membership.Epoch == 3 && s.Rows.Held == len(rows)
	})
	// a write to a slot that came back is delivered by the subscription
	var key string
	for i := 0; key == ""; i++ {
		k := fmt.Sprintf("https://example.com/back/%d", i)
		if out, err := st.Upsert(ctx, []schedule.Row{srow(k, time.Now().Add(-time.Minute), time.Hour)}); err != nil {
			t.Fatal(err)
		} else if !half.Has(out[0].Slot()) {
			key = k
		}
	}
	eventually(t, "the write to a slot that came back", 10*time.Second, func() bool {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		_, held := sh.core.HeldRev(key)
		return held
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run stopped with %v", err)
	}
}

func testLogger(t *testing.T) logr.Logger {
	return funcr.New(func(prefix, args string) { t.Log(time.Now().Format("15:04:05.000"), prefix, args) }, funcr.Options{Verbosity: 1})
}

// TestRunRetriesPartialWalk: a walk that could not read a segment leaves the shard inexact; Run
// walks again after a short back-off rather than at the next verify interval (an hour here).
func TestRunRetriesPartialWalk(t *testing.T) {
	e := newShardEnv(t, allSlots(24*time.Hour))
	rows := e.upsert(srow("https://example.com/partial", time.Now().Add(-time.Hour), time.Hour))
	e.fs.set(false, rows[0].Slot())
	sh, err := NewShard(Options{Name: "partial", Store: e.fs, Log: logr.Discard()}, allSlots(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- sh.Run(ctx, nil) }()
	eventually(t, "a partial load", 10*time.Second, func() bool {
		w := sh.Status(time.Now()).LastWalk
		return w != nil && w.Partial
	})
	e.fs.set(false)
	eventually(t, "exact after a retried walk", 10*time.Second, func() bool {
		s := sh.Status(time.Now())
		return s.Exact && s.Due == 1
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run stopped with %v", err)
	}
}
