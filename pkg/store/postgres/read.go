package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/renderqueue/renderqueue/pkg/schedule"
	"github.com/renderqueue/renderqueue/pkg/store"
)

// readRowSQL reads one row by its key, through the hash index on key (schema version 5), and the
// key's hash whether or not a row has it: for a key no row has, the database computes what its
// key_hash would be (the generated column's expression, migrations/0001_render_schedule.sql).
const readRowSQL = `SELECT true, ` + rowColumns + ` FROM render_schedule WHERE key = $1
UNION ALL
SELECT false, $1, hashtextextended($1, 0), NULL, 0, '', 'discovered', false, 0
WHERE NOT EXISTS (SELECT 1 FROM render_schedule WHERE key = $1)`

var _ store.RowReader = (*Store)(nil)

// ReadRow implements store.RowReader: one statement, one round trip.
func (s *Store) ReadRow(ctx context.Context, key string) (schedule.Row, bool, error) {
	if why := schedule.KeyProblem(key); why != "" {
		return schedule.Row{}, false, fmt.Errorf("reading a row: %s", why)
	}
	if s.closed() {
		return schedule.Row{}, false, store.ErrClosed
	}
	rows, err := s.pool.Query(ctx, readRowSQL, key)
	if err != nil {
		return schedule.Row{}, false, fmt.Errorf("reading a row: %w", err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return schedule.Row{}, false, fmt.Errorf("reading a row: %w", err)
		}
		return schedule.Row{}, false, errors.New("reading a row: the database returned nothing")
	}
	var found bool
	r, err := scanRow(rows, &found)
	if err != nil {
		return schedule.Row{}, false, fmt.Errorf("reading a row: %w", err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return schedule.Row{}, false, fmt.Errorf("reading a row: %w", err)
	}
	if !found {
		return schedule.Row{Key: key, KeyHash: r.KeyHash}, false, nil
	}
	return r, true, nil
}
