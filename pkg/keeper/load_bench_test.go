package keeper

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5"

	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
)

// BenchmarkShardLoad measures a standalone shard (all slots, window 0: every row held) loading
// 1,000,000 rows from PostgreSQL to ready: subscribe, then the first walk.
func BenchmarkShardLoad(b *testing.B) {
	const n = 1_000_000
	dsn := pgtest.NewDatabase(b)
	ctx := context.Background()
	st, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	if err := st.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	// 64-byte keys, 97% 96 h / 3% 24 h, half submitted, due spread over the cadence
	if _, err := conn.Exec(ctx, `
		INSERT INTO render_schedule (key, due_at, cadence_ms, route, source)
		SELECT format('https://shop.example.com/product/%s', lpad(i::text, 31, '0')),
		       now() - (random() * CASE WHEN i % 33 = 0 THEN 86400 ELSE 345600 END) * interval '1 second',
		       CASE WHEN i % 33 = 0 THEN 86400000 ELSE 345600000 END,
		       'product', CASE WHEN i % 2 = 0 THEN 'submitted' ELSE 'discovered' END
		FROM generate_series(1, $1) AS i`, n); err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `VACUUM ANALYZE render_schedule`); err != nil {
		b.Fatal(err)
	}
	_ = conn.Close(ctx)
	var total time.Duration
	for b.Loop() {
		sh, err := NewShard(Options{Name: "bench", Store: st, Log: logr.Discard()}, allSlots(0))
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := sh.Subscribe(ctx); err != nil {
			b.Fatal(err)
		}
		rep := sh.Walk(ctx, true)
		took := time.Since(start)
		total += took
		if rep.Failed || rep.Partial || rep.Counts.Scanned != n || !sh.Ready() || sh.core.Held() != n {
			b.Fatalf("load: %+v held %d", rep, sh.core.Held())
		}
		_ = sh.sub.Close()
	}
	secs := total.Seconds() / float64(b.N)
	b.ReportMetric(secs, "s/load")
	b.ReportMetric(n/secs, "rows/s")
}
