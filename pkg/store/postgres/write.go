package postgres

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/changes"
	"github.com/renderqueue/renderqueue/pkg/store/postgres/internal/columns"
)

// upsertSQL inserts rows (the insert trigger stamps their revs) or updates existing ones, stamping
// the fresh rev itself: an update that left rev alone would be written again after the statement
// for its rev (migrations/0008_after_row_rev.sql), and RETURNING would show the old one.
const upsertSQL = `INSERT INTO render_schedule AS r (key, due_at, cadence_ms, route, source, urgent)
SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::bigint[], $4::text[], $5::text[], $6::boolean[])
ON CONFLICT (key) DO UPDATE SET
    due_at = EXCLUDED.due_at, cadence_ms = EXCLUDED.cadence_ms, route = EXCLUDED.route,
    source = EXCLUDED.source, urgent = EXCLUDED.urgent, rev = nextval('render_schedule_rev_seq')
RETURNING ` + rowColumns

// completeSQL completes a batch of distinct keys, each only while its row is at the rev given
// (0: any rev). The ordinality column maps results back. It stamps the fresh rev itself, which
// spares each row the rev triggers (migrations/0003_writer_rev.sql, 0008_after_row_rev.sql). It
// returns the written rows without their keys (the writer has them): ~90 bytes a row on the wire
// instead of ~160 with a 64-byte key, so the backend fills the socket's buffer about half as often
// in a group and waits less for this process to read it (decodeAfterKey reads the columns after
// the ordinality).
const completeSQL = completeUpdate + `WHERE r.key = c.key AND (c.rev = 0 OR r.rev = c.rev)
RETURNING c.i, r.key_hash, r.due_at, r.cadence_ms, r.route, r.source, r.urgent, r.rev`

// completeUpdate is what completeSQL and knownSQL write.
const completeUpdate = `UPDATE render_schedule AS r SET due_at = c.due, urgent = false, rev = nextval('render_schedule_rev_seq')
FROM unnest($1::text[], $2::timestamptz[], $3::bigint[]) WITH ORDINALITY AS c(key, due, rev, i)
`

// knownSQL is completeSQL for a round whose every item is store.Completion.Known: the database
// returns only what the writer does not know, the key's hash and the new rev, with the ordinality
// as an int4 (39 bytes a row on the wire instead of ~95 with a short route), and scanKnown builds
// the rest from the items. So a 5,000-row group's answer, ~195 KB instead of ~475, fits the
// backend's send buffer on a Unix socket (208 KiB by default): the backend writes it whole and
// need not wait for this process to read it.
const knownSQL = completeUpdate + `WHERE r.key = c.key AND r.rev = c.rev
RETURNING c.i::int4, r.key_hash, r.rev`

// changedSQL reads the rows a rev-checked completion left alone.
const changedSQL = `SELECT c.i, r.key, r.key_hash, r.due_at, r.cadence_ms, r.route, r.source, r.urgent, r.rev
FROM unnest($1::text[]) WITH ORDINALITY AS c(key, i) JOIN render_schedule AS r ON r.key = c.key`

const deleteSQL = `DELETE FROM render_schedule WHERE key = ANY($1::text[])
RETURNING key, key_hash, nextval('render_schedule_rev_seq')`

// scanRow scans rowColumns from a pgx result (used by writes, whose results are small).
func scanRow(rows pgx.Rows, extra ...any) (schedule.Row, error) {
	var (
		r      schedule.Row
		due    pgtype.Timestamptz
		ms     int64
		source string
	)
	dest := append(extra, &r.Key, &r.KeyHash, &due, &ms, &r.Route, &source, &r.Urgent, &r.Rev)
	if err := rows.Scan(dest...); err != nil {
		return r, err
	}
	if due.Valid {
		r.HasDue = true
		switch due.InfinityModifier {
		case pgtype.Infinity:
			r.Due = pgMicrosToTime(1<<63 - 1)
		case pgtype.NegativeInfinity:
			r.Due = pgMicrosToTime(-1 << 63)
		default:
			r.Due = due.Time.UTC()
		}
	}
	r.Cadence = columns.CadenceFromMillis(ms)
	src, err := schedule.ParseSource(source)
	if err != nil {
		return r, fmt.Errorf("key %q: %w", r.Key, err)
	}
	r.Source = src
	return r, nil
}

func timestamptz(t time.Time, valid bool) pgtype.Timestamptz {
	if !valid {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: t, Valid: true}
}

// Upsert implements store.Store.
func (s *Store) Upsert(ctx context.Context, in []schedule.Row) ([]schedule.Row, error) {
	if err := store.ValidateRows(in); err != nil {
		return nil, fmt.Errorf("upsert: %w", err)
	}
	if s.closed() {
		return nil, store.ErrClosed
	}
	if len(in) == 0 {
		return nil, nil
	}
	n := len(in)
	keys := make([]string, n)
	dues := make([]pgtype.Timestamptz, n)
	cadences := make([]int64, n)
	routes := make([]string, n)
	sources := make([]string, n)
	urgent := make([]bool, n)
	index := make(map[string]int, n)
	// in key order: rows are locked in the order they are written (see commitGroup)
	sorted := slices.SortedFunc(slices.Values(in), func(a, b schedule.Row) int { return strings.Compare(a.Key, b.Key) })
	for i, r := range sorted {
		keys[i] = r.Key
		dues[i] = timestamptz(r.Due, r.HasDue)
		cadences[i] = r.Cadence.Milliseconds()
		routes[i] = r.Route
		sources[i] = sourceName(r.Source)
		urgent[i] = r.Urgent
	}
	for i, r := range in {
		index[r.Key] = i
	}
	rows, err := s.pool.Query(ctx, upsertSQL, keys, dues, cadences, routes, sources, urgent)
	if err != nil {
		return nil, fmt.Errorf("upserting %d rows: %w", n, err)
	}
	defer rows.Close()
	out := make([]schedule.Row, n)
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return nil, fmt.Errorf("upserting %d rows: reading the result: %w", n, err)
		}
		i, ok := index[r.Key]
		if !ok {
			return nil, fmt.Errorf("upserting %d rows: the database returned unknown key %q", n, r.Key)
		}
		out[i] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("upserting %d rows: %w", n, err)
	}
	return out, nil
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, keys []string) ([]store.DeleteResult, error) {
	if s.closed() {
		return nil, store.ErrClosed
	}
	out := make([]store.DeleteResult, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	for i, k := range keys {
		out[i].Key = k
	}
	rows, err := s.pool.Query(ctx, deleteSQL, slices.Sorted(slices.Values(keys))) // key order, see commitGroup
	if err != nil {
		return nil, fmt.Errorf("deleting %d keys: %w", len(keys), err)
	}
	defer rows.Close()
	found := make(map[string]store.DeleteResult, len(keys))
	for rows.Next() {
		var d store.DeleteResult
		if err := rows.Scan(&d.Key, &d.KeyHash, &d.Rev); err != nil {
			return nil, fmt.Errorf("deleting %d keys: reading the result: %w", len(keys), err)
		}
		d.Found = true
		found[d.Key] = d
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("deleting %d keys: %w", len(keys), err)
	}
	for i, k := range keys {
		if d, ok := found[k]; ok {
			out[i] = d
		}
	}
	return out, nil
}

// completeReq is one Complete call waiting for its group commit.
type completeReq struct {
	items []store.Completion
	res   []store.CompleteResult
	err   error
	done  chan struct{}
}

// Complete implements store.Store: the items join the next group commit and the call returns
// when it committed.
func (s *Store) Complete(ctx context.Context, items []store.Completion) ([]store.CompleteResult, error) {
	if err := store.ValidateCompletions(items); err != nil {
		return nil, fmt.Errorf("complete: %w", err)
	}
	if len(items) == 0 {
		return nil, nil
	}
	req := &completeReq{items: items, done: make(chan struct{})}
	select {
	case s.commits <- req:
	case <-s.stop:
		return nil, store.ErrClosed
	case <-ctx.Done():
		return nil, fmt.Errorf("complete: %w", ctx.Err())
	}
	// Once queued, the request is committed or failed as part of its group even if ctx ends:
	// wait for the outcome so the caller learns what was written. A request queued as the store
	// closed may never be picked up; the committer has finished everything it took when done
	// closes.
	select {
	case <-req.done:
	case <-s.done:
		select {
		case <-req.done:
		default:
			return nil, store.ErrClosed
		}
	}
	if req.err != nil {
		return nil, fmt.Errorf("complete %d item(s): %w", len(items), req.err)
	}
	return req.res, nil
}

// committer is the group-commit loop. It gathers requests into a group until FlushRows items
// wait or FlushDelay passed since the first, and commits up to CommitConns groups at once, each in
// its own transaction on its own connection, so PostgreSQL can use more than one core for them. A
// group never commits beside a group with any of the same keys: it waits until that one finished,
// so the writes of one key stay in arrival order (and concurrent groups, touching different rows,
// cannot deadlock). Requests that queued while every connection was busy form the next group as
// soon as one is free.
func (s *Store) committer() {
	defer close(s.done)
	var (
		batch    []*completeReq
		n        int
		ripe     bool // the batch waited FlushDelay (or is full): commit it as soon as it may
		inflight int
		busy     = map[string]int{} // keys of the groups committing
		finished = make(chan []*completeReq, s.opts.CommitConns)
		timer    = time.NewTimer(time.Hour)
	)
	timer.Stop()
	keysOf := func(b []*completeReq) []string {
		var keys []string
		for _, req := range b {
			for _, it := range req.items {
				keys = append(keys, it.Key)
			}
		}
		return keys
	}
	overlaps := func(b []*completeReq) bool {
		if len(busy) == 0 {
			return false
		}
		for _, req := range b {
			for _, it := range req.items {
				if busy[it.Key] > 0 {
					return true
				}
			}
		}
		return false
	}
	dispatch := func() {
		g := batch
		for _, k := range keysOf(g) {
			busy[k]++
		}
		inflight++
		batch, n, ripe = nil, 0, false
		timer.Stop()
		go func() {
			s.commitGroup(g)
			finished <- g
		}()
	}
	done := func(g []*completeReq) {
		inflight--
		for _, k := range keysOf(g) {
			if busy[k]--; busy[k] == 0 {
				delete(busy, k)
			}
		}
	}
	for {
		if len(batch) > 0 && (ripe || n >= s.opts.FlushRows) && inflight < s.opts.CommitConns && !overlaps(batch) {
			dispatch()
		}
		// take more requests only while the batch is below a group's size
		commits := s.commits
		if n >= s.opts.FlushRows {
			commits = nil
		}
		select {
		case req := <-commits:
			if len(batch) == 0 {
				timer.Reset(s.opts.FlushDelay)
			}
			batch = append(batch, req)
			n += len(req.items)
		case g := <-finished:
			done(g)
		case <-timer.C:
			ripe = true
		case <-s.stop:
			timer.Stop()
			for inflight > 0 {
				done(<-finished)
			}
			if len(batch) > 0 {
				s.commitGroup(batch)
			}
			s.drainCommits()
			return
		}
	}
}

// drainCommits fails requests still queued when the store closes.
func (s *Store) drainCommits() {
	for {
		select {
		case req := <-s.commits:
			req.err = store.ErrClosed
			close(req.done)
		default:
			return
		}
	}
}

// queryRows runs a query returning (ordinality, row columns) and hands each row to fn with its
// 0-based ordinality.
func queryRows(ctx context.Context, q *pgxpool.Pool, fn func(i int, r schedule.Row), sql string, args ...any) error {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var i int64
		r, err := scanRow(rows, &i)
		if err != nil {
			return err
		}
		fn(int(i-1), r)
	}
	return rows.Err()
}

// scanCompleted reads completeSQL's result for the keys of the statement: it hands each written
// row to fn with its 0-based ordinality. It closes rows.
func scanCompleted(rows pgx.Rows, keys []string, fn func(i int, r schedule.Row)) error {
	defer rows.Close()
	// every column must come in binary format but route and source (4, 5): text, whose two
	// formats are the same bytes
	for k, f := range rows.FieldDescriptions() {
		if f.Format != pgx.BinaryFormatCode && k != 4 && k != 5 {
			return fmt.Errorf("column %s of the completion's result is not in binary format", f.Name)
		}
	}
	routes := columns.Interner{}
	for rows.Next() {
		vals := rows.RawValues()
		if len(vals) != 8 {
			return fmt.Errorf("malformed completion result: %d columns, want 8", len(vals))
		}
		i, err := ordinality(vals[0], len(keys))
		if err != nil {
			return err
		}
		r := schedule.Row{Key: keys[i]}
		if err := decodeAfterKey(vals[1:], routes, &r); err != nil {
			return err
		}
		fn(i, r)
	}
	return rows.Err()
}

// ordinality decodes a completion result's binary ordinality (an int8, or an int4 from knownSQL)
// as a 0-based index into the statement's n keys.
func ordinality(v []byte, n int) (int, error) {
	var i int64
	switch len(v) {
	case 8:
		i = int64(binary.BigEndian.Uint64(v))
	case 4:
		i = int64(int32(binary.BigEndian.Uint32(v)))
	default:
		return 0, fmt.Errorf("malformed completion result: an ordinality of %d bytes", len(v))
	}
	if i < 1 || i > int64(n) {
		return 0, fmt.Errorf("the database returned ordinality %d for a statement of %d keys", i, n)
	}
	return int(i - 1), nil
}

// scanKnown reads the result of a round written with knownSQL and builds each written row from
// its item: the due time as stored (to the microsecond), urgent false, the item's known values,
// the key's hash and the new rev from the database.
func scanKnown(rows pgx.Rows, rd *groupRound, batch []*completeReq, fn func(i int, r schedule.Row)) error {
	defer rows.Close()
	for k, f := range rows.FieldDescriptions() {
		if f.Format != pgx.BinaryFormatCode {
			return fmt.Errorf("column %d (%s) of the completion's result is not in binary format", k, f.Name)
		}
	}
	for rows.Next() {
		vals := rows.RawValues()
		if len(vals) != 3 || len(vals[1]) != 8 || len(vals[2]) != 8 {
			return fmt.Errorf("malformed completion result: %d columns (want 3: the ordinality, two of 8 bytes)", len(vals))
		}
		i, err := ordinality(vals[0], len(rd.refs))
		if err != nil {
			return err
		}
		it := batch[rd.refs[i].req].items[rd.refs[i].item]
		fn(i, schedule.Row{
			Key:     it.Key,
			KeyHash: int64(binary.BigEndian.Uint64(vals[1])),
			Due:     columns.MicrosToTime(it.Due.UnixMicro()),
			HasDue:  true,
			Cadence: it.Cadence,
			Route:   it.Route,
			Source:  it.Source,
			Rev:     int64(binary.BigEndian.Uint64(vals[2])),
		})
	}
	return rows.Err()
}

// groupRef is one item of a group commit: its request and its place in the request.
type groupRef struct{ req, item int }

// groupRound is one UPDATE of a group commit: each key at most once, in key order, with the
// statement's arguments.
type groupRound struct {
	refs []groupRef
	keys []string
	dues []pgtype.Timestamptz
	revs []int64
	// known: every item is store.Completion.Known (the round is written with knownSQL)
	known bool
}

// groupRounds cuts a group into rounds: keys completed more than once in the group are written
// in rounds (one UPDATE per round, each key at most once per round), in arrival order, so each
// write gets its own rev and the last one wins. It also sizes each request's results.
func groupRounds(batch []*completeReq) []groupRound {
	var rounds []groupRound
	round := make(map[string]int)
	for ri, req := range batch {
		req.res = make([]store.CompleteResult, len(req.items))
		for ii, it := range req.items {
			k := round[it.Key]
			round[it.Key] = k + 1
			if k == len(rounds) {
				rounds = append(rounds, groupRound{})
			}
			rounds[k].refs = append(rounds[k].refs, groupRef{ri, ii})
		}
	}
	for i := range rounds {
		rd := &rounds[i]
		// Each round's rows are locked in key order, as Upsert and Delete lock theirs: writers
		// that take the locks of several rows in one order cannot deadlock one another.
		slices.SortFunc(rd.refs, func(a, b groupRef) int {
			return strings.Compare(batch[a.req].items[a.item].Key, batch[b.req].items[b.item].Key)
		})
		rd.keys = make([]string, len(rd.refs))
		rd.dues = make([]pgtype.Timestamptz, len(rd.refs))
		rd.revs = make([]int64, len(rd.refs))
		rd.known = true
		for j, rf := range rd.refs {
			it := batch[rf.req].items[rf.item]
			rd.keys[j], rd.dues[j], rd.revs[j] = it.Key, timestamptz(it.Due, true), it.Rev
			rd.known = rd.known && it.Known
		}
	}
	return rounds
}

// commitGroup writes a group of completions in one transaction (see groupRounds for keys that
// come more than once).
//
// A group is one message flight: the quiet setting (when the group is quiet) and each round's
// UPDATE are sent together as a pipeline, and the Sync that ends it commits them as one implicit
// transaction (an error in any rolls back all). So the group's connection never waits on this
// process between BEGIN, the setting, the UPDATEs and COMMIT, each a round trip before, which
// left the database idle while this process, busy with its clients, came round to send the next
// one. The rows a rev-checked write left alone are read after the commit, in a statement of
// their own (rare: a row changed since its claim): the row as stored then.
func (s *Store) commitGroup(batch []*completeReq) {
	rounds := groupRounds(batch)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	quiet, quietPID := s.quietFor()
	lostConn := false // the previous attempt failed with its connection: it may have committed
	// readChanged reads the rows of a round's rev-checked items that it did not write (done):
	// missing rows, or rows whose rev moved
	readChanged := func(rd *groupRound, done []bool) error {
		var changed []int
		for j := range rd.refs {
			if !done[j] && rd.revs[j] != 0 {
				changed = append(changed, j)
			}
		}
		if len(changed) == 0 {
			return nil
		}
		ckeys := make([]string, len(changed))
		for k, j := range changed {
			ckeys[k] = rd.keys[j]
		}
		return queryRows(ctx, s.pool, func(k int, r schedule.Row) {
			rf := rd.refs[changed[k]]
			it := batch[rf.req].items[rf.item]
			// On the retry, a row already as this completion writes it was written by the
			// first attempt, whose answer was lost with its connection.
			ours := lostConn && !r.Urgent && r.HasDue && r.Due.Equal(it.Due.Truncate(time.Microsecond))
			batch[rf.req].res[rf.item] = store.CompleteResult{Row: r, Found: true, Changed: !ours}
		}, changedSQL, ckeys)
	}
	write := func() error {
		b := &pgx.Batch{}
		if quiet != nil {
			b.Queue(quietSQL, strconv.FormatUint(uint64(quietPID), 10))
		}
		for _, rd := range rounds {
			if rd.known {
				b.Queue(knownSQL, rd.keys, rd.dues, rd.revs)
			} else {
				b.Queue(completeSQL, rd.keys, rd.dues, rd.revs)
			}
		}
		done := make([][]bool, len(rounds)) // done[i][j]: round i wrote its item j
		br := s.pool.SendBatch(ctx, b)
		err := func() error {
			if quiet != nil {
				if _, err := br.Exec(); err != nil {
					return err
				}
			}
			for i := range rounds {
				rd := &rounds[i]
				done[i] = make([]bool, len(rd.refs))
				rows, err := br.Query()
				if err != nil {
					return err
				}
				record := func(j int, r schedule.Row) {
					done[i][j] = true
					batch[rd.refs[j].req].res[rd.refs[j].item] = store.CompleteResult{Row: r, Found: true}
				}
				if rd.known {
					err = scanKnown(rows, rd, batch, record)
				} else {
					err = scanCompleted(rows, rd.keys, record)
				}
				if err != nil {
					return err
				}
			}
			return nil
		}()
		// Close reads what is left up to the Sync's answer: the commit's outcome
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		for i := range rounds {
			if err := readChanged(&rounds[i], done[i]); err != nil {
				return err
			}
		}
		return nil
	}
	// A group that fails on a connection error (a killed backend, a failover) is written once
	// more on another connection. A first attempt that committed before its answer was lost does
	// no harm: an unchecked completion writes the same again, and a rev-checked one finds the rev
	// moved and the row as it wrote it, which counts as written.
	var err error
	for attempt := 1; ; attempt++ {
		for _, req := range batch {
			for ii, it := range req.items {
				req.res[ii] = store.CompleteResult{Row: schedule.Row{Key: it.Key}}
			}
		}
		err = write()
		if err == nil || attempt == 2 || ctx.Err() != nil {
			break
		}
		lostConn = isConnError(err)
		if !lostConn && !isDeadlock(err) {
			break
		}
		// a deadlock with another writer (one that locks rows in another order) rolled the
		// group back whole: written once more, it usually goes through
		s.log.Error(err, "Group commit of completions failed on a connection error or a deadlock; retrying once", "requests", len(batch), "rounds", len(rounds))
	}
	if err != nil {
		s.log.Error(err, "Group commit of completions failed; its requests fail", "requests", len(batch), "rounds", len(rounds))
		if quiet != nil && isConnError(err) {
			// it may have committed, and its rows sent no change events: the subscriber walks
			quiet.Gap(fmt.Errorf("a group commit of %d completion request(s) failed and may have written its rows without change events: %w", len(batch), err))
		}
	}
	for _, req := range batch {
		if err != nil {
			req.err = fmt.Errorf("group commit of %d request(s): %w", len(batch), err)
			req.res = nil
		}
		close(req.done)
	}
}

// quietSQL declares, for the rest of a group commit's transaction, that the listener with this
// backend pid (the store's subscription) needs no change events of the rows written
// (migrations/0007_quiet_completions.sql).
const quietSQL = `SELECT set_config('renderqueue.quiet_for', $1, true)`

// quietFor returns the subscription a group commit may leave its change events out for, and its
// listener's backend pid: with Options.QuietCompletions, the store's only subscription once it
// has recorded its slots (schema version 7); else nil.
func (s *Store) quietFor() (*changes.Subscription, uint32) {
	if !s.opts.QuietCompletions {
		return nil, 0
	}
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if len(s.subs) != 1 {
		return nil, 0
	}
	for sub := range s.subs {
		if pid := sub.ListenerPID(); pid != 0 {
			return sub, pid
		}
	}
	return nil, 0
}

// isDeadlock reports whether err is PostgreSQL's deadlock_detected: the transaction was rolled
// back whole.
func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}
