package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/renderqueue/renderqueue/pkg/shardapi"
	"github.com/renderqueue/renderqueue/pkg/shardapi/wire"
)

// Shape is a number of workers and the rows each claims at once.
type Shape struct {
	Workers, Batch int
}

func (s Shape) String() string { return fmt.Sprintf("%d × %d", s.Workers, s.Batch) }

// RunResult is what one run measured.
type RunResult struct {
	Shape Shape
	// Completed is the rows whose completion was acknowledged; Verified how many of them the
	// database shows completed (checked after the run).
	Completed, Verified int
	// Elapsed is the run's length: its duration, or until the queue ran out of due rows.
	Elapsed time.Duration
	// Drained is set when the queue ran out of due rows before the duration.
	Drained bool
	// Claim and Complete are the latencies of the claim and complete requests (SKIP LOCKED: the
	// SELECT … FOR UPDATE SKIP LOCKED, and the UPDATE plus COMMIT).
	Claim, Complete Latency
	CPU             cpuUse
	// CPUs is where its processes were allowed to run (read when it ended).
	CPUs Placement
	// Errors counts failed requests; LastError is one of them.
	Errors    int
	LastError string
	// Maintenance is, by table of the scratch database, how many vacuums and analyzes
	// (autovacuum's or not) ended during the run or were running at its end: their CPU is
	// PostgreSQL's, taken from the run. Nil when there were none or they could not be read.
	Maintenance map[string]int
	// Settled says how the machine and the database were settled before the run (settle).
	Settled string
	// WAL is what the server wrote to its write-ahead log during the run, in bytes (the whole
	// server's: the run's writes and whatever else wrote meanwhile).
	WAL float64
}

// Unverified is how many acknowledged completions the database did not show completed.
func (r RunResult) Unverified() int { return r.Completed - r.Verified }

// RowsPerSecond is the completion rate.
func (r RunResult) RowsPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Completed) / r.Elapsed.Seconds()
}

// Latency summarises request latencies.
type Latency struct {
	N             int
	P50, P99, Max time.Duration
}

func summarize(v []time.Duration) Latency {
	if len(v) == 0 {
		return Latency{}
	}
	slices.Sort(v)
	at := func(q float64) time.Duration { return v[max(0, min(len(v)-1, int(q*float64(len(v)))-1))] }
	return Latency{N: len(v), P50: at(0.50), P99: at(0.99), Max: v[len(v)-1]}
}

// workerLog is what one worker recorded.
type workerLog struct {
	claim, complete []time.Duration
	done            []completed
	errs            int
	lastErr         string
	drained         bool
}

func (w *workerLog) fail(err error) {
	w.errs++
	w.lastErr = err.Error()
}

func merge(logs []*workerLog) (claim, complete []time.Duration, done []completed, errs int, lastErr string, drained bool) {
	for _, l := range logs {
		claim = append(claim, l.claim...)
		complete = append(complete, l.complete...)
		done = append(done, l.done...)
		errs += l.errs
		if l.lastErr != "" {
			lastErr = l.lastErr
		}
		drained = drained || l.drained
	}
	return
}

// keeperClient makes the shard API requests of the keeper run.
type keeperClient struct {
	url, token string
	http       *http.Client
}

// post sends in and decodes the reply into out with package wire's codecs, as pkg/client (the
// workers) does.
func (k *keeperClient) post(ctx context.Context, path string, in, out any) error {
	body, err := wire.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, k.url+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if k.token != "" {
		req.Header.Set("Authorization", "Bearer "+k.token)
	}
	resp, err := k.http.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	// read into a buffer sized by the Content-Length, as pkg/client does
	b := make([]byte, 0, max(resp.ContentLength, 0)+1)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := resp.Body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
	}
	return wire.Unmarshal(b, out)
}

// runKeeper drives the keeper with shape.Workers workers, each claiming shape.Batch rows and
// completing them all at once (no render time), until the deadline or the queue runs dry.
func runKeeper(ctx context.Context, k *keeperClient, shape Shape, deadline time.Time) []*workerLog {
	logs := make([]*workerLog, shape.Workers)
	var wg sync.WaitGroup
	for w := range shape.Workers {
		l := &workerLog{}
		logs[w] = l
		wg.Add(1)
		go func() {
			defer wg.Done()
			empty := 0
			for time.Now().Before(deadline) && ctx.Err() == nil {
				start := time.Now()
				var claim shardapi.ClaimResponse
				if err := k.post(ctx, "/v1/claim", shardapi.ClaimRequest{N: shape.Batch, LeaseSeconds: 300}, &claim); err != nil {
					l.fail(err)
					continue
				}
				l.claim = append(l.claim, time.Since(start))
				if len(claim.Items) == 0 {
					if empty++; empty >= 3 {
						l.drained = true
						return
					}
					continue
				}
				empty = 0
				req := shardapi.CompleteRequest{Items: make([]shardapi.Completion, len(claim.Items))}
				for i, it := range claim.Items {
					req.Items[i] = shardapi.Completion{Key: it.Key, Lease: it.Lease}
				}
				start = time.Now()
				var resp shardapi.CompleteResponse
				if err := k.post(ctx, "/v1/complete", req, &resp); err != nil {
					l.fail(err)
					continue
				}
				l.complete = append(l.complete, time.Since(start))
				for i, r := range resp.Results {
					if r.Error == "" && i < len(claim.Items) {
						it := claim.Items[i]
						l.done = append(l.done, completed{key: it.Key, due: it.Due, cadence: time.Duration(it.Cadence * float64(time.Second))})
					} else if r.Error != "" {
						l.fail(errors.New(r.Error))
					}
				}
			}
		}()
	}
	wg.Wait()
	return logs
}

// runSkipLocked drives the SKIP LOCKED queue: each worker, in one transaction, claims shape.Batch
// due rows with SELECT … ORDER BY due_at LIMIT n FOR UPDATE SKIP LOCKED and completes them with one
// UPDATE (the next due time: due + cadence), then commits.
func runSkipLocked(ctx context.Context, pool *pgxpool.Pool, shape Shape, deadline time.Time) []*workerLog {
	logs := make([]*workerLog, shape.Workers)
	var wg sync.WaitGroup
	for w := range shape.Workers {
		l := &workerLog{}
		logs[w] = l
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pool.Acquire(ctx)
			if err != nil {
				l.fail(err)
				return
			}
			defer conn.Release()
			keys := make([]string, 0, shape.Batch)
			dues := make([]time.Time, 0, shape.Batch)
			next := make([]time.Time, 0, shape.Batch)
			cads := make([]int64, 0, shape.Batch)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				keys, dues, next, cads = keys[:0], dues[:0], next[:0], cads[:0]
				start := time.Now()
				tx, err := conn.Begin(ctx)
				if err != nil {
					l.fail(err)
					continue
				}
				rows, err := tx.Query(ctx, `SELECT key, due_at, cadence_ms FROM bench_queue
					WHERE due_at <= now() ORDER BY due_at LIMIT $1 FOR UPDATE SKIP LOCKED`, shape.Batch)
				if err == nil {
					for rows.Next() {
						var k string
						var d pgtype.Timestamptz
						var c int64
						if err = rows.Scan(&k, &d, &c); err != nil {
							break
						}
						keys, dues, cads = append(keys, k), append(dues, d.Time), append(cads, c)
						next = append(next, d.Time.Add(time.Duration(c)*time.Millisecond))
					}
					rows.Close()
					if err == nil {
						err = rows.Err()
					}
				}
				if err != nil {
					_ = tx.Rollback(ctx)
					l.fail(err)
					continue
				}
				l.claim = append(l.claim, time.Since(start))
				if len(keys) == 0 {
					_ = tx.Rollback(ctx)
					l.drained = true
					return
				}
				start = time.Now()
				_, err = tx.Exec(ctx, `UPDATE bench_queue AS q SET due_at = c.due
					FROM unnest($1::text[], $2::timestamptz[]) AS c(key, due) WHERE q.key = c.key`, keys, next)
				if err == nil {
					err = tx.Commit(ctx)
				} else {
					_ = tx.Rollback(ctx)
				}
				if err != nil {
					l.fail(err)
					continue
				}
				l.complete = append(l.complete, time.Since(start))
				for i, k := range keys {
					l.done = append(l.done, completed{key: k, due: dues[i], cadence: time.Duration(cads[i]) * time.Millisecond})
				}
			}
		}()
	}
	wg.Wait()
	return logs
}

// floorBatch is the rows of one bare UPDATE of the floor run: about what a keeper's group commit
// writes at once under the benchmark's load.
const floorBatch = 5000

// floorSQL is the least a completion can be in render_schedule: due_at set by key, nothing else
// (no rev, no rev check, no RETURNING), with every user trigger disabled for the run
// (pkg/store/postgres's BenchmarkCompleteStatement/bare-update, the same statement).
const floorSQL = `UPDATE render_schedule AS r SET due_at = c.due
	FROM unnest($1::text[], $2::timestamptz[]) AS c(key, due) WHERE r.key = c.key`

// floorRows are the due rows the floor run completes, read (in due order) before it.
type floorRows struct {
	keys []string
	dues []time.Time
	cads []int64
}

// readFloorRows reads render_schedule's rows in due order, due or not (a bare UPDATE by key costs
// the same either way, and the keeper's run may have left few due), for runFloor.
func readFloorRows(ctx context.Context, pool *pgxpool.Pool) (floorRows, error) {
	var f floorRows
	rows, err := pool.Query(ctx, `SELECT key, due_at, cadence_ms FROM render_schedule ORDER BY due_at`)
	if err != nil {
		return f, fmt.Errorf("reading the rows for the floor run: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var d pgtype.Timestamptz
		var c int64
		if err := rows.Scan(&k, &d, &c); err != nil {
			return f, fmt.Errorf("reading the rows for the floor run: %w", err)
		}
		f.keys, f.dues, f.cads = append(f.keys, k), append(f.dues, d.Time), append(f.cads, c)
	}
	return f, rows.Err()
}

// runFloor writes completions to render_schedule as cheaply as PostgreSQL allows: one worker,
// batches of floorBatch of the rows read before (so the run's database work is the UPDATEs
// alone), each row's due time moved forward by its cadence as a completion's is. What
// PostgreSQL spends per row here is the floor under any queue that writes each completion to its
// row in this table (user triggers disabled by the caller).
func runFloor(ctx context.Context, pool *pgxpool.Pool, f floorRows, deadline time.Time) []*workerLog {
	l := &workerLog{}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		l.fail(err)
		return []*workerLog{l}
	}
	defer conn.Release()
	next := make([]time.Time, 0, floorBatch)
	for lo := 0; time.Now().Before(deadline) && ctx.Err() == nil; lo += floorBatch {
		if lo >= len(f.keys) {
			l.drained = true
			break
		}
		hi := min(lo+floorBatch, len(f.keys))
		next = next[:0]
		for i := lo; i < hi; i++ {
			next = append(next, f.dues[i].Add(time.Duration(f.cads[i])*time.Millisecond))
		}
		start := time.Now()
		if _, err := conn.Exec(ctx, floorSQL, f.keys[lo:hi], next); err != nil {
			l.fail(err)
			continue
		}
		l.complete = append(l.complete, time.Since(start))
		for i := lo; i < hi; i++ {
			l.done = append(l.done, completed{key: f.keys[i], due: f.dues[i], cadence: time.Duration(f.cads[i]) * time.Millisecond})
		}
	}
	return []*workerLog{l}
}
