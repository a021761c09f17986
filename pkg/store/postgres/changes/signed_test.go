package changes_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/changes"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/pgtest"
	"github.com/renderqueue/renderqueue/pkg/store/storetest"
)

// TestSignatureMatchesGo: the HMAC the database computes with sha256() is HMAC-SHA-256 as Go's
// crypto/hmac computes it, for bodies with non-ASCII text.
func TestSignatureMatchesGo(t *testing.T) {
	st, _ := openTestStore(t, postgres.Options{})
	key := eventKey(t, st)
	if len(key) != 64 {
		t.Fatalf("key of %d bytes", len(key))
	}
	for _, body := range []string{"", "T", "1,2,,3,0,3:abc0:", "ü例え\n\t,:" + strings.Repeat("x", 7000)} {
		var p string
		if err := st.Pool().QueryRow(context.Background(), `SELECT renderqueue_sign('rq_slots_7', $1)`, body).Scan(&p); err != nil {
			t.Fatal(err)
		}
		got, ts, authentic, err := changes.OpenPayload(key, "rq_slots_7", p)
		_, _, otherChannel, _ := changes.OpenPayload(key, "rq_slots_8", p)
		if err != nil || got != body || !authentic || otherChannel {
			t.Fatalf("body %.20q: payload %.120q: %v", body, p, err)
		}
		if d := time.Since(time.UnixMicro(ts)); d < -time.Minute || d > time.Minute {
			t.Errorf("signed at %v", time.UnixMicro(ts))
		}
	}
}

// TestForgedEventsAreGaps: payloads the triggers did not send — unsigned (format 1), signed with
// another key, for another channel, stale, from the future, or a replay of a real one — deliver
// no event and are signalled as a gap, then resumed; real writes before and after flow as events
// with no gap.
func TestForgedEventsAreGaps(t *testing.T) {
	st, dsn := openTestStore(t, postgres.Options{EventMaxAge: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sub, err := st.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	raw, got := listenAll(t, dsn)
	key := eventKey(t, st)

	// a real write: an event, no gap; capture its raw payload for the replay
	real, err := st.Upsert(ctx, []schedule.Row{storetest.Row("https://example.com/real", time.Now().Add(-time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	bs := nextUntil(t, sub, func(b store.Batch) bool { return b.Kind == store.KindEvents })
	if len(bs) != 1 || len(bs[0].Events) != 1 || bs[0].Events[0].Row != real[0] {
		t.Fatalf("a real write: %+v", bs)
	}
	for len(*got) == 0 {
		if err := raw.WaitForNotification(ctx); err != nil {
			t.Fatal(err)
		}
	}
	captured := (*got)[0]

	// forgeries: each names a row that would hide the real one (same key, newer rev, due far
	// ahead) or add an urgent row that does not exist
	hide := real[0]
	hide.Rev += 1000
	hide.Due = time.Now().Add(1000 * time.Hour)
	fake := storetest.Row("https://example.com/fake", time.Now().Add(-10*time.Hour))
	fake.Urgent, fake.Rev = true, hide.Rev+1
	fake.KeyHash = hide.KeyHash // same slot, same channel
	ch := changes.GroupChannel(changes.GroupOf(real[0].Slot()))
	body := entry(hide, false) + entry(fake, false)
	otherKey := make([]byte, 64)
	_, _ = rand.Read(otherKey)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	for _, tc := range []struct {
		name, channel, payload string
		want                   error
	}{
		{"unsigned (format 1)", ch, "1" + body, changes.ErrUnsigned},
		{"another key", ch, signedPayload(otherKey, ch, time.Now(), body), changes.ErrBadSignature},
		{"signed for another channel", ch, signedPayload(key, changes.GroupChannel((changes.GroupOf(real[0].Slot())+1)%changes.NumGroups), time.Now(), body), changes.ErrBadSignature},
		{"signed for its slot's channel (schema version 2)", ch, signedPayload(key, changes.SlotChannel(real[0].Slot()), time.Now(), body), changes.ErrBadSignature},
		{"a real signature on another body", ch, strings.Replace(signedPayload(key, ch, time.Now(), "x"), ",x", ","+body, 1), changes.ErrBadSignature},
		{"stale", ch, signedPayload(key, ch, time.Now().Add(-2*time.Minute), body), changes.ErrStale},
		{"from the future", ch, signedPayload(key, ch, time.Now().Add(2*time.Minute), body), changes.ErrStale},
		{"replayed", captured.Channel, captured.Payload, changes.ErrReplayed},
		{"truncated signature", ch, signedPayload(key, ch, time.Now(), body)[:40], changes.ErrBadPayload},
	} {
		if _, err := conn.Exec(ctx, `SELECT pg_notify($1, $2)`, tc.channel, tc.payload); err != nil {
			t.Fatal(err)
		}
		bs := nextUntil(t, sub, func(b store.Batch) bool { return b.Kind == store.KindResumed })
		if len(bs) != 2 || bs[0].Kind != store.KindGap || !errors.Is(bs[0].Err, tc.want) {
			t.Errorf("%s: %+v, want a gap (%v) then resumed", tc.name, bs, tc.want)
		}
	}

	// a real write after all that still flows, with no gap before it
	later, err := st.Upsert(ctx, []schedule.Row{storetest.Row("https://example.com/later", time.Now())})
	if err != nil {
		t.Fatal(err)
	}
	bs = nextUntil(t, sub, func(b store.Batch) bool { return b.Kind != store.KindEvents || len(b.Events) > 0 })
	if len(bs) != 1 || bs[0].Kind != store.KindEvents || bs[0].Events[0].Row != later[0] {
		t.Fatalf("a real write after the forgeries: %+v", bs)
	}
}

// TestKeyRotation: after the key is rotated, the subscription reads the new key at the first
// payload signed with it, and the write flows as an event with no gap.
func TestKeyRotation(t *testing.T) {
	st, _ := openTestStore(t, postgres.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sub, err := st.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	old := eventKey(t, st)
	if _, err := st.Pool().Exec(ctx, `SELECT renderqueue_rotate_event_key()`); err != nil {
		t.Fatal(err)
	}
	if string(eventKey(t, st)) == string(old) {
		t.Fatal("the key did not change")
	}
	// the subscription read its key less than changes.KeyRefreshInterval ago: wait that long once
	time.Sleep(changes.KeyRefreshInterval)
	out, err := st.Upsert(ctx, []schedule.Row{storetest.Row("https://example.com/rotated", time.Now())})
	if err != nil {
		t.Fatal(err)
	}
	bs := nextUntil(t, sub, func(b store.Batch) bool { return b.Kind != store.KindEvents || len(b.Events) > 0 })
	if len(bs) != 1 || bs[0].Kind != store.KindEvents || bs[0].Events[0].Row != out[0] {
		t.Fatalf("after a rotation: %+v", bs)
	}
}

// TestRoles: a producer role with the privileges docs/security.md lists writes rows (their events
// are signed) but cannot read the key or sign; a keeper role needs EXECUTE on
// renderqueue_event_key() to subscribe, and is told so without it.
func TestRoles(t *testing.T) {
	st, dsn := openTestStore(t, postgres.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, producerDSN := pgtest.Role(t, dsn, "rq_producer_",
		`GRANT SELECT, INSERT, UPDATE, DELETE ON render_schedule TO %s`,
		`GRANT USAGE ON SEQUENCE render_schedule_rev_seq TO %s`)
	keeper, keeperDSN := pgtest.Role(t, dsn, "rq_keeper_",
		`GRANT SELECT, UPDATE ON render_schedule TO %s`,
		`GRANT USAGE ON SEQUENCE render_schedule_rev_seq TO %s`)

	// the keeper role without the grant: Subscribe says what to grant
	ks, err := postgres.Open(ctx, keeperDSN, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ks.Close() }()
	if _, err := ks.Subscribe(ctx, []int{1}); err == nil || !strings.Contains(err.Error(), "GRANT EXECUTE ON FUNCTION renderqueue_event_key()") {
		t.Fatalf("subscribing without the grant: %v", err)
	}
	if _, err := st.Pool().Exec(ctx, `GRANT EXECUTE ON FUNCTION renderqueue_event_key() TO `+keeper); err != nil {
		t.Fatal(err)
	}
	sub, err := ks.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		t.Fatalf("subscribing with the grant: %v", err)
	}
	defer func() { _ = sub.Close() }()

	// the producer writes with plain SQL; the keeper gets the event, signed
	pc, err := pgx.Connect(ctx, producerDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pc.Close(context.Background()) }()
	if _, err := pc.Exec(ctx, `INSERT INTO render_schedule (key, due_at, cadence_ms) VALUES ('https://example.com/p', now(), 3600000)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pc.Exec(ctx, `DELETE FROM render_schedule WHERE key = 'https://example.com/p'`); err != nil {
		t.Fatal(err)
	}
	var evs []store.Event
	for len(evs) < 2 {
		bs := nextUntil(t, sub, func(b store.Batch) bool { return true })
		if bs[0].Kind != store.KindEvents {
			t.Fatalf("producer's writes: %+v", bs)
		}
		evs = append(evs, bs[0].Events...)
	}
	if evs[0].Row.Key != "https://example.com/p" || evs[0].Deleted || !evs[1].Deleted {
		t.Fatalf("producer's events: %+v", evs)
	}
	// ... but cannot read the key, sign, or rotate it
	for _, q := range []string{
		`SELECT key FROM renderqueue_event_key`,
		`SELECT renderqueue_event_key()`,
		`SELECT renderqueue_sign('rq_slots_1', 'T')`,
		`SELECT renderqueue_rotate_event_key()`,
	} {
		_, err := pc.Exec(ctx, q)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("producer: %s: %v, want permission denied", q, err)
		}
	}
	// nor can it shadow what the triggers call with a temporary table of the key's name
	if _, err := pc.Exec(ctx, `CREATE TEMP TABLE renderqueue_event_key (id boolean, key bytea, ikey bytea, okey bytea)`); err == nil {
		if _, err := pc.Exec(ctx, `INSERT INTO pg_temp.renderqueue_event_key VALUES (true, '\x00', '\x00', '\x00')`); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pc.Exec(ctx, `INSERT INTO render_schedule (key, due_at, cadence_ms) VALUES ('https://example.com/q', now(), 3600000)`); err != nil {
		t.Fatal(err)
	}
	bs := nextUntil(t, sub, func(b store.Batch) bool { return true })
	if bs[0].Kind != store.KindEvents || len(bs[0].Events) != 1 || bs[0].Events[0].Row.Key != "https://example.com/q" {
		t.Fatalf("a write after shadowing the key table: %+v", bs)
	}
}

// TestBulkPayloads writes 100,000 rows in one statement, some with the longest key and route, and
// checks the raw notifications: every payload under the limit, on the right channel, and every
// row's event present exactly once.
func TestBulkPayloads(t *testing.T) {
	st, dsn := openTestStore(t, postgres.Options{})
	conn, got := listenAll(t, dsn)
	key := eventKey(t, st)
	const n = 100000
	rows := make([]schedule.Row, n)
	for i := range rows {
		r := storetest.Row(fmt.Sprintf("payload/%d", i), time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(i)*time.Second))
		if i%100 == 0 { // the largest entries: longest key and route
			r.Key = fmt.Sprintf("https://example.com/long/%07d/", i)
			r.Key += strings.Repeat("k", schedule.MaxKeyBytes-len(r.Key))
			r.Route = strings.Repeat("r", schedule.MaxRouteBytes)
		}
		rows[i] = r
	}
	ctx := context.Background()
	if _, err := st.Upsert(ctx, rows); err != nil {
		t.Fatal(err)
	}
	seen := make(map[string]int, n)
	var maxLen, payloads int
	deadline := time.Now().Add(time.Minute)
	for len(seen) < n && time.Now().Before(deadline) {
		wctx, cancel := context.WithDeadline(ctx, deadline)
		err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("waiting for notifications (%d rows seen): %v", len(seen), err)
		}
		for _, nt := range *got {
			payloads++
			maxLen = max(maxLen, len(nt.Payload))
			if len(nt.Payload) >= changes.MaxPayloadBytes {
				t.Errorf("payload of %d bytes on %s", len(nt.Payload), nt.Channel)
			}
			body, _, authentic, err := changes.OpenPayload(key, nt.Channel, nt.Payload)
			if err != nil || !authentic {
				t.Fatalf("a payload not signed with the key: %v", err)
			}
			evs, err := changes.ParseBody(body)
			if err != nil {
				t.Fatalf("parsing a payload: %v", err)
			}
			for _, e := range evs {
				if want := changes.GroupChannel(changes.GroupOf(e.Row.Slot())); nt.Channel != want {
					t.Errorf("event of slot %d on channel %s", e.Row.Slot(), nt.Channel)
				}
				seen[e.Row.Key]++
			}
		}
		*got = (*got)[:0]
	}
	if len(seen) != n {
		t.Fatalf("events for %d of %d rows", len(seen), n)
	}
	for k, c := range seen {
		if c != 1 {
			t.Errorf("key %q: %d events", k, c)
		}
	}
	t.Logf("%d rows in %d notifications, largest payload %d bytes", n, payloads, maxLen)
}
