package keeper

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// TestShardCompleteWritesPolicyDue: a completion writes the next due time the shard's Reschedule
// policy gives (to the store, not just the core), and a worker's nextDue overrides it.
func TestShardCompleteWritesPolicyDue(t *testing.T) {
	for _, tc := range []struct {
		policy policy.Reschedule
		want   time.Time
	}{
		// 90 min late on an hourly cadence: KeepPhase takes the point of the row's own schedule
		// nearest to an hour after the render (t0+30m and t0+90m tie: the later); AfterRender
		// an hour after the completion
		{policy.KeepPhase, t0.Add(90 * time.Minute)},
		{policy.AfterRender, t0.Add(time.Hour)},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			settings := allSlots(0)
			settings.Reschedule = tc.policy
			e := newShardEnv(t, settings)
			e.upsert(srow("late", t0.Add(-90*time.Minute), time.Hour), srow("given", t0.Add(-90*time.Minute), time.Hour))
			e.sh.Walk(e.ctx, true)
			claimed, err := e.sh.Claim(e.clock.Now(), 2, time.Minute)
			if err != nil || len(claimed) != 2 {
				t.Fatalf("claim: %v %v", claimed, err)
			}
			given := t0.Add(7 * time.Hour)
			items := []CompleteItem{{Key: "late", Lease: claimed[0].Lease}, {Key: "given", Lease: claimed[1].Lease, NextDue: &given}}
			if claimed[0].Key != "late" {
				items[0].Lease, items[1].Lease = claimed[1].Lease, claimed[0].Lease
			}
			if errs, err := e.sh.Complete(e.ctx, items); err != nil || errs[0] != nil || errs[1] != nil {
				t.Fatalf("complete: %v %v", errs, err)
			}
			conn, err := pgx.Connect(e.ctx, e.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = conn.Close(e.ctx) }()
			for key, want := range map[string]time.Time{"late": tc.want, "given": given} {
				var due time.Time
				if err := conn.QueryRow(e.ctx, "SELECT due_at FROM render_schedule WHERE key = $1", key).Scan(&due); err != nil {
					t.Fatal(err)
				}
				if !due.Equal(want) {
					t.Errorf("%s: stored due %v, want %v", key, due.UTC(), want)
				}
			}
		})
	}
}

// TestShardRunsTheFairDefaults: a shard claims with the starvation bound on (a class that has had
// due rows for half its cadence gets a row though the boost ranks it last), and with the Adaptive
// policy keeps a row's phase while it has not measured an overload.
func TestShardRunsTheFairDefaults(t *testing.T) {
	settings := allSlots(0)
	settings.Reschedule = policy.Adaptive
	e := newShardEnv(t, settings)
	hourly := srow("hourly", t0.Add(-90*time.Minute), time.Hour)
	hourly.Source = schedule.SourceSubmitted
	hourly2 := srow("hourly2", t0.Add(-80*time.Minute), time.Hour)
	hourly2.Source = schedule.SourceSubmitted
	// 1.5, 1.33 and 0.54 cadences late: by score (boost 2) the hourly rows first
	e.upsert(hourly, hourly2, srow("daily", t0.Add(-13*time.Hour), 24*time.Hour))
	e.sh.Walk(e.ctx, true)
	claimed, err := e.sh.Claim(e.clock.Now(), 2, time.Minute)
	if err != nil || len(claimed) != 2 || claimed[0].Key != "hourly" || claimed[1].Key != "daily" {
		t.Fatalf("claim: %+v %v; want both classes, each past its bound", claimed, err)
	}
	if errs, err := e.sh.Complete(e.ctx, []CompleteItem{{Key: "hourly", Lease: claimed[0].Lease}}); err != nil || errs[0] != nil {
		t.Fatalf("complete: %v %v", errs, err)
	}
	conn, err := pgx.Connect(e.ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(e.ctx) }()
	var due time.Time
	if err := conn.QueryRow(e.ctx, "SELECT due_at FROM render_schedule WHERE key = 'hourly'").Scan(&due); err != nil {
		t.Fatal(err)
	}
	if want := t0.Add(90 * time.Minute); !due.Equal(want) { // KeepPhase: nothing measured yet
		t.Errorf("stored due %v, want %v", due.UTC(), want)
	}
}
