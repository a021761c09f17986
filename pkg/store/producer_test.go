package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/memstore"
)

// rowsOf reads every row of st by key.
func rowsOf(t *testing.T, st store.Store) map[string]schedule.Row {
	t.Helper()
	out := map[string]schedule.Row{}
	_, err := st.Walk(context.Background(), schedule.AllSlots().Slots(), func(it store.WalkItem) error {
		for _, r := range it.Rows {
			out[r.Key] = r
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestUpsertNDJSON(t *testing.T) {
	st := memstore.New(memstore.Options{})
	in := strings.Join([]string{
		`{"key":"https://a.example/1","cadence":"96h","route":"product","source":"submitted","due":"2026-12-01T10:00:00Z"}`,
		`{"key":"https://a.example/2","cadence":"1h","urgent":true,"due":"2026-12-01T09:00:00+01:00"}`,
		``,
		`{"key":"https://a.example/3","cadence":"24h","unscheduled":true}`,
		`{"key":"https://a.example/bad1","cadence":"1x","due":"2026-12-01T10:00:00Z"}`,
		`{"key":"https://a.example/bad2","cadence":"1h"}`,
		`{"key":"https://a.example/bad3","cadence":"1h","due":"2026-12-01T10:00:00Z","unscheduled":true}`,
		`{"key":"https://a.example/bad4","cadence":"1h","due":"2026-12-01T10:00:00Z","colour":"red"}`,
		`{"key":"https://a.example/bad5","cadence":"1h","due":"2026-12-01T10:00:00Z","source":"sitemap"}`,
		`{"key":"` + strings.Repeat("x", 2049) + `","cadence":"1h","due":"2026-12-01T10:00:00Z"}`,
		`{"key":"https://a.example/bad7","cadence":"-1h","due":"2026-12-01T10:00:00Z"}`,
		`not json`,
		`{"key":"https://a.example/1","cadence":"48h","route":"product","due":"2026-12-02T10:00:00Z"}`,
		`{"cadence":"1h","due":"2026-12-01T10:00:00Z"}`,
		`{"key":"https://a.example/4","cadence":"1h","due":"2026-12-01T10:00:00Z"} {"x":1}`,
		`{"key":"https://a.example/5","cadence":"1h30m","due":"2026-12-01T10:00:00Z"}`,
	}, "\n")
	bad := map[int]string{}
	res, err := store.UpsertNDJSON(context.Background(), st, strings.NewReader(in), store.NDJSONOptions{Batch: 2,
		BadLine: func(line int, err error) { bad[line] = err.Error() }})
	if err != nil {
		t.Fatal(err)
	}
	want := store.NDJSONResult{Lines: 16, Blank: 1, Written: 5, Batches: 3, Bad: 10}
	if res != want {
		t.Fatalf("result %+v, want %+v", res, want)
	}
	wantBad := map[int]string{5: "cadence \"1x\"", 6: "neither due nor", 7: "both due and", 8: `unknown field "colour"`, 9: `unknown source "sitemap"`,
		10: "longer than 2048", 11: "not positive", 12: "not a JSON row", 14: "key is missing", 15: "trailing data"}
	for line, msg := range wantBad {
		if !strings.Contains(bad[line], msg) {
			t.Errorf("line %d: %q, want it to say %q", line, bad[line], msg)
		}
	}
	if len(bad) != len(wantBad) {
		t.Errorf("bad lines %v, want %v", bad, wantBad)
	}
	rows := rowsOf(t, st)
	if len(rows) != 4 {
		t.Fatalf("%d rows stored, want 4: %v", len(rows), rows)
	}
	for k := range rows {
		if strings.Contains(k, "bad") || len(k) > 2048 {
			t.Errorf("a bad line was written: %s", k)
		}
	}
	r1 := rows["https://a.example/1"]
	if r1.Cadence != 48*time.Hour || r1.Source != schedule.SourceDiscovered || !r1.Due.Equal(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)) {
		t.Errorf("the later line of a key did not win: %+v", r1)
	}
	if r2 := rows["https://a.example/2"]; !r2.Urgent || !r2.Due.Equal(time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)) {
		t.Errorf("row 2: %+v", r2)
	}
	if r3 := rows["https://a.example/3"]; r3.HasDue {
		t.Errorf("the unscheduled row has a due time: %+v", r3)
	}
}

// closingStore closes the store after a number of upserts, so the next batch fails.
type closingStore struct {
	*memstore.Store
	left int
}

func (c *closingStore) Upsert(ctx context.Context, rows []schedule.Row) ([]schedule.Row, error) {
	if c.left == 0 {
		_ = c.Close()
	}
	c.left--
	return c.Store.Upsert(ctx, rows)
}

func TestUpsertNDJSONFailedBatchWritesNothingOfIt(t *testing.T) {
	st := &closingStore{Store: memstore.New(memstore.Options{}), left: 1}
	var lines []string
	for i := range 7 {
		lines = append(lines, fmt.Sprintf(`{"key":"k%d","cadence":"1h","due":"2026-12-01T10:00:00Z"}`, i))
	}
	res, err := store.UpsertNDJSON(context.Background(), st, strings.NewReader(strings.Join(lines, "\n")+"\n"), store.NDJSONOptions{Batch: 3})
	if !errors.Is(err, store.ErrClosed) || !strings.Contains(err.Error(), "lines 4-6") {
		t.Fatalf("error %v, want the closed store's, naming lines 4-6", err)
	}
	if res.Written != 3 || res.Batches != 1 {
		t.Fatalf("result %+v, want the first batch of 3 written", res)
	}
}

func TestUpsertNDJSONLongLine(t *testing.T) {
	st := memstore.New(memstore.Options{})
	in := `{"key":"k1","cadence":"1h","due":"2026-12-01T10:00:00Z"}` + "\n" + strings.Repeat(" ", 200) + "\n" + `{"key":"k2","cadence":"1h","due":"2026-12-01T10:00:00Z"}`
	var badLines []int
	res, err := store.UpsertNDJSON(context.Background(), st, strings.NewReader(in), store.NDJSONOptions{MaxLineBytes: 100,
		BadLine: func(line int, _ error) { badLines = append(badLines, line) }})
	if err != nil || res.Written != 2 || res.Bad != 1 || len(badLines) != 1 || badLines[0] != 2 {
		t.Fatalf("result %+v, bad lines %v, err %v", res, badLines, err)
	}
}
