// Package storetest is the conformance suite every store.Store implementation must pass. An
// implementation's tests call Run with a Harness that makes fresh stores:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness{New: ..., BreakSubscriptions: ...})
//	}
//
// The suite checks walks (exact rows of a slot set, segments, pagination under concurrent writes,
// failed segments), change events (revs increasing per key for insert, update, complete and
// delete; slot filtering; SetSlots; a bulk statement; gap and resumed signals), writes (results,
// group commit under concurrency, validation that writes nothing) and migrations. It uses no
// sleeps: every wait polls or blocks with a deadline.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
)

// Options configure a store made for one test.
type Options struct {
	// PageRows is the walk page size (small values exercise pagination). 0 = the default.
	PageRows int
	// SegmentSlots caps the slots per walk segment. 0 = the default.
	SegmentSlots int
	// FailSegment, when set, makes the walk of every segment it returns true for fail (a query
	// error in the real store), while other segments are read as usual.
	FailSegment func(schedule.Run) bool
}

// Harness adapts an implementation to the suite.
type Harness struct {
	// New returns a new, empty, migrated store configured with opts. The suite closes it.
	New func(t *testing.T, opts Options) store.Store
	// BreakSubscriptions makes every subscription of st lose continuity the way a real failure
	// does (for PostgreSQL: pg_terminate_backend on the listening backends). Required.
	BreakSubscriptions func(t *testing.T, st store.Store)
	// BulkRows is the number of rows written by one statement in the bulk event test.
	// Default 100000.
	BulkRows int
}

// timeout bounds every wait of the suite.
const timeout = 60 * time.Second

// Run runs the conformance suite.
func Run(t *testing.T, h Harness) {
	if h.New == nil || h.BreakSubscriptions == nil {
		t.Fatal("storetest: Harness.New and Harness.BreakSubscriptions are required")
	}
	if h.BulkRows <= 0 {
		h.BulkRows = 100000
	}
	tests := []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"MigrateIsIdempotent", testMigrate},
		{"UpsertRoundTrip", testUpsertRoundTrip},
		{"WalkSlotSet", testWalkSlotSet},
		{"WalkUnderConcurrentWrites", testWalkConcurrentWrites},
		{"WalkFailedSegment", testWalkFailedSegment},
		{"WalkCallbackError", testWalkCallbackError},
		{"EventsRevIncreasing", testEventsRev},
		{"EventsOnlyOwnedSlots", testEventsOwnedSlots},
		{"SetSlots", testSetSlots},
		{"BulkStatementEvents", testBulkEvents},
		{"GapThenResumed", testGap},
		{"SubscriptionClose", testSubscriptionClose},
		{"StoreClose", testStoreClose},
		{"CompleteResults", testCompleteResults},
		{"CompleteGroupCommitConcurrent", testCompleteConcurrent},
		{"CompleteChecksRev", testCompleteChecksRev},
		{"CompleteKnown", testCompleteKnown},
		{"DeleteResults", testDelete},
		{"RejectBadInput", testRejectBadInput},
		{"KeeperSessions", testSessions},
		{"ReadRow", testReadRow},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, h) })
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// Row makes a valid test row with key "https://example.com/<name>".
func Row(name string, due time.Time) schedule.Row {
	return schedule.Row{
		Key:     "https://example.com/" + name,
		Due:     due.UTC().Truncate(time.Microsecond),
		HasDue:  true,
		Cadence: time.Hour,
		Route:   "product",
		Source:  schedule.SourceSubmitted,
	}
}

var base = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func makeRows(prefix string, n int) []schedule.Row {
	rows := make([]schedule.Row, n)
	for i := range rows {
		r := Row(fmt.Sprintf("%s/%d", prefix, i), base.Add(time.Duration(i)*time.Second+123456*time.Nanosecond))
		switch i % 4 {
		case 1:
			r.Source, r.Route = schedule.SourceDiscovered, "category"
		case 2:
			r.HasDue, r.Due = false, time.Time{}
		case 3:
			r.Urgent, r.Cadence, r.Route = true, 96*time.Hour, ""
		}
		rows[i] = r
	}
	return rows
}

func upsert(t *testing.T, st store.Store, rows []schedule.Row) []schedule.Row {
	t.Helper()
	out, err := st.Upsert(ctxT(t), rows)
	if err != nil {
		t.Fatalf("upsert %d rows: %v", len(rows), err)
	}
	if len(out) != len(rows) {
		t.Fatalf("upsert returned %d rows for %d", len(out), len(rows))
	}
	return out
}

// sameFields reports how got differs from want in the written fields (not KeyHash, Rev).
func sameFields(got, want schedule.Row) string {
	var d []string
	if got.Key != want.Key {
		d = append(d, fmt.Sprintf("key %q != %q", got.Key, want.Key))
	}
	if got.HasDue != want.HasDue || (got.HasDue && !got.Due.Equal(want.Due)) {
		d = append(d, fmt.Sprintf("due %v/%v != %v/%v", got.HasDue, got.Due, want.HasDue, want.Due))
	}
	if got.Cadence != want.Cadence {
		d = append(d, fmt.Sprintf("cadence %v != %v", got.Cadence, want.Cadence))
	}
	if got.Route != want.Route {
		d = append(d, fmt.Sprintf("route %q != %q", got.Route, want.Route))
	}
	if got.Source != want.Source {
		d = append(d, fmt.Sprintf("source %v != %v", got.Source, want.Source))
	}
	if got.Urgent != want.Urgent {
		d = append(d, fmt.Sprintf("urgent %v != %v", got.Urgent, want.Urgent))
	}
	return strings.Join(d, "; ")
}

// walkRecord is what walking collects.
type walkRecord struct {
	rows     map[string]schedule.Row
	dups     []string
	ends     map[schedule.Run]error
	endCount map[schedule.Run]int
	res      store.WalkResult
}

// walk walks slots, checking the callback contract (never concurrent; rows of a segment in
// (key_hash, key) order, inside the segment, before its end; one end per segment).
func walk(t *testing.T, st store.Store, slots []int, onItem func(store.WalkItem)) (*walkRecord, error) {
	t.Helper()
	rec := &walkRecord{rows: map[string]schedule.Row{}, ends: map[schedule.Run]error{}, endCount: map[schedule.Run]int{}}
	var inFlight atomic.Int32
	last := map[schedule.Run]schedule.Row{}
	res, err := st.Walk(ctxT(t), slots, func(it store.WalkItem) error {
		if inFlight.Add(1) != 1 {
			t.Errorf("walk callback called concurrently")
		}
		defer inFlight.Add(-1)
		if rec.endCount[it.Segment] > 0 {
			t.Errorf("segment %v: item after its end", it.Segment)
		}
		if it.End {
			rec.endCount[it.Segment]++
			rec.ends[it.Segment] = it.Err
			if len(it.Rows) > 0 {
				t.Errorf("segment %v: end item with rows", it.Segment)
			}
		}
		for _, r := range it.Rows {
			if !it.Segment.Contains(r.Slot()) {
				t.Errorf("segment %v: row %q of slot %d", it.Segment, r.Key, r.Slot())
			}
			if p, ok := last[it.Segment]; ok && (r.KeyHash < p.KeyHash || (r.KeyHash == p.KeyHash && r.Key <= p.Key)) {
				t.Errorf("segment %v: row %q (hash %d) after %q (hash %d): not in (key_hash, key) order",
					it.Segment, r.Key, r.KeyHash, p.Key, p.KeyHash)
			}
			last[it.Segment] = r
			if _, dup := rec.rows[r.Key]; dup {
				rec.dups = append(rec.dups, r.Key)
			}
			rec.rows[r.Key] = r
		}
		if onItem != nil {
			onItem(it)
		}
		return nil
	})
	rec.res = res
	return rec, err
}

func testMigrate(t *testing.T, h Harness) {
	st := newStore(t, h, Options{})
	for i := range 2 {
		if err := st.Migrate(ctxT(t)); err != nil {
			t.Fatalf("migrate run %d: %v", i+1, err)
		}
	}
	upsert(t, st, makeRows("migrate", 3))
	if err := st.Migrate(ctxT(t)); err != nil {
		t.Fatalf("migrate with data: %v", err)
	}
	rec, err := walk(t, st, schedule.AllSlots().Slots(), nil)
	if err != nil || len(rec.rows) != 3 {
		t.Fatalf("after migrating again: %d rows, err %v; want 3", len(rec.rows), err)
	}
}

func newStore(t *testing.T, h Harness, opts Options) store.Store {
	t.Helper()
	st := h.New(t, opts)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func testUpsertRoundTrip(t *testing.T, h Harness) {
	st := newStore(t, h, Options{})
	in := makeRows("roundtrip", 40)
	out := upsert(t, st, in)
	revs := map[int64]bool{}
	for i := range in {
		if d := sameFields(out[i], in[i]); d != "" {
			t.Errorf("upsert result %d: %s", i, d)
		}
		if out[i].Rev <= 0 || revs[out[i].Rev] {
			t.Errorf("upsert result %d: rev %d not fresh", i, out[i].Rev)
		}
		revs[out[i].Rev] = true
	}
	rec, err := walk(t, st, schedule.AllSlots().Slots(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.rows) != len(in) {
		t.Fatalf("walk found %d rows, want %d", len(rec.rows), len(in))
	}
	for i := range out {
		got := rec.rows[out[i].Key]
		if d := sameFields(got, in[i]); d != "" {
			t.Errorf("walked row %q: %s", in[i].Key, d)
		}
		if got.KeyHash != out[i].KeyHash || got.Rev != out[i].Rev {
			t.Errorf("walked row %q: hash/rev %d/%d, upsert said %d/%d", in[i].Key, got.KeyHash, got.Rev, out[i].KeyHash, out[i].Rev)
		}
	}
	// Replacing changes every field and gives a newer rev.
	again := make([]schedule.Row, len(in))
	for i, r := range in {
		r.Urgent = !r.Urgent
		r.Route += "-v2"
		r.Cadence += time.Minute
		r.HasDue, r.Due = true, base.Add(-time.Duration(i)*time.Hour)
		again[i] = r
	}
	out2 := upsert(t, st, again)
	for i := range again {
		if d := sameFields(out2[i], again[i]); d != "" {
			t.Errorf("replace result %d: %s", i, d)
		}
		if out2[i].Rev <= out[i].Rev {
			t.Errorf("replace result %d: rev %d not above %d", i, out2[i].Rev, out[i].Rev)
		}
		if out2[i].KeyHash != out[i].KeyHash {
			t.Errorf("replace result %d: hash changed", i)
		}
	}
}

// slotSet picks a slot set with adjacent runs and isolated slots.
func slotSet(rng *rand.Rand) []int {
	var s []int
	for sl := 0; sl < schedule.NumSlots; sl++ {
		switch {
		case sl >= 100 && sl < 180: // a long run (several segments)
			s = append(s, sl)
		case sl >= 600 && sl < 603:
			s = append(s, sl)
		case rng.IntN(9) == 0:
			s = append(s, sl)
		}
	}
	return s
}

func setOf(slots []int) map[int]bool {
	m := make(map[int]bool, len(slots))
	for _, s := range slots {
		m[s] = true
	}
	return m
}

func testWalkSlotSet(t *testing.T, h Harness) {
	st := newStore(t, h, Options{PageRows: 7, SegmentSlots: 16})
	all := upsert(t, st, makeRows("walkset", 3000))
	rng := rand.New(rand.NewPCG(1, 2))
	slots := slotSet(rng)
	in := setOf(slots)
	want := map[string]bool{}
	for _, r := range all {
		if in[r.Slot()] {
			want[r.Key] = true
		}
	}
	if len(want) == 0 || len(want) == len(all) {
		t.Fatalf("bad test setup: %d of %d rows in the slot set", len(want), len(all))
	}
	rec, err := walk(t, st, slots, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkExact(t, rec, want, in)
	// Segments cover exactly the slot set, in order, at most 16 slots each, each ended once, OK.
	var covered []int
	for _, sr := range rec.res.Segments {
		if sr.Segment.Len() > 16 {
			t.Errorf("segment %v longer than 16 slots", sr.Segment)
		}
		if sr.Err != nil || rec.ends[sr.Segment] != nil || rec.endCount[sr.Segment] != 1 {
			t.Errorf("segment %v: result err %v, end err %v, %d ends", sr.Segment, sr.Err, rec.ends[sr.Segment], rec.endCount[sr.Segment])
		}
		for s := sr.Segment.First; s <= sr.Segment.Last; s++ {
			covered = append(covered, s)
		}
	}
	if fmt.Sprint(covered) != fmt.Sprint(slots) {
		t.Errorf("segments cover %v, want %v", covered, slots)
	}
	if rec.res.Rows != len(want) || rec.res.Partial() {
		t.Errorf("result: %d rows, partial %v; want %d, false", rec.res.Rows, rec.res.Partial(), len(want))
	}
	// Unsorted input with duplicates means the same set; an empty set walks nothing.
	shuffled := append(append([]int(nil), slots...), slots[:5]...)
	rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	rec2, err := walk(t, st, shuffled, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkExact(t, rec2, want, in)
	rec3, err := walk(t, st, nil, nil)
	if err != nil || len(rec3.rows) != 0 {
		t.Errorf("walk of no slots: %d rows, err %v", len(rec3.rows), err)
	}
	if _, err := st.Walk(ctxT(t), []int{schedule.NumSlots}, func(store.WalkItem) error { return nil }); err == nil {
		t.Errorf("walk of slot %d: no error", schedule.NumSlots)
	}
}

func checkExact(t *testing.T, rec *walkRecord, want map[string]bool, in map[int]bool) {
	t.Helper()
	if len(rec.dups) > 0 {
		t.Errorf("%d rows delivered twice, e.g. %q", len(rec.dups), rec.dups[0])
	}
	missing := 0
	for k := range want {
		if _, ok := rec.rows[k]; !ok {
			if missing == 0 {
				t.Errorf("row %q missing from the walk", k)
			}
			missing++
		}
	}
	if missing > 0 {
		t.Errorf("%d rows missing from the walk", missing)
	}
	for k, r := range rec.rows {
		if !in[r.Slot()] {
			t.Errorf("row %q of slot %d outside the slot set", k, r.Slot())
		}
	}
}

// testWalkConcurrentWrites writes between the pages of a walk (from the callback, so writes and
// pages interleave deterministically, and from a concurrent writer): every row that exists
// throughout the walk is delivered exactly once.
func testWalkConcurrentWrites(t *testing.T, h Harness) {
	st := newStore(t, h, Options{PageRows: 5, SegmentSlots: 8})
	stable := upsert(t, st, makeRows("stable", 2000))
	churn := upsert(t, st, makeRows("churn", 500))
	slots := slotSet(rand.New(rand.NewPCG(3, 4)))
	in := setOf(slots)
	want := map[string]bool{}
	for _, r := range stable {
		if in[r.Slot()] {
			want[r.Key] = true
		}
	}
	ctx := ctxT(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writerErr error
	wg.Add(1)
	go func() { // a concurrent writer: completes stable rows, re-upserts churn rows, inserts new ones
		defer wg.Done()
		for i := 0; i < 1000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := stable[(i*7)%len(stable)].Key
			if _, err := st.Complete(ctx, []store.Completion{{Key: k, Due: base.Add(time.Duration(i) * time.Minute)}}); err != nil {
				writerErr = err
				return
			}
			if _, err := st.Upsert(ctx, []schedule.Row{Row(fmt.Sprintf("writer/%d", i), base)}); err != nil {
				writerErr = err
				return
			}
		}
	}()
	n := 0
	rec, err := walk(t, st, slots, func(it store.WalkItem) {
		// Between pages: delete some churn rows, insert new rows, update stable rows.
		n++
		if n%3 == 0 && len(churn) > 0 {
			if _, err := st.Delete(ctx, []string{churn[0].Key}); err != nil {
				t.Errorf("delete during walk: %v", err)
			}
			churn = churn[1:]
		}
		fresh := makeRows(fmt.Sprintf("during/%d", n), 3)
		if _, err := st.Upsert(ctx, fresh); err != nil {
			t.Errorf("upsert during walk: %v", err)
		}
		k := stable[(n*13)%len(stable)]
		k.Urgent = !k.Urgent
		if _, err := st.Upsert(ctx, []schedule.Row{k}); err != nil {
			t.Errorf("update during walk: %v", err)
		}
	})
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if writerErr != nil {
		t.Fatalf("concurrent writer: %v", writerErr)
	}
	if n < 50 {
		t.Fatalf("bad test setup: only %d walk items (pagination not exercised)", n)
	}
	checkExact(t, rec, want, in)
	if rec.res.Partial() {
		t.Errorf("walk partial: %+v", rec.res)
	}
}

func testWalkFailedSegment(t *testing.T, h Harness) {
	const bad = 40 // the segment holding slot 40 fails
	st := newStore(t, h, Options{PageRows: 50, SegmentSlots: 16, FailSegment: func(g schedule.Run) bool { return g.Contains(bad) }})
	all := upsert(t, st, makeRows("failseg", 3000))
	rec, err := walk(t, st, schedule.AllSlots().Slots(), nil)
	if err != nil {
		t.Fatalf("walk with a failing segment returned an error: %v", err)
	}
	if f := rec.res.Failed(); f != 1 || !rec.res.Partial() {
		t.Fatalf("failed segments: %d (partial %v), want 1", f, rec.res.Partial())
	}
	var badSeg schedule.Run
	for _, sr := range rec.res.Segments {
		if sr.Segment.Contains(bad) {
			badSeg = sr.Segment
			if sr.Err == nil || rec.ends[sr.Segment] == nil {
				t.Errorf("segment %v: result err %v, end err %v; want errors", sr.Segment, sr.Err, rec.ends[sr.Segment])
			}
		} else if sr.Err != nil || rec.ends[sr.Segment] != nil || rec.endCount[sr.Segment] != 1 {
			t.Errorf("segment %v: result err %v, end err %v, %d ends; want read completely", sr.Segment, sr.Err, rec.ends[sr.Segment], rec.endCount[sr.Segment])
		}
	}
	want := map[string]bool{}
	in := map[int]bool{}
	for s := range schedule.NumSlots {
		in[s] = true
	}
	for _, r := range all {
		if !badSeg.Contains(r.Slot()) {
			want[r.Key] = true
		}
	}
	checkExact(t, rec, want, in)
}

func testWalkCallbackError(t *testing.T, h Harness) {
	st := newStore(t, h, Options{PageRows: 10})
	upsert(t, st, makeRows("cberr", 500))
	boom := errors.New("boom")
	calls := 0
	_, err := st.Walk(ctxT(t), schedule.AllSlots().Slots(), func(store.WalkItem) error {
		calls++
		if calls == 3 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("walk returned %v, want the callback's error", err)
	}
	if calls != 3 {
		t.Errorf("callback called %d times after failing on call 3", calls)
	}
}

// collector reads a subscription in the background.
type collector struct {
	mu      sync.Mutex
	batches []store.Batch
	events  []store.Event
	changed chan struct{}
	done    chan struct{}
	err     error
}

func collect(t *testing.T, sub store.Subscription) *collector {
	c := &collector{changed: make(chan struct{}, 1), done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(c.done)
		for {
			b, err := sub.Next(ctx)
			if err != nil {
				c.mu.Lock()
				c.err = err
				c.mu.Unlock()
				return
			}
			c.mu.Lock()
			c.batches = append(c.batches, b)
			c.events = append(c.events, b.Events...)
			c.mu.Unlock()
			select {
			case c.changed <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-c.done })
	return c
}

// waitFor blocks until cond (called under the collector's lock) holds, or fails the test.
func (c *collector) waitFor(t *testing.T, what string, cond func(c *collector) bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		ok := cond(c)
		err := c.err
		n := len(c.events)
		c.mu.Unlock()
		if ok {
			return
		}
		if err != nil {
			t.Fatalf("waiting for %s: subscription ended: %v", what, err)
		}
		select {
		case <-c.changed:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s (%d events so far)", what, n)
		}
	}
}

func (c *collector) hasKey(key string) func(*collector) bool {
	return func(c *collector) bool {
		for _, e := range c.events {
			if e.Row.Key == key {
				return true
			}
		}
		return false
	}
}

func (c *collector) eventsOf(key string) []store.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []store.Event
	for _, e := range c.events {
		if e.Row.Key == key {
			out = append(out, e)
		}
	}
	return out
}

func subscribe(t *testing.T, st store.Store, slots []int) store.Subscription {
	t.Helper()
	sub, err := st.Subscribe(ctxT(t), slots)
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

func testEventsRev(t *testing.T, h Harness) {
	st := newStore(t, h, Options{})
	sub := subscribe(t, st, schedule.AllSlots().Slots())
	c := collect(t, sub)
	ctx := ctxT(t)
	r := Row("events/a", base)
	r.Urgent = true
	ins := upsert(t, st, []schedule.Row{r})[0]
	r.Route, r.Cadence = "home", 24*time.Hour
	upd := upsert(t, st, []schedule.Row{r})[0]
	cres, err := st.Complete(ctx, []store.Completion{{Key: r.Key, Due: base.Add(24 * time.Hour)}})
	if err != nil || len(cres) != 1 || !cres[0].Found {
		t.Fatalf("complete: %v %+v", err, cres)
	}
	del, err := st.Delete(ctx, []string{r.Key})
	if err != nil || len(del) != 1 || !del[0].Found {
		t.Fatalf("delete: %v %+v", err, del)
	}
	c.waitFor(t, "4 events of the key", func(c *collector) bool {
		n := 0
		for _, e := range c.events {
			if e.Row.Key == r.Key {
				n++
			}
		}
		return n >= 4
	})
	evs := c.eventsOf(r.Key)
	if len(evs) != 4 {
		t.Fatalf("got %d events, want 4 (insert, update, complete, delete): %+v", len(evs), evs)
	}
	for i, want := range []schedule.Row{ins, upd, cres[0].Row} {
		if evs[i].Deleted {
			t.Errorf("event %d: deleted", i)
		}
		if d := sameFields(evs[i].Row, want); d != "" {
			t.Errorf("event %d: %s", i, d)
		}
		if evs[i].Row.Rev != want.Rev || evs[i].Row.KeyHash != want.KeyHash {
			t.Errorf("event %d: rev/hash %d/%d, write said %d/%d", i, evs[i].Row.Rev, evs[i].Row.KeyHash, want.Rev, want.KeyHash)
		}
	}
	if got := evs[2].Row; got.Urgent || !got.Due.Equal(base.Add(24*time.Hour)) {
		t.Errorf("complete event: urgent %v due %v; want false, %v", got.Urgent, got.Due, base.Add(24*time.Hour))
	}
	if !evs[3].Deleted || evs[3].Row.KeyHash != ins.KeyHash {
		t.Errorf("delete event: %+v", evs[3])
	}
	for i := 1; i < 4; i++ {
		if evs[i].Row.Rev <= evs[i-1].Row.Rev {
			t.Errorf("event %d rev %d not above event %d rev %d", i, evs[i].Row.Rev, i-1, evs[i-1].Row.Rev)
		}
	}
	if del[0].Rev <= cres[0].Row.Rev || del[0].KeyHash != ins.KeyHash {
		t.Errorf("delete result: %+v; want rev above %d", del[0], cres[0].Row.Rev)
	}
	// Re-inserting after the delete gets a rev above the delete's.
	re := upsert(t, st, []schedule.Row{r})[0]
	if re.Rev <= evs[3].Row.Rev || re.Rev <= del[0].Rev {
		t.Errorf("re-insert rev %d not above delete revs %d/%d", re.Rev, evs[3].Row.Rev, del[0].Rev)
	}
	c.waitFor(t, "the re-insert event", func(c *collector) bool { return len(c.eventsOf2(r.Key)) == 5 })
}

func (c *collector) eventsOf2(key string) []store.Event { // caller holds mu
	var out []store.Event
	for _, e := range c.events {
		if e.Row.Key == key {
			out = append(out, e)
		}
	}
	return out
}

// rowsInOut returns rows whose slot is / is not in the set (from upsert results).
func split(rows []schedule.Row, in map[int]bool) (inRows, outRows []schedule.Row) {
	for _, r := range rows {
		if in[r.Slot()] {
			inRows = append(inRows, r)
		} else {
			outRows = append(outRows, r)
		}
	}
	return inRows, outRows
}

func testEventsOwnedSlots(t *testing.T, h Harness) {
	st := newStore(t, h, Options{})
	probe := upsert(t, st, makeRows("owned", 400))
	slots := slotSet(rand.New(rand.NewPCG(5, 6)))
	in := setOf(slots)
	inRows, outRows := split(probe, in)
	if len(inRows) == 0 || len(outRows) == 0 {
		t.Fatal("bad test setup")
	}
	sub := subscribe(t, st, slots)
	c := collect(t, sub)
	// Touch every row (in and out of the set), then a marker in the set: once the marker arrives,
	// every earlier commit has been delivered.
	touched := make([]schedule.Row, len(probe))
	for i, r := range probe {
		touched[i] = r
		touched[i].Urgent = !r.Urgent
	}
	upsert(t, st, touched)
	marker := inRows[0]
	marker.Route = "marker"
	upsert(t, st, []schedule.Row{marker})
	c.waitFor(t, "the marker", func(c *collector) bool {
		for _, e := range c.events {
			if e.Row.Key == marker.Key && e.Row.Route == "marker" {
				return true
			}
		}
		return false
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[string]int{}
	for _, e := range c.events {
		if !in[e.Row.Slot()] {
			t.Errorf("event of unsubscribed slot %d (key %q)", e.Row.Slot(), e.Row.Key)
		}
		seen[e.Row.Key]++
	}
	for _, r := range inRows {
		if want := map[bool]int{true: 2, false: 1}[r.Key == marker.Key]; seen[r.Key] != want {
			t.Errorf("key %q: %d events, want %d", r.Key, seen[r.Key], want)
		}
	}
}

func testSetSlots(t *testing.T, h Harness) {
	st := newStore(t, h, Options{})
	rows := upsert(t, st, makeRows("setslots", 300))
	first := []int{}
	second := []int{}
	for s := range schedule.NumSlots {
		if s < 512 {
			first = append(first, s)
		} else {
			second = append(second, s)
		}
	}
	sub := subscribe(t, st, first)
	c := collect(t, sub)
	if err := sub.SetSlots(ctxT(t), second); err != nil {
		t.Fatalf("set slots: %v", err)
	}
	inSecond := setOf(second)
	inRows, outRows := split(rows, inSecond)
	touched := append(append([]schedule.Row(nil), outRows...), inRows...)
	for i := range touched {
		touched[i].Route = "touched"
	}
	upsert(t, st, touched)
	c.waitFor(t, "events of the new slots", func(c *collector) bool {
		n := 0
		for _, e := range c.events {
			if e.Row.Route == "touched" {
				n++
			}
		}
		return n >= len(inRows)
	})
	c.mu.Lock()
	for _, e := range c.events {
		if !inSecond[e.Row.Slot()] {
			t.Errorf("event of slot %d after SetSlots moved away from it", e.Row.Slot())
		}
	}
	c.mu.Unlock()
	if err := sub.SetSlots(ctxT(t), []int{-1}); err == nil {
		t.Errorf("SetSlots with slot -1: no error")
	}
}

func testBulkEvents(t *testing.T, h Harness) {
	st := newStore(t, h, Options{})
	sub := subscribe(t, st, schedule.AllSlots().Slots())
	c := collect(t, sub)
	rows := makeRows("bulk", h.BulkRows)
	upsert(t, st, rows)
	c.waitFor(t, fmt.Sprintf("%d events", h.BulkRows), func(c *collector) bool { return len(c.events) >= h.BulkRows })
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.events) != h.BulkRows {
		t.Errorf("%d events, want %d", len(c.events), h.BulkRows)
	}
	seen := make(map[string]bool, h.BulkRows)
	for _, e := range c.events {
		if seen[e.Row.Key] {
			t.Fatalf("key %q delivered twice", e.Row.Key)
		}
		seen[e.Row.Key] = true
	}
	for _, r := range rows {
		if !seen[r.Key] {
			t.Fatalf("no event for %q", r.Key)
		}
	}
	for _, b := range c.batches {
		if b.Kind != store.KindEvents {
			t.Errorf("unexpected %v batch", b.Kind)
		}
	}
}

func testGap(t *testing.T, h Harness) {
	st := newStore(t, h, Options{})
	sub := subscribe(t, st, schedule.AllSlots().Slots())
	c := collect(t, sub)
	before := Row("gap/before", base)
	upsert(t, st, []schedule.Row{before})
	c.waitFor(t, "the event before the break", c.hasKey(before.Key))
	h.BreakSubscriptions(t, st)
	kinds := func(c *collector) []store.BatchKind {
		var ks []store.BatchKind
		for _, b := range c.batches {
			if b.Kind != store.KindEvents {
				ks = append(ks, b.Kind)
			}
		}
		return ks
	}
	c.waitFor(t, "gap then resumed", func(c *collector) bool { return len(kinds(c)) >= 2 })
	c.mu.Lock()
	ks := kinds(c)
	var gapErr error
	for _, b := range c.batches {
		if b.Kind == store.KindGap {
			gapErr = b.Err
			break
		}
	}
	c.mu.Unlock()
	if len(ks) != 2 || ks[0] != store.KindGap || ks[1] != store.KindResumed {
		t.Fatalf("signals %v, want [gap resumed]", ks)
	}
	if gapErr == nil {
		t.Errorf("gap without a cause")
	}
	after := Row("gap/after", base)
	upsert(t, st, []schedule.Row{after})
	c.waitFor(t, "an event after resuming", c.hasKey(after.Key))
	// SetSlots still works on the new connection.
	if err := sub.SetSlots(ctxT(t), []int{1, 2, 3}); err != nil {
		t.Fatalf("set slots after resuming: %v", err)
	}
}

func testSubscriptionClose(t *testing.T, h Harness) {
	st := newStore(t, h, Options{})
	sub, err := st.Subscribe(ctxT(t), []int{0})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := sub.Next(context.Background())
		errc <- err
	}()
	if err := sub.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, store.ErrClosed) {
			t.Errorf("Next after Close: %v, want ErrClosed", err)
		}
	case <-time.After(timeout):
		t.Fatal("Next still blocked after Close")
	}
	if err := sub.SetSlots(ctxT(t), []int{1}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("SetSlots after Close: %v, want ErrClosed", err)
	}
	// A subscription ends with the context it was made with.
	ctx, cancel := context.WithCancel(context.Background())
	sub2, err := st.Subscribe(ctx, []int{0})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	nctx := ctxT(t)
	if _, err := sub2.Next(nctx); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Next after the subscribe context ended: %v, want ErrClosed", err)
	}
}

func testCompleteResults(t *testing.T, h Harness) {
	st := newStore(t, h, Options{})
	rows := makeRows("complete", 8)
	for i := range rows {
		rows[i].Urgent = true
	}
	in := upsert(t, st, rows)
	ctx := ctxT(t)
	due := base.Add(time.Hour + 789*time.Microsecond)
	items := []store.Completion{
		{Key: in[0].Key, Due: due},
		{Key: "https://example.com/complete/missing", Due: due},
		{Key: in[1].Key, Due: due},
		{Key: in[0].Key, Due: due.Add(time.Hour)}, // the same key again: applied after the first
	}
	res, err := st.Complete(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(items) {
		t.Fatalf("%d results for %d items", len(res), len(items))
	}
	if res[1].Found {
		t.Errorf("missing key reported found: %+v", res[1])
	}
	for _, i := range []int{0, 2, 3} {
		r := res[i]
		if !r.Found || r.Row.Key != items[i].Key || r.Row.Urgent || !r.Row.HasDue || !r.Row.Due.Equal(items[i].Due) {
			t.Errorf("result %d: %+v; want found, due %v, not urgent", i, r, items[i].Due)
		}
	}
	if res[3].Row.Rev <= res[0].Row.Rev || res[0].Row.Rev <= in[0].Rev {
		t.Errorf("revs: upsert %d, first completion %d, second %d; want increasing", in[0].Rev, res[0].Row.Rev, res[3].Row.Rev)
	}
	if d := sameFields(res[2].Row, schedule.Row{Key: in[1].Key, Due: due, HasDue: true, Cadence: in[1].Cadence,
		Route: in[1].Route, Source: in[1].Source}); d != "" {
		t.Errorf("result 2: %s", d)
	}
	rec, err := walk(t, st, schedule.AllSlots().Slots(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := rec.rows[in[0].Key]; !got.Due.Equal(due.Add(time.Hour)) || got.Rev != res[3].Row.Rev {
		t.Errorf("stored row after two completions: %+v", got)
	}
	if _, ok := rec.rows[items[1].Key]; ok {
		t.Errorf("completing a missing key created it")
	}
	if res, err := st.Complete(ctx, nil); err != nil || len(res) != 0 {
		t.Errorf("empty completion: %v, %v", res, err)
	}
}

// completeAll completes items, failing the test unless every item has a result.
func completeAll(t *testing.T, st store.Store, items ...store.Completion) []store.CompleteResult {
	t.Helper()
	res, err := st.Complete(ctxT(t), items)
	if err != nil || len(res) != len(items) {
		t.Fatalf("complete %+v: %+v, %v", items, res, err)
	}
	return res
}

// testCompleteChecksRev: a completion with a Rev writes only while the row is at that rev; a row
// a producer changed since is left as the producer wrote it and reported Changed, with the row
// as stored; Rev 0 writes whatever the rev.
func testCompleteChecksRev(t *testing.T, h Harness) {
	st := newStore(t, h, Options{})
	in := upsert(t, st, makeRows("revcheck", 3))
	due := base.Add(2 * time.Hour)
	// the row as leased: written
	res := completeAll(t, st, store.Completion{Key: in[0].Key, Due: due, Rev: in[0].Rev})
	if !res[0].Found || res[0].Changed || !res[0].Row.Due.Equal(due) || res[0].Row.Rev <= in[0].Rev {
		t.Fatalf("completion at the current rev: %+v", res[0])
	}
	// a producer sets urgent and moves the due time earlier while the row is leased
	changed := in[1]
	changed.Urgent, changed.Due = true, base.Add(-3*time.Hour)
	now := upsert(t, st, []schedule.Row{changed})[0]
	res = completeAll(t, st,
		store.Completion{Key: in[1].Key, Due: due, Rev: in[1].Rev},                // the producer's change wins
		store.Completion{Key: in[0].Key, Due: due.Add(time.Hour), Rev: in[0].Rev}, // completed already: the rev moved
		store.Completion{Key: "https://example.com/revcheck/missing", Due: due, Rev: 7},
		store.Completion{Key: in[2].Key, Due: due, Rev: in[2].Rev},
		store.Completion{Key: in[2].Key, Due: due.Add(time.Hour), Rev: in[2].Rev}, // the same lease twice
	)
	if r := res[0]; !r.Found || !r.Changed || r.Row != now {
		t.Errorf("completion of a row changed since: %+v, want Changed with the row as stored %+v", r, now)
	}
	if r := res[1]; !r.Found || !r.Changed || !r.Row.Due.Equal(due) {
		t.Errorf("second completion at an old rev: %+v, want Changed with the first completion's row", r)
	}
	if r := res[2]; r.Found || r.Changed {
		t.Errorf("missing key: %+v", r)
	}
	if r := res[3]; !r.Found || r.Changed || !r.Row.Due.Equal(due) {
		t.Errorf("first of the same lease twice: %+v, want written", r)
	}
	if r := res[4]; !r.Found || !r.Changed || !r.Row.Due.Equal(due) {
		t.Errorf("second of the same lease twice: %+v, want Changed", r)
	}
	rec, err := walk(t, st, schedule.AllSlots().Slots(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := rec.rows[in[1].Key]; got != now {
		t.Errorf("stored row after a refused completion: %+v, want the producer's %+v", got, now)
	}
	// Rev 0: written whatever the rev
	res = completeAll(t, st, store.Completion{Key: in[1].Key, Due: due})
	if r := res[0]; !r.Found || r.Changed || r.Row.Urgent || !r.Row.Due.Equal(due) {
		t.Errorf("unchecked completion: %+v", r)
	}
}

// testCompleteKnown: a completion whose values at its Rev are Known returns exactly the row as
// stored — the due time to the microsecond, the key's hash, the new rev, the known values — as one
// without does; a row changed since is reported Changed with the row as stored, whatever the
// values said; Known and unknown items mix in one call; Known without a Rev is refused.
func testCompleteKnown(t *testing.T, h Harness) {
	st := newStore(t, h, Options{})
	in := upsert(t, st, makeRows("known", 8))
	ctx := ctxT(t)
	due := base.Add(3*time.Hour + 123456789*time.Nanosecond) // stored to the microsecond
	known := func(r schedule.Row, due time.Time) store.Completion {
		return store.Completion{Key: r.Key, Due: due, Rev: r.Rev, Known: true, Cadence: r.Cadence, Route: r.Route, Source: r.Source}
	}
	for _, bad := range []store.Completion{
		{Key: in[0].Key, Due: due, Known: true, Cadence: in[0].Cadence, Route: in[0].Route, Source: in[0].Source}, // no Rev
		{Key: in[0].Key, Due: due, Rev: in[0].Rev, Known: true, Route: in[0].Route, Source: in[0].Source},         // no cadence
		{Key: in[0].Key, Due: due, Rev: in[0].Rev, Known: true, Cadence: time.Hour, Source: 7},                    // no such source
	} {
		if _, err := st.Complete(ctx, []store.Completion{bad}); !errors.As(err, new(*store.ValidationError)) {
			t.Errorf("Known %+v: %v, want a validation error", bad, err)
		}
	}
	changed := in[5]
	changed.Route, changed.Cadence = "moved", 2*time.Hour
	now := upsert(t, st, []schedule.Row{changed})[0]
	// every item known
	items := []store.Completion{
		known(in[0], due), known(in[1], due), known(in[2], due),
		known(in[3], due.Add(time.Minute)),
		known(in[5], due),                // changed by a producer since: its values are not the row's
		known(in[1], due.Add(time.Hour)), // the same version twice: the second finds the rev moved
		known(schedule.Row{Key: "https://example.com/known/missing", Rev: 9, Cadence: time.Hour, Route: "product"}, due),
	}
	res := completeAll(t, st, items...)
	// known and not, in one call
	items = append(items, known(in[6], due), store.Completion{Key: in[4].Key, Due: due, Rev: in[4].Rev})
	res = append(res, completeAll(t, st, items[7:]...)...)
	rec, err := walk(t, st, schedule.AllSlots().Slots(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// the written items, and the rows they were of
	for i, was := range map[int]schedule.Row{0: in[0], 1: in[1], 2: in[2], 3: in[3], 7: in[6], 8: in[4]} {
		r := res[i]
		if !r.Found || r.Changed {
			t.Errorf("item %d: %+v, want written", i, r)
			continue
		}
		if stored := rec.rows[items[i].Key]; r.Row != stored {
			t.Errorf("item %d: the result %+v is not the row as stored %+v", i, r.Row, stored)
		}
		if r.Row.Urgent || !r.Row.Due.Equal(items[i].Due.Truncate(time.Microsecond)) || r.Row.Rev <= was.Rev {
			t.Errorf("item %d: %+v, want due %v, not urgent, a rev above %d", i, r.Row, items[i].Due, was.Rev)
		}
	}
	if r := res[4]; !r.Found || !r.Changed || r.Row != now {
		t.Errorf("known values of a version since changed: %+v, want Changed with the row as stored %+v", r, now)
	}
	if r := res[5]; !r.Found || !r.Changed || r.Row != res[1].Row {
		t.Errorf("the same version completed twice: %+v, want Changed with the first completion's row %+v", r, res[1].Row)
	}
	if r := res[6]; r.Found || r.Changed {
		t.Errorf("missing key: %+v", r)
	}
}

func testCompleteConcurrent(t *testing.T, h Harness) {
	st := newStore(t, h, Options{})
	rows := upsert(t, st, makeRows("concurrent", 400))
	ctx := ctxT(t)
	const workers = 40
	var wg sync.WaitGroup
	results := make([][]store.CompleteResult, workers)
	errs := make([]error, workers)
	start := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var items []store.Completion
			for i := w; i < len(rows); i += workers {
				items = append(items, store.Completion{Key: rows[i].Key, Due: base.Add(time.Duration(i) * time.Minute)})
			}
			for j := 0; j < len(items); j += 2 { // several calls per worker, 2 items each
				res, err := st.Complete(ctx, items[j:min(j+2, len(items))])
				if err != nil {
					errs[w] = err
					return
				}
				results[w] = append(results[w], res...)
			}
		}()
	}
	close(start)
	wg.Wait()
	byKey := map[string]store.CompleteResult{}
	for w := range workers {
		if errs[w] != nil {
			t.Fatalf("worker %d: %v", w, errs[w])
		}
		for _, r := range results[w] {
			byKey[r.Row.Key] = r
		}
	}
	for i, r := range rows {
		got, ok := byKey[r.Key]
		if !ok || !got.Found || !got.Row.Due.Equal(base.Add(time.Duration(i)*time.Minute)) || got.Row.Rev <= r.Rev || got.Row.KeyHash != r.KeyHash {
			t.Errorf("key %q: result %+v", r.Key, got)
		}
	}
	rec, err := walk(t, st, schedule.AllSlots().Slots(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rows {
		if got := rec.rows[r.Key]; !got.Due.Equal(base.Add(time.Duration(i)*time.Minute)) || got.Rev != byKey[r.Key].Row.Rev {
			t.Errorf("stored %q: %+v", r.Key, got)
		}
	}
}

func testDelete(t *testing.T, h Harness) {
	st := newStore(t, h, Options{})
	rows := upsert(t, st, makeRows("delete", 5))
	res, err := st.Delete(ctxT(t), []string{rows[1].Key, "https://example.com/delete/none", rows[3].Key})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 || !res[0].Found || res[1].Found || !res[2].Found {
		t.Fatalf("results %+v", res)
	}
	if res[0].Key != rows[1].Key || res[0].KeyHash != rows[1].KeyHash || res[0].Rev <= rows[1].Rev {
		t.Errorf("result 0: %+v", res[0])
	}
	rec, err := walk(t, st, schedule.AllSlots().Slots(), nil)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, 0, len(rec.rows))
	for k := range rec.rows {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	want := []string{rows[0].Key, rows[2].Key, rows[4].Key}
	sort.Strings(want)
	if fmt.Sprint(keys) != fmt.Sprint(want) {
		t.Errorf("after delete: %v, want %v", keys, want)
	}
}

func testRejectBadInput(t *testing.T, h Harness) {
	st := newStore(t, h, Options{})
	ctx := ctxT(t)
	good := Row("bad/good", base)
	long := Row("bad/"+strings.Repeat("x", schedule.MaxKeyBytes), base)
	zero := Row("bad/zero", base)
	zero.Cadence = 0
	neg := Row("bad/neg", base)
	neg.Cadence = -time.Second
	frac := Row("bad/frac", base)
	frac.Cadence = time.Millisecond + time.Microsecond
	src := Row("bad/source", base)
	src.Source = schedule.Source(7)
	route := Row("bad/route", base)
	route.Route = strings.Repeat("r", schedule.MaxRouteBytes+1)
	empty := Row("", base)
	empty.Key = ""
	maxKey := Row("", base)
	maxKey.Key = "https://example.com/" + strings.Repeat("m", schedule.MaxKeyBytes-len("https://example.com/"))

	cases := []struct {
		name    string
		rows    []schedule.Row
		badIdxs []int
	}{
		{"over-long key", []schedule.Row{long}, []int{0}},
		{"zero cadence", []schedule.Row{zero}, []int{0}},
		{"negative cadence", []schedule.Row{neg}, []int{0}},
		{"sub-millisecond cadence", []schedule.Row{frac}, []int{0}},
		{"unknown source", []schedule.Row{src}, []int{0}},
		{"over-long route", []schedule.Row{route}, []int{0}},
		{"empty key", []schedule.Row{empty}, []int{0}},
		{"duplicate key", []schedule.Row{good, good}, []int{1}},
		{"one bad row among good ones", []schedule.Row{good, Row("bad/good2", base), zero, Row("bad/good3", base), long}, []int{2, 4}},
	}
	for _, tc := range cases {
		_, err := st.Upsert(ctx, tc.rows)
		var ve *store.ValidationError
		if !errors.As(err, &ve) {
			t.Errorf("%s: error %v, want a *store.ValidationError", tc.name, err)
			continue
		}
		var idxs []int
		for _, p := range ve.Problems {
			idxs = append(idxs, p.Index)
			if p.Reason == "" {
				t.Errorf("%s: problem without a reason", tc.name)
			}
		}
		if fmt.Sprint(idxs) != fmt.Sprint(tc.badIdxs) {
			t.Errorf("%s: problems name items %v, want %v (%v)", tc.name, idxs, tc.badIdxs, err)
		}
	}
	if _, err := st.Complete(ctx, []store.Completion{{Key: good.Key, Due: base}, {Key: "", Due: base}}); err == nil {
		t.Errorf("complete with an empty key: no error")
	}
	if _, err := st.Complete(ctx, []store.Completion{{Key: good.Key, Due: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}}); err == nil {
		t.Errorf("complete with a due time in year 10000: no error")
	}
	rec, err := walk(t, st, schedule.AllSlots().Slots(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.rows) != 0 {
		t.Fatalf("refused writes wrote %d rows", len(rec.rows))
	}
	// The longest valid key is accepted.
	if got := upsert(t, st, []schedule.Row{maxKey}); len(got[0].Key) != schedule.MaxKeyBytes {
		t.Errorf("max-length key came back with %d bytes", len(got[0].Key))
	}
}

func testStoreClose(t *testing.T, h Harness) {
	st := h.New(t, Options{})
	sub, err := st.Subscribe(ctxT(t), schedule.AllSlots().Slots())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	ctx := ctxT(t)
	if _, err := sub.Next(ctx); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Next after the store closed: %v, want ErrClosed", err)
	}
	if _, err := st.Upsert(ctx, []schedule.Row{Row("closed", base)}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Upsert after Close: %v, want ErrClosed", err)
	}
	if _, err := st.Complete(ctx, []store.Completion{{Key: "https://example.com/closed", Due: base}}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Complete after Close: %v, want ErrClosed", err)
	}
	if _, err := st.Delete(ctx, []string{"https://example.com/closed"}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Delete after Close: %v, want ErrClosed", err)
	}
	if _, err := st.Walk(ctx, schedule.AllSlots().Slots(), func(store.WalkItem) error { return nil }); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Walk after Close: %v, want ErrClosed", err)
	}
	if _, err := st.Subscribe(ctx, []int{0}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Subscribe after Close: %v, want ErrClosed", err)
	}
	if err := st.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// ExpectOverflow reads sub after a flood of events written while nobody read it, to a queue of
// at most max events: at most max events, then one gap whose cause wraps overflow, then resumed;
// then it writes a row with write and expects its event, with no further gap. It returns the
// number of events delivered before the gap.
func ExpectOverflow(t *testing.T, sub store.Subscription, max int, overflow error, write func() schedule.Row) int {
	t.Helper()
	ctx := ctxT(t)
	events := 0
	var kinds []store.BatchKind
	for len(kinds) < 2 {
		b, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("after %d events: %v", events, err)
		}
		switch b.Kind {
		case store.KindEvents:
			if len(kinds) > 0 {
				t.Fatalf("%d events between the gap and resumed", len(b.Events))
			}
			events += len(b.Events)
		case store.KindGap:
			if !errors.Is(b.Err, overflow) {
				t.Fatalf("gap cause %v, want %v", b.Err, overflow)
			}
			kinds = append(kinds, b.Kind)
		default:
			kinds = append(kinds, b.Kind)
		}
	}
	if kinds[0] != store.KindGap || kinds[1] != store.KindResumed || events > max {
		t.Fatalf("%d events then %v; want at most %d events, then a gap and resumed", events, kinds, max)
	}
	want := write()
	for {
		b, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if b.Kind != store.KindEvents {
			t.Fatalf("%v after resumed, want the event of the next write", b.Kind)
		}
		for _, e := range b.Events {
			if e.Row.Key == want.Key {
				return events
			}
		}
	}
}

// testSessions: a shard's first session finds none before it; each later one finds the one before
// it, ended cleanly (with its leases' end, or none) or not; an end by a session that is no longer
// the latest changes nothing.
func testSessions(t *testing.T, h Harness) {
	st := h.New(t, Options{})
	ss, ok := st.(store.Sessions)
	if !ok {
		t.Fatalf("%T does not record keeper sessions (store.Sessions)", st)
	}
	ctx := ctxT(t)
	before := time.Now().Add(-time.Minute)
	if _, found, err := ss.BeginSession(ctx, store.Session{Shard: "web-shard-0", Instance: "i1", Pod: "p1"}); err != nil || found {
		t.Fatalf("first session: found %v, %v", found, err)
	}
	// another shard's sessions are its own
	if _, found, err := ss.BeginSession(ctx, store.Session{Shard: "web-shard-1", Instance: "j1", Pod: "q1"}); err != nil || found {
		t.Fatalf("another shard's first session: found %v, %v", found, err)
	}
	prev, found, err := ss.BeginSession(ctx, store.Session{Shard: "web-shard-0", Instance: "i2", Pod: "p1"})
	if err != nil || !found || prev.Instance != "i1" || prev.Pod != "p1" || !prev.EndedAt.IsZero() || prev.StartedAt.Before(before) {
		t.Fatalf("after a process that died: %+v found %v, %v", prev, found, err)
	}
	if ok, err := ss.EndSession(ctx, "web-shard-0", "i1", time.Time{}); err != nil || ok {
		t.Fatalf("ending a session that is not the latest: %v %v", ok, err)
	}
	until := time.Now().Add(time.Minute).UTC().Truncate(time.Microsecond)
	if ok, err := ss.EndSession(ctx, "web-shard-0", "i2", until); err != nil || !ok {
		t.Fatalf("ending the latest session: %v %v", ok, err)
	}
	prev, found, err = ss.BeginSession(ctx, store.Session{Shard: "web-shard-0", Instance: "i3", Pod: "p2"})
	if err != nil || !found || prev.Instance != "i2" || prev.EndedAt.IsZero() || !prev.LeasesUntil.Equal(until) {
		t.Fatalf("after a clean end with leases until %v: %+v found %v, %v", until, prev, found, err)
	}
	if ok, err := ss.EndSession(ctx, "web-shard-0", "i3", time.Time{}); err != nil || !ok {
		t.Fatalf("ending without leases: %v %v", ok, err)
	}
	prev, _, err = ss.BeginSession(ctx, store.Session{Shard: "web-shard-0", Instance: "i4", Pod: "p2"})
	if err != nil || prev.EndedAt.IsZero() || !prev.LeasesUntil.IsZero() {
		t.Fatalf("after a clean end without leases: %+v, %v", prev, err)
	}
}

// testReadRow: a row read by its key is the row as stored (unscheduled ones included); a key no
// row has is not found, with the hash a row of that key then gets; a deleted row is gone; a bad
// key is refused.
func testReadRow(t *testing.T, h Harness) {
	st := h.New(t, Options{})
	rr, ok := st.(store.RowReader)
	if !ok {
		t.Fatalf("%T does not read rows by key (store.RowReader)", st)
	}
	ctx := ctxT(t)
	rows := upsert(t, st, makeRows("read", 4))
	for _, want := range rows {
		got, found, err := rr.ReadRow(ctx, want.Key)
		if err != nil || !found {
			t.Fatalf("%s: found %v, %v", want.Key, found, err)
		}
		if diff := sameFields(got, want); diff != "" || got.KeyHash != want.KeyHash || got.Rev != want.Rev {
			t.Errorf("%s: read %+v, stored %+v %s", want.Key, got, want, diff)
		}
	}
	missing := Row("read/missing", base)
	got, found, err := rr.ReadRow(ctx, missing.Key)
	if err != nil || found || got.Key != missing.Key {
		t.Fatalf("a missing key: %+v found %v, %v", got, found, err)
	}
	stored := upsert(t, st, []schedule.Row{missing})
	if got.KeyHash != stored[0].KeyHash {
		t.Errorf("a missing key's hash %d, the hash its row got %d", got.KeyHash, stored[0].KeyHash)
	}
	if _, err := st.Delete(ctx, []string{rows[0].Key}); err != nil {
		t.Fatal(err)
	}
	if got, found, err := rr.ReadRow(ctx, rows[0].Key); err != nil || found || got.KeyHash != rows[0].KeyHash {
		t.Errorf("a deleted row: %+v found %v, %v", got, found, err)
	}
	for _, bad := range []string{"", strings.Repeat("x", schedule.MaxKeyBytes+1), "a\x00b"} {
		if _, _, err := rr.ReadRow(ctx, bad); err == nil {
			t.Errorf("key %.20q: read without an error", bad)
		}
	}
}
