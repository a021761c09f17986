package keeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/renderqueue/renderqueue/pkg/keeper/httpserve"
	"github.com/renderqueue/renderqueue/pkg/keeper/shardmetrics"
	"github.com/renderqueue/renderqueue/pkg/shardapi"
)

// lockRow holds key's row lock in a transaction of its own, so that a completion's write waits
// on it, until the returned function releases it.
func lockRow(t *testing.T, e *shardEnv, key string) (release func()) {
	t.Helper()
	conn, err := pgx.Connect(e.ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(e.ctx, `SELECT 1 FROM render_schedule WHERE key = $1 FOR UPDATE`, key); err != nil {
		t.Fatal(err)
	}
	return func() { _ = tx.Rollback(context.Background()) }
}

// killBlockedWrite waits until a completion's write waits on a row lock and terminates its
// backend (a connection killed in the middle of the write), and waits until it is gone.
func killBlockedWrite(t *testing.T, e *shardEnv) {
	t.Helper()
	eventually(t, "a completion write to wait on the lock and be killed", 20*time.Second, func() bool {
		var pid int
		err := e.st.Pool().QueryRow(e.ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE 'UPDATE render_schedule AS r SET due_at%'`).Scan(&pid)
		if errors.Is(err, pgx.ErrNoRows) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.st.Pool().Exec(e.ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the killed backend to go", 20*time.Second, func() bool {
			var n int
			if err := e.st.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 0
		})
		return true
	})
}

// TestCompleteWriteFailure: a completion whose write fails (its connection killed on the first
// attempt and on the store's one retry) is answered 503, counted as write_failed and logged; its
// lease stands, and completing again with the same lease succeeds.
func TestCompleteWriteFailure(t *testing.T) {
	e := newShardEnv(t, allSlots(24*time.Hour))
	row := e.upsert(srow("https://example.com/w", t0.Add(-time.Hour), time.Hour))[0]
	var mu sync.Mutex
	var logged []string
	reg := prometheus.NewPedanticRegistry()
	sh, err := NewShard(Options{Name: "w", Store: e.st, Clock: e.clock.Now, Metrics: shardmetrics.New(reg),
		Log: funcr.New(func(_, args string) { mu.Lock(); logged = append(logged, args); mu.Unlock() }, funcr.Options{})},
		allSlots(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if rep := sh.Walk(e.ctx, true); rep.Failed {
		t.Fatal(rep.Err)
	}
	srv := httptest.NewServer(sh.Handler(HandlerOptions{Token: "t", Gatherer: reg}))
	defer srv.Close()
	claimed, err := sh.Claim(e.clock.Now(), 1, time.Hour)
	if err != nil || len(claimed) != 1 {
		t.Fatal(claimed, err)
	}
	body := fmt.Sprintf(`{"items":[{"key":%q,"lease":%q}]}`, row.Key, httpserve.FormatLease(claimed[0].Lease))

	release := lockRow(t, e, row.Key)
	type reply struct {
		code int
		body []byte
		err  error
	}
	done := make(chan reply, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/complete", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer t")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- reply{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		done <- reply{resp.StatusCode, b, err}
	}()
	killBlockedWrite(t, e) // the first attempt
	killBlockedWrite(t, e) // the store's retry
	r := <-done
	release()
	var eb shardapi.Error
	if r.err != nil || r.code != 503 || json.Unmarshal(r.body, &eb) != nil || !strings.Contains(eb.Error, "writing 1 completions") {
		t.Fatalf("complete with its write failing: %d %s", r.code, r.body)
	}
	wantLines(t, scrape(t, sh, reg), `renderqueue_keeper_completed_rows_total{cadence_le="1h",result="write_failed",source="discovered"} 1`)
	mu.Lock()
	log := strings.Join(logged, "\n")
	mu.Unlock()
	if !strings.Contains(log, "Writing completions failed") || !strings.Contains(log, "terminating connection") {
		t.Fatalf("log:\n%s", log)
	}
	if err := sh.core.CheckLease(e.clock.Now(), row.Key, claimed[0].Lease); err != nil {
		t.Fatalf("the lease after the failed write: %v", err)
	}

	// the worker tries again with the same lease
	code, b := postJSON(t, srv.URL, "/v1/complete", body)
	var cr shardapi.CompleteResponse
	if code != 200 || json.Unmarshal(b, &cr) != nil || cr.Completed != 1 {
		t.Fatalf("completing again: %d %s", code, b)
	}
	wantLines(t, scrape(t, sh, reg), `renderqueue_keeper_completed_rows_total{cadence_le="1h",result="ok",source="discovered"} 1`)
}
