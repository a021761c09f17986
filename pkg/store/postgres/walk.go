package postgres

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/internal/columns"
)

const (
	walkFirstStmt = "rq_walk_first"
	walkFirstSQL  = "SELECT " + rowColumns + " FROM render_schedule" +
		" WHERE key_hash BETWEEN $1 AND $2 ORDER BY key_hash, key LIMIT $3"
	walkNextStmt = "rq_walk_next"
	walkNextSQL  = "SELECT " + rowColumns + " FROM render_schedule" +
		" WHERE key_hash BETWEEN $1 AND $2 AND (key_hash, key) > ($3, $4)" +
		" ORDER BY key_hash, key LIMIT $5"
	// failSQL fails in the database; the failSegment test hook runs it instead of a page query.
	failSQL = "SELECT 1/0 AS injected_walk_failure"
)

// walkMsg carries a page of rows (or the end of a segment) from a walk worker to the dispatcher.
type walkMsg struct {
	seg  int
	rows []schedule.Row
	end  bool
	err  error
}

// Walk implements store.Store: segments are read by Options.WalkConns workers in parallel, each
// on its own connection, and their pages are handed to fn by the calling goroutine.
func (s *Store) Walk(ctx context.Context, slots []int, fn store.WalkFunc) (store.WalkResult, error) {
	norm, err := store.NormalizeSlots(slots)
	if err != nil {
		return store.WalkResult{}, fmt.Errorf("walk: %w", err)
	}
	if s.closed() {
		return store.WalkResult{}, store.ErrClosed
	}
	segs := store.Segments(norm, s.opts.SegmentSlots)
	res := store.WalkResult{Segments: make([]store.SegmentResult, len(segs))}
	for i, g := range segs {
		res.Segments[i].Segment = g
	}
	if len(segs) == 0 {
		return res, nil
	}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := make(chan int, len(segs))
	for i := range segs {
		jobs <- i
	}
	close(jobs)
	nw := min(s.opts.WalkConns, len(segs))
	out := make(chan walkMsg, 4*nw)
	free := make(chan []schedule.Row, 8*nw)
	var wg sync.WaitGroup
	for range nw {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := walker{s: s, segs: segs, out: out, free: free, routes: columns.Interner{}}
			w.run(wctx, jobs)
		}()
	}
	go func() { wg.Wait(); close(out) }()

	var fnErr error
	ended := make([]bool, len(segs))
	for m := range out {
		if fnErr != nil {
			continue // draining after fn failed
		}
		sr := &res.Segments[m.seg]
		if len(m.rows) > 0 {
			sr.Rows += len(m.rows)
			res.Rows += len(m.rows)
			if err := fn(store.WalkItem{Segment: segs[m.seg], Rows: m.rows}); err != nil {
				fnErr = err
				cancel()
				continue
			}
			select {
			case free <- m.rows[:0]:
			default:
			}
		}
		if m.end {
			ended[m.seg] = true
			sr.Err = m.err
			if err := fn(store.WalkItem{Segment: segs[m.seg], End: true, Err: m.err}); err != nil {
				fnErr = err
				cancel()
			}
		}
	}
	if fnErr != nil {
		markUnended(&res, ended, fmt.Errorf("walk stopped: %w", fnErr))
		return res, fnErr
	}
	if err := ctx.Err(); err != nil {
		markUnended(&res, ended, err)
		return res, fmt.Errorf("walk: %w", err)
	}
	return res, nil
}

func markUnended(res *store.WalkResult, ended []bool, err error) {
	for i := range res.Segments {
		if !ended[i] && res.Segments[i].Err == nil {
			res.Segments[i].Err = err
		}
	}
}

// walker is one walk worker: it reads whole segments on one pool connection.
type walker struct {
	s      *Store
	segs   []schedule.Run
	out    chan<- walkMsg
	free   chan []schedule.Row
	routes columns.Interner
	keys   columns.Strings // walked keys share blocks: the keeper copies those it holds
	conn   *pgxpool.Conn
}

func (w *walker) run(ctx context.Context, jobs <-chan int) {
	defer w.release(false)
	for i := range jobs {
		if ctx.Err() != nil {
			return
		}
		err := w.segment(ctx, i)
		if ctx.Err() != nil {
			return // the walk is over; the dispatcher marks unfinished segments
		}
		if !w.send(ctx, walkMsg{seg: i, end: true, err: err}) {
			return
		}
	}
}

func (w *walker) send(ctx context.Context, m walkMsg) bool {
	select {
	case w.out <- m:
		return true
	case <-ctx.Done():
		return false
	}
}

// release returns the worker's connection to the pool, or destroys it when it may be broken.
func (w *walker) release(broken bool) {
	if w.conn == nil {
		return
	}
	if broken || w.conn.Conn().PgConn().IsClosed() {
		_ = w.conn.Conn().Close(context.Background())
	}
	w.conn.Release()
	w.conn = nil
}

func (w *walker) acquire(ctx context.Context) (*pgconn.PgConn, error) {
	if w.conn == nil {
		c, err := w.s.pool.Acquire(ctx)
		if err != nil {
			return nil, fmt.Errorf("acquiring a connection: %w", err)
		}
		w.conn = c
	}
	cc := w.conn.Conn()
	if _, err := cc.Prepare(ctx, walkFirstStmt, walkFirstSQL); err != nil {
		w.release(isConnError(err))
		return nil, fmt.Errorf("preparing the walk query: %w", err)
	}
	if _, err := cc.Prepare(ctx, walkNextStmt, walkNextSQL); err != nil {
		w.release(isConnError(err))
		return nil, fmt.Errorf("preparing the walk query: %w", err)
	}
	return cc.PgConn(), nil
}

func (w *walker) buffer() []schedule.Row {
	select {
	case b := <-w.free:
		return b
	default:
		return make([]schedule.Row, 0, walkChunkRows)
	}
}

// walkChunkRows is how many rows a worker hands the dispatcher at a time (pages are streamed in
// chunks, so applying rows overlaps with reading the rest of the page).
const walkChunkRows = 4096

// segment reads segment i page by page, sending rows to the dispatcher in chunks as they are
// decoded, and returns nil when the whole segment was read.
func (w *walker) segment(ctx context.Context, i int) error {
	seg := w.segs[i]
	lo, hi := seg.HashRange()
	c := cursor{lo: lo, hi: hi}
	failures := 0
	for {
		n, err := w.page(ctx, i, &c)
		if err == nil && n < w.s.opts.WalkPageRows {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			failures++
			if failures > w.s.opts.WalkRetries {
				if isConnError(err) {
					// the database was not reached, or the connection went: store.ErrUnavailable
					return fmt.Errorf("walking slots %v: %w: %w", seg, store.ErrUnavailable, err)
				}
				return fmt.Errorf("walking slots %v: %w", seg, err)
			}
			w.s.log.V(1).Info("walk page failed, retrying", "segment", seg.String(), "error", err.Error())
		}
	}
}

// cursor is a segment's keyset position: the hash range and the last row delivered.
type cursor struct {
	lo, hi   int64
	started  bool
	lastHash int64
	lastKey  string
}

func be64(v int64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), uint64(v)) }

// page runs one page query after c, streaming its rows to the dispatcher in chunks and advancing
// c past every row sent. It returns how many rows the page had (up to an error).
func (w *walker) page(ctx context.Context, i int, c *cursor) (int, error) {
	pc, err := w.acquire(ctx)
	if err != nil {
		return 0, err
	}
	seg := w.segs[i]
	pageRows := w.s.opts.WalkPageRows
	var rr *pgconn.ResultReader
	switch {
	case w.s.opts.failSegment != nil && w.s.opts.failSegment(seg):
		rr = pc.ExecParams(ctx, failSQL, nil, nil, nil, nil)
	case !c.started:
		rr = pc.ExecPrepared(ctx, walkFirstStmt,
			[][]byte{be64(c.lo), be64(c.hi), be64(int64(pageRows))}, []int16{1, 1, 1}, []int16{1})
	default:
		rr = pc.ExecPrepared(ctx, walkNextStmt,
			[][]byte{be64(c.lo), be64(c.hi), be64(c.lastHash), []byte(c.lastKey), be64(int64(pageRows))},
			[]int16{1, 1, 1, 1, 1}, []int16{1})
	}
	n := 0
	var rows []schedule.Row
	flush := func() bool {
		if len(rows) == 0 {
			return true
		}
		last := &rows[len(rows)-1]
		c.started, c.lastHash, c.lastKey = true, last.KeyHash, last.Key
		ok := w.send(ctx, walkMsg{seg: i, rows: rows})
		rows = nil
		return ok
	}
	var decodeErr error
	for rr.NextRow() {
		if decodeErr != nil {
			continue
		}
		if rows == nil {
			rows = w.buffer()
		}
		rows = append(rows, schedule.Row{})
		if err := decodeRow(rr.Values(), &w.keys, w.routes, &rows[len(rows)-1]); err != nil {
			rows = rows[:len(rows)-1]
			decodeErr = err
			continue
		}
		n++
		if len(rows) == walkChunkRows && !flush() {
			decodeErr = ctx.Err()
		}
	}
	_, err = rr.Close()
	if err == nil {
		err = decodeErr
	}
	if err == nil || ctx.Err() == nil {
		flush()
	}
	if err != nil {
		var pgErr *pgconn.PgError
		w.release(!errors.As(err, &pgErr) || isConnError(err))
	}
	return n, err
}
