package store

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/renderqueue/renderqueue/pkg/schedule"
)

// RowJSON is one schedule row as producers write it, one JSON object per line (NDJSON), for
// UpsertNDJSON and `renderqueue upsert`:
//
//	{"key":"https://shop.example.com/p/1","cadence":"96h","route":"product","source":"submitted","due":"2026-12-01T10:00:00Z"}
//	{"key":"https://shop.example.com/","cadence":"1h","route":"home","urgent":true,"due":"2026-12-01T09:00:00Z"}
//	{"key":"https://shop.example.com/old","cadence":"96h","unscheduled":true}
//
// key and cadence are required, and exactly one of due and "unscheduled": true: a row is never
// given a due time it did not ask for. An upsert replaces every scheduling field of an existing
// row with the same key.
type RowJSON struct {
	// Key is the canonical URL: 1 to 2048 bytes, no NUL byte.
	Key string `json:"key"`
	// Cadence is the render interval, a Go duration ("96h", "1h30m"): whole milliseconds, at
	// least 1ms and at most 10 years (schedule.MinCadence, MaxCadence).
	Cadence string `json:"cadence"`
	// Route groups rows for the byRoute summary (at most 256 bytes). Default "".
	Route string `json:"route,omitempty"`
	// Source is "discovered" (the default) or "submitted" (from a sitemap; may be boosted).
	Source string `json:"source,omitempty"`
	// Urgent rows are claimed first, within the RenderQueue's urgentMaxShare.
	Urgent bool `json:"urgent,omitempty"`
	// Due is the next render time (RFC 3339, within [1970, 2106)).
	Due *time.Time `json:"due,omitempty"`
	// Unscheduled rows have no due time (due_at NULL): held by no shard until one is set.
	Unscheduled bool `json:"unscheduled,omitempty"`
}

// ParseRowJSON parses and validates one NDJSON line (see RowJSON): unknown fields, a missing key
// or cadence, both or neither of due and unscheduled, and every limit of ValidateRows are errors.
func ParseRowJSON(line []byte) (schedule.Row, error) {
	var rj RowJSON
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rj); err != nil {
		return schedule.Row{}, fmt.Errorf("not a JSON row object: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return schedule.Row{}, errors.New("trailing data after the JSON object")
	}
	var probs []string
	if rj.Key == "" {
		probs = append(probs, "key is missing")
	}
	row := schedule.Row{Key: rj.Key, Route: rj.Route, Urgent: rj.Urgent}
	if rj.Cadence == "" {
		probs = append(probs, `cadence is missing (a duration such as "96h")`)
	} else if d, err := time.ParseDuration(rj.Cadence); err != nil {
		probs = append(probs, fmt.Sprintf("cadence %q is not a duration such as \"96h\" or \"1h30m\"", rj.Cadence))
	} else {
		row.Cadence = d
	}
	switch rj.Source {
	case "", "discovered":
		row.Source = schedule.SourceDiscovered
	default:
		src, err := schedule.ParseSource(rj.Source)
		if err != nil {
			probs = append(probs, err.Error())
		}
		row.Source = src
	}
	switch {
	case rj.Due != nil && rj.Unscheduled:
		probs = append(probs, `both due and "unscheduled": true: give one`)
	case rj.Due == nil && !rj.Unscheduled:
		probs = append(probs, `neither due nor "unscheduled": true: give one`)
	case rj.Due != nil:
		row.Due, row.HasDue = rj.Due.UTC(), true
	}
	if len(probs) == 0 {
		if err := ValidateRows([]schedule.Row{row}); err != nil {
			var ve *ValidationError
			if errors.As(err, &ve) {
				for _, p := range ve.Problems {
					probs = append(probs, p.Reason)
				}
			} else {
				probs = append(probs, err.Error())
			}
		}
	}
	if len(probs) > 0 {
		return schedule.Row{}, errors.New(strings.Join(probs, "; "))
	}
	return row, nil
}

// Upserter is the write a producer needs; every Store is one.
type Upserter interface {
	Upsert(ctx context.Context, rows []schedule.Row) ([]schedule.Row, error)
}

// NDJSONOptions tune UpsertNDJSON.
type NDJSONOptions struct {
	// Batch is the most rows written in one Upsert (one transaction). Default 1000.
	Batch int
	// MaxLineBytes bounds a line; a longer one is a bad line. Default 64 KiB.
	MaxLineBytes int
	// BadLine, when set, is called for every bad line (1-based number) as it is found.
	BadLine func(line int, err error)
}

// NDJSONResult counts what UpsertNDJSON did.
type NDJSONResult struct {
	// Lines is the number of lines read (blank lines included), Blank those skipped.
	Lines, Blank int
	// Written is the rows written, in Batches transactions.
	Written, Batches int
	// Bad is the number of bad lines (none of them written).
	Bad int
}

// UpsertNDJSON is the producers' path into the schedule table: it reads rows from r, one JSON
// object per line (RowJSON), validates each line on its own, and upserts the good ones through up
// in batches of opts.Batch rows, each batch one transaction. A bad line is reported (BadLine,
// and counted) and writes nothing of itself; it does not stop the good lines around it. A key
// given again on a later line is written after the earlier one, so the last line wins. Blank
// lines are skipped.
//
// It returns an error when reading r fails or a batch could not be written; then nothing of that
// batch was written (a transaction), the batches before it were, and the result counts them.
func UpsertNDJSON(ctx context.Context, up Upserter, r io.Reader, opts NDJSONOptions) (NDJSONResult, error) {
	if opts.Batch <= 0 {
		opts.Batch = 1000
	}
	if opts.MaxLineBytes <= 0 {
		opts.MaxLineBytes = 64 << 10
	}
	var res NDJSONResult
	batch := make([]schedule.Row, 0, opts.Batch)
	inBatch := make(map[string]bool, opts.Batch)
	firstLine, lastLine := 0, 0 // line numbers of the batch's first and last rows
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if _, err := up.Upsert(ctx, batch); err != nil {
			return fmt.Errorf("writing the %d rows of lines %d-%d (nothing of them written): %w", len(batch), firstLine, lastLine, err)
		}
		res.Written += len(batch)
		res.Batches++
		batch = batch[:0]
		clear(inBatch)
		return nil
	}
	bad := func(err error) {
		res.Bad++
		if opts.BadLine != nil {
			opts.BadLine(res.Lines, err)
		}
	}
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, tooLong, err := readLine(br, opts.MaxLineBytes)
		if err != nil && !errors.Is(err, io.EOF) {
			return res, fmt.Errorf("reading line %d: %w", res.Lines+1, err)
		}
		if errors.Is(err, io.EOF) && len(line) == 0 && !tooLong {
			break
		}
		res.Lines++
		switch {
		case tooLong:
			bad(fmt.Errorf("line is longer than %d bytes", opts.MaxLineBytes))
		case len(bytes.TrimSpace(line)) == 0:
			res.Blank++
		default:
			row, perr := ParseRowJSON(line)
			if perr != nil {
				bad(perr)
				break
			}
			if inBatch[row.Key] || len(batch) == opts.Batch {
				if err := flush(); err != nil {
					return res, err
				}
			}
			if len(batch) == 0 {
				firstLine = res.Lines
			}
			batch = append(batch, row)
			inBatch[row.Key] = true
			lastLine = res.Lines
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if cerr := ctx.Err(); cerr != nil {
			return res, fmt.Errorf("stopped after line %d: %w", res.Lines, cerr)
		}
	}
	return res, flush()
}

// readLine reads one line (without its newline) of at most limit bytes; a longer line is read to
// its end and reported tooLong. err is io.EOF at the end of the input.
func readLine(br *bufio.Reader, limit int) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if tooLong || len(line)+len(chunk) > limit+1 { // +1: the newline
			tooLong = true
			line = line[:0]
		} else {
			line = append(line, chunk...)
		}
		switch {
		case err == nil:
			return bytes.TrimRight(line, "\r\n"), tooLong, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return bytes.TrimRight(line, "\r\n"), tooLong, err
		}
	}
}
