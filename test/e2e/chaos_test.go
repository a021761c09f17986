//go:build e2e

package e2e

// TestChaos: faults in the middle of slot handoffs, with writers and render workers running
// throughout, on a cluster of its own (config/default as shipped, the operator Deployment scaled
// to two replicas with leader election).
//
// The cases, in the order of spec.shards 3→4→6→2→5:
//
//   - kill-giver-in-prepare (3→4): SIGKILL a shard that gives slots while the prepare is in flight;
//   - kill-receiver-in-walk (4→6): SIGKILL a receiving shard while it walks its incoming slots;
//   - kill-operator-in-handoff (6→2): SIGKILL the leading operator replica between prepare and
//     commit; the other replica (or the restarted one) takes the leader Lease over and finishes;
//   - restart-postgres-in-handoff (2→5): stop and start PostgreSQL during the prepare;
//   - rescale-in-flight (5→3→4→6→2→5): change spec.shards again while each handoff is in flight;
//
// and the faults of a real node (chaos_node_test.go):
//
//   - cut-keeper-from-postgres (5): a shard's Pod cut from PostgreSQL for 30 s or more (iptables in
//     its network namespace): reported inexact within 30 s, exact again after;
//   - cut-operator-from-shard-in-handoff (5→6): the leading operator cut from a giving shard for
//     30 s while the handoff prepares;
//   - restart-kubelet, restart-containerd (6): the keepers run on, the same processes;
//   - evict-shard (6): a shard Pod evicted through the Eviction API.
//
// A prepare is held in flight where a case needs it to be by an ACCESS EXCLUSIVE lock on
// render_schedule (a receiver's walk waits for it), taken before the change and released after
// the fault.
//
// Checks:
//   - quiescent samples: before and after every case, and between cases in the soak, writers and
//     workers are paused (nothing writes, no row crosses now: see chaosHorizon) and the queue,
//     once settled (no handoff in flight) and exact, must report the SQL count of due rows;
//   - every completion a worker saw acknowledged must be in PostgreSQL: an audit trigger (created
//     by the test) records every row version written, and each acknowledged completion's next
//     due time must be among its key's;
//   - no row is handed out twice at once: any two leases of one key that overlap in time fail
//     the test (leases travel with their slots through a handoff, and a keeper that took over
//     from a dead one holds its rows back: docs/design.md);
//   - no row is rendered twice: two acknowledged completions of one key from different leases
//     granted for the same due time (the same render asked for twice) fail the test. A render
//     of the row after a producer made it due again is a new render, not a duplicate, even
//     within its cadence: the writer does that on purpose.
//
// CHAOS_DURATION (a Go duration) loops the case mix until that much time has passed (`make soak
// DURATION=30m`); unset, the mix runs once (the CI version, about 3 minutes; TestChaosTLS's about
// 2). The summary is logged at the end and written to CHAOS_SUMMARY when set. CHAOS_CASES
// (comma-separated names) runs only those cases. The operator polls its shards every 2 s here
// (chaosShardPoll).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	rqv1 "github.com/renderqueue/renderqueue/api/v1alpha1"
	"github.com/renderqueue/renderqueue/pkg/client"
	"github.com/renderqueue/renderqueue/pkg/client/discovery/kube"
	"github.com/renderqueue/renderqueue/pkg/schedule"
)

const (
	chaosRows      = 20000
	chaosOverdue   = 1500
	chaosLease     = 30 * time.Second
	chaosWorkers   = 4
	chaosBatch     = 5
	leaderLease    = "renderqueue-operator.renderqueue.dev"
	sampleTimeout  = 90 * time.Second
	settleTimeout  = 4 * time.Minute
	preparePoll    = 100 * time.Millisecond
	prepareTimeout = 2 * time.Minute
	// chaosShardPoll is the operator's --shard-poll-interval in the chaos runs (the chart's
	// operator.shardPollInterval; a patch of the kustomize install's argument): the status
	// follows the shards within 2 s rather than the shipped 10 s, so that a sample, which waits
	// for the status to reach the SQL count, waits seconds rather than up to a poll (about 20
	// samples a CI run). Nothing the chaos checks depends on the interval's length.
	chaosShardPoll = "2s"
	// chaosShardPollSet is the Helm value that sets it (install and upgrade alike: helm upgrade
	// without --reuse-values starts again from the chart's values).
	chaosShardPollSet = "operator.shardPollInterval=" + chaosShardPoll
)

// chaosHorizon: no row is due between now − 10 minutes and now + the horizon when the test
// starts, and nothing the test writes lands there, so no row crosses now while the test runs and
// the SQL count of due rows changes only by writes.
func chaosHorizon(d time.Duration) time.Duration { return max(3*time.Hour, d+time.Hour) }

type ackRec struct {
	key     string
	nextDue time.Time
	lease   string
}

type leaseRec struct {
	lease   string
	shard   string
	due     time.Time // the row's due time the lease was granted for: which render it is
	claimed time.Time
	expires time.Time
	ended   time.Time // acknowledged or refused (when the answer came); zero: ran out
	endSent time.Time // when the completion that was acknowledged or refused was sent
	outcome string    // "acknowledged", the shard's reason for refusing, or "" (never answered)
}

type sampleRec struct {
	n      int
	why    string
	sqlDue int64
	moved  int64 // the SQL count when the pause began minus sqlDue: writes that landed paused
	waited time.Duration
	epoch  int64
	shards int32
}

// chaosCase is one fault; run returns its outcome for the summary.
type chaosCase struct {
	name string
	run  func(t *testing.T) string
}

type caseRec struct {
	round   int
	name    string
	shards  string
	outcome string
	took    time.Duration
}

// chaos is TestChaos's state: the load (writers, workers) and what it recorded.
type chaos struct {
	e       *env
	tls     bool   // spec.tls OperatorIssued
	opNS    string // the operator's namespace: config/default's, or config/samples/namespace's with tls
	pool    *pgxpool.Pool
	horizon time.Duration
	gate    sync.RWMutex // writers and workers hold it shared per request; a sample takes it
	stop    atomic.Bool
	wg      sync.WaitGroup
	cl      *client.Client
	hc      *http.Client // the workers' HTTP client (TLS with the shards' CA under ch.tls)

	// What setup installs with Helm: TestUpgrade's is the previous version's (upgrade_test.go).
	migrateBin string   // the renderqueue binary that migrates the schema; empty: the test's
	chart      string   // the chart's directory; empty: charts/renderqueue
	helmArgs   []string // more arguments for helm install

	mu         sync.Mutex
	keys       []string
	acks       []ackRec
	leases     map[string][]*leaseRec
	refused    map[string]int
	res        *resources // the processes' resources over time (resources_test.go)
	unanswered int
	claimed    int
	writes     int
	writeErrs  int
	samples    []sampleRec
	cases      []caseRec
}

// TestChaos runs the case mix with the shards' API over plain HTTP.
func TestChaos(t *testing.T) { runChaos(t, false, nil) }

// soakOnly are cases left out of the single CI round (TestChaos and TestChaosTLS without
// CHAOS_DURATION or CHAOS_CASES) because they still find a fault in the product, which must not
// block every other change until it is fixed; `make soak` and CHAOS_CASES run them. None today.
//
// cut-keeper-from-postgres was here until 2026-12-06: a sample after it found the queue exact
// with one claim's rows (5) fewer than the SQL count read when the sample paused. The keeper was
// right: a completion sent into the partition was retransmitted by the kernel after the network
// came back, ~50 s after it was sent and long after the worker had given up on it (20 s), and it
// landed while the sample was paused; the sample compared the status with a count taken before.
// The sample now reads the count at every poll (and reports a count that moved), and the store's
// connections carry TCP_USER_TIMEOUT (pkg/store/postgres, dialer), so each attempt of such a write
// lands within 15 s of being sent or never (the store's one retry on another connection can still
// land later than a worker's 20 s: the 2-hour soak saw it once in 27 partitions, reported as a moved
// sample).
var soakOnly []string

// tlsCases are the cases TestChaosTLS runs unless CHAOS_CASES says otherwise: a handoff fault and
// every fault of the node (the rest of the mix differs from TestChaos's only in the transport, and
// the two runs together must stay within CI's time).
var tlsCases = []string{"kill-giver-in-prepare", "cut-keeper-from-postgres", "cut-operator-from-shard-in-handoff", "restart-kubelet", "restart-containerd", "evict-shard"}

// TestChaosTLS is TestChaos with the shards' API over HTTPS (spec.tls OperatorIssued): the
// workers, the operator's polls and the handoff all go over TLS. The operator is installed into
// platform-rq with a plain kustomize namespace: overlay (config/samples/namespace), and the
// external metric is read through the aggregator there.
func TestChaosTLS(t *testing.T) { runChaos(t, true, tlsCases) }

func runChaos(t *testing.T, tls bool, only []string) {
	e := startEnv(t)
	var duration time.Duration
	if d := os.Getenv("CHAOS_DURATION"); d != "" {
		var err error
		if duration, err = time.ParseDuration(d); err != nil || duration <= 0 {
			t.Fatalf("CHAOS_DURATION=%q: want a positive Go duration such as 30m", d)
		}
	}
	// TestChaos installs the operator with Helm (charts/renderqueue) into a namespace of its own,
	// TestChaosTLS with a kustomize namespace: overlay (config/samples/namespace)
	ch := &chaos{e: e, tls: tls, opNS: helmNS, horizon: chaosHorizon(duration), leases: map[string][]*leaseRec{}, refused: map[string]int{}}
	if tls {
		ch.opNS = overlayNS
	}
	step := func(name string, f func(t *testing.T)) { e.runSteps(t, []envStep{{name, f}}) }
	t.Cleanup(func() {
		if ch.pool != nil {
			ch.pool.Close()
		}
	})
	step("setup", ch.setup)
	t.Cleanup(ch.stopLoad) // before the pool closes and the cluster stops
	step("load", ch.startLoad)
	ch.startResources(t) // what grows: samples at the start, every 5 minutes and at the end
	t.Cleanup(func() {
		if ch.res != nil {
			ch.res.halt(nil) // a test that failed before verify: no last sample
		}
	})
	step("sample-initial", func(t *testing.T) { ch.sample(t, "initial, 3 shards") })

	cases := []chaosCase{
		{"kill-giver-in-prepare", ch.caseKillGiver},
		{"kill-receiver-in-walk", ch.caseKillReceiver},
		{"kill-operator-in-handoff", ch.caseKillOperator},
		{"restart-postgres-in-handoff", ch.caseRestartPostgres},
		{"rescale-in-flight", ch.caseRescaleInFlight},
		{"cut-keeper-from-postgres", ch.caseCutKeeperFromPostgres},
		{"cut-operator-from-shard-in-handoff", ch.caseCutOperatorFromShard},
		{"restart-kubelet", ch.caseRestartKubelet},
		{"restart-containerd", ch.caseRestartContainerd},
		{"evict-shard", ch.caseEvictShard},
	}
	if env := os.Getenv("CHAOS_CASES"); env != "" { // a comma-separated subset, in the mix's order
		only = strings.Split(env, ",")
	} else if duration == 0 {
		// The CI's single round leaves out the cases that still find a fault in the product (see
		// soakOnly); the soak and CHAOS_CASES run them.
		cases = slices.DeleteFunc(cases, func(c chaosCase) bool { return slices.Contains(soakOnly, c.name) })
	}
	if only != nil {
		cases = slices.DeleteFunc(cases, func(c chaosCase) bool { return !slices.Contains(only, c.name) })
		if len(cases) == 0 {
			t.Fatalf("the cases %q name none of the mix's", only)
		}
	}
	start := time.Now()
	// The soak ends after the case during which CHAOS_DURATION ran out, not at the end of its round
	// (a round of the whole mix takes about 8 minutes).
rounds:
	for round := 1; ; round++ {
		for _, c := range cases {
			if duration > 0 && time.Since(start) >= duration {
				break rounds
			}
			from := e.queue().Spec.Shards
			began := time.Now()
			var outcome string
			step(fmt.Sprintf("round-%d/%s", round, c.name), func(t *testing.T) {
				outcome = c.run(t)
				ch.sample(t, "after "+c.name)
			})
			ch.mu.Lock()
			ch.cases = append(ch.cases, caseRec{round: round, name: c.name, outcome: outcome, took: time.Since(began),
				shards: fmt.Sprintf("%d→%d", from, e.queue().Spec.Shards)})
			ch.mu.Unlock()
		}
		if duration == 0 || time.Since(start) >= duration {
			break
		}
		// between rounds in the soak: the load alone, sampled
		for i := 0; i < 3; i++ {
			time.Sleep(5 * time.Second) // load runs between samples: what the soak is for
			step(fmt.Sprintf("round-%d/sample-%d", round, i+1), func(t *testing.T) { ch.sample(t, "between rounds") })
		}
	}
	step("verify", ch.verify)
}

// setup seeds the schedule and the audit trigger, installs config/default with two operator
// replicas, and applies a 3-shard RenderQueue; it waits until the queue is exact.
func (ch *chaos) setup(t *testing.T) {
	e := ch.e
	dsn := e.c.Postgres.DSN
	for _, args := range [][]string{
		{"schema", "migrate", "--dsn", dsn},
		{"seed", "--dsn", dsn, "--rows", fmt.Sprint(chaosRows), "--overdue", fmt.Sprint(chaosOverdue), "--progress", "0"},
	} {
		if out, err := execOut(or(ch.migrateBin, e.bin), args...); err != nil {
			ch.e.fatalf(t, "renderqueue %s: %v\n%s", args[0], err, out)
		}
	}
	e.sql(fmt.Sprintf(`UPDATE render_schedule SET due_at = now() + interval '%d seconds'
		WHERE due_at > now() - interval '10 minutes' AND due_at <= now() + interval '%d seconds'`,
		int(ch.horizon.Seconds()), int(ch.horizon.Seconds())))
	// every row version written, with its due time: what an acknowledged completion must be among
	e.sql(`CREATE TABLE chaos_audit (key text COLLATE "C" NOT NULL, due_at timestamptz, rev bigint NOT NULL,
		at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	e.sql(`CREATE FUNCTION chaos_audit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO chaos_audit (key, due_at, rev) VALUES (NEW.key, NEW.due_at, NEW.rev); RETURN NULL; END $$`)
	e.sql(`CREATE TRIGGER chaos_audit AFTER INSERT OR UPDATE ON render_schedule FOR EACH ROW EXECUTE FUNCTION chaos_audit()`)
	var err error
	if ch.pool, err = pgxpool.New(context.Background(), dsn); err != nil {
		ch.e.fatalf(t, "connecting to PostgreSQL: %v", err)
	}
	rows, err := ch.pool.Query(context.Background(), `SELECT key FROM render_schedule`)
	if err != nil {
		ch.e.fatalf(t, "%v", err)
	}
	if ch.keys, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		ch.e.fatalf(t, "%v", err)
	}
	t.Logf("seeded %d rows, %d due; audit trigger on render_schedule", len(ch.keys), e.sqlDue())

	// Neither in renderqueue-system: the operator must find its Secrets and Service in its own
	// namespace, and the metrics API its grants (checked below). TestChaos installs as a Helm
	// user does (helm install into a new namespace, default values), TestChaosTLS as a user with
	// a plain kustomize namespace: overlay.
	if ch.tls {
		install := filepath.Join("config", "samples", "namespace")
		e.kubectl("create", "namespace", ch.opNS)
		out := e.kubectl("apply", "--server-side", "-k", filepath.Join(e.root, install))
		t.Logf("kubectl apply --server-side -k %s:\n%s", install, out)
		ch.patchShardPoll(t)
	} else {
		chart := or(ch.chart, filepath.Join(e.root, "charts", "renderqueue"))
		args := append([]string{"install", "renderqueue", chart, "--namespace", ch.opNS, "--create-namespace",
			"--set", chaosShardPollSet}, ch.helmArgs...)
		out, err := execOut(ch.helm(t), append(args, "--kubeconfig", e.c.Kubeconfig)...)
		if err != nil {
			ch.e.fatalf(t, "helm install: %v\n%s", err, out)
		}
		t.Logf("helm %s:\n%s", strings.Join(args, " "), out)
	}
	e.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/renderqueues.renderqueue.dev")
	e.kubectl("-n", ch.opNS, "scale", "deployment/renderqueue-operator", "--replicas=2")
	e.kubectl("-n", namespace, "create", "secret", "generic", storeSecret, "--from-literal=dsn="+e.c.Postgres.PodDSN)
	e.kubectl("-n", ch.opNS, "rollout", "status", "deployment/renderqueue-operator", "--timeout=150s")
	manifest := fmt.Sprintf(`apiVersion: renderqueue.dev/v1alpha1
kind: RenderQueue
metadata: {name: %s, namespace: %s}
spec:
  shards: 3
  window: 24h
  verifyInterval: 60m
  leaseDuration: %s
  store: {secretRef: {name: %s, key: dsn}}
`, queueName, namespace, chaosLease, storeSecret)
	if ch.tls {
		manifest += "  tls: {mode: OperatorIssued}\n"
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := e.c.Kubectl(ctx, []byte(manifest), "apply", "-f", "-"); err != nil {
		ch.e.fatalf(t, "%v\n%s", err, out)
	}
	e.kubectl("wait", "--for=condition=Ready", "--timeout=120s", "renderqueue/"+queueName)
	e.exactAndTrue(2*time.Minute, 3)
	ch.checkMetricsAPI(t)
	holder, pod := ch.leader(t)
	t.Logf("operator leader %s (pod %s); kubectl get pods -A:\n%s", holder, pod, e.kubectl("get", "pods", "-A", "-o", "wide"))
}

// patchShardPoll sets the kustomize install's --shard-poll-interval to chaosShardPoll.
func (ch *chaos) patchShardPoll(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dep, err := ch.e.c.Client.AppsV1().Deployments(ch.opNS).Get(ctx, "renderqueue-operator", metav1.GetOptions{})
	if err != nil {
		ch.e.fatalf(t, "reading the operator Deployment: %v", err)
	}
	i := slices.IndexFunc(dep.Spec.Template.Spec.Containers[0].Args, func(a string) bool { return strings.HasPrefix(a, "--shard-poll-interval=") })
	if i < 0 {
		ch.e.fatalf(t, "the operator Deployment's first container has no --shard-poll-interval argument: %q", dep.Spec.Template.Spec.Containers[0].Args)
	}
	patch := fmt.Sprintf(`[{"op":"replace","path":"/spec/template/spec/containers/0/args/%d","value":"--shard-poll-interval=%s"}]`, i, chaosShardPoll)
	ch.e.kubectl("-n", ch.opNS, "patch", "deployment", "renderqueue-operator", "--type=json", "-p", patch)
}

// helm is the helm binary: RENDERQUEUE_HELM (hack/test.sh's), else what hack/helm.sh finds or
// builds.
func (ch *chaos) helm(t *testing.T) string {
	if h := os.Getenv("RENDERQUEUE_HELM"); h != "" {
		return h
	}
	out, err := execOut(filepath.Join(ch.e.root, "hack", "helm.sh"))
	if err != nil {
		ch.e.fatalf(t, "hack/helm.sh: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

func execOut(bin string, args ...string) (string, error) {
	out, err := exec.Command(bin, args...).CombinedOutput()
	return string(out), err
}

// startLoad starts the writer and the render workers; stopLoad (at the end of the test) stops
// them and waits for their last completions.
func (ch *chaos) startLoad(t *testing.T) {
	e := ch.e
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sec, err := e.c.Client.CoreV1().Secrets(namespace).Get(ctx, queueName+"-api-token", metav1.GetOptions{})
	if err != nil {
		ch.e.fatalf(t, "reading the API token: %v", err)
	}
	disc, err := kube.RenderQueue(e.c.RESTConfig, namespace, queueName)
	if err != nil {
		ch.e.fatalf(t, "%v", err)
	}
	hc := &http.Client{Timeout: 15 * time.Second}
	if ch.tls {
		e.checkShardsServeTLS(t)
		cm, err := e.c.Client.CoreV1().ConfigMaps(namespace).Get(ctx, rqv1.ShardCAConfigMapName(queueName), metav1.GetOptions{})
		if err != nil {
			ch.e.fatalf(t, "reading the shard CA: %v", err)
		}
		if hc, err = client.NewHTTPClient(client.TLSOptions{CAPEM: []byte(cm.Data["ca.crt"]), ServerName: rqv1.ShardServerName(namespace, queueName)}); err != nil {
			ch.e.fatalf(t, "%v", err)
		}
		hc.Timeout = 15 * time.Second
	}
	ch.hc = hc
	cl, err := client.New(client.Options{Discovery: disc, Token: string(sec.Data["token"]), Batch: chaosBatch, HTTPClient: hc})
	if err != nil {
		ch.e.fatalf(t, "%v", err)
	}
	ch.cl = cl
	for i := range chaosWorkers {
		ch.wg.Go(func() { ch.worker(i) })
	}
	ch.wg.Go(ch.writer)
	t.Logf("load started: %d workers (claims of %d, lease %s), 1 writer", chaosWorkers, chaosBatch, chaosLease)
}

func (ch *chaos) stopLoad() {
	if ch.stop.Swap(true) || ch.cl == nil {
		return
	}
	ch.wg.Wait()
	_ = ch.cl.Close()
}

// pause sleeps d unless the load is stopping.
func (ch *chaos) pause(d time.Duration) {
	deadline := time.Now().Add(d)
	for !ch.stop.Load() && time.Now().Before(deadline) {
		time.Sleep(min(50*time.Millisecond, time.Until(deadline)))
	}
}

// worker claims rows, "renders" them (a few milliseconds) and completes them with a next due
// time of its own choosing beyond the horizon, recording every claim and every answer.
func (ch *chaos) worker(id int) {
	rng := rand.New(rand.NewPCG(uint64(id), uint64(time.Now().UnixNano())))
	for !ch.stop.Load() {
		ch.gate.RLock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		items, err := ch.cl.Claim(ctx, chaosBatch)
		cancel()
		ch.gate.RUnlock()
		if err != nil || len(items) == 0 {
			ch.pause(200 * time.Millisecond)
			continue
		}
		now := time.Now()
		ch.mu.Lock()
		ch.claimed += len(items)
		for _, it := range items {
			ch.leases[it.Key] = append(ch.leases[it.Key], &leaseRec{lease: it.Lease, shard: it.Shard, due: it.Due, claimed: now, expires: it.LeaseExpires})
		}
		ch.mu.Unlock()
		// the render: slow enough that the writer keeps a backlog of due rows (the workers complete
		// about as many rows a second as the writer makes due), so samples compare real counts
		time.Sleep(time.Duration(800+rng.IntN(800)) * time.Millisecond)
		done := make([]client.Completion, len(items))
		for i, it := range items {
			// unique to the millisecond per key in practice, beyond the horizon (never due in the test)
			next := time.Now().Add(ch.horizon + time.Hour + time.Duration(rng.Int64N(int64(time.Hour)))).Truncate(time.Millisecond)
			done[i] = client.Completion{Item: it, NextDue: next}
		}
		ch.complete(done)
	}
}

// complete sends completions, retrying those whose request was not answered (a 503, a
// connection error) with the same lease, as pkg/client's Run does; it records each answer.
func (ch *chaos) complete(done []client.Completion) {
	for attempt := 0; attempt < 5 && len(done) > 0; attempt++ {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * 500 * time.Millisecond)
		}
		ch.gate.RLock()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		sent := time.Now()
		res, _ := ch.cl.Complete(ctx, done)
		cancel()
		ch.gate.RUnlock()
		now := time.Now()
		var again []client.Completion
		ch.mu.Lock()
		for i, err := range res {
			d := done[i]
			var ie *client.ItemError
			switch {
			case err == nil:
				ch.acks = append(ch.acks, ackRec{key: d.Item.Key, nextDue: d.NextDue, lease: d.Item.Lease})
				ch.endLease(d.Item, sent, now, "acknowledged")
			case errors.As(err, &ie):
				ch.refused[ie.Reason]++
				ch.endLease(d.Item, sent, now, "refused: "+ie.Reason)
			default:
				again = append(again, d)
			}
		}
		ch.mu.Unlock()
		done = again
	}
	ch.mu.Lock()
	ch.unanswered += len(done)
	ch.mu.Unlock()
}

// endLease records the answer to the completion under it's lease, sent at sent and answered at.
func (ch *chaos) endLease(it client.Item, sent, at time.Time, outcome string) {
	for _, l := range ch.leases[it.Key] {
		if l.lease == it.Lease && l.shard == it.Shard {
			l.endSent, l.ended, l.outcome = sent, at, outcome
		}
	}
}

// writer is a producer: it makes rows due, pushes rows beyond the horizon, inserts new rows
// (due or not), deletes rows and flips urgent, about 20 writes a second.
func (ch *chaos) writer() {
	rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	n := 0
	for !ch.stop.Load() {
		ch.mu.Lock()
		key := ch.keys[rng.IntN(len(ch.keys))]
		ch.mu.Unlock()
		var q string
		var args []any
		switch p := rng.IntN(100); {
		case p < 55: // due now: a row to render
			q, args = `UPDATE render_schedule SET due_at = now() - make_interval(secs => $2) WHERE key = $1`, []any{key, 60 + rng.IntN(3600)}
		case p < 70: // not due for a long time
			q, args = `UPDATE render_schedule SET due_at = now() + make_interval(secs => $2) WHERE key = $1`, []any{key, int(ch.horizon.Seconds()) + 3*3600 + rng.IntN(3600)}
		case p < 90: // a new row, due or not
			n++
			key = fmt.Sprintf("https://chaos.example/%d/%d", time.Now().UnixNano(), n)
			secs := -(60 + rng.IntN(3600))
			if rng.IntN(2) == 0 {
				secs = int(ch.horizon.Seconds()) + 3*3600 + rng.IntN(3600)
			}
			q, args = `INSERT INTO render_schedule (key, due_at, cadence_ms, source) VALUES ($1, now() + make_interval(secs => $2), 3600000, 'submitted')`, []any{key, secs}
		case p < 95:
			q, args = `DELETE FROM render_schedule WHERE key = $1`, []any{key}
		default:
			q, args = `UPDATE render_schedule SET urgent = NOT urgent WHERE key = $1`, []any{key}
		}
		ch.gate.RLock()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		_, err := ch.pool.Exec(ctx, q, args...)
		cancel()
		ch.gate.RUnlock()
		ch.mu.Lock()
		if err != nil {
			ch.writeErrs++
		} else {
			ch.writes++
			if strings.HasPrefix(q, "INSERT") {
				ch.keys = append(ch.keys, key)
			}
		}
		ch.mu.Unlock()
		ch.pause(50 * time.Millisecond)
	}
}

// sample pauses the writers and workers, counts the due rows in SQL and waits for the queue to
// be settled (no handoff in flight), exact and equal to that count.
func (ch *chaos) sample(t *testing.T, why string) {
	ch.gate.Lock()
	defer ch.gate.Unlock()
	paused := time.Now()
	// The SQL count is read again at every poll: a request a worker abandoned (its 20 s ran out)
	// may still be written after the pause began, e.g. a completion whose packets a partition
	// held until the network came back. The keeper must follow the table then, so the status is
	// compared with the count as it is now, and how much it moved is reported.
	first := ch.sqlDue(t)
	want := first
	var st rqv1.RenderQueueStatus
	ch.e.eventually(t, sampleTimeout, 250*time.Millisecond, fmt.Sprintf("sample %q: the queue settled, exact and at the SQL count (%d when paused)", why, first), func() (bool, string) {
		want = ch.sqlDue(t)
		st = ch.e.queue().Status
		return !st.Membership.HandoffInProgress() && st.DueExact && st.Due == want && st.ReadyShards == st.CurrentShards,
			fmt.Sprintf("due=%d SQL=%d exact=%v handoff=%s ready=%d/%d; %s", st.Due, want, st.DueExact, handoffString(st.Membership.Handoff), st.ReadyShards, st.CurrentShards, conds(st.Conditions))
	})
	ch.mu.Lock()
	s := sampleRec{n: len(ch.samples) + 1, why: why, sqlDue: want, moved: first - want, waited: time.Since(paused), epoch: st.Membership.Epoch, shards: st.CurrentShards}
	ch.samples = append(ch.samples, s)
	ch.mu.Unlock()
	if s.moved != 0 {
		t.Logf("sample %d (%s): the SQL count moved from %d to %d while paused: a request abandoned before the pause was written during it", s.n, why, first, want)
	}
	t.Logf("sample %d (%s): due %d = SQL, %d shards, epoch %d, after %s paused", s.n, why, want, s.shards, s.epoch, s.waited.Round(100*time.Millisecond))
}

func (ch *chaos) sqlDue(t *testing.T) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n int64
	if err := ch.pool.QueryRow(ctx, `SELECT count(*) FROM render_schedule WHERE due_at <= now()`).Scan(&n); err != nil {
		ch.e.fatalf(t, "counting due rows: %v", err)
	}
	return n
}

// lockTable takes an ACCESS EXCLUSIVE lock on render_schedule, so every walk (and every write)
// waits: a prepare stays in flight while it is held. unlock is idempotent.
func (ch *chaos) lockTable(t *testing.T) (unlock func()) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, ch.e.c.Postgres.DSN)
	if err != nil {
		ch.e.fatalf(t, "connecting to PostgreSQL: %v", err)
	}
	if _, err := conn.Exec(ctx, `BEGIN; LOCK TABLE render_schedule IN ACCESS EXCLUSIVE MODE`); err != nil {
		_ = conn.Close(ctx)
		ch.e.fatalf(t, "locking render_schedule: %v", err)
	}
	var once sync.Once
	unlock = func() {
		once.Do(func() {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, _ = conn.Exec(cctx, `ROLLBACK`)
			_ = conn.Close(cctx)
		})
	}
	t.Cleanup(unlock)
	return unlock
}

// scale sets spec.shards.
func (ch *chaos) scale(n int) {
	ch.e.kubectl("scale", "renderqueue", queueName, fmt.Sprintf("--replicas=%d", n))
}

// waitPreparing waits for a handoff in its prepare phase with a prepare epoch above after and
// returns the status that shows it.
func (ch *chaos) waitPreparing(t *testing.T, after int64) rqv1.RenderQueueStatus {
	var st rqv1.RenderQueueStatus
	ch.e.eventually(t, prepareTimeout, preparePoll, fmt.Sprintf("a prepare above epoch %d", after), func() (bool, string) {
		st = ch.e.queue().Status
		h := st.Membership.Handoff
		return h != nil && h.State == rqv1.HandoffPreparing && h.PrepareEpoch > after,
			fmt.Sprintf("epoch=%d handoff=%s; %s", st.Membership.Epoch, handoffString(h), conds(st.Conditions))
	})
	return st
}

// waitHandoff waits for a handoff with a prepare epoch above after, either in its prepare
// (preparing true) or already finished, its prepare never seen; it returns the status that shows
// it.
func (ch *chaos) waitHandoff(t *testing.T, after int64) (st rqv1.RenderQueueStatus, preparing bool) {
	ch.e.eventually(t, prepareTimeout, preparePoll, fmt.Sprintf("a handoff above epoch %d", after), func() (bool, string) {
		st = ch.e.queue().Status
		h := st.Membership.Handoff
		return h != nil && h.PrepareEpoch > after,
			fmt.Sprintf("epoch=%d handoff=%s; %s", st.Membership.Epoch, handoffString(h), conds(st.Conditions))
	})
	return st, st.Membership.Handoff.State == rqv1.HandoffPreparing
}

func handoffString(h *rqv1.HandoffStatus) string {
	if h == nil {
		return "none"
	}
	return fmt.Sprintf("%s from epoch %d (prepare %d, final %d)", h.State, h.FromEpoch, h.PrepareEpoch, h.FinalEpoch)
}

// waitSettled waits until the queue runs n ready shards with the membership settled and exact.
func (ch *chaos) waitSettled(t *testing.T, n int) rqv1.RenderQueueStatus {
	var st rqv1.RenderQueueStatus
	ch.e.eventually(t, settleTimeout, 500*time.Millisecond, fmt.Sprintf("the queue settled at %d shards", n), func() (bool, string) {
		st = ch.e.queue().Status
		return !st.Membership.HandoffInProgress() && int(st.CurrentShards) == n && int(st.ReadyShards) == n &&
				len(st.Membership.Assignment) == n && st.DueExact,
			fmt.Sprintf("current=%d ready=%d assignment=%d exact=%v handoff=%s; %s", st.CurrentShards,
				st.ReadyShards, len(st.Membership.Assignment), st.DueExact, handoffString(st.Membership.Handoff), conds(st.Conditions))
	})
	return st
}

// roles are the givers and receivers of the handoff in st.
func (ch *chaos) roles(t *testing.T, st rqv1.RenderQueueStatus) (givers, receivers []string) {
	owned := map[string]schedule.SlotSet{}
	for _, a := range st.Membership.Assignment {
		s, err := schedule.ParseSlots(a.Slots)
		if err != nil {
			ch.e.fatalf(t, "slots of %s: %v", a.Shard, err)
		}
		owned[a.Shard] = s
	}
	give := map[string]bool{}
	for _, in := range st.Membership.Incoming {
		s, err := schedule.ParseSlots(in.Slots)
		if err != nil {
			ch.e.fatalf(t, "incoming slots of %s: %v", in.Shard, err)
		}
		if s.Len() == 0 {
			continue
		}
		receivers = append(receivers, in.Shard)
		for name, o := range owned {
			for _, sl := range s.Slots() {
				if o.Has(sl) {
					give[name] = true
					break
				}
			}
		}
	}
	for g := range give {
		givers = append(givers, g)
	}
	sort.Strings(givers)
	sort.Strings(receivers)
	return givers, receivers
}

func (ch *chaos) kill(t *testing.T, ns, pod string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pid, err := ch.e.c.Node.KillContainer(ctx, ns, pod, "", syscall.SIGKILL)
	if err != nil {
		ch.e.fatalf(t, "kill -9 %s/%s: %v", ns, pod, err)
	}
	return pid
}

// caseKillGiver: 3→4; SIGKILL a giving shard while the prepare is in flight.
func (ch *chaos) caseKillGiver(t *testing.T) string {
	before := ch.e.queue().Status.Membership.Epoch
	unlock := ch.lockTable(t)
	ch.scale(4)
	st := ch.waitPreparing(t, before)
	givers, receivers := ch.roles(t, st)
	if len(givers) == 0 {
		ch.e.fatalf(t, "the prepare at epoch %d has no giver", st.Membership.Handoff.PrepareEpoch)
	}
	victim := givers[len(givers)-1]
	pid := ch.kill(t, namespace, victim)
	still := handoffString(ch.e.queue().Status.Membership.Handoff)
	unlock()
	t.Logf("prepare epoch %d (givers %v → receivers %v): killed giver %s (pid %d); handoff after the kill: %s",
		st.Membership.Handoff.PrepareEpoch, givers, receivers, victim, pid, still)
	end := ch.waitSettled(t, 4)
	return fmt.Sprintf("killed giver %s during prepare epoch %d (handoff %s at the kill); handoff %s, epoch %d",
		victim, st.Membership.Handoff.PrepareEpoch, still, handoffString(end.Membership.Handoff), end.Membership.Epoch)
}

// caseKillReceiver: 4→6; SIGKILL a receiving shard while it walks its incoming slots (the walk
// waits on the table lock, and its /v1/status says it is walking).
func (ch *chaos) caseKillReceiver(t *testing.T) string {
	before := ch.e.queue().Status.Membership.Epoch
	unlock := ch.lockTable(t)
	ch.scale(6)
	st := ch.waitPreparing(t, before)
	_, receivers := ch.roles(t, st)
	if len(receivers) == 0 {
		ch.e.fatalf(t, "the prepare at epoch %d has no receiver", st.Membership.Handoff.PrepareEpoch)
	}
	victim := receivers[len(receivers)-1]
	url := ""
	for _, s := range st.Shards {
		if s.Name == victim {
			url = s.URL
		}
	}
	walking := "no status"
	ch.e.eventually(t, 30*time.Second, 50*time.Millisecond, victim+" walking its incoming slots", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		ss, err := client.GetStatus(ctx, ch.hc, url)
		if err != nil {
			return false, err.Error()
		}
		walking = fmt.Sprintf("walkingSince=%v incoming=%q preparedEpoch=%d epoch=%d", ss.WalkingSince, ss.Membership.Incoming, ss.Membership.PreparedEpoch, ss.Membership.Epoch)
		return ss.WalkingSince != nil && ss.Membership.Incoming != "" && ss.Membership.PreparedEpoch < st.Membership.Handoff.PrepareEpoch, walking
	})
	pid := ch.kill(t, namespace, victim)
	unlock()
	t.Logf("prepare epoch %d (receivers %v): killed receiver %s (pid %d) in its walk (%s)", st.Membership.Handoff.PrepareEpoch, receivers, victim, pid, walking)
	end := ch.waitSettled(t, 6)
	return fmt.Sprintf("killed receiver %s in its walk of prepare epoch %d; handoff %s, epoch %d",
		victim, st.Membership.Handoff.PrepareEpoch, handoffString(end.Membership.Handoff), end.Membership.Epoch)
}

// checkMetricsAPI reads renderqueue_due through the aggregator (the APIService, its Service in
// the operator's namespace, kube-proxy, the operator Pod) and wants the SQL count: the metrics
// API works where the operator was installed, its certificate Secret and Service found in its
// own namespace and the aggregator's settings read with its grants.
func (ch *chaos) checkMetricsAPI(t *testing.T) {
	e := ch.e
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := e.c.WaitAPIServiceAvailable(ctx, "external.metrics.k8s.io", "v1beta1", 60*time.Second); err != nil {
		e.fatalf(t, "%v", err)
	}
	svc := e.kubectl("get", "apiservice", "v1beta1.external.metrics.k8s.io", "-o", "jsonpath={.spec.service.namespace}/{.spec.service.name}")
	if want := ch.opNS + "/" + metricsAPISvc; svc != want {
		e.fatalf(t, "the APIService points at %q, want %s", svc, want)
	}
	due := e.sqlDue()
	e.eventually(t, 30*time.Second, 500*time.Millisecond, "renderqueue_due through the aggregator", func() (bool, string) {
		out, err := e.c.Kubectl(ctx, nil, "get", "--raw", metricPath("renderqueue_due"))
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(out, fmt.Sprintf(`"value":"%d"`, due)), out
	})
	t.Logf("renderqueue_due %d through the APIService, Service %s and the operator in namespace %s", due, svc, ch.opNS)
}

// leader returns the holder of the operator's leader Lease and its Pod's name.
func (ch *chaos) leader(t *testing.T) (holder, pod string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := ch.e.c.Client.CoordinationV1().Leases(ch.opNS).Get(ctx, leaderLease, metav1.GetOptions{})
	if err != nil {
		ch.e.fatalf(t, "reading the leader Lease: %v", err)
	}
	if l.Spec.HolderIdentity == nil {
		return "", ""
	}
	holder = *l.Spec.HolderIdentity
	pod, _, _ = strings.Cut(holder, "_")
	return holder, pod
}

// caseKillOperator: 6→2; SIGKILL the leading operator replica between prepare and commit; another
// operator process takes the Lease over and finishes the handoff.
func (ch *chaos) caseKillOperator(t *testing.T) string {
	before := ch.e.queue().Status.Membership.Epoch
	unlock := ch.lockTable(t)
	ch.scale(2)
	st := ch.waitPreparing(t, before)
	holder, pod := ch.leader(t)
	if pod == "" {
		ch.e.fatalf(t, "no operator holds the leader Lease")
	}
	pid := ch.kill(t, ch.opNS, pod)
	t.Logf("prepare epoch %d: killed the leading operator %s (pod %s, pid %d)", st.Membership.Handoff.PrepareEpoch, holder, pod, pid)
	unlock()
	var next, nextPod string
	ch.e.eventually(t, 2*time.Minute, 250*time.Millisecond, "another operator process to lead", func() (bool, string) {
		next, nextPod = ch.leader(t)
		return next != "" && next != holder, "holder " + next
	})
	who := "the other replica"
	if nextPod == pod {
		who = "the restarted replica"
	}
	mid := ch.e.queue().Status
	t.Logf("%s (%s) leads; handoff then: %s", nextPod, who, handoffString(mid.Membership.Handoff))
	end := ch.waitSettled(t, 2)
	return fmt.Sprintf("killed leader %s in prepare epoch %d; %s %s took over; handoff %s, epoch %d",
		pod, st.Membership.Handoff.PrepareEpoch, who, nextPod, handoffString(end.Membership.Handoff), end.Membership.Epoch)
}

// caseRestartPostgres: 2→5; stop PostgreSQL during the prepare, wait for the queue to turn
// inexact, start it again.
func (ch *chaos) caseRestartPostgres(t *testing.T) string {
	before := ch.e.queue().Status.Membership.Epoch
	unlock := ch.lockTable(t)
	ch.scale(5)
	st := ch.waitPreparing(t, before)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := ch.e.c.Postgres.Pause(ctx); err != nil {
		ch.e.fatalf(t, "%v", err)
	}
	unlock() // its connection is gone
	resumed := false
	defer func() {
		if !resumed {
			_ = ch.e.c.Postgres.Resume(context.Background())
		}
	}()
	down := time.Now()
	ch.e.eventually(t, 60*time.Second, 250*time.Millisecond, "the queue to turn inexact", func() (bool, string) {
		s := ch.e.queue().Status
		return !s.DueExact, fmt.Sprintf("due=%d exact=%v", s.Due, s.DueExact)
	})
	mid := ch.e.queue().Status
	if err := ch.e.c.Postgres.Resume(ctx); err != nil {
		ch.e.fatalf(t, "%v", err)
	}
	resumed = true
	t.Logf("prepare epoch %d: PostgreSQL down for %s (handoff %s)", st.Membership.Handoff.PrepareEpoch,
		time.Since(down).Round(100*time.Millisecond), handoffString(mid.Membership.Handoff))
	end := ch.waitSettled(t, 5)
	return fmt.Sprintf("PostgreSQL stopped during prepare epoch %d for %s; handoff %s, epoch %d", st.Membership.Handoff.PrepareEpoch,
		time.Since(down).Round(time.Second), handoffString(end.Membership.Handoff), end.Membership.Epoch)
}

// caseRescaleInFlight: 5→3→4→6→2→5, each change written while the handoff towards the one before
// is in its prepare. The first prepare is held there by the table lock until the next change is
// written; the later ones are caught by polling (a prepare lasts until the operator's next poll
// of the shards finds every receiver prepared), and the lock holds each while the change is
// written. A later prepare can finish between two polls (the operator polls again on any Pod
// event): the change is then written after it. Whether each change landed in flight is checked
// and reported; the first must have.
func (ch *chaos) caseRescaleInFlight(t *testing.T) string {
	chain := []int{3, 4, 6, 2, 5}
	var seen []string
	inFlight := 0
	epoch := ch.e.queue().Status.Membership.Epoch
	unlock := ch.lockTable(t)
	ch.scale(chain[0])
	for i := 1; i < len(chain); i++ {
		var st rqv1.RenderQueueStatus
		seenPreparing := true
		if i == 1 {
			st = ch.waitPreparing(t, epoch) // held by the lock: it cannot finish unseen
		} else {
			// Not held: a prepare lasts until the operator next finds every receiver prepared,
			// which a Pod event can make a matter of milliseconds, shorter than a poll here.
			st, seenPreparing = ch.waitHandoff(t, epoch)
			if seenPreparing {
				unlock = ch.lockTable(t)
			}
		}
		epoch = st.Membership.Handoff.PrepareEpoch
		ch.scale(chain[i])
		now := ch.e.queue().Status
		landed := now.Membership.Handoff != nil && now.Membership.Handoff.State == rqv1.HandoffPreparing && now.Membership.Handoff.PrepareEpoch == epoch
		unlock()
		if landed {
			inFlight++
		} else if i == 1 {
			ch.e.fatalf(t, "the change to %d shards was written after the prepare at epoch %d finished (held by the lock): %s", chain[i], epoch, handoffString(now.Membership.Handoff))
		}
		how := "in flight"
		switch {
		case !seenPreparing:
			how = "missed: it finished between two polls"
		case !landed:
			how = "missed: it had finished"
		}
		seen = append(seen, fmt.Sprintf("→%d during prepare %d towards %d (%s)", chain[i], epoch, chain[i-1], how))
		t.Logf("spec.shards %d → %d while the prepare at epoch %d towards %d shards: %s", chain[i-1], chain[i], epoch, chain[i-1], how)
	}
	end := ch.waitSettled(t, chain[len(chain)-1])
	return fmt.Sprintf("%d of %d changes in flight: %s; handoff %s, epoch %d", inFlight, len(chain)-1, strings.Join(seen, "; "),
		handoffString(end.Membership.Handoff), end.Membership.Epoch)
}

// verify stops the load, takes the last sample and checks every acknowledged completion against
// the audit of written row versions; then it prints the summary.
func (ch *chaos) verify(t *testing.T) {
	ch.stopResources(t)
	ch.stopLoad()
	ch.sample(t, "final, load stopped")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := ch.pool.Query(ctx, `SELECT key, due_at FROM chaos_audit WHERE due_at IS NOT NULL`)
	if err != nil {
		ch.e.fatalf(t, "%v", err)
	}
	written := map[string]map[int64]bool{}
	var key string
	var due time.Time
	if _, err := pgx.ForEachRow(rows, []any{&key, &due}, func() error {
		if written[key] == nil {
			written[key] = map[int64]bool{}
		}
		written[key][due.UnixMicro()] = true
		return nil
	}); err != nil {
		ch.e.fatalf(t, "reading the audit: %v", err)
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	var missing []ackRec
	for _, a := range ch.acks {
		if !written[a.key][a.nextDue.UnixMicro()] {
			missing = append(missing, a)
		}
	}
	// leases of one key that overlapped in time: the row handed out twice at once. Each fails
	// the test; they are told apart (different shards, the earlier lease still acknowledged)
	// to say where it came from.
	//
	// What the workers see bounds when a shard granted and ended a lease: a lease a was live
	// until its expiry and at least until its ending completion was sent (endSent), and ended
	// by the time that completion's answer came (ended); a lease b was granted before its claim's
	// answer came (claimed). So b overlapped a for certain when b was claimed before a's ending
	// completion was sent. A b claimed while that completion was in flight may have been granted
	// just after the shard ended a — a completion refused because the producer changed the row
	// ends the lease, and the row, due, is handed out at once: the order is not observable from
	// here. Those are counted apart (unordered), not failed.
	overlaps, cross, bothServed, bothAcked, unordered := 0, 0, 0, 0, 0
	var details, unorderedDetails []string
	for k, ls := range ch.leases {
		sort.Slice(ls, func(i, j int) bool { return ls[i].claimed.Before(ls[j].claimed) })
		for i := range ls {
			sure, late := ls[i].expires, ls[i].expires
			if !ls[i].ended.IsZero() {
				sure, late = minTime(sure, ls[i].endSent), minTime(late, ls[i].ended)
			}
			for j := i + 1; j < len(ls) && ls[j].claimed.Before(late); j++ {
				a, b := ls[i], ls[j]
				if !b.claimed.Before(sure) {
					unordered++
					unorderedDetails = append(unorderedDetails, fmt.Sprintf("%s: leased by %s at %s, its completion sent at %s and answered at %s (%s); leased again by %s, answered at %s",
						k, a.shard, a.claimed.Format("15:04:05.000"), a.endSent.Format("15:04:05.000000"), a.ended.Format("15:04:05.000000"),
						a.outcome, b.shard, b.claimed.Format("15:04:05.000000")))
					continue
				}
				overlaps++
				if a.shard != b.shard {
					cross++
				}
				if a.outcome == "acknowledged" {
					bothServed++
				}
				if a.outcome == "acknowledged" && b.outcome == "acknowledged" {
					bothAcked++
					ch.e.errorf(t, "key %s acknowledged twice for overlapping leases (%s from %s, %s from %s)", k, a.lease, a.shard, b.lease, b.shard)
				}
				details = append(details, fmt.Sprintf("%s: leased by %s at %s (%s at %s), again by %s at %s (%s)", k,
					a.shard, a.claimed.Format("15:04:05.000"), or(a.outcome, "never answered"), a.ended.Format("15:04:05.000"),
					b.shard, b.claimed.Format("15:04:05.000"), or(b.outcome, "never answered")))
			}
		}
	}
	logFirst(t, "overlapping leases: ", details)
	if overlaps > 0 {
		ch.e.errorf(t, "%d overlapping leases of one key (%d across shards, %d with the earlier one acknowledged): a row was handed out twice at once", overlaps, cross, bothServed)
	}
	logFirst(t, "lease granted while the completion ending the one before was in flight: ", unorderedDetails)
	// duplicate renders: acknowledged completions of one key from different leases granted for
	// the same due time
	duplicates := 0
	for k, ls := range ch.leases {
		byDue := map[int64]*leaseRec{}
		for _, l := range ls {
			if l.outcome != "acknowledged" {
				continue
			}
			if first, ok := byDue[l.due.UnixMicro()]; ok {
				duplicates++
				if duplicates <= 20 {
					t.Logf("duplicate render: %s due %s: lease %s from %s acknowledged at %s, lease %s from %s at %s", k,
						l.due.Format(time.RFC3339Nano), first.lease, first.shard, first.ended.Format("15:04:05.000"),
						l.lease, l.shard, l.ended.Format("15:04:05.000"))
				}
				continue
			}
			byDue[l.due.UnixMicro()] = l
		}
	}
	if duplicates > 0 {
		ch.e.errorf(t, "%d duplicate renders: one row's render for one due time acknowledged from two leases", duplicates)
	}
	acked := 0
	for _, ls := range ch.leases {
		for _, l := range ls {
			if l.outcome == "acknowledged" {
				acked++
			}
		}
	}
	if acked != len(ch.acks) {
		ch.e.errorf(t, "%d leases acknowledged, %d acknowledgements recorded", acked, len(ch.acks))
	}
	// each refused completion, with its lease: when a worker's render was refused, and by which shard
	var refusedLeases []string
	for k, ls := range ch.leases {
		for _, l := range ls {
			if strings.HasPrefix(l.outcome, "refused") {
				refusedLeases = append(refusedLeases, fmt.Sprintf("%s %s: leased by %s at %s (expires %s), %s", l.ended.Format("15:04:05.000"), k,
					l.shard, l.claimed.Format("15:04:05.000"), l.expires.Format("15:04:05.000"), l.outcome))
			}
		}
	}
	logFirst(t, "completion refused at ", refusedLeases)
	var refused []string
	for r, n := range ch.refused {
		refused = append(refused, fmt.Sprintf("%s: %d", r, n))
	}
	slices.Sort(refused)

	var b strings.Builder
	fmt.Fprintf(&b, "chaos summary\n\n| round | case | spec.shards | outcome | took |\n| --- | --- | --- | --- | --- |\n")
	for _, c := range ch.cases {
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s |\n", c.round, c.name, c.shards, c.outcome, c.took.Round(time.Second))
	}
	fmt.Fprintf(&b, "\n| check | figure |\n| --- | --- |\n")
	fmt.Fprintf(&b, "| chaos cases run | %d |\n", len(ch.cases))
	fmt.Fprintf(&b, "| quiescent samples checked (status.due = SQL count, settled and exact) | %d |\n", len(ch.samples))
	movedSamples := 0
	for _, s := range ch.samples {
		if s.moved != 0 {
			movedSamples++
		}
	}
	fmt.Fprintf(&b, "| samples whose SQL count moved while paused (an abandoned request written late) | %d |\n", movedSamples)
	fmt.Fprintf(&b, "| rows claimed | %d |\n", ch.claimed)
	fmt.Fprintf(&b, "| completions acknowledged | %d |\n", len(ch.acks))
	fmt.Fprintf(&b, "| acknowledged completions persisted (in the audit) | %d |\n", len(ch.acks)-len(missing))
	fmt.Fprintf(&b, "| completions refused | %d (%s) |\n", sum(ch.refused), strings.Join(refused, "; "))
	fmt.Fprintf(&b, "| completions never answered (5 attempts) | %d |\n", ch.unanswered)
	fmt.Fprintf(&b, "| overlapping leases of one key (of them: different shards; earlier one still acknowledged) | %d (%d; %d) |\n", overlaps, cross, bothServed)
	fmt.Fprintf(&b, "| keys acknowledged twice for overlapping leases | %d |\n", bothAcked)
	fmt.Fprintf(&b, "| leases claimed while the completion ending the one before was in flight (order not observable; not failed) | %d |\n", unordered)
	fmt.Fprintf(&b, "| duplicate renders (one due time acknowledged from two leases) | %d |\n", duplicates)
	fmt.Fprintf(&b, "| producer writes (failed) | %d (%d) |\n", ch.writes, ch.writeErrs)
	if ch.res != nil {
		problems, judged := ch.res.growthProblems()
		fmt.Fprintf(&b, "| processes followed for %s or more, judged for growth (resources_test.go) | %d |\n", resourceMinSpan, judged)
		fmt.Fprintf(&b, "| resources that grew without bound | %d |\n", len(problems))
		fmt.Fprintf(&b, "\nresources, sampled at the start, every %s and at the end:\n\n%s", resourceEvery, ch.res.table())
		for _, p := range problems {
			ch.e.errorf(t, "grew without bound: %s", p)
		}
	}
	summary := b.String()
	t.Log(summary)
	if p := os.Getenv("CHAOS_SUMMARY"); p != "" {
		if err := os.WriteFile(p, []byte(summary), 0o644); err != nil {
			ch.e.errorf(t, "writing CHAOS_SUMMARY: %v", err)
		}
	}
	for i, a := range missing {
		if i == 10 {
			ch.e.errorf(t, "... and %d more", len(missing)-10)
			break
		}
		ch.e.errorf(t, "acknowledged completion not persisted: key %s next due %s (lease %s)", a.key, a.nextDue.Format(time.RFC3339Nano), a.lease)
	}
	if len(ch.acks) == 0 {
		t.Error("no completion was acknowledged: the workers did nothing")
	}
}

// logFirst logs the first 20 of lines, sorted, each after prefix, and how many more there are.
func logFirst(t *testing.T, prefix string, lines []string) {
	t.Helper()
	slices.Sort(lines)
	for i, l := range lines {
		if i == 20 {
			t.Logf("... and %d more", len(lines)-20)
			return
		}
		t.Log(prefix + l)
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func or(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
