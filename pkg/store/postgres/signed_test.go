package postgres

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/storetest"
)

// eventKey reads the change-event signing key (the test role owns the schema).
func eventKey(tb testing.TB, st *Store) []byte {
	tb.Helper()
	var h string
	if err := st.pool.QueryRow(context.Background(), `SELECT renderqueue_event_key()`).Scan(&h); err != nil {
		tb.Fatal(err)
	}
	k, err := hex.DecodeString(h)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

// signedPayload builds a format-2 payload of body on channel, signed at ts under key.
func signedPayload(key []byte, channel string, ts time.Time, body string) string {
	tsText := strconv.FormatInt(ts.UnixMicro(), 10)
	mac := signature(key, channel, tsText, body)
	return "2" + tsText + "," + hex.EncodeToString(mac[:]) + "," + body
}

// entry is one format-1 entry for row r (as the trigger writes it).
func entry(r schedule.Row, deleted bool) string {
	due := ""
	if r.HasDue {
		due = strconv.FormatInt(r.Due.UnixMicro(), 10)
	}
	flags := 0
	if r.Source == schedule.SourceSubmitted {
		flags |= 1
	}
	if r.Urgent {
		flags |= 2
	}
	if deleted {
		flags |= 4
	}
	return fmt.Sprintf("%d,%d,%s,%d,%d,%d:%s%d:%s", r.Rev, r.KeyHash, due, r.Cadence.Milliseconds(), flags,
		len(r.Key), r.Key, len(r.Route), r.Route)
}

// nextUntil reads batches up to and including the first for which stop is true.
func nextUntil(t *testing.T, sub store.Subscription, stop func(store.Batch) bool) []store.Batch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []store.Batch
	for {
		b, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("after %d batches: %v", len(out), err)
		}
		out = append(out, b)
		if stop(b) {
			return out
		}
	}
}

// TestSignatureMatchesGo: the HMAC the database computes with sha256() is HMAC-SHA-256 as Go's
// crypto/hmac computes it, for bodies with non-ASCII text.
func TestSignatureMatchesGo(t *testing.T) {
	st, _ := openTestStore(t, Options{})
	key := eventKey(t, st)
	if len(key) != 64 {
		t.Fatalf("key of %d bytes", len(key))
	}
	for _, body := range []string{"", "T", "1,2,,3,0,3:abc0:", "ü例え\n\t,:" + strings.Repeat("x", 7000)} {
		var p string
		if err := st.pool.QueryRow(context.Background(), `SELECT renderqueue_sign('rq_slot_7', $1)`, body).Scan(&p); err != nil {
			t.Fatal(err)
		}
		e, err := openEnvelope(p)
		if err != nil || e.body != body || !e.authentic(key, "rq_slot_7") || e.authentic(key, "rq_slot_8") {
			t.Fatalf("body %.20q: payload %.120q: %v", body, p, err)
		}
		if d := time.Since(time.UnixMicro(e.ts)); d < -time.Minute || d > time.Minute {
			t.Errorf("signed at %v", time.UnixMicro(e.ts))
		}
	}
}

// TestForgedEventsAreGaps: payloads the triggers did not send — unsigned (format 1), signed with
// another key, for another channel, stale, from the future, or a replay of a real one — deliver
// no event and are signalled as a gap, then resumed; real writes before and after flow as events
// with no gap.
func TestForgedEventsAreGaps(t *testing.T) {
	st, dsn := openTestStore(t, Options{EventMaxAge: time.Minute})
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
	ch := channelName(real[0].Slot())
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
		{"unsigned (format 1)", ch, "1" + body, errUnsigned},
		{"another key", ch, signedPayload(otherKey, ch, time.Now(), body), errBadSignature},
		{"signed for another channel", ch, signedPayload(key, channelName((real[0].Slot()+1)%schedule.NumSlots), time.Now(), body), errBadSignature},
		{"a real signature on another body", ch, strings.Replace(signedPayload(key, ch, time.Now(), "x"), ",x", ","+body, 1), errBadSignature},
		{"stale", ch, signedPayload(key, ch, time.Now().Add(-2*time.Minute), body), errStale},
		{"from the future", ch, signedPayload(key, ch, time.Now().Add(2*time.Minute), body), errStale},
		{"replayed", captured.Channel, captured.Payload, errReplayed},
		{"truncated signature", ch, signedPayload(key, ch, time.Now(), body)[:40], errBadPayload},
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
	st, _ := openTestStore(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sub, err := st.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Close() }()
	old := eventKey(t, st)
	if _, err := st.pool.Exec(ctx, `SELECT renderqueue_rotate_event_key()`); err != nil {
		t.Fatal(err)
	}
	if string(eventKey(t, st)) == string(old) {
		t.Fatal("the key did not change")
	}
	// the subscription read its key less than keyRefreshInterval ago: wait that long once
	time.Sleep(keyRefreshInterval)
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
	st, dsn := openTestStore(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	producer, keeper := "rq_producer_"+suffix, "rq_keeper_"+suffix
	for _, q := range []string{
		`CREATE ROLE ` + producer + ` LOGIN`,
		`CREATE ROLE ` + keeper + ` LOGIN`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON render_schedule TO ` + producer,
		`GRANT USAGE ON SEQUENCE render_schedule_rev_seq TO ` + producer,
		`GRANT SELECT, UPDATE ON render_schedule TO ` + keeper,
		`GRANT USAGE ON SEQUENCE render_schedule_rev_seq TO ` + keeper,
	} {
		if _, err := st.pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, r := range []string{producer, keeper} {
			_, _ = st.pool.Exec(ctx, `DROP OWNED BY `+r)
			_, _ = st.pool.Exec(ctx, `DROP ROLE `+r)
		}
	})
	as := func(role string) string {
		cfg, err := pgconn.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Replace(dsn, "user="+cfg.User, "user="+role, 1)
	}

	// the keeper role without the grant: Subscribe says what to grant
	ks, err := Open(ctx, as(keeper), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ks.Close() }()
	if _, err := ks.Subscribe(ctx, []int{1}); err == nil || !strings.Contains(err.Error(), "GRANT EXECUTE ON FUNCTION renderqueue_event_key()") {
		t.Fatalf("subscribing without the grant: %v", err)
	}
	if _, err := st.pool.Exec(ctx, `GRANT EXECUTE ON FUNCTION renderqueue_event_key() TO `+keeper); err != nil {
		t.Fatal(err)
	}
	sub, err := ks.Subscribe(ctx, schedule.AllSlots().Slots())
	if err != nil {
		t.Fatalf("subscribing with the grant: %v", err)
	}
	defer func() { _ = sub.Close() }()

	// the producer writes with plain SQL; the keeper gets the event, signed
	pc, err := pgx.Connect(ctx, as(producer))
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
		`SELECT renderqueue_sign('rq_slot_1', 'T')`,
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

// TestReplayGuard: the guard's window, its memory of payloads and its bound.
func TestReplayGuard(t *testing.T) {
	const sec = int64(time.Second / time.Microsecond)
	g := newReplayGuard(time.Minute, 3)
	mac := func(i int) *[sha256.Size]byte {
		var m [sha256.Size]byte
		m[0], m[1] = byte(i), byte(i>>8)
		return &m
	}
	now := int64(1_000_000) * sec
	for i, tc := range []struct {
		ts, now int64
		mac     int
		want    error
	}{
		{now, now, 1, nil},
		{now, now, 1, errReplayed},
		{now - 61*sec, now, 2, errStale},
		{now + 61*sec, now, 3, errStale},
		{now - 30*sec, now, 4, nil},
		{now + 30*sec, now, 5, nil},
		{now + 1, now, 6, nil},                       // a fourth remembered: the oldest arrival (mac 1, ts now) is forgotten
		{now, now, 7, errStale},                      // signed no later than a forgotten one: cannot be told from a replay
		{now + 2, now, 1, nil},                       // a new payload
		{now + 30*sec, now + 80*sec, 5, errReplayed}, // remembered while fresh
		{now + 30*sec, now + 100*sec, 5, errStale},   // then too old: refused by age, forgotten
		{now + 190*sec, now + 200*sec, 8, nil},
	} {
		err := g.admit(tc.ts, mac(tc.mac), tc.now)
		if !errors.Is(err, tc.want) && (err != nil || tc.want != nil) {
			t.Errorf("step %d: %v, want %v", i, err, tc.want)
		}
	}
	if len(g.seen) > 3 || len(g.ring)-g.head > 3 {
		t.Errorf("remembers %d payloads, at most 3", len(g.seen))
	}
}
