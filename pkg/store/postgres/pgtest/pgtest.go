// Package pgtest gives tests and benchmarks their own PostgreSQL database on the throwaway server
// named by RENDERQUEUE_TEST_DSN (hack/test.sh and hack/bench.sh start one with hack/postgres.sh
// and set it). Without the variable, tests that need the database are skipped with a message
// saying how to run them.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDSN names the environment variable holding the test server's DSN.
const EnvDSN = "RENDERQUEUE_TEST_DSN"

// DSN returns the test server's DSN, or skips the test when none is set.
func DSN(tb testing.TB) string {
	tb.Helper()
	dsn := os.Getenv(EnvDSN)
	if dsn == "" {
		tb.Skipf("%s is not set: this needs PostgreSQL. Run it through `make test` / hack/test.sh "+
			"(or hack/bench.sh for benchmarks), which start a throwaway server with hack/postgres.sh, "+
			"or set %s=$(hack/postgres.sh start | tail -n 1)", EnvDSN, EnvDSN)
	}
	return dsn
}

// NewDatabase creates an empty database for the calling test on the test server and returns a
// DSN for it. The database is dropped when the test ends (connections still open are ended).
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	dsn, drop, err := CreateDatabase(context.Background(), DSN(tb))
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := drop(); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	return dsn
}

// CreateDatabase creates an empty database on the server named by serverDSN and returns a DSN
// for it and a function that drops it (ending connections still open). Use it for fixtures that
// outlive one test, such as benchmark tables shared by several benchmarks (drop them in TestMain).
func CreateDatabase(ctx context.Context, serverDSN string) (dsn string, drop func() error, err error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", nil, err
	}
	name := "rqtest_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, serverDSN)
	if err != nil {
		return "", nil, fmt.Errorf("connecting to the test server (%s): %w", EnvDSN, err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE template0 ENCODING 'UTF8'"); err != nil {
		return "", nil, fmt.Errorf("creating database %s: %w", name, err)
	}
	drop = func() error { return dropDatabase(serverDSN, name) }
	dsn, err = WithDatabase(serverDSN, name)
	if err != nil {
		_ = drop()
		return "", nil, err
	}
	return dsn, drop, nil
}

// dropDatabase drops a test database, ending connections still open. A role that is not a
// superuser cannot end an autovacuum worker busy in it, so the drop is retried for a while.
func dropDatabase(serverDSN, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, serverDSN)
	if err != nil {
		return fmt.Errorf("dropping database %s: %w", name, err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	for {
		_, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		if err == nil {
			return nil
		}
		retry := time.NewTimer(100 * time.Millisecond)
		select {
		case <-retry.C:
		case <-ctx.Done():
			retry.Stop()
			return fmt.Errorf("dropping database %s: %w", name, err)
		}
	}
}

// WithDatabase returns dsn (a URL or a keyword/value string) pointing at database name.
func WithDatabase(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parsing %s: %w", EnvDSN, err)
		}
		u.Path = "/" + name
		q := u.Query()
		q.Del("dbname")
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return dsn + " dbname=" + name, nil
}

// Role creates a login role for the calling test, named prefix and a random suffix, runs grants on
// the database of dsn (each with %s for the role's name), and returns the role's name and a DSN
// for the same database as that role. The role, and its privileges there, are dropped when the
// test ends.
func Role(tb testing.TB, dsn, prefix string, grants ...string) (name, roleDSN string) {
	tb.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	name = prefix + hex.EncodeToString(b[:])
	exec := func(stmts ...string) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close(ctx) }()
		for _, q := range stmts {
			if _, err := conn.Exec(ctx, q); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		return nil
	}
	stmts := []string{`CREATE ROLE ` + name + ` LOGIN`}
	for _, g := range grants {
		stmts = append(stmts, fmt.Sprintf(g, name))
	}
	err := exec(stmts...)
	tb.Cleanup(func() {
		if err := exec(`DROP OWNED BY `+name, `DROP ROLE `+name); err != nil {
			tb.Errorf("pgtest: dropping role %s: %v", name, err)
		}
	})
	if err != nil {
		tb.Fatalf("pgtest: creating role %s: %v", name, err)
	}
	roleDSN, err = WithUser(dsn, name)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	return name, roleDSN
}

// WithUser returns dsn (a URL or a keyword/value string) connecting as user (the test server
// trusts local connections: no password).
func WithUser(dsn, user string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parsing %s: %w", EnvDSN, err)
		}
		u.User = url.User(user)
		q := u.Query()
		q.Del("user")
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return dsn + " user=" + user, nil
}
