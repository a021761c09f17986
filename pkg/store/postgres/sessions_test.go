package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

// TestSessionsNeedTheKeepersRole: a role that may write rows but not read the signing key (a
// producer) can neither record nor end a keeper session, nor read or write the sessions' table:
// it could otherwise make a keeper believe its predecessor ended cleanly and hand out rows a dead
// keeper had leased.
func TestSessionsNeedTheKeepersRole(t *testing.T) {
	_, dsn := openTestStore(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, producerDSN := pgtest.Role(t, dsn, "rq_producer_",
		`GRANT SELECT, INSERT, UPDATE, DELETE ON render_schedule TO %s`)
	pc, err := pgx.Connect(ctx, producerDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pc.Close(context.Background()) }()
	var pgErr *pgconn.PgError
	for _, q := range []string{
		`SELECT * FROM renderqueue_keeper_begin('web-shard-0', 'x', 'y')`,
		`SELECT renderqueue_keeper_end('web-shard-0', 'x', now())`,
		`SELECT count(*) FROM renderqueue_keeper_sessions`,
		`UPDATE renderqueue_keeper_sessions SET ended_at = now()`,
	} {
		if _, err := pc.Exec(ctx, q); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("a producer: %s: %v, want insufficient_privilege", q, err)
		}
	}
}

// TestSessionsBeforeSchema9: a database at schema version 8 has no sessions: the store says so
// (store.ErrNoSessions), and the keeper holds its slots back for the longest lease instead.
func TestSessionsBeforeSchema9(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := Open(ctx, dsn, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	if _, err := MigratePoolWith(ctx, st.pool, MigrateOptions{Version: 8}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.BeginSession(ctx, store.Session{Shard: "s", Instance: "i"}); !errors.Is(err, store.ErrNoSessions) {
		t.Fatalf("BeginSession at schema 8: %v, want ErrNoSessions", err)
	}
}
