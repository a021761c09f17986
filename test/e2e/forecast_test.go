//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	waveNS        = "waves"
	waveRows      = 960              // the wave: rows that come due together
	waveLead      = 80 * time.Second // how far ahead of the seeding the wave comes due
	waveSpread    = 2 * time.Second  // its rows' due times spread over this much
	waveMaxPods   = 4                // each HPA's maxReplicas, and what waveRows asks for
	waveRender    = time.Second      // a worker's mean render time (worker-sim --render-time)
	waveWorkerCon = 16               // rows a worker renders at once (--concurrency)
	// waveWarmUp is how long a worker Pod takes to become useful (an init container sleeps it):
	// on this node Pods start in seconds, from an image already there; a render worker elsewhere
	// pulls its image and starts a browser.
	waveWarmUp  = 20 * time.Second
	waveTimeout = 6 * time.Minute // the whole wave, from seeding to both queues drained
	wavePoll    = 500 * time.Millisecond
)

// waveQueue is one side of stepForecastWave: a RenderQueue of one shard on a database of its
// own, its render workers and the HPA that scales them.
type waveQueue struct {
	name    string
	metrics string // the HPA's metrics: YAML list items
	dsn     string // the test's DSN of its database
	podDSN  string

	mu       sync.Mutex
	ready    int32     // the worker Deployment's ready replicas, last seen
	atWave   int32     // … when the wave came due
	fullAt   time.Time // when it first had waveMaxPods ready
	timeline []string
}

// waveRun is a wave in flight, from stepForecastWaveStart to stepForecastWave.
type waveRun struct {
	forecast, due *waveQueue
	wave          time.Time // when its rows come due
	done          chan struct{}
	wg            sync.WaitGroup
	cancel        context.CancelFunc
}

// stepForecastWaveStart starts stepForecastWave's wave: the two queues, their workers and HPAs,
// and the rows coming due waveLead later; it follows the worker Deployments from then on. The
// steps between it and stepForecastWave run while the wave comes. cleanup registers what must
// run when the test ends.
func (e *env) stepForecastWaveStart(t *testing.T, cleanup func(func())) {
	ctx, cancel := context.WithTimeout(context.Background(), waveTimeout+2*time.Minute)
	run := &waveRun{done: make(chan struct{}), cancel: cancel}
	cleanup(func() {
		cancel()
		run.wg.Wait()
	})
	target := waveRows / waveMaxPods // rows per worker: the wave asks for waveMaxPods workers
	forecast := &waveQueue{name: "wave-forecast", metrics: fmt.Sprintf(`
  - type: External
    external:
      metric:
        name: renderqueue_due_forecast
        selector: {matchLabels: {renderqueue.dev/name: wave-forecast, horizon: 15m}}
      target: {type: AverageValue, averageValue: "%[1]d"}
  - type: External
    external:
      metric:
        name: renderqueue_due
        selector: {matchLabels: {renderqueue.dev/name: wave-forecast}}
      target: {type: AverageValue, averageValue: "%[1]d"}`, target)}
	due := &waveQueue{name: "wave-due", metrics: fmt.Sprintf(`
  - type: External
    external:
      metric:
        name: renderqueue_due
        selector: {matchLabels: {renderqueue.dev/name: wave-due}}
      target: {type: AverageValue, averageValue: "%d"}`, target)}
	queues := []*waveQueue{forecast, due}
	run.forecast, run.due = forecast, due

	// 1. a database each, migrated, seeded with the rows of the wave, all of them far ahead
	e.kubectl("create", "namespace", waveNS)
	for _, q := range queues {
		db := strings.ReplaceAll(q.name, "-", "_")
		e.sql("CREATE DATABASE " + db)
		q.dsn = strings.Replace(e.c.Postgres.DSN, "dbname=renderqueue", "dbname="+db, 1)
		q.podDSN = strings.Replace(e.c.Postgres.PodDSN, "dbname=renderqueue", "dbname="+db, 1)
		if q.dsn == e.c.Postgres.DSN || q.podDSN == e.c.Postgres.PodDSN {
			t.Fatalf("no dbname=renderqueue in the DSNs %q, %q", e.c.Postgres.DSN, e.c.Postgres.PodDSN)
		}
		for _, args := range [][]string{
			{"schema", "migrate", "--dsn", q.dsn},
			{"seed", "--dsn", q.dsn, "--rows", fmt.Sprint(waveRows), "--overdue", "0", "--progress", "0"},
		} {
			if out, err := execOut(e.bin, args...); err != nil {
				t.Fatalf("renderqueue %s (%s): %v\n%s", args[0], q.name, err, out)
			}
		}
		waveSQL(t, q.dsn, `UPDATE render_schedule SET due_at = now() + interval '20 hours'`)
		// every render of a row that was due: when it was due and when the completion was written
		waveSQL(t, q.dsn, `CREATE TABLE wave_renders (key text NOT NULL, due_at timestamptz NOT NULL,
			done_at timestamptz NOT NULL DEFAULT clock_timestamp())`)
		waveSQL(t, q.dsn, `CREATE FUNCTION wave_renders() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN IF OLD.due_at <= now() AND NEW.due_at IS DISTINCT FROM OLD.due_at THEN
			INSERT INTO wave_renders (key, due_at) VALUES (OLD.key, OLD.due_at); END IF; RETURN NULL; END $$`)
		waveSQL(t, q.dsn, `CREATE TRIGGER wave_renders AFTER UPDATE ON render_schedule FOR EACH ROW EXECUTE FUNCTION wave_renders()`)
		e.kubectl("-n", waveNS, "create", "secret", "generic", q.name+"-db", "--from-literal=dsn="+q.podDSN)
	}

	// 2. the queues, their workers (one each) and their HPAs
	for _, q := range queues {
		manifest := fmt.Sprintf(`apiVersion: renderqueue.dev/v1alpha1
kind: RenderQueue
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  shards: 1
  store: {secretRef: {name: %[1]s-db, key: dsn}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: %[1]s-workers, namespace: %[2]s}
spec:
  replicas: 1
  selector: {matchLabels: {app: %[1]s-workers}}
  template:
    metadata: {labels: {app: %[1]s-workers}}
    spec:
      securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
      initContainers:
      - name: warm-up
        image: %[8]q
        args: [sleep, %[9]q]
        securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
      containers:
      - name: worker
        image: %[3]q
        args: [worker-sim, "--dns=%[1]s-shards.%[2]s.svc:8080", --token-file=/var/run/renderqueue/token,
          "--concurrency=%[4]d", "--batch=%[4]d", "--render-time=%[5]s", --progress=0]
        securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
        volumeMounts:
        - {name: token, mountPath: /var/run/renderqueue, readOnly: true}
      volumes:
      - {name: token, secret: {secretName: %[1]s-api-token, items: [{key: token, path: token}]}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: %[1]s-workers, namespace: %[2]s}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: %[1]s-workers}
  minReplicas: 1
  maxReplicas: %[6]d
  metrics:%[7]s
`, q.name, waveNS, e.images.Renderqueue, waveWorkerCon, waveRender, waveMaxPods, q.metrics, e.images.Probe, waveWarmUp.String())
		if out, err := e.c.Kubectl(ctx, []byte(manifest), "apply", "-f", "-"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	// 3. the wave: every row due at one time (spread over waveSpread), waveLead from now
	wave := time.Now().Add(waveLead).Truncate(time.Millisecond)
	for _, q := range queues {
		waveSQL(t, q.dsn, fmt.Sprintf(`UPDATE render_schedule SET due_at = '%s'::timestamptz + random() * interval '%d milliseconds'`,
			wave.UTC().Format(time.RFC3339Nano), waveSpread.Milliseconds()))
	}
	t.Logf("%s the wave: %d rows a queue, due at %s (+%s); HPAs target %d rows a worker (%d workers), workers take %s to start and render %d rows at once, %s each",
		time.Now().Format("15:04:05.000"), waveRows, wave.Format("15:04:05.000"), waveLead, target, waveMaxPods, waveWarmUp, waveWorkerCon, waveRender)

	// 4. follow both worker Deployments until the wave is rendered (stepForecastWave)
	run.wave = wave
	for _, q := range queues {
		run.wg.Go(func() { q.follow(ctx, e, wave, run.done) })
	}
	e.wave = run
}

// stepForecastWave: a wave of rows that comes due at once, waveLead after it is written
// (stepForecastWaveStart, which this step runs first unless an earlier step did), on two queues
// alike but for their HPAs: one scales its render workers on renderqueue_due_forecast (horizon
// 15m, next to renderqueue_due: docs/autoscaling.md's recipe), the other on renderqueue_due
// alone. The forecast-driven HPA must have its workers up before the wave comes due, the
// due-driven one only after; both queues must render the whole wave. Each completion's lateness
// (completed − due, from a trigger on the table) is reported per queue: docs/autoscaling.md has
// the figures of a run of this step alone (E2E_STEPS=seed,install,ready,forecast-wave; in the
// whole test, the steps before it share the 2 cores while the wave drains).
func (e *env) stepForecastWave(t *testing.T) {
	if e.wave == nil {
		e.stepForecastWaveStart(t, t.Cleanup)
	}
	run := e.wave
	forecast, due, wave := run.forecast, run.due, run.wave
	queues := []*waveQueue{forecast, due}
	drained := func() (bool, string) {
		var parts []string
		ok := true
		for _, q := range queues {
			var rendered, left int64
			waveQuery(t, q.dsn, `SELECT (SELECT count(DISTINCT key) FROM wave_renders), (SELECT count(*) FROM render_schedule WHERE due_at <= now())`, &rendered, &left)
			q.mu.Lock()
			parts = append(parts, fmt.Sprintf("%s: %d rendered, %d due, %d workers ready", q.name, rendered, left, q.ready))
			q.mu.Unlock()
			ok = ok && rendered == waveRows && left == 0
		}
		return ok, strings.Join(parts, "; ")
	}
	e.eventually(t, waveTimeout, time.Second, "both queues to render the whole wave", drained)
	close(run.done)
	run.wg.Wait()
	run.cancel()

	// 5. what each side did
	for _, q := range queues {
		var n int64
		var p50, p95, peak float64
		waveQuery(t, q.dsn, `SELECT count(*),
			coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM done_at - due_at)), 0),
			coalesce(percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM done_at - due_at)), 0),
			coalesce(max(extract(epoch FROM done_at - due_at)), 0) FROM wave_renders`, &n, &p50, &p95, &peak)
		q.mu.Lock()
		full := "never"
		if !q.fullAt.IsZero() {
			full = fmt.Sprintf("%+.1fs", q.fullAt.Sub(wave).Seconds())
		}
		t.Logf("%s: %d workers ready when the wave came due, %d first ready at %s from it; %d renders, lateness p50 %.1fs, p95 %.1fs, peak %.1fs\n  %s",
			q.name, q.atWave, waveMaxPods, full, n, p50, p95, peak, strings.Join(q.timeline, "\n  "))
		q.mu.Unlock()
	}
	forecast.mu.Lock()
	defer forecast.mu.Unlock()
	due.mu.Lock()
	defer due.mu.Unlock()
	if forecast.fullAt.IsZero() || !forecast.fullAt.Before(wave) {
		e.errorf(t, "the forecast-driven HPA did not have its %d workers ready before the wave came due (at %s)", waveMaxPods, forecast.fullAt.Format("15:04:05.000"))
	}
	if due.atWave >= waveMaxPods {
		e.errorf(t, "the due-driven HPA had %d workers ready before the wave came due: nothing was due to scale on", due.atWave)
	}
	if due.fullAt.IsZero() || due.fullAt.Before(wave) {
		e.errorf(t, "the due-driven HPA's %d workers were ready at %s, want after the wave came due", waveMaxPods, due.fullAt.Format("15:04:05.000"))
	}
}

// follow records the ready replicas of q's worker Deployment every wavePoll until done or ctx ends.
func (q *waveQueue) follow(ctx context.Context, e *env, wave time.Time, done <-chan struct{}) {
	tick := time.NewTicker(wavePoll)
	defer tick.Stop()
	last := int32(-1)
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		d, err := e.c.Client.AppsV1().Deployments(waveNS).Get(ctx, q.name+"-workers", metav1.GetOptions{})
		if err != nil {
			continue
		}
		now := time.Now()
		q.mu.Lock()
		q.ready = d.Status.ReadyReplicas
		if now.Before(wave) {
			q.atWave = q.ready
		}
		if q.ready >= waveMaxPods && q.fullAt.IsZero() {
			q.fullAt = now
		}
		if q.ready != last {
			q.timeline = append(q.timeline, fmt.Sprintf("%s (%+.1fs from the wave) %d of %d workers ready (%d wanted)",
				now.Format("15:04:05.000"), now.Sub(wave).Seconds(), q.ready, d.Status.Replicas, *d.Spec.Replicas))
			last = q.ready
		}
		q.mu.Unlock()
	}
}

// waveSQL runs q on dsn, failing the test on error.
func waveSQL(t *testing.T, dsn, q string) {
	t.Helper()
	waveConn(t, dsn, q, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, q)
		return err
	})
}

// waveQuery scans the one row of q on dsn into dest, failing the test on error.
func waveQuery(t *testing.T, dsn, q string, dest ...any) {
	t.Helper()
	waveConn(t, dsn, q, func(ctx context.Context, conn *pgx.Conn) error { return conn.QueryRow(ctx, q).Scan(dest...) })
}

// waveConn runs f (the statement q) on a connection of its own to dsn, failing the test on error.
func waveConn(t *testing.T, dsn, q string, f func(context.Context, *pgx.Conn) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting to PostgreSQL: %v", err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if err := f(ctx, conn); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}
