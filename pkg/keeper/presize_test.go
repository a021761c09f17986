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

// TestPresizeFromEstimate checks that a shard with window 0 sizes its key index from the
// database's row estimate before the load (so the load never rebuilds it), and that a shard with
// a window does not.
func TestPresizeFromEstimate(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	st, err := postgres.Open(ctx, dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := st.EstimateRows(ctx); err != nil || n != 0 {
		t.Fatalf("estimate of a table never analyzed: %d, %v; want 0", n, err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20_000
	if _, err := conn.Exec(ctx, `INSERT INTO render_schedule (key, due_at, cadence_ms)
		SELECT 'k' || i, now() - interval '1 hour', 3600000 FROM generate_series(1, $1) AS i`, n); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ANALYZE render_schedule`); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)
	if est, err := st.EstimateRows(ctx); err != nil || est < n*9/10 || est > n*11/10 {
		t.Fatalf("estimate %d, %v; want about %d", est, err, n)
	}

	windowed, err := NewShard(Options{Name: "w", Store: st, Log: logr.Discard()}, allSlots(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	windowed.presize(ctx)
	if got, _ := windowed.core.IndexSize(); got != 0 {
		t.Fatalf("a shard with a window reserved %d index slots before its first walk", got)
	}

	sh, err := NewShard(Options{Name: "all", Store: st, Log: logr.Discard()}, allSlots(0))
	if err != nil {
		t.Fatal(err)
	}
	if rep := sh.Walk(ctx, true); rep.Failed || rep.Counts.Scanned != n {
		t.Fatalf("load: %+v", rep)
	}
	// sized once (from the estimate) before the load: no rebuild on the way
	if slots, builds := sh.core.IndexSize(); builds != 1 || slots*3 < n*4 {
		t.Fatalf("the load rebuilt the index %d times (%d slots for %d rows); want once, before it", builds, slots, n)
	}
}
