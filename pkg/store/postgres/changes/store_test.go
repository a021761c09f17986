package changes_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/changes"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

// The tests of this package run subscriptions as the store opens them: a postgres.Store on a
// database of their own with the schema migrated, whose triggers send the change events. Package
// postgres imports this one, so they are an external test package; export_test.go gives them the
// internals they check.

// openTestStore opens a migrated store on a fresh database.
func openTestStore(tb testing.TB, opts postgres.Options) (*postgres.Store, string) {
	tb.Helper()
	dsn := pgtest.NewDatabase(tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := postgres.Open(ctx, dsn, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(ctx); err != nil {
		tb.Fatal(err)
	}
	return st, dsn
}

// breakListeners ends every subscription connection of the store's database.
func breakListeners(tb testing.TB, st *postgres.Store) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var n int
	err := st.Pool().QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1`, changes.ListenerApplicationName).Scan(&n)
	if err != nil {
		tb.Fatalf("terminating the listeners: %v", err)
	}
	if n == 0 {
		tb.Fatalf("no listener backend to terminate")
	}
}

// eventKey reads the change-event signing key (the test role owns the schema), declaring, as a
// subscription does, that it listens on group channels.
func eventKey(tb testing.TB, st *postgres.Store) []byte {
	tb.Helper()
	var h string
	err := pgx.BeginFunc(context.Background(), st.Pool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(context.Background(), `SET LOCAL renderqueue.event_channels = 'rq_slots'`); err != nil {
			return err
		}
		return tx.QueryRow(context.Background(), `SELECT renderqueue_event_key()`).Scan(&h)
	})
	if err != nil {
		tb.Fatal(err)
	}
	k, err := hex.DecodeString(h)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

// signedPayload builds a format-2 payload of body on channel, signed at ts under key.
func signedPayload(key []byte, channel string, ts time.Time, body string) string {
	tsText := strconv.FormatInt(ts.UnixMicro(), 10)
	mac := changes.Signature(key, channel, tsText, body)
	return "2" + tsText + "," + hex.EncodeToString(mac[:]) + "," + body
}

// entry is one format-1 entry for row r (as the trigger writes it).
func entry(r schedule.Row, deleted bool) string {
	due := ""
	if r.HasDue {
		due = strconv.FormatInt(r.Due.UnixMicro(), 10)
	}
	flags := 0
	if r.Source == schedule.SourceSubmitted {
		flags |= 1
	}
	if r.Urgent {
		flags |= 2
	}
	if deleted {
		flags |= 4
	}
	return fmt.Sprintf("%d,%d,%s,%d,%d,%d:%s%d:%s", r.Rev, r.KeyHash, due, r.Cadence.Milliseconds(), flags,
		len(r.Key), r.Key, len(r.Route), r.Route)
}

// nextUntil reads batches up to and including the first for which stop is true.
func nextUntil(t *testing.T, sub store.Subscription, stop func(store.Batch) bool) []store.Batch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []store.Batch
	for {
		b, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("after %d batches: %v", len(out), err)
		}
		out = append(out, b)
		if stop(b) {
			return out
		}
	}
}

// listenAll opens a raw connection LISTENing on every group channel and collects payloads.
func listenAll(t *testing.T, dsn string) (*pgconn.PgConn, *[]*pgconn.Notification) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	var got []*pgconn.Notification
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) { got = append(got, n) }
	conn, err := pgconn.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	var b strings.Builder
	for g := range changes.NumGroups {
		b.WriteString("LISTEN " + changes.GroupChannel(g) + ";")
	}
	if _, err := conn.Exec(context.Background(), b.String()).ReadAll(); err != nil {
		t.Fatal(err)
	}
	return conn, &got
}
