#!/usr/bin/env bash
# Runs the benchmarks with a throwaway PostgreSQL cluster (unless RENDERQUEUE_TEST_DSN is set).
# Usage: hack/bench.sh [extra go test flags]
#
#   BENCH_ROWS=10M          also run the scaling benchmarks at 10M rows (comma-separate sizes;
#                           1M always runs). At 10M: about 1 min to build each 10M-row core and
#                           6 min to write the 10M-row table; needs ~4 GB of memory.
#   BENCH_CLAIM_SECONDS=10  length of each BenchmarkClaimLatency run
#   BENCH_WALK_RATE=100000  rows/s of BenchmarkShardLoad's paced re-walk (0: unpaced)
#   BENCH_CPU=1             GOMAXPROCS of BenchmarkClaimLatency and BenchmarkShardLoad (go test
#                           -cpu; a list such as 1,2 runs each): 1, as the keeper runs (--procs)
#   BENCH_E2E_ROWS=1000000  rows of `renderqueue bench` (0 skips it)
#   BENCH_E2E_ROUNDS=3      rounds of `renderqueue bench` (--rounds: it reports the median ratio;
#                           one run's ratio is not a verdict, docs/benchmarks.md)
#   BENCH_SHARED_BUFFERS=4GB  the throwaway cluster's shared_buffers (default 512MB; the 10M
#                           figures in docs/benchmarks.md use 4GB)
#   BENCH_HUGEPAGES=1       as root: reserve huge pages for those shared buffers (vm.nr_hugepages,
#                           given back at the end), so PostgreSQL uses them (docs/scale.md)
#   BENCH_QUEUES=500        RenderQueues of BenchmarkManyQueues, the operator against envtest
#                           (0 skips it; about 5 minutes); BENCH_IDLE_SECONDS=60, BENCH_CHANGES=300,
#                           BENCH_CHANGE_RATE=5, BENCH_HANGING=10 tune it (controllers/manyqueues_bench_test.go)
set -euo pipefail
cd "$(dirname "$0")/.."
started_pg=""
hugepages_before=""
cleanup() {
  if [ -n "$started_pg" ]; then hack/postgres.sh stop "$RENDERQUEUE_TEST_DSN" >/dev/null 2>&1 || true; fi
  if [ -n "$hugepages_before" ]; then echo "$hugepages_before" > /proc/sys/vm/nr_hugepages || true; fi
}
trap cleanup EXIT
if [ -n "${BENCH_SHARED_BUFFERS:-}" ]; then
  export RENDERQUEUE_PG_SHARED_BUFFERS=$BENCH_SHARED_BUFFERS
fi
if [ "${BENCH_HUGEPAGES:-}" = 1 ]; then
  [ "$(id -u)" = 0 ] || { echo "bench.sh: BENCH_HUGEPAGES=1 needs root (it sets vm.nr_hugepages)" >&2; exit 1; }
  [ -z "${RENDERQUEUE_TEST_DSN:-}" ] || { echo "bench.sh: BENCH_HUGEPAGES=1 starts its own cluster: unset RENDERQUEUE_TEST_DSN" >&2; exit 1; }
  sb=${RENDERQUEUE_PG_SHARED_BUFFERS:-512MB}
  case "$sb" in
    *GB) mb=$(( ${sb%GB} * 1024 )) ;;
    *MB) mb=${sb%MB} ;;
    *) echo "bench.sh: BENCH_SHARED_BUFFERS=$sb: give it in MB or GB" >&2; exit 1 ;;
  esac
  want=$(( mb / 2 + mb / 20 + 64 )) # 2 MB pages: the buffers, plus PostgreSQL's other shared memory
  hugepages_before=$(cat /proc/sys/vm/nr_hugepages)
  if [ "$hugepages_before" -lt "$want" ]; then
    echo "$want" > /proc/sys/vm/nr_hugepages
  else
    hugepages_before=""
  fi
  echo "bench.sh: $(cat /proc/sys/vm/nr_hugepages) huge pages reserved for shared_buffers=$sb"
fi
if [ -z "${RENDERQUEUE_TEST_DSN:-}" ] && [ -x hack/postgres.sh ]; then
  RENDERQUEUE_TEST_DSN=$(hack/postgres.sh start | tail -n 1)
  export RENDERQUEUE_TEST_DSN
  started_pg=1
fi
echo "bench.sh: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), BENCH_ROWS=${BENCH_ROWS:-1M}"
echo "bench.sh: PostgreSQL shared_buffers $(psql "$RENDERQUEUE_TEST_DSN" -Atc 'SHOW shared_buffers' 2>/dev/null || echo '?'), huge pages in use: $(awk '/HugePages_Rsvd|HugePages_Total|HugePages_Free/ {printf "%s %s ", $1, $2}' /proc/meminfo)"
# The keeper core's benchmarks run for a time; the others do a fixed amount of work per iteration
# (timed loads and walks, a claim-latency run of BENCH_CLAIM_SECONDS), so one iteration each.
go test -run '^$' -bench 'BenchmarkKeeper|BenchmarkStatus' -benchtime "${BENCHTIME:-2s}" -timeout 60m "$@" ./pkg/keeper/ ./pkg/keeper/core/
# The shard's concurrent benchmarks run with the keeper's GOMAXPROCS (renderqueue keeper --procs).
go test -run '^$' -bench 'BenchmarkClaimLatency|BenchmarkShardLoad' -benchtime 1x -cpu "${BENCH_CPU:-1}" -timeout 60m "$@" ./pkg/keeper/
# A handoff's commit on the core alone (each iteration builds its core, untimed).
go test -run '^$' -bench 'BenchmarkCommit' -benchtime 3x -timeout 60m "$@" ./pkg/keeper/core/
# A rebalance from 3 to 4 shards and back, and a shard's failover, with BENCH_ROWS a shard: the
# shards share one process (and its Go runtime), so it runs with the machine's cores rather than
# the keeper's one thread.
go test -run '^$' -bench 'BenchmarkHandoff|BenchmarkFailover' -benchtime 1x -timeout 60m "$@" ./pkg/keeper/
go test -run '^$' -bench 'BenchmarkSimulate' -benchtime 3x "$@" ./pkg/simulate/
go test -run '^$' -bench 'BenchmarkWalk|BenchmarkComplete$|BenchmarkEventLatency|BenchmarkHOT' -benchtime 1x "$@" ./pkg/store/...
# What one completion costs PostgreSQL, taken apart (docs/benchmarks.md, "End to end").
go test -run '^$' -bench 'BenchmarkCompleteStatement' -benchtime 200x "$@" ./pkg/store/postgres/
# The operator with many RenderQueues against a real kube-apiserver and etcd (docs/benchmarks.md).
if [ "${BENCH_QUEUES:-500}" != 0 ]; then
  if [ -z "${KUBEBUILDER_ASSETS:-}" ]; then
    KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)
    export KUBEBUILDER_ASSETS
  fi
  go test -run '^$' -bench 'BenchmarkManyQueues' -benchtime 1x -timeout 30m "$@" ./controllers/
fi
# End to end: a keeper over HTTP against a SKIP LOCKED queue on the same server (docs/benchmarks.md).
if [ "${BENCH_E2E_ROWS:-1000000}" != 0 ]; then
  go build -o bin/renderqueue ./cmd/renderqueue
  bin/renderqueue bench --dsn "$RENDERQUEUE_TEST_DSN" --rows "${BENCH_E2E_ROWS:-1000000}" --duration 8s --rounds "${BENCH_E2E_ROUNDS:-3}"
fi
echo "bench.sh: load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
