package postgres

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/renderqueue/renderqueue/internal/procstat"
	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

// benchDB is a benchmark database holding generated rows, made once per test binary and dropped
// by TestMain, so several benchmarks (and several runs of one) share it.
type benchDB struct {
	// partitions is the layout (0: one table), see MigrateOptions.
	partitions int
	once       sync.Once
	st         *Store
	keys       []string
	drop       func() error
	err        error
}

var (
	walkDB     benchDB                   // 1,000,000 rows
	walkPartDB = benchDB{partitions: 16} // 1,000,000 rows in 16 hash partitions
	completeDB benchDB                   // 100,000 rows
	stmtDB     benchDB                   // 1,000,000 rows, changed by BenchmarkCompleteStatement
)

func TestMain(m *testing.M) {
	code := m.Run()
	for _, d := range []*benchDB{&walkDB, &walkPartDB, &completeDB, &stmtDB} {
		if d.st != nil {
			_ = d.st.Close()
		}
		if d.drop != nil {
			if err := d.drop(); err != nil {
				fmt.Fprintln(os.Stderr, "dropping a benchmark database:", err)
			}
		}
	}
	os.Exit(code)
}

// fill creates (once) a store whose table holds n rows with realistic keys, routes and sources,
// vacuumed and analysed as a table in steady state would be.
func (d *benchDB) fill(b *testing.B, n int) (*Store, []string) {
	b.Helper()
	serverDSN := pgtest.DSN(b) // skips without a server, before the fixture is made
	d.once.Do(func() { d.st, d.keys, d.drop, d.err = makeBenchDB(serverDSN, n, d.partitions) })
	if d.err != nil {
		b.Fatal(d.err)
	}
	return d.st, d.keys
}

func makeBenchDB(serverDSN string, n, partitions int) (*Store, []string, func() error, error) {
	ctx := context.Background()
	dsn, drop, err := pgtest.CreateDatabase(ctx, serverDSN)
	if err != nil {
		return nil, nil, nil, err
	}
	st, err := Open(ctx, dsn, Options{Partitions: partitions})
	if err == nil {
		err = st.Migrate(ctx)
	}
	if err == nil {
		_, err = st.pool.Exec(ctx, `INSERT INTO render_schedule (key, due_at, cadence_ms, route, source, urgent)
			SELECT format('https://shop%s.example.com/%s/%s-%s', i % 7, r.route, i, md5(i::text)),
			       now() + ((i::bigint * 7919) % 345600) * interval '1 second' - interval '1 day',
			       CASE WHEN r.route = 'product' THEN 345600000 WHEN r.route = 'category' THEN 86400000 ELSE 3600000 END,
			       r.route,
			       CASE WHEN i % 3 = 0 THEN 'submitted' ELSE 'discovered' END,
			       i % 1000 = 0
			FROM generate_series(1, $1::int) AS i,
			     LATERAL (SELECT (ARRAY['product','product','product','category','home'])[1 + i % 5] AS route) r`, n)
	}
	if err == nil {
		_, err = st.pool.Exec(ctx, "VACUUM ANALYZE render_schedule")
	}
	var keys []string
	if err == nil {
		var rows pgx.Rows
		rows, err = st.pool.Query(ctx, "SELECT key FROM render_schedule")
		if err == nil {
			for rows.Next() {
				var k string
				if err = rows.Scan(&k); err != nil {
					break
				}
				keys = append(keys, k)
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
	}
	if err != nil {
		if st != nil {
			_ = st.Close()
		}
		_ = drop()
		return nil, nil, nil, fmt.Errorf("making a benchmark table of %d rows: %w", n, err)
	}
	return st, keys, drop, nil
}

// BenchmarkWalk walks 1,000,000 rows (all slots) into memory, as a keeper's load does: from one
// table, and from 16 hash partitions of the key (schema migrate --partitions 16).
func BenchmarkWalk(b *testing.B) {
	b.Run("layout=table", func(b *testing.B) { benchWalk(b, &walkDB) })
	b.Run("layout=partitions-16", func(b *testing.B) { benchWalk(b, &walkPartDB) })
}

func benchWalk(b *testing.B, db *benchDB) {
	const n = 1000000
	st, _ := db.fill(b, n)
	ctx := context.Background()
	held := make([]schedule.Row, 0, n)
	b.ResetTimer()
	start := time.Now()
	total := 0
	for range b.N {
		held = held[:0]
		res, err := st.Walk(ctx, schedule.AllSlots().Slots(), func(it store.WalkItem) error {
			held = append(held, it.Rows...)
			return nil
		})
		if err != nil || res.Partial() || res.Rows != n || len(held) != n {
			b.Fatalf("walk: %d rows (held %d), partial %v, err %v", res.Rows, len(held), res.Partial(), err)
		}
		total += res.Rows
	}
	el := time.Since(start)
	b.ReportMetric(float64(total)/el.Seconds(), "rows/s")
}

// BenchmarkComplete: each op, 256 concurrent callers complete 100 rows each, one row per call (as
// a keeper's HTTP handlers do), through the group commit, on a 100,000-row table.
func BenchmarkComplete(b *testing.B) {
	const (
		callers = 256
		calls   = 100
	)
	st, keys := completeDB.fill(b, 100000)
	ctx := context.Background()
	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		var wg sync.WaitGroup
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range calls {
					i := next.Add(1)
					k := keys[int(i*7919)%len(keys)]
					res, err := st.Complete(ctx, []store.Completion{{Key: k, Due: time.Now().Add(96 * time.Hour)}})
					if err != nil || !res[0].Found {
						b.Errorf("complete %q: %v %+v", k, err, res)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	el := time.Since(start)
	b.ReportMetric(float64(b.N*callers*calls)/el.Seconds(), "completions/s")
}

// BenchmarkEventLatency: completions at a steady 2,000 per second (one per call, through the group
// commit) for 5 s per op, with a subscription on all slots; reports the delay from the start of
// each write call to the delivery of its event (an upper bound on commit-to-delivery: it includes
// the group commit's wait and the commit itself).
func BenchmarkEventLatency(b *testing.B) {
	const (
		rate     = 2000
		duration = 5 * time.Second
	)
	st, keys := completeDB.fill(b, 100000)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub, err := st.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sub.Close() }()

	var mu sync.Mutex
	sent := map[string]time.Time{} // key -> write start, for writes not yet delivered
	var lat []time.Duration
	delivered := make(chan struct{}, 1)
	go func() {
		for {
			batch, err := sub.Next(ctx)
			if err != nil {
				return
			}
			now := time.Now()
			mu.Lock()
			for _, e := range batch.Events {
				if t0, ok := sent[e.Row.Key]; ok {
					lat = append(lat, now.Sub(t0))
					delete(sent, e.Row.Key)
				}
			}
			left := len(sent)
			mu.Unlock()
			if left == 0 {
				select {
				case delivered <- struct{}{}:
				default:
				}
			}
		}
	}()

	rng := rand.New(rand.NewPCG(11, 12))
	b.ResetTimer()
	for range b.N {
		jobs := make(chan string, rate)
		var wg sync.WaitGroup
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range jobs {
					mu.Lock()
					sent[k] = time.Now()
					mu.Unlock()
					if _, err := st.Complete(ctx, []store.Completion{{Key: k, Due: time.Now().Add(time.Hour)}}); err != nil {
						b.Errorf("complete: %v", err)
					}
				}
			}()
		}
		perm := rng.Perm(len(keys))
		total := int(duration.Seconds() * rate)
		start := time.Now()
		for i := range total {
			// Pace the writes: the i-th starts i/rate seconds in.
			if d := time.Until(start.Add(time.Duration(i) * time.Second / rate)); d > 0 {
				time.Sleep(d)
			}
			jobs <- keys[perm[i%len(perm)]]
		}
		close(jobs)
		wg.Wait()
		deadline := time.NewTimer(30 * time.Second)
		for {
			mu.Lock()
			left := len(sent)
			mu.Unlock()
			if left == 0 {
				break
			}
			select {
			case <-delivered:
			case <-deadline.C:
				b.Fatalf("%d events not delivered within 30s", left)
			}
		}
		deadline.Stop()
	}
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(lat)
	q := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
	b.Logf("%d writes at %d/s: p50 %.2f ms, p99 %.2f ms, max %.2f ms", len(lat), rate, q(0.5), q(0.99), q(1))
}

// BenchmarkHOT reports the share of completions that are HOT updates (see TestCompletionsAreHOT).
func BenchmarkHOT(b *testing.B) {
	for range b.N {
		st, _ := openTestStore(b, Options{})
		upd, hot := measureHOT(b, st, 100000, 3, 1000)
		b.ReportMetric(100*float64(hot)/float64(upd), "hot-%")
		b.ReportMetric(float64(upd), "updates")
	}
}

// BenchmarkCompleteStatement runs the group commit's UPDATE alone, 500 distinct random keys of a
// 1,000,000-row table per statement on one connection, and reports the PostgreSQL backend's CPU
// per completed row (backend-us/row, read from /proc: only when the server runs on this machine)
// and the wall time per row. The variants take apart what a completion costs the database:
//
//	shipped           the statement and schema as they are
//	rev-trigger       the statement leaves rev to the triggers: before schema 3 a PL/pgSQL row
//	                  trigger stamped it; since schema 8 the rows are written again after the
//	                  statement, with fresh revs
//	no-notify         the change-event trigger builds and signs its payloads but sends none
//	                  (what pg_notify costs, by difference with shipped)
//	empty-trigger     the change-event trigger does nothing: the statement still collects its
//	                  transition table (what building and signing the payloads costs, by
//	                  difference with no-notify)
//	no-change-events  the change-event trigger disabled (what collecting the rows costs, by
//	                  difference with empty-trigger)
//	bare-update       the least a completion can be: every user trigger off, and a statement
//	                  that sets due_at by key and nothing else (no rev, no rev check, no
//	                  RETURNING). The floor under any queue that writes each completion to its
//	                  row in this table: what is left is finding the row, pruning its page and
//	                  the HOT update with its WAL
//	btree-lookup      no-change-events without the key's hash index: rows found through the
//	                  primary key's btree (before schema 5)
//
// The variants change the schema on a database of their own, each setting all it depends on
// first (triggers, the change-event function, the hash index), so any of them may run alone, in
// any order or again (-count).
func BenchmarkCompleteStatement(b *testing.B) {
	st, keys := stmtDB.fill(b, 1_000_000)
	ctx := context.Background()
	revTriggerSQL := strings.Replace(completeSQL, ", rev = nextval('render_schedule_rev_seq')", "", 1)
	if revTriggerSQL == completeSQL {
		b.Fatal("completeSQL no longer stamps rev itself: update this benchmark")
	}
	shippedFn, noNotifyFn, emptyFn := notifyVariants(b)
	exec := func(b *testing.B, sql string) {
		b.Helper()
		if _, err := st.pool.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	const bareSQL = `UPDATE render_schedule AS r SET due_at = c.due
FROM unnest($1::text[], $2::timestamptz[]) AS c(key, due) WHERE r.key = c.key`
	const (
		allTriggers    = "ALTER TABLE render_schedule ENABLE TRIGGER USER"
		noTriggers     = "ALTER TABLE render_schedule DISABLE TRIGGER USER"
		noChangeEvents = "ALTER TABLE render_schedule DISABLE TRIGGER render_schedule_notify_update"
		hashIndex      = "CREATE INDEX IF NOT EXISTS render_schedule_key_lookup ON render_schedule USING hash (key)"
		noHashIndex    = "DROP INDEX IF EXISTS render_schedule_key_lookup"
	)
	for _, v := range []struct {
		name  string
		sql   string
		setup []string // run before the variant, in order: everything the variant depends on
		bare  bool     // sql takes keys and due times only, and returns no rows
	}{
		{"shipped", completeSQL, []string{shippedFn, allTriggers, hashIndex}, false},
		{"rev-trigger", revTriggerSQL, []string{shippedFn, allTriggers, hashIndex}, false},
		{"no-notify", completeSQL, []string{noNotifyFn, allTriggers, hashIndex}, false},
		{"empty-trigger", completeSQL, []string{emptyFn, allTriggers, hashIndex}, false},
		{"no-change-events", completeSQL, []string{shippedFn, allTriggers, noChangeEvents, hashIndex}, false},
		{"bare-update", bareSQL, []string{shippedFn, noTriggers, hashIndex}, true},
		{"btree-lookup", completeSQL, []string{shippedFn, allTriggers, noChangeEvents, noHashIndex}, false},
	} {
		b.Run(v.name, func(b *testing.B) {
			for _, q := range v.setup {
				exec(b, q)
			}
			conn, err := st.pool.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Release()
			pid := int(conn.Conn().PgConn().PID()) // the backend serving this connection
			rng := rand.New(rand.NewPCG(5, 6))
			const batch = 500
			statement := func() {
				picked := make(map[int]bool, batch)
				ks := make([]string, 0, batch)
				for len(ks) < batch {
					if i := rng.IntN(len(keys)); !picked[i] {
						picked[i] = true
						ks = append(ks, keys[i])
					}
				}
				dues := make([]time.Time, batch)
				for i := range dues {
					dues[i] = time.Now().Add(time.Duration(rng.IntN(86400)) * time.Second)
				}
				if v.bare {
					tag, err := conn.Exec(ctx, v.sql, ks, dues)
					if err != nil || tag.RowsAffected() != batch {
						b.Fatalf("completed %d of %d: %v", tag.RowsAffected(), batch, err)
					}
					return
				}
				rows, err := conn.Query(ctx, v.sql, ks, dues, make([]int64, batch))
				if err != nil {
					b.Fatal(err)
				}
				n := 0
				for rows.Next() {
					n++
				}
				if err := rows.Err(); err != nil || n != batch {
					b.Fatalf("completed %d of %d: %v", n, batch, err)
				}
			}
			for range 20 { // warm: plan cached, pages in shared buffers
				statement()
			}
			cpu0, cpuOK := procstat.CPU(pid)
			b.ResetTimer()
			for range b.N {
				statement()
			}
			b.StopTimer()
			rows := float64(b.N * batch)
			b.ReportMetric(float64(b.Elapsed().Microseconds())/rows, "wall-us/row")
			if cpu1, ok := procstat.CPU(pid); cpuOK && ok {
				b.ReportMetric(float64((cpu1-cpu0).Microseconds())/rows, "backend-us/row")
			}
		})
	}
}

// notifyVariants returns the change-event trigger function of the newest migration that defines
// it (shipped), that function rewritten to build and sign its payloads without sending them
// (noNotify), and one that does nothing (empty), as statements replacing the schema's function.
func notifyVariants(b *testing.B) (shipped, noNotify, empty string) {
	b.Helper()
	ms, err := Migrations()
	if err != nil {
		b.Fatal(err)
	}
	const head = "CREATE OR REPLACE FUNCTION render_schedule_notify() RETURNS trigger"
	var fn string
	for _, m := range ms {
		if i := strings.Index(m.SQL, head); i >= 0 {
			end := strings.Index(m.SQL[i:], "$fn$;")
			if end < 0 {
				b.Fatalf("%s: render_schedule_notify() has no end", m.Name)
			}
			fn = m.SQL[i : i+end+len("$fn$")]
		}
	}
	send := "PERFORM pg_notify(p.channel, '2' || ts || ','"
	noNotify = strings.Replace(fn, send, "PERFORM octet_length(p.channel || '2' || ts || ','", 1)
	if fn == "" || noNotify == fn {
		b.Fatal("render_schedule_notify() no longer sends as this benchmark expects: update it")
	}
	body := fn[strings.Index(fn, "$fn$"):]
	empty = strings.Replace(fn, body, "$fn$ BEGIN RETURN NULL; END $fn$", 1)
	return fn, noNotify, empty
}
