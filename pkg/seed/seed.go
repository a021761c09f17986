// Package seed generates synthetic schedule rows with a realistic prerender mix and writes them
// through a store's batch Upsert (`renderqueue seed`).
//
// Generation is pure and random-access: Plan.Row(i, now) depends only on the plan, the row's index
// and now, so the same plan and seed give the same rows, in any order and in any batch size. The
// mix is exact, not sampled: Plan.Homepages rows render hourly (route "home"), about 3% of the
// others daily (route "category") and the rest every 96 hours (route "product"); the Overdue rows
// and the Urgent rows are spread evenly over the index range. Each row is submitted or discovered
// with even odds (seeded).
//
// Due times model a fleet in steady state around now: an ordinary row is due uniformly within
// [now − DueShare·cadence, now + (1 − DueShare)·cadence), so a DueShare of every class is already
// due; an overdue (backlog) row is due uniformly within [now − OverdueCycles·cadence, now); an
// urgent row is marked urgent and due within the minute before now.
//
// Writing (Write) cuts the index range into batches, generates each batch and upserts it, with a
// few batches in flight at once, and reports progress after every batch.
package seed

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// The cadences of the three row classes.
const (
	HomeCadence     = time.Hour
	CategoryCadence = 24 * time.Hour
	ProductCadence  = 96 * time.Hour
)

// The routes of the three row classes.
const (
	RouteHome     = "home"
	RouteCategory = "category"
	RouteProduct  = "product"
)

// DefaultCategoryPermille is the share of non-homepage rows that render daily, in permille.
const DefaultCategoryPermille = 30

// urgentSpread is how far before now urgent rows are due.
const urgentSpread = time.Minute

// Plan describes a synthetic data set. The zero value of every optional field gives its default
// (see Defaults); Validate reports nonsense.
type Plan struct {
	// Rows is how many rows to generate.
	Rows int
	// Homepages is how many of them are 1 h homepages.
	Homepages int
	// CategoryPermille is the share (permille) of the non-homepage rows that render every 24 h;
	// the rest render every 96 h. Default DefaultCategoryPermille.
	CategoryPermille int
	// Overdue is how many rows form a backlog, due within the OverdueCycles cadences before now.
	Overdue int
	// OverdueCycles is how many cadences back the backlog reaches. Default 2.
	OverdueCycles float64
	// Urgent is how many rows (none of them backlog rows) are marked urgent and due now.
	Urgent int
	// DueShare is the share of each ordinary row's cadence that lies before now, i.e. about the
	// share of ordinary rows already due. Default 0.02; must be within [0, 1].
	DueShare float64
	// KeyPrefix starts every key (scheme and host, optionally a path); keys are
	// KeyPrefix + "/" + route + "/" + index. Default "https://shop.example.com".
	KeyPrefix string
	// Seed makes the source mix and the due times reproducible.
	Seed uint64
}

// Default values of Plan's optional fields.
const (
	DefaultKeyPrefix     = "https://shop.example.com"
	DefaultOverdueCycles = 2
	DefaultDueShare      = 0.02
)

// Defaults returns p with its optional fields defaulted.
func (p Plan) Defaults() Plan {
	if p.CategoryPermille == 0 {
		p.CategoryPermille = DefaultCategoryPermille
	}
	if p.OverdueCycles == 0 {
		p.OverdueCycles = DefaultOverdueCycles
	}
	if p.DueShare == 0 {
		p.DueShare = DefaultDueShare
	}
	if p.KeyPrefix == "" {
		p.KeyPrefix = DefaultKeyPrefix
	}
	return p
}

// Validate reports every problem of a (defaulted) plan.
func (p Plan) Validate() error {
	var errs []error
	if p.Rows < 0 {
		errs = append(errs, fmt.Errorf("rows %d is negative", p.Rows))
	}
	if p.Homepages < 0 || p.Homepages > p.Rows {
		errs = append(errs, fmt.Errorf("homepages %d is not within [0, rows=%d]", p.Homepages, p.Rows))
	}
	if p.CategoryPermille < 0 || p.CategoryPermille > 1000 {
		errs = append(errs, fmt.Errorf("category share %d‰ is not within [0, 1000]", p.CategoryPermille))
	}
	if p.Overdue < 0 || p.Overdue > p.Rows {
		errs = append(errs, fmt.Errorf("overdue %d is not within [0, rows=%d]", p.Overdue, p.Rows))
	}
	if !(p.OverdueCycles > 0) || p.OverdueCycles > 1000 {
		errs = append(errs, fmt.Errorf("overdue cycles %v is not within (0, 1000]", p.OverdueCycles))
	}
	if p.Urgent < 0 || p.Urgent > p.Rows-p.Overdue {
		errs = append(errs, fmt.Errorf("urgent %d is not within [0, rows−overdue=%d]", p.Urgent, p.Rows-p.Overdue))
	}
	if !(p.DueShare >= 0 && p.DueShare <= 1) {
		errs = append(errs, fmt.Errorf("due share %v is not within [0, 1]", p.DueShare))
	}
	if p.KeyPrefix == "" || strings.HasSuffix(p.KeyPrefix, "/") {
		errs = append(errs, fmt.Errorf("key prefix %q must be non-empty and not end in '/'", p.KeyPrefix))
	} else if n := len(p.KeyPrefix) + len("/category/") + 20; n > schedule.MaxKeyBytes {
		errs = append(errs, fmt.Errorf("key prefix is too long: keys could reach %d bytes (max %d)", n, schedule.MaxKeyBytes))
	}
	return errors.Join(errs...)
}

// hit reports whether index i (of n) is one of the k indices spread evenly over [0, n), and
// before(i) is how many of those k precede i. Exactly k indices hit.
func hit(i, n, k int) bool { return before(i+1, n, k) > before(i, n, k) }

func before(i, n, k int) int {
	if n == 0 {
		return 0
	}
	return int(int64(i) * int64(k) / int64(n))
}

// Kind is what role a generated row plays in the mix.
type Kind uint8

// Row kinds.
const (
	// KindOrdinary rows are due around now (DueShare of the cadence before now).
	KindOrdinary Kind = iota
	// KindOverdue rows belong to the backlog.
	KindOverdue
	// KindUrgent rows are urgent and due now.
	KindUrgent
)

// KindOf returns the kind of row i.
func (p Plan) KindOf(i int) Kind {
	if hit(i, p.Rows, p.Overdue) {
		return KindOverdue
	}
	j := i - before(i, p.Rows, p.Overdue) // index among the non-overdue rows
	if hit(j, p.Rows-p.Overdue, p.Urgent) {
		return KindUrgent
	}
	return KindOrdinary
}

// ClassOf returns the cadence and route of row i.
func (p Plan) ClassOf(i int) (time.Duration, string) {
	if hit(i, p.Rows, p.Homepages) {
		return HomeCadence, RouteHome
	}
	j := i - before(i, p.Rows, p.Homepages) // index among the non-homepage rows
	if hit(j, p.Rows-p.Homepages, before(p.Rows-p.Homepages, 1000, p.CategoryPermille)) {
		return CategoryCadence, RouteCategory
	}
	return ProductCadence, RouteProduct
}

// Key returns the key of row i.
func (p Plan) Key(i int, route string) string {
	return p.KeyPrefix + "/" + route + "/" + strconv.Itoa(i)
}

// Row returns row i of the plan (0 <= i < Rows) with due times relative to now. It depends only on
// p, i and now. The row's KeyHash and Rev are zero (the store computes them).
func (p Plan) Row(i int, now time.Time) schedule.Row {
	var src rand.PCG
	src.Seed(p.Seed, uint64(i)^0x9e3779b97f4a7c15)
	rng := rand.New(&src)
	cadence, route := p.ClassOf(i)
	r := schedule.Row{
		Key:     p.Key(i, route),
		HasDue:  true,
		Cadence: cadence,
		Route:   route,
		Source:  schedule.SourceDiscovered,
	}
	if rng.IntN(2) == 1 {
		r.Source = schedule.SourceSubmitted
	}
	u := rng.Float64() // [0, 1)
	switch p.KindOf(i) {
	case KindOverdue:
		// (now − cycles·cadence, now]: never in the future.
		r.Due = now.Add(-time.Duration((1 - u) * p.OverdueCycles * float64(cadence)))
	case KindUrgent:
		r.Urgent = true
		r.Due = now.Add(-time.Duration((1 - u) * float64(urgentSpread)))
	default:
		r.Due = now.Add(time.Duration((u - p.DueShare) * float64(cadence)))
	}
	// The store keeps microseconds; generate what it will store.
	r.Due = r.Due.Truncate(time.Microsecond)
	return r
}

// AppendRows appends rows [from, from+n) of the plan to dst and returns it.
func (p Plan) AppendRows(dst []schedule.Row, from, n int, now time.Time) []schedule.Row {
	for i := from; i < from+n; i++ {
		dst = append(dst, p.Row(i, now))
	}
	return dst
}
