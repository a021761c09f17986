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
	_, err := MigratePoolWith(ctx, s.pool, MigrateOptions{Partitions: s.opts.Partitions})
	return err
}

// MigrateOptions choose how a schema is created.
type MigrateOptions struct {
	// Partitions, when at least 2, creates render_schedule as that many hash partitions of the key
	// (PARTITION BY HASH (key)) instead of one table. It applies only when the schema is created;
	// asking for it on an existing schema with another layout fails and changes nothing. 0 takes
	// an existing schema as it is (and creates one table).
	Partitions int
	// Version, when not 0, is the version to migrate to: migrations after it are not applied.
	// It must be within 1..SchemaVersion and not below the database's version (migrations only go
	// up); another fails and changes nothing. 0 migrates to SchemaVersion.
	Version int
}

// MaxPartitions is the most partitions MigrateOptions.Partitions may ask for.
const MaxPartitions = 1024

// MigratePool is Migrate on a pool (one table), returning what was done.
func MigratePool(ctx context.Context, pool *pgxpool.Pool) (MigrateResult, error) {
	return MigratePoolWith(ctx, pool, MigrateOptions{})
}

// MigratePoolWith is Migrate on a pool with options, returning what was done.
func MigratePoolWith(ctx context.Context, pool *pgxpool.Pool, opts MigrateOptions) (MigrateResult, error) {
	var res MigrateResult
	if opts.Partitions == 1 || opts.Partitions < 0 || opts.Partitions > MaxPartitions {
		return res, fmt.Errorf("partitions %d: want 0 (one table) or 2..%d", opts.Partitions, MaxPartitions)
	}
	ms, err := Migrations()
	if err != nil {
		return res, err
	}
	if opts.Version < 0 || opts.Version > ms[len(ms)-1].Version {
		return res, fmt.Errorf("schema version %d: want 0 (the newest) or 1..%d (the newest this binary knows)", opts.Version, ms[len(ms)-1].Version)
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
		if opts.Version > 0 && opts.Version < res.From {
			return fmt.Errorf("schema version %d: the database is already at version %d, and migrations only go up", opts.Version, res.From)
		}
		if res.From > 0 && opts.Partitions > 0 {
			var parts int
			if err := tx.QueryRow(ctx, partitionCountSQL).Scan(&parts); err != nil {
				return fmt.Errorf("reading the table's layout: %w", err)
			}
			if parts != opts.Partitions {
				return fmt.Errorf("render_schedule exists with %s, not %s: the layout is chosen when the schema is created", layout(parts), layout(opts.Partitions))
			}
		}
		for _, m := range ms {
			if m.Version <= res.From || (opts.Version > 0 && m.Version > opts.Version) {
				continue
			}
			if m.Version == 1 && opts.Partitions > 0 {
				if m, err = partitioned(m, opts.Partitions); err != nil {
					return err
				}
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

// partitionCountSQL counts the partitions of render_schedule: 0 when it is one table.
const partitionCountSQL = `SELECT count(*)::int FROM pg_inherits WHERE inhparent = 'render_schedule'::regclass`

func layout(partitions int) string {
	if partitions == 0 {
		return "one table"
	}
	return fmt.Sprintf("%d partitions", partitions)
}

// partitioned rewrites the first migration to create render_schedule as n hash partitions of the
// key. Everything else stays: the generated key_hash column, its (key_hash, key) index (created on
// every partition), the rev trigger and the change-event triggers (defined once, on the parent).
//
// Why the key and not ranges of key_hash: PostgreSQL does not allow a generated column in a
// partition key, and partitioning by the expression hashtextextended(key, 0) would forbid the
// primary key on key that upserts (ON CONFLICT (key)) need. Partitioning by the key keeps every
// statement as it is; a walk's range of key_hash reads every partition's index (docs/scale.md).
func partitioned(m Migration, n int) (Migration, error) {
	const table = ") WITH (fillfactor = 80);"
	if strings.Count(m.SQL, table) != 1 {
		return m, fmt.Errorf("migration %s: cannot find the end of the table definition to partition it", m.Name)
	}
	var b strings.Builder
	b.WriteString(") PARTITION BY HASH (key);\n")
	for i := range n {
		fmt.Fprintf(&b, "CREATE TABLE render_schedule_p%03d PARTITION OF render_schedule FOR VALUES WITH (MODULUS %d, REMAINDER %d) WITH (fillfactor = 80);\n", i, n, i)
	}
	m.SQL = strings.Replace(m.SQL, table, b.String(), 1)
	m.Name = fmt.Sprintf("%s (%d hash partitions of key)", m.Name, n)
	return m, nil
}
