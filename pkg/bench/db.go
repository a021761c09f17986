package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

// The SKIP LOCKED queue: the table a team writes by hand — the key, the due time and the cadence,
// an index on the due time to claim from.
const skipLockedSchema = `
CREATE TABLE bench_queue (
    key        text COLLATE "C" PRIMARY KEY,
    due_at     timestamptz NOT NULL,
    cadence_ms bigint NOT NULL,
    source     text NOT NULL
) WITH (fillfactor = 80);
CREATE INDEX bench_queue_due ON bench_queue (due_at);`

// seedSQL writes rows $1..$2 of the benchmark fleet into a table: 64-byte keys, 96 h cadence,
// due spread over the past cadence (every row due), half submitted.
const seedSelect = `SELECT format('https://shop.example.com/product/%s', lpad(i::text, 31, '0')),
       $3::timestamptz - (random() * 345600000)::bigint * interval '1 millisecond',
       345600000::bigint,
       CASE WHEN i % 2 = 0 THEN 'submitted' ELSE 'discovered' END
FROM generate_series($1::int, $2::int) AS i`

// scratchDB is the database the benchmark creates and drops.
type scratchDB struct {
	dsn  string
	name string
	drop func(context.Context) error
}

// createDatabase creates an empty database named rqbench_<random> on the server of serverDSN.
func createDatabase(ctx context.Context, serverDSN string) (*scratchDB, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	name := "rqbench_" + hex.EncodeToString(b[:])
	conn, err := pgx.Connect(ctx, serverDSN)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", redact(serverDSN), err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return nil, fmt.Errorf("creating the scratch database %s (the role needs CREATEDB): %w", name, err)
	}
	dsn, err := pgtest.WithDatabase(serverDSN, name)
	if err != nil {
		return nil, err
	}
	return &scratchDB{dsn: dsn, name: name, drop: func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, serverDSN)
		if err != nil {
			return fmt.Errorf("dropping %s: %w", name, err)
		}
		defer func() { _ = conn.Close(context.Background()) }()
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("dropping %s: %w", name, err)
		}
		return nil
	}}, nil
}

// redact hides a password in a DSN for messages.
func redact(dsn string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "the database"
	}
	return fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
}

// prepare migrates the renderqueue schema and creates the SKIP LOCKED queue, then writes rows into
// both (the change-event trigger off while seeding: nobody listens yet) and analyzes them.
func prepare(ctx context.Context, pool *pgxpool.Pool, rows int, now time.Time) error {
	if _, err := postgres.MigratePool(ctx, pool); err != nil {
		return fmt.Errorf("migrating: %w", err)
	}
	if _, err := pool.Exec(ctx, skipLockedSchema); err != nil {
		return fmt.Errorf("creating the SKIP LOCKED queue: %w", err)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE render_schedule DISABLE TRIGGER render_schedule_notify_insert`); err != nil {
		return err
	}
	for _, t := range []string{"render_schedule", "bench_queue"} {
		if err := seedTable(ctx, pool, t, rows, now); err != nil {
			return err
		}
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE render_schedule ENABLE TRIGGER render_schedule_notify_insert`); err != nil {
		return err
	}
	for _, t := range []string{"render_schedule", "bench_queue"} {
		if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+t); err != nil {
			return fmt.Errorf("vacuuming %s: %w", t, err)
		}
	}
	return nil
}

// seedTable writes rows due rows into table (render_schedule or bench_queue), as seedSelect
// makes them.
func seedTable(ctx context.Context, pool *pgxpool.Pool, table string, rows int, now time.Time) error {
	const step = 500_000
	for lo := 1; lo <= rows; lo += step {
		hi := min(lo+step-1, rows)
		if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (key, due_at, cadence_ms, source) `+seedSelect, lo, hi, now); err != nil {
			return fmt.Errorf("seeding %s: %w", table, err)
		}
	}
	return nil
}

// resetQueue writes the SKIP LOCKED queue afresh, its rows due as seeded, so each run starts from
// the same state (measure then settles it). Not an UPDATE of every row: that leaves
// the table and its indexes twice their size (the old versions dead, then free space once
// vacuumed), so each shape would run on a queue larger than the one before it and the shapes
// measured later would look worse than they are (docs/benchmarks.md, "SKIP LOCKED's best batch").
func resetQueue(ctx context.Context, pool *pgxpool.Pool, rows int, now time.Time) error {
	if _, err := pool.Exec(ctx, `TRUNCATE bench_queue`); err != nil {
		return fmt.Errorf("resetting bench_queue: %w", err)
	}
	if err := seedTable(ctx, pool, "bench_queue", rows, now); err != nil {
		return fmt.Errorf("resetting bench_queue: %w", err)
	}
	return nil
}

// completed is one acknowledged completion: the row as claimed.
type completed struct {
	key     string
	due     time.Time
	cadence time.Duration
}

// verify checks every acknowledged completion in SQL: the row's due time moved forward on its own
// schedule (the claimed due time plus a whole number of cadences, at least one). It returns how
// many passed.
func verify(ctx context.Context, pool *pgxpool.Pool, table string, done []completed) (int, error) {
	ok := 0
	const chunk = 20_000
	for lo := 0; lo < len(done); lo += chunk {
		part := done[lo:min(lo+chunk, len(done))]
		keys := make([]string, 0, len(part))
		// a key may be completed more than once in a run: a SKIP LOCKED row whose claimed due
		// plus its cadence is still past is due again, and is claimed again once the queue is
		// drained; each completion is checked against the row as it stands
		want := make(map[string][]completed, len(part))
		for _, c := range part {
			if _, seen := want[c.key]; !seen {
				keys = append(keys, c.key)
			}
			want[c.key] = append(want[c.key], c)
		}
		rows, err := pool.Query(ctx, "SELECT key, due_at FROM "+table+" WHERE key = ANY($1::text[])", keys)
		if err != nil {
			return ok, fmt.Errorf("verifying: %w", err)
		}
		for rows.Next() {
			var key string
			var due pgtype.Timestamptz
			if err := rows.Scan(&key, &due); err != nil {
				rows.Close()
				return ok, fmt.Errorf("verifying: %w", err)
			}
			for _, c := range want[key] {
				moved := due.Time.Sub(c.due)
				if due.Valid && moved > 0 && moved%c.cadence == 0 {
					ok++
				}
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return ok, fmt.Errorf("verifying: %w", err)
		}
	}
	return ok, nil
}

// triggerCost measures what the change-event trigger and its NOTIFY add to a completion: batches
// of the group commit's UPDATE on rows of render_schedule, alternately with the notify trigger
// enabled and disabled, each in its own transaction. It returns the time per row of each.
func triggerCost(ctx context.Context, pool *pgxpool.Pool, rows, batch, rounds int) (with, without time.Duration, err error) {
	if rows < batch {
		return 0, 0, errors.New("too few rows to measure the trigger")
	}
	var tWith, tWithout time.Duration
	var nWith, nWithout int
	next := 1
	run := func() (time.Duration, error) {
		keys := make([]string, batch)
		dues := make([]time.Time, batch)
		for i := range keys {
			keys[i] = fmt.Sprintf("https://shop.example.com/product/%031d", next)
			dues[i] = time.Now().Add(96 * time.Hour)
			next = next%rows + 1
		}
		start := time.Now()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE render_schedule AS r SET due_at = c.due, urgent = false, rev = nextval('render_schedule_rev_seq')
				FROM unnest($1::text[], $2::timestamptz[]) AS c(key, due) WHERE r.key = c.key`, keys, dues)
			return err
		})
		return time.Since(start), err
	}
	setTrigger := func(on bool) error {
		verb := "DISABLE"
		if on {
			verb = "ENABLE"
		}
		_, err := pool.Exec(ctx, "ALTER TABLE render_schedule "+verb+" TRIGGER render_schedule_notify_update")
		return err
	}
	defer func() {
		if e := setTrigger(true); e != nil && err == nil {
			err = e
		}
	}()
	for r := range rounds {
		on := r%2 == 0
		if err := setTrigger(on); err != nil {
			return 0, 0, err
		}
		d, err := run()
		if err != nil {
			return 0, 0, fmt.Errorf("measuring the trigger: %w", err)
		}
		if r < 2 {
			continue // warm-up
		}
		if on {
			tWith += d
			nWith += batch
		} else {
			tWithout += d
			nWithout += batch
		}
	}
	return tWith / time.Duration(max(nWith, 1)), tWithout / time.Duration(max(nWithout, 1)), nil
}
