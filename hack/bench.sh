#!/usr/bin/env bash
# Runs the benchmarks with a throwaway PostgreSQL cluster (unless RENDERQUEUE_TEST_DSN is set).
# Usage: hack/bench.sh [extra go test flags]
#
#   BENCH_ROWS=10M          also run the scaling benchmarks at 10M rows (comma-separate sizes;
#                           1M always runs). At 10M: about 1 min to build each 10M-row core and
#                           6 min to write the 10M-row table; needs ~4 GB of memory.
#   BENCH_CLAIM_SECONDS=10  length of each BenchmarkClaimLatency run
#   BENCH_WALK_RATE=100000  rows/s of BenchmarkShardLoad's paced re-walk (0: unpaced)
#   BENCH_E2E_ROWS=1000000  rows of `renderqueue bench` (0 skips it)
set -euo pipefail
cd "$(dirname "$0")/.."
started_pg=""
cleanup() { if [ -n "$started_pg" ]; then hack/postgres.sh stop "$RENDERQUEUE_TEST_DSN" >/dev/null 2>&1 || true; fi; }
trap cleanup EXIT
if [ -z "${RENDERQUEUE_TEST_DSN:-}" ] && [ -x hack/postgres.sh ]; then
  RENDERQUEUE_TEST_DSN=$(hack/postgres.sh start | tail -n 1)
  export RENDERQUEUE_TEST_DSN
  started_pg=1
fi
echo "bench.sh: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), BENCH_ROWS=${BENCH_ROWS:-1M}"
# The keeper core's benchmarks run for a time; the others do a fixed amount of work per iteration
# (timed loads and walks, a claim-latency run of BENCH_CLAIM_SECONDS), so one iteration each.
go test -run '^$' -bench 'BenchmarkKeeper|BenchmarkStatus' -benchtime "${BENCHTIME:-2s}" -timeout 60m "$@" ./pkg/keeper/ ./pkg/keeper/core/
go test -run '^$' -bench 'BenchmarkClaimLatency|BenchmarkShardLoad' -benchtime 1x -timeout 60m "$@" ./pkg/keeper/
go test -run '^$' -bench 'BenchmarkSimulate' -benchtime 3x "$@" ./pkg/simulate/
go test -run '^$' -bench 'BenchmarkWalk|BenchmarkComplete$|BenchmarkEventLatency|BenchmarkHOT' -benchtime 1x "$@" ./pkg/store/...
# What one completion costs PostgreSQL, taken apart (docs/benchmarks.md, "End to end").
go test -run '^$' -bench 'BenchmarkCompleteStatement' -benchtime 200x "$@" ./pkg/store/postgres/
# End to end: a keeper over HTTP against a SKIP LOCKED queue on the same server (docs/benchmarks.md).
if [ "${BENCH_E2E_ROWS:-1000000}" != 0 ]; then
  go build -o bin/renderqueue ./cmd/renderqueue
  bin/renderqueue bench --dsn "$RENDERQUEUE_TEST_DSN" --rows "${BENCH_E2E_ROWS:-1000000}" --duration 10s
fi
echo "bench.sh: load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
