package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
	"github.com/renderqueue/renderqueue/pkg/store/storetest"
)

// TestConformancePartitioned runs the store conformance suite on render_schedule created as 8
// hash partitions of the key (schema migrate --partitions 8).
func TestConformancePartitioned(t *testing.T) {
	pgtest.DSN(t)
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T, o storetest.Options) store.Store {
			st, _ := openTestStore(t, Options{Partitions: 8, WalkPageRows: o.PageRows, SegmentSlots: o.SegmentSlots, failSegment: o.FailSegment})
			if n := partitionCount(t, st); n != 8 {
				t.Fatalf("render_schedule has %d partitions, want 8", n)
			}
			return st
		},
		BreakSubscriptions: func(t *testing.T, st store.Store) { breakListeners(t, st.(*Store)) },
	})
}

func partitionCount(tb testing.TB, st *Store) int {
	tb.Helper()
	var n int
	if err := st.pool.QueryRow(context.Background(), partitionCountSQL).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}

// TestPartitionedLayout checks the partitioned schema: rows spread over the partitions, every
// partition has the (key_hash, key) index and fillfactor 80, a completion is one partition's
// index lookup, and migrating asks for a layout consistently.
func TestPartitionedLayout(t *testing.T) {
	st, _ := openTestStore(t, Options{Partitions: 4})
	ctx := context.Background()
	if _, err := st.pool.Exec(ctx, `INSERT INTO render_schedule (key, due_at, cadence_ms)
		SELECT 'https://example.com/' || i, now(), 3600000 FROM generate_series(1, 4000) AS i`); err != nil {
		t.Fatal(err)
	}
	rows, err := st.pool.Query(ctx, `SELECT c.relname, count(r.*), c.reloptions::text,
			(SELECT count(*) FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
			 WHERE i.indrelid = c.oid AND pg_get_indexdef(i.indexrelid) LIKE '%(key_hash, key)%')
		FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
		LEFT JOIN render_schedule r ON r.tableoid = c.oid
		WHERE h.inhparent = 'render_schedule'::regclass GROUP BY c.oid, c.relname, c.reloptions ORDER BY c.relname`)
	if err != nil {
		t.Fatal(err)
	}
	parts := 0
	for rows.Next() {
		var name, opts string
		var n, idx int
		if err := rows.Scan(&name, &n, &opts, &idx); err != nil {
			t.Fatal(err)
		}
		parts++
		if n < 700 || n > 1300 || !strings.Contains(opts, "fillfactor=80") || idx != 1 {
			t.Errorf("partition %s: %d of 4000 rows, options %s, %d (key_hash, key) indexes", name, n, opts, idx)
		}
	}
	rows.Close()
	if parts != 4 {
		t.Fatalf("%d partitions, want 4", parts)
	}
	// a completion reads one partition: the other partitions' scans never run
	full := explain(t, st, []string{"https://example.com/7"})
	if strings.Count(full, "never executed") != 3 && !strings.Contains(full, "Subplans Removed: 3") {
		t.Errorf("a completion of one key does not prune to one partition:\n%s", full)
	}
	// asking again for the same layout is a no-op; for another one it fails and changes nothing
	if _, err := MigratePoolWith(ctx, st.pool, MigrateOptions{Partitions: 4}); err != nil {
		t.Fatalf("migrating again with the same partitions: %v", err)
	}
	if _, err := MigratePoolWith(ctx, st.pool, MigrateOptions{Partitions: 8}); err == nil || !strings.Contains(err.Error(), "exists with 4 partitions") {
		t.Fatalf("migrating with 8 partitions over 4: %v", err)
	}
	if _, err := MigratePoolWith(ctx, st.pool, MigrateOptions{Partitions: 1}); err == nil {
		t.Fatal("1 partition: no error")
	}
	plain, _ := openTestStore(t, Options{})
	if _, err := MigratePoolWith(ctx, plain.pool, MigrateOptions{Partitions: 4}); err == nil || !strings.Contains(err.Error(), "exists with one table") {
		t.Fatalf("partitioning an existing table: %v", err)
	}
}

// explain returns the executed plan of a completion of keys.
func explain(t *testing.T, st *Store, keys []string) string {
	t.Helper()
	dues := make([]time.Time, len(keys))
	for i := range dues {
		dues[i] = time.Now()
	}
	ctx := context.Background()
	tx, err := st.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	revs := make([]int64, len(keys)) // 0: any rev
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+completeSQL, keys, dues, revs)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}
