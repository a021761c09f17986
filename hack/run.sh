#!/usr/bin/env bash
# make run: a local standalone renderqueue, end to end, in about a minute.
#
#   1. builds bin/renderqueue
#   2. starts a throwaway PostgreSQL cluster (hack/postgres.sh) and migrates the schema
#   3. seeds $ROWS synthetic rows (default 200,000) with a small overdue backlog and a few urgent rows
#   4. starts a standalone keeper (all slots, window 24h) on a free loopback port, waits for /readyz
#   5. prints its status, runs the worker simulator for $SIM_SECONDS seconds (default 20), prints
#      the status again (renderqueue status --url ...)
#
# Everything it started (keeper, PostgreSQL) is stopped on exit, Ctrl-C included. Tunables (env):
# ROWS, OVERDUE, URGENT, SIM_SECONDS, SIM_CONCURRENCY, SIM_BATCH, SIM_RENDER_TIME, READY_TIMEOUT,
# KEEPER_ARGS (extra keeper flags).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/lib.sh
. hack/lib.sh

ROWS=${ROWS:-200000}
OVERDUE=${OVERDUE:-2000}
URGENT=${URGENT:-50}
SIM_SECONDS=${SIM_SECONDS:-20}
SIM_CONCURRENCY=${SIM_CONCURRENCY:-16}
SIM_BATCH=${SIM_BATCH:-10}
SIM_RENDER_TIME=${SIM_RENDER_TIME:-100ms}
READY_TIMEOUT=${READY_TIMEOUT:-60}
KEEPER_ARGS=${KEEPER_ARGS:-}

log() { printf '\n== %s\n' "$*" >&2; }
die() { printf 'run: %s\n' "$*" >&2; exit 1; }

dsn=""
keeper_pid=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$keeper_pid" ] && kill -0 "$keeper_pid" 2>/dev/null; then
    echo "run: stopping the keeper (pid $keeper_pid)" >&2
    kill -TERM "$keeper_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$keeper_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$keeper_pid" 2>/dev/null || true
    wait "$keeper_pid" 2>/dev/null || true
  fi
  if [ -n "$dsn" ]; then
    echo "run: stopping PostgreSQL" >&2
    hack/postgres.sh stop "$dsn" >/dev/null 2>&1 || true
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM


# http_code PATH prints the HTTP status code of GET PATH on the keeper (000 when unreachable),
# with nothing but bash.
http_code() {
  local code
  code=$( (
    exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 0
    printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$1" >&3
    IFS=' ' read -r -t 5 _ code _ <&3 && echo "$code"
  ) 2>/dev/null || true)
  echo "${code:-000}"
}

log "building bin/renderqueue"
go build -o bin/renderqueue ./cmd/renderqueue
rq=bin/renderqueue

log "starting a throwaway PostgreSQL"
dsn=$(hack/postgres.sh start | tail -n 1)
[ -n "$dsn" ] || die "hack/postgres.sh printed no DSN"

log "migrating the schema"
$rq schema migrate --dsn "$dsn"

log "seeding $ROWS rows ($OVERDUE overdue backlog, $URGENT urgent)"
$rq seed --dsn "$dsn" --rows "$ROWS" --overdue "$OVERDUE" --urgent "$URGENT"

port=$(free_port)
url="http://127.0.0.1:$port"
log "starting a standalone keeper on $url (window 24h, verify interval 1h, no auth)"
# shellcheck disable=SC2086 # KEEPER_ARGS is a list of flags
$rq keeper --dsn "$dsn" --listen "127.0.0.1:$port" --name standalone --window 24h --verify-interval 1h \
  --insecure-no-auth $KEEPER_ARGS 2> >(sed -u 's/^/  keeper | /' >&2) &
keeper_pid=$!

start=$SECONDS
last=-1
while :; do
  code=$(http_code /readyz)
  [ "$code" = 200 ] && break
  kill -0 "$keeper_pid" 2>/dev/null || { wait "$keeper_pid" || true; die "the keeper exited before it was ready"; }
  elapsed=$((SECONDS - start))
  [ "$elapsed" -ge "$READY_TIMEOUT" ] && die "the keeper was not ready after ${READY_TIMEOUT}s (last /readyz: $code)"
  if [ "$elapsed" -ne "$last" ]; then
    case "$code" in 000) what="not listening yet" ;; *) what="/readyz $code, loading" ;; esac
    echo "run: waiting for the keeper: ${elapsed}s, $what" >&2
    last=$elapsed
  fi
  sleep 0.2
done
echo "run: keeper ready after $((SECONDS - start))s" >&2

log "status after load"
$rq status --url "$url"

log "worker-sim: $SIM_CONCURRENCY workers, batch $SIM_BATCH, render $SIM_RENDER_TIME ±50%, for ${SIM_SECONDS}s"
$rq worker-sim --shard "$url" --duration "${SIM_SECONDS}s" --concurrency "$SIM_CONCURRENCY" \
  --batch "$SIM_BATCH" --render-time "$SIM_RENDER_TIME" --progress 5s

kill -0 "$keeper_pid" 2>/dev/null || die "the keeper is gone (interrupted?)"

log "status after ${SIM_SECONDS}s of work"
$rq status --url "$url"

echo >&2
echo "run: done. Run it yourself: bin/renderqueue seed|keeper|worker-sim|status --help" >&2
