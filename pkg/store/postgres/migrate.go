package postgres

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLockID is the advisory lock key that serialises concurrent migrations.
const migrationLockID = 0x72715f736368656d // "rq_schem"

// Migration is one embedded schema migration.
type Migration struct {
	// Version is the number the file name starts with.
	Version int
	// Name is the file name.
	Name string
	// SQL is the file's contents.
	SQL string
}

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("reading embedded migrations: %w", err)
	}
	var ms []Migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("embedded migration %q: name must start with a positive version number and '_'", name)
		}
		b, err := migrationFiles.ReadFile("migrations/" + name)
		if err != nil {
			return nil, fmt.Errorf("reading embedded migration %s: %w", name, err)
		}
		ms = append(ms, Migration{Version: v, Name: name, SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i := 1; i < len(ms); i++ {
		if ms[i].Version == ms[i-1].Version {
			return nil, fmt.Errorf("embedded migrations %s and %s have the same version", ms[i-1].Name, ms[i].Name)
		}
	}
	return ms, nil
}

// SchemaVersion is the version of the newest embedded migration: the schema this code expects.
func SchemaVersion() int {
	ms, err := Migrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

// MigrateResult says what a migration run did.
type MigrateResult struct {
	// From and To are the schema versions before and after.
	From, To int
	// Applied names the migrations applied, in order.
	Applied []string
}

// Migrate applies the embedded migrations the database lacks, in one transaction, holding an
// advisory lock so concurrent runs wait for each other. Applied versions are recorded in
// renderqueue_schema_migrations. Running it again is a no-op.
func (s *Store) Migrate(ctx context.Context) error {
	_, err := MigratePool(ctx, s.pool)
	return err
}

// MigratePool is Migrate on a pool, returning what was done.
func MigratePool(ctx context.Context, pool *pgxpool.Pool) (MigrateResult, error) {
	var res MigrateResult
	ms, err := Migrations()
	if err != nil {
		return res, err
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrationLockID)); err != nil {
			return fmt.Errorf("taking the migration lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS renderqueue_schema_migrations (
			version    integer PRIMARY KEY,
			name       text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("creating the schema version table: %w", err)
		}
		if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM renderqueue_schema_migrations").Scan(&res.From); err != nil {
			return fmt.Errorf("reading the schema version: %w", err)
		}
		res.To = res.From
		if latest := ms[len(ms)-1].Version; res.From > latest {
			return fmt.Errorf("database schema is at version %d, newer than this binary's %d: upgrade renderqueue", res.From, latest)
		}
		for _, m := range ms {
			if m.Version <= res.From {
				continue
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return fmt.Errorf("applying migration %s: %w", m.Name, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO renderqueue_schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
				return fmt.Errorf("recording migration %s: %w", m.Name, err)
			}
			res.Applied = append(res.Applied, m.Name)
			res.To = m.Version
		}
		return nil
	})
	if err != nil {
		return MigrateResult{}, fmt.Errorf("migrating the schema: %w", err)
	}
	return res, nil
}
