#!/usr/bin/env bash
# Runs the benchmarks with a throwaway PostgreSQL cluster (unless RENDERQUEUE_TEST_DSN is set).
# Usage: hack/bench.sh [extra go test flags]
set -euo pipefail
cd "$(dirname "$0")/.."
started_pg=""
cleanup() { if [ -n "$started_pg" ]; then hack/postgres.sh stop >/dev/null 2>&1 || true; fi; }
trap cleanup EXIT
if [ -z "${RENDERQUEUE_TEST_DSN:-}" ] && [ -x hack/postgres.sh ]; then
  RENDERQUEUE_TEST_DSN=$(hack/postgres.sh start | tail -n 1)
  export RENDERQUEUE_TEST_DSN
  started_pg=1
fi
# The keeper core's benchmarks run for a time; the store's and the shard load do a fixed amount of
# work per iteration (1M-row walks, timed loads), so one iteration each.
go test -run '^$' -bench 'BenchmarkKeeper' -benchtime "${BENCHTIME:-2s}" "$@" ./pkg/keeper/
go test -run '^$' -bench 'BenchmarkShardLoad' -benchtime 2x "$@" ./pkg/keeper/
go test -run '^$' -bench 'BenchmarkSimulate' -benchtime 3x "$@" ./pkg/simulate/
go test -run '^$' -bench . -benchtime 1x "$@" ./pkg/store/...
