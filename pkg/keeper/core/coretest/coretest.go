// Package coretest builds keeper cores for benchmarks: rows with 64-byte keys spread over every
// slot, four cadences and both sources (eight groups), loaded as a shard loads them. The keeper
// core's benchmarks and the shard's use the same cores, so their figures compare.
package coretest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/renderqueue/renderqueue/pkg/keeper/core"
	"github.com/renderqueue/renderqueue/pkg/keeper/core/policy"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// The scaling benchmarks run at 1,000,000 rows, and also at the sizes listed in BENCH_ROWS
// (e.g. BENCH_ROWS=10M, or BENCH_ROWS=1M,10M,20M): building a 10M-row core takes about a minute
// on a 2-core machine, so those runs are opt-in (see docs/benchmarks.md).
const RowsEnv = "BENCH_ROWS"

// Sizes returns the row counts to run: 1M plus those of BENCH_ROWS.
func Sizes(tb testing.TB) []int {
	tb.Helper()
	sizes := []int{1_000_000}
	for _, f := range strings.FieldsFunc(os.Getenv(RowsEnv), func(r rune) bool { return r == ',' || r == ' ' }) {
		mult := 1
		switch {
		case strings.HasSuffix(f, "M"):
			mult, f = 1_000_000, strings.TrimSuffix(f, "M")
		case strings.HasSuffix(f, "k"):
			mult, f = 1_000, strings.TrimSuffix(f, "k")
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 || n*mult > core.MaxRows {
			tb.Fatalf("%s: %q is not a row count like 10M (at most %d)", RowsEnv, f, core.MaxRows)
		}
		if !slices.Contains(sizes, n*mult) {
			sizes = append(sizes, n*mult)
		}
	}
	return sizes
}

// SizeName names a row count as the sub-benchmarks do: rows=1M, rows=10M, rows=500k.
func SizeName(n int) string {
	switch {
	case n%1_000_000 == 0:
		return fmt.Sprintf("rows=%dM", n/1_000_000)
	case n%1_000 == 0:
		return fmt.Sprintf("rows=%dk", n/1_000)
	}
	return fmt.Sprintf("rows=%d", n)
}

// Key returns a 64-byte key.
func Key(i int) string {
	return fmt.Sprintf("https://shop.example.com/product/%031d", i)
}

// Hash is row i's ownership hash: fixed per key, spread over every slot.
func Hash(i int) int64 {
	z := uint64(i)*0x9e3779b97f4a7c15 + 1
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return int64(z ^ z>>31)
}

// cadences are 4 cadences × 2 sources = 8 groups.
var cadences = [...]time.Duration{time.Hour, 24 * time.Hour, 96 * time.Hour, 7 * 24 * time.Hour}

// Cadences returns the rows' four cadences (with two sources: eight groups).
func Cadences() []time.Duration { return cadences[:len(cadences):len(cadences)] }

// Row makes row i: due spread over the past cadence (all due at now) or over ±cadence/2.
func Row(rng *rand.Rand, i int, now time.Time, allDue bool) schedule.Row {
	cad := cadences[i%len(cadences)]
	off := time.Duration(rng.Int64N(int64(cad)))
	due := now.Add(-off)
	if !allDue {
		due = now.Add(cad/2 - off)
	}
	return schedule.Row{
		Key:     Key(i),
		KeyHash: Hash(i),
		Due:     due,
		HasDue:  true,
		Cadence: cad,
		Route:   []string{"product", "category", "home"}[i%3],
		Source:  schedule.Source(i / len(cadences) % 2),
		Rev:     int64(i + 1),
	}
}

// Config returns the claim policy of the benchmark cores (the keeper tests' allSlots settings
// have the same).
func Config() policy.Config { return policy.Config{SubmittedBoost: 2, UrgentMaxShare: 0.2} }

// Build returns a core owning every slot and holding n rows built at now (Row), loaded as a shard
// loads them: the index sized first, the trees built at the end.
func Build(tb testing.TB, n int, now time.Time, allDue bool) *core.Core {
	tb.Helper()
	c, err := core.New(Config())
	if err != nil {
		tb.Fatal(err)
	}
	for s := 0; s < schedule.NumSlots; s++ {
		c.SetSlot(s, core.SlotOwned)
	}
	// as a shard loads: the index sized, the trees built at the end
	c.Reserve(n)
	c.BeginBulk()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < n; i++ {
		if o := c.Apply(now, Row(rng, i, now, allDue)); o.Result != core.Held {
			tb.Fatalf("row %d: %v", i, o.Result)
		}
	}
	c.EndBulk()
	return c
}

// LiveHeap returns the live heap after two garbage collections.
func LiveHeap() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// HashOf returns the ownership hash Row gives key (a key of Key).
func HashOf(key string) int64 {
	digits := strings.TrimLeft(key[len("https://shop.example.com/product/"):], "0")
	i := 0
	if digits != "" {
		var err error
		if i, err = strconv.Atoi(digits); err != nil {
			panic(err)
		}
	}
	return Hash(i)
}
