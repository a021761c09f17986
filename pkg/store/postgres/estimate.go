package postgres

import (
	"context"
	"fmt"
)

// estimateSQL reads the planner's row estimate of the schedule table (the sum over its partitions
// when it is partitioned); a table never analyzed counts 0.
const estimateSQL = `SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint FROM pg_class c
WHERE c.oid = 'render_schedule'::regclass
   OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'render_schedule'::regclass)`

// EstimateRows returns PostgreSQL's estimate of the rows in the schedule table (pg_class.reltuples,
// as of the last VACUUM or ANALYZE): a cheap size hint, not a count. 0 means unknown.
func (s *Store) EstimateRows(ctx context.Context) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, estimateSQL).Scan(&n); err != nil {
		return 0, fmt.Errorf("estimating the rows of render_schedule: %w", err)
	}
	return n, nil
}
