package changes_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/changes"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
	"github.com/renderqueue/renderqueue/pkg/store/storetest"
)

// notifyGarbage sends n garbage notifications spread over the event channels, as the role of dsn,
// in one statement.
func notifyGarbage(t *testing.T, dsn string, n int) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(context.Background(), `SELECT count(pg_notify('rq_slots_' || (g % 64), 'garbage ' || g))
		FROM generate_series(1, $1::int) g`, n); err != nil {
		t.Fatal(err)
	}
}

// TestFloodStopsReading: a role with no rights on the schema sends 50,000 garbage notifications
// at once on the event channels; the subscription reads and checks no more than its flood rate
// (1,000 a second here) of them, signals a gap (ErrFlood) and closes its connection, listens again
// after its pause and says resumed; then a real write is delivered as an event again.
func TestFloodStopsReading(t *testing.T) {
	st, dsn := openTestStore(t, postgres.Options{FloodRate: 1000, FloodPause: 200 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := st.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	sub := s.(*changes.Subscription)
	_, flooder := pgtest.Role(t, dsn, "rq_flooder_")

	notifyGarbage(t, flooder, 50_000)
	var gap error
	nextUntil(t, sub, func(b store.Batch) bool {
		if b.Kind == store.KindGap && gap == nil && errors.Is(b.Err, changes.ErrFlood) {
			gap = b.Err
		}
		return gap != nil
	})
	nextUntil(t, sub, func(b store.Batch) bool { return b.Kind == store.KindResumed })
	if n := sub.Opened(); n > 2000 {
		t.Fatalf("%d of 50,000 garbage notifications were checked, with a flood rate of 1,000 a second", n)
	} else {
		t.Logf("%d of 50,000 garbage notifications checked; gap: %v", n, gap)
	}

	row, err := st.Upsert(ctx, []schedule.Row{storetest.Row("https://example.com/after-flood", time.Now())})
	if err != nil {
		t.Fatal(err)
	}
	nextUntil(t, sub, func(b store.Batch) bool {
		return b.Kind == store.KindEvents && len(b.Events) == 1 && b.Events[0].Row == row[0]
	})
}
