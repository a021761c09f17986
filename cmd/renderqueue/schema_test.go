package main

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

func TestSchemaMigrate(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	v := postgres.SchemaVersion()
	for i, want := range []string{fmt.Sprintf("schema migrated from version 0 to %d", v), fmt.Sprintf("schema is up to date (version %d)", v)} {
		var out, errb bytes.Buffer
		if code := run([]string{"schema", "migrate", "--dsn", dsn}, &out, &errb); code != 0 || !strings.Contains(out.String(), want) {
			t.Fatalf("run %d: code %d, out %q, err %q; want %q", i+1, code, out.String(), errb.String(), want)
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"schema", "migrate"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "--dsn") {
		t.Errorf("without --dsn: code %d, err %q", code, errb.String())
	}
}

// TestSchemaMigrateVersion: --version migrates up to a version, and a version the database cannot
// be migrated to (negative, past the newest this binary knows, below the database's) fails before
// anything is applied.
func TestSchemaMigrateVersion(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	latest := postgres.SchemaVersion()
	if latest < 4 {
		t.Fatalf("schema version %d: the test migrates to 3 and then further", latest)
	}
	for _, step := range []struct {
		args    []string
		out     string // in stdout when it succeeds
		err     string // in stderr when it fails
		version int    // the database's version afterwards
	}{
		{[]string{"--version", strconv.Itoa(latest + 1)}, "", fmt.Sprintf("want 0 (the newest) or 1..%d", latest), 0},
		{[]string{"--version", "-1"}, "", fmt.Sprintf("want 0 (the newest) or 1..%d", latest), 0},
		{[]string{"--version", "3"}, "schema migrated from version 0 to 3", "", 3},
		{[]string{"--version", "3"}, "schema is up to date (version 3)", "", 3},
		{[]string{"--version", "2"}, "", "already at version 3", 3},
		{[]string{"--version", "-1"}, "", "want 0 (the newest)", 3},
		{[]string{"--version", strconv.Itoa(latest + 1)}, "", fmt.Sprintf("1..%d", latest), 3},
		{[]string{"--version", "three"}, "", "invalid value", 3},
		{[]string{"3"}, "", "unexpected arguments", 3},
		{nil, fmt.Sprintf("schema migrated from version 3 to %d", latest), "", latest},
		{[]string{"--version", "3"}, "", fmt.Sprintf("already at version %d", latest), latest},
		{[]string{"--version", "0"}, fmt.Sprintf("schema is up to date (version %d)", latest), "", latest},
	} {
		var out, errb bytes.Buffer
		code := run(append([]string{"schema", "migrate", "--dsn", dsn}, step.args...), &out, &errb)
		switch {
		case step.err == "" && (code != 0 || !strings.Contains(out.String(), step.out)):
			t.Errorf("%q: code %d, out %q, err %q; want %q", step.args, code, out.String(), errb.String(), step.out)
		case step.err != "" && (code == 0 || !strings.Contains(errb.String(), step.err)):
			t.Errorf("%q: code %d, out %q, err %q; want an error saying %q", step.args, code, out.String(), errb.String(), step.err)
		}
		if v := databaseSchemaVersion(t, dsn); v != step.version {
			t.Errorf("%q: the database is at version %d afterwards, want %d", step.args, v, step.version)
		}
	}
}

// databaseSchemaVersion reads the schema version recorded in the database at dsn (0 without the
// table of versions: nothing was ever migrated).
func databaseSchemaVersion(t *testing.T, dsn string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	var v int
	var exists bool
	err = conn.QueryRow(ctx, `SELECT to_regclass('renderqueue_schema_migrations') IS NOT NULL`).Scan(&exists)
	if err == nil && exists {
		err = conn.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM renderqueue_schema_migrations`).Scan(&v)
	}
	if err != nil {
		t.Fatalf("reading the schema version: %v", err)
	}
	return v
}
