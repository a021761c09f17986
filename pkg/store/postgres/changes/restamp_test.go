package changes_test

import (
	"context"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/changes"
)

// TestMigrationToRevAfterTheRow: migrating a live schema from version 7 to 8 changes nothing a
// listener sees: the subscription stays connected (no gap), and a producer's update that leaves
// rev alone, written after the migration, arrives once, with the row's fresh rev
// (migrations/0008_after_row_rev.sql).
func TestMigrationToRevAfterTheRow(t *testing.T) {
	st, _ := openAtVersion(t, changes.ListenerSlotsVersion, postgres.Options{QuietCompletions: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, a, sub := rowThenSubscription(ctx, t, st)
	listenerPID(t, sub)
	if res, err := postgres.MigratePool(ctx, st.Pool()); err != nil || res.From != changes.ListenerSlotsVersion || res.To != postgres.SchemaVersion() {
		t.Fatalf("migrating: %+v, %v", res, err)
	}
	if _, err := st.Pool().Exec(ctx, `UPDATE render_schedule SET cadence_ms = 7200000 WHERE key = $1`, a.Key); err != nil {
		t.Fatal(err)
	}
	before := a.Rev
	if err := st.Pool().QueryRow(ctx, `SELECT rev FROM render_schedule WHERE key = $1`, a.Key).Scan(&a.Rev); err != nil {
		t.Fatal(err)
	}
	if a.Rev <= before {
		t.Fatalf("rev %d after an update from %d, want a fresh one", a.Rev, before)
	}
	got := eventsUntil(t, sub, a) // fails on a gap
	if len(got) != 1 || got[0].Cadence != 2*time.Hour {
		t.Errorf("events %v, want only the update's, with its cadence", keysOf(got))
	}
}
