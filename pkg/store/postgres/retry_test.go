package postgres

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/jackc/pgx/v5"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/storetest"
)

// completeBlocker holds a row lock so that a group commit waits on it, and ends the waiting
// backend on demand: a connection killed in the middle of a completion's write.
type completeBlocker struct {
	t    testing.TB
	st   *Store
	tx   pgx.Tx
	conn *pgx.Conn
}

// blockCompletions locks key's row in a transaction of its own until release.
func blockCompletions(t testing.TB, st *Store, dsn, key string) *completeBlocker {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM render_schedule WHERE key = $1 FOR UPDATE`, key); err != nil {
		t.Fatal(err)
	}
	return &completeBlocker{t: t, st: st, tx: tx, conn: conn}
}

// waitBlocked waits until a group commit waits on the lock and returns its backend's pid.
func (b *completeBlocker) waitBlocked() int {
	b.t.Helper()
	return lockWaiter(b.t, b.st, "UPDATE render_schedule AS r SET due_at%")
}

// lockWaiter waits until a backend of st's database running a query LIKE pattern waits for a
// lock, and returns its pid.
func lockWaiter(t testing.TB, st *Store, pattern string) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var pid int
		err := st.pool.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1`, pattern).Scan(&pid)
		if err == nil {
			return pid
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no query %q waited on a lock", pattern)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// kill waits until a group commit waits on the lock and terminates its backend.
func (b *completeBlocker) kill() {
	b.t.Helper()
	pid := b.waitBlocked()
	if _, err := b.st.pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid); err != nil {
		b.t.Fatal(err)
	}
	// the next waitBlocked must not find this backend again
	for {
		var n int
		if err := b.st.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil {
			b.t.Fatal(err)
		}
		if n == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (b *completeBlocker) release() {
	if err := b.tx.Rollback(context.Background()); err != nil {
		b.t.Fatal(err)
	}
}

// commitWith runs sql in the blocking transaction and commits it.
func (b *completeBlocker) commitWith(sql string, args ...any) {
	b.t.Helper()
	if _, err := b.tx.Exec(context.Background(), sql, args...); err != nil {
		b.t.Fatal(err)
	}
	if err := b.tx.Commit(context.Background()); err != nil {
		b.t.Fatal(err)
	}
}

// TestRetryOfRevCheckedCompletion: when a rev-checked completion's first attempt is lost with
// its connection, the retry finds the rev moved. A row as the completion writes it (what a first
// attempt that committed leaves) counts as written; a row changed otherwise is Changed.
func TestRetryOfRevCheckedCompletion(t *testing.T) {
	st, dsn := openTestStore(t, Options{})
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		meanwhile   string // what the row becomes while the first attempt dies
		wantChanged bool
	}{
		{"as written by the first attempt", `UPDATE render_schedule SET due_at = $2, urgent = false WHERE key = $1`, false},
		{"changed by a producer", `UPDATE render_schedule SET urgent = true WHERE key = $1 AND $2::timestamptz IS NOT NULL`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, err := st.Upsert(ctx, []schedule.Row{storetest.Row("retry/"+strings.ReplaceAll(tc.name, " ", "-"), time.Now().Add(-time.Hour))})
			if err != nil {
				t.Fatal(err)
			}
			due := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
			b := blockCompletions(t, st, dsn, in[0].Key)
			type out struct {
				res []store.CompleteResult
				err error
			}
			done := make(chan out, 1)
			go func() {
				res, err := st.Complete(ctx, []store.Completion{{Key: in[0].Key, Due: due, Rev: in[0].Rev}})
				done <- out{res, err}
			}()
			b.kill()
			b.waitBlocked()
			b.commitWith(tc.meanwhile, in[0].Key, due)
			o := <-done
			if o.err != nil || len(o.res) != 1 || !o.res[0].Found || o.res[0].Changed != tc.wantChanged || o.res[0].Row.Rev <= in[0].Rev {
				t.Fatalf("retried completion: %+v %v, want changed=%v", o.res, o.err, tc.wantChanged)
			}
		})
	}
}

// TestCompleteRetriesOnConnectionError: a group commit whose connection is killed is written
// once more on another connection and succeeds; one killed twice fails, and says so in the log.
func TestCompleteRetriesOnConnectionError(t *testing.T) {
	var mu sync.Mutex
	var logged []string
	logger := funcr.New(func(_, args string) {
		mu.Lock()
		logged = append(logged, args)
		mu.Unlock()
	}, funcr.Options{})
	st, dsn := openTestStore(t, Options{Logger: logger})
	ctx := context.Background()
	in := storetest.Row("https://example.com/retry", time.Now().Add(-time.Hour))
	if _, err := st.Upsert(ctx, []schedule.Row{in}); err != nil {
		t.Fatal(err)
	}
	complete := func(due time.Time) <-chan error {
		done := make(chan error, 1)
		go func() {
			res, err := st.Complete(ctx, []store.Completion{{Key: in.Key, Due: due}})
			if err == nil && (len(res) != 1 || !res[0].Found || !res[0].Row.Due.Equal(due)) {
				t.Errorf("result %+v", res)
			}
			done <- err
		}()
		return done
	}

	// killed once: written by the retry
	due := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	b := blockCompletions(t, st, dsn, in.Key)
	done := complete(due)
	b.kill()
	b.waitBlocked() // the retry, on another connection
	b.release()
	if err := <-done; err != nil {
		t.Fatalf("completion killed once: %v", err)
	}
	var got time.Time
	if err := st.pool.QueryRow(ctx, `SELECT due_at FROM render_schedule WHERE key = $1`, in.Key).Scan(&got); err != nil || !got.Equal(due) {
		t.Fatalf("due_at %v (%v), want %v", got, err, due)
	}

	// killed twice: the call fails, logged
	b = blockCompletions(t, st, dsn, in.Key)
	done = complete(due.Add(time.Hour))
	b.kill()
	b.kill()
	err := <-done
	b.release()
	if err == nil || !strings.Contains(err.Error(), "terminating connection") {
		t.Fatalf("completion killed twice: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	all := strings.Join(logged, "\n")
	if strings.Count(all, "retrying once") != 2 || strings.Count(all, "its requests fail") != 1 {
		t.Fatalf("log:\n%s", all)
	}
}

// TestQuietCompletionLostIsAGap: a quiet group commit (QuietCompletions) killed on both attempts
// may have written its rows without change events, so the store's subscription signals a gap
// (then resumed); the subscriber walks.
func TestQuietCompletionLostIsAGap(t *testing.T) {
	st, dsn := openTestStore(t, Options{QuietCompletions: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in := storetest.Row("https://example.com/quiet-lost", time.Now().Add(-time.Hour))
	if _, err := st.Upsert(ctx, []schedule.Row{in}); err != nil {
		t.Fatal(err)
	}
	sub, err := st.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	b := blockCompletions(t, st, dsn, in.Key)
	done := make(chan error, 1)
	go func() {
		_, err := st.Complete(ctx, []store.Completion{{Key: in.Key, Due: time.Now().Add(time.Hour)}})
		done <- err
	}()
	b.kill()
	b.kill()
	err = <-done
	b.release()
	if err == nil {
		t.Fatal("completion killed twice succeeded")
	}
	next, err := sub.Next(ctx)
	if err != nil || next.Kind != store.KindGap || !strings.Contains(next.Err.Error(), "without change events") {
		t.Fatalf("after the lost group commit: %+v %v, want a gap", next, err)
	}
	if next, err = sub.Next(ctx); err != nil || next.Kind != store.KindResumed {
		t.Fatalf("after the gap: %+v %v, want resumed", next, err)
	}
}
