package seed

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
)

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestHitSpreadsExactly(t *testing.T) {
	for _, tc := range []struct{ n, k int }{{0, 0}, {1, 0}, {1, 1}, {10, 3}, {1000, 999}, {7, 7}, {200000, 300}} {
		got := 0
		for i := range tc.n {
			if hit(i, tc.n, tc.k) {
				got++
			}
			if b := before(i, tc.n, tc.k); b != got-boolInt(hit(i, tc.n, tc.k)) {
				t.Fatalf("n=%d k=%d: before(%d)=%d, counted %d", tc.n, tc.k, i, b, got)
			}
		}
		if got != tc.k {
			t.Errorf("n=%d k=%d: %d hits", tc.n, tc.k, got)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestMix(t *testing.T) {
	p := Plan{Rows: 100000, Homepages: 300, Overdue: 2000, Urgent: 50, Seed: 7}.Defaults()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	byRoute := map[string]int{}
	kinds := map[Kind]int{}
	submitted, dueOrdinary, ordinary := 0, 0, 0
	keys := map[string]bool{}
	rows := p.AppendRows(nil, 0, p.Rows, now)
	if err := store.ValidateRows(rows); err != nil {
		t.Fatalf("generated rows the store would refuse: %v", err)
	}
	for i, r := range rows {
		byRoute[r.Route]++
		k := p.KindOf(i)
		kinds[k]++
		if keys[r.Key] {
			t.Fatalf("duplicate key %q", r.Key)
		}
		keys[r.Key] = true
		if want := fmt.Sprintf("https://shop.example.com/%s/%d", r.Route, i); r.Key != want {
			t.Fatalf("row %d: key %q, want %q", i, r.Key, want)
		}
		wantCadence := map[string]time.Duration{RouteHome: time.Hour, RouteCategory: 24 * time.Hour, RouteProduct: 96 * time.Hour}[r.Route]
		if r.Cadence != wantCadence || !r.HasDue {
			t.Fatalf("row %d: %+v", i, r)
		}
		if r.Source == schedule.SourceSubmitted {
			submitted++
		}
		if r.Urgent != (k == KindUrgent) {
			t.Fatalf("row %d: urgent %v, kind %v", i, r.Urgent, k)
		}
		lateness := now.Sub(r.Due)
		switch k {
		case KindOverdue:
			if lateness < 0 || lateness > time.Duration(p.OverdueCycles*float64(r.Cadence)) {
				t.Fatalf("overdue row %d due %v (lateness %v)", i, r.Due, lateness)
			}
		case KindUrgent:
			if lateness < 0 || lateness > time.Minute {
				t.Fatalf("urgent row %d due %v", i, r.Due)
			}
		default:
			ordinary++
			lo := -time.Duration((1 - p.DueShare) * float64(r.Cadence))
			hi := time.Duration(p.DueShare * float64(r.Cadence))
			if lateness <= lo-time.Microsecond || lateness > hi+time.Microsecond {
				t.Fatalf("ordinary row %d: lateness %v outside (%v, %v]", i, lateness, lo, hi)
			}
			if lateness >= 0 {
				dueOrdinary++
			}
		}
	}
	if byRoute[RouteHome] != 300 {
		t.Errorf("homepages: %d, want 300", byRoute[RouteHome])
	}
	if want := (100000 - 300) * 30 / 1000; byRoute[RouteCategory] != want {
		t.Errorf("categories: %d, want %d", byRoute[RouteCategory], want)
	}
	if kinds[KindOverdue] != 2000 || kinds[KindUrgent] != 50 {
		t.Errorf("kinds: %v", kinds)
	}
	if math.Abs(float64(submitted)/float64(p.Rows)-0.5) > 0.01 {
		t.Errorf("submitted share %d/%d, want about half", submitted, p.Rows)
	}
	if share := float64(dueOrdinary) / float64(ordinary); math.Abs(share-p.DueShare) > 0.005 {
		t.Errorf("due share of ordinary rows %.4f, want about %.4f", share, p.DueShare)
	}
}

func TestDeterministic(t *testing.T) {
	p := Plan{Rows: 5000, Homepages: 10, Overdue: 100, Urgent: 5, Seed: 42}.Defaults()
	a := p.AppendRows(nil, 0, p.Rows, now)
	// Random access and other batch cuts give the same rows.
	var b []schedule.Row
	for from := 0; from < p.Rows; from += 333 {
		b = p.AppendRows(b, from, min(333, p.Rows-from), now)
	}
	for i := range a {
		if a[i] != b[i] || a[i] != p.Row(i, now) {
			t.Fatalf("row %d differs: %+v vs %+v", i, a[i], b[i])
		}
	}
	p2 := p
	p2.Seed = 43
	same := 0
	for i := range a {
		if r := p2.Row(i, now); r.Due.Equal(a[i].Due) {
			same++
		}
	}
	if same > p.Rows/100 {
		t.Errorf("another seed gave %d identical due times of %d", same, p.Rows)
	}
	p3 := p
	p3.KeyPrefix = "https://other.example.com"
	if p3.Row(0, now).Key == a[0].Key {
		t.Error("key prefix ignored")
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Plan
	}{
		{"negative rows", Plan{Rows: -1}},
		{"too many homepages", Plan{Rows: 5, Homepages: 6}},
		{"too many overdue", Plan{Rows: 5, Overdue: 6}},
		{"urgent beyond non-overdue", Plan{Rows: 5, Overdue: 3, Urgent: 3}},
		{"due share", Plan{Rows: 5, DueShare: 1.5}},
		{"prefix slash", Plan{Rows: 5, KeyPrefix: "https://x/"}},
		{"overdue cycles", Plan{Rows: 5, OverdueCycles: -1}},
	} {
		if err := tc.p.Defaults().Validate(); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	if err := (Plan{Rows: 5, Overdue: 3, Urgent: 2}).Defaults().Validate(); err != nil {
		t.Errorf("valid plan refused: %v", err)
	}
}

type fakeUpserter struct {
	mu      sync.Mutex
	batches [][]schedule.Row
	failAt  int // fail the call with this many earlier calls (0 = never)
	calls   int
}

func (f *fakeUpserter) Upsert(ctx context.Context, rows []schedule.Row) ([]schedule.Row, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.failAt > 0 && f.calls > f.failAt {
		return nil, errors.New("boom")
	}
	if err := store.ValidateRows(rows); err != nil {
		return nil, err
	}
	f.batches = append(f.batches, append([]schedule.Row(nil), rows...))
	return rows, nil
}

func TestWrite(t *testing.T) {
	p := Plan{Rows: 12345, Homepages: 20, Overdue: 500, Urgent: 7, Seed: 1}
	f := &fakeUpserter{}
	var reports []Progress
	sum, err := Write(context.Background(), f, p, WriteOptions{Batch: 1000, Parallel: 3, Now: now,
		Progress: func(pr Progress) { reports = append(reports, pr) }})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Written != p.Rows || sum.Total != p.Rows {
		t.Fatalf("summary %+v", sum)
	}
	if len(f.batches) != 13 || len(reports) != 13 || reports[12].Written != p.Rows {
		t.Fatalf("%d batches, %d reports, last %+v", len(f.batches), len(reports), reports[len(reports)-1])
	}
	seen := map[string]bool{}
	want := p.Defaults()
	dueNow := 0
	for _, b := range f.batches {
		if len(b) > 1000 {
			t.Fatalf("batch of %d rows", len(b))
		}
		for _, r := range b {
			seen[r.Key] = true
		}
	}
	for i := range p.Rows {
		r := want.Row(i, now)
		if !seen[r.Key] {
			t.Fatalf("row %d (%s) not written", i, r.Key)
		}
		if !r.Due.After(now) {
			dueNow++
		}
	}
	if len(seen) != p.Rows || sum.DueNow != dueNow || sum.Urgent != 7 || sum.ByRoute[RouteHome] != 20 {
		t.Fatalf("%d keys, summary %+v (want due %d)", len(seen), sum, dueNow)
	}
}

func TestWriteStopsOnError(t *testing.T) {
	f := &fakeUpserter{failAt: 2}
	sum, err := Write(context.Background(), f, Plan{Rows: 10000}, WriteOptions{Batch: 100, Parallel: 1, Now: now})
	if err == nil || sum.Written != 200 || f.calls != 3 {
		t.Fatalf("err %v, written %d, calls %d", err, sum.Written, f.calls)
	}
}

func TestWriteStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	f := &fakeUpserter{}
	sum, err := Write(ctx, f, Plan{Rows: 10000}, WriteOptions{Batch: 100, Parallel: 1, Now: now,
		Progress: func(p Progress) {
			if p.Written == 300 {
				cancel()
			}
		}})
	if !errors.Is(err, context.Canceled) || sum.Written > 400 {
		t.Fatalf("err %v, written %d", err, sum.Written)
	}
}

func TestWriteRefusesBadPlan(t *testing.T) {
	if _, err := Write(context.Background(), &fakeUpserter{}, Plan{Rows: 3, Homepages: 4}, WriteOptions{Now: now}); err == nil {
		t.Fatal("no error")
	}
	if _, err := Write(context.Background(), &fakeUpserter{}, Plan{Rows: 3}, WriteOptions{}); err == nil {
		t.Fatal("no error without Now")
	}
}
