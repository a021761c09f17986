#!/usr/bin/env bash
# Throwaway PostgreSQL cluster for tests and benchmarks.
#
#   hack/postgres.sh start        initdb into a fresh directory under $RENDERQUEUE_PG_BASE
#                                 (default /tmp/renderqueue-pg), start the server on its own unix
#                                 socket and a free loopback port, create the test role and
#                                 database, and print the DSN as the LAST line of stdout.
#   hack/postgres.sh stop [DSN]   stop and remove the cluster named by DSN (default: the one in
#                                 $RENDERQUEUE_TEST_DSN, else the most recently started one).
#   hack/postgres.sh stop-all     stop and remove every cluster this script started.
#
# Each start makes its own cluster, so several test runs on one machine do not share (or stop)
# each other's server. PostgreSQL refuses to run as root: when run as root the server runs as the
# `postgres` system user (runuser). Missing server binaries are installed with apt-get when running
# as root on Debian; otherwise the script says what to install.
#
# The test role is a superuser of this throwaway cluster (tests create and force-drop their own
# databases, which may mean ending an autovacuum worker). The cluster is tuned for throwaway use: fsync, synchronous_commit and full_page_writes are OFF
# (a crash loses data, which is fine for a cluster deleted after the run; it also makes commit
# latency figures from benchmarks optimistic compared with a durable server).
#
#   RENDERQUEUE_PG_LISTEN          one more address to listen on besides 127.0.0.1 (the local
#                                  cluster's node address, for its Pods: test/e2e/cluster)
#   RENDERQUEUE_PG_CLIENTS         a CIDR whose clients may connect over TCP too (trust, like
#                                  127.0.0.1): the local cluster's Pod range
#   RENDERQUEUE_PG_SHARED_BUFFERS  the cluster's shared_buffers (default 512MB; the 10M-row
#                                  benchmarks use 4GB, hack/bench.sh). The server uses huge pages
#                                  for them when the machine has enough reserved (huge_pages =
#                                  try, PostgreSQL's default; vm.nr_hugepages).
set -euo pipefail

base=${RENDERQUEUE_PG_BASE:-/tmp/renderqueue-pg}
pg_user=renderqueue
pg_db=renderqueue

log() { echo "postgres.sh: $*" >&2; }
die() { log "$*"; exit 1; }

find_bindir() {
  local d
  if [ -n "${PG_BINDIR:-}" ] && [ -x "$PG_BINDIR/initdb" ]; then echo "$PG_BINDIR"; return 0; fi
  # Newest installed major version first.
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5 -V -r); do
    if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ]; then echo "$d"; return 0; fi
  done
  if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(command -v initdb)"; return 0
  fi
  return 1
}

ensure_server() {
  local bindir
  if bindir=$(find_bindir); then echo "$bindir"; return 0; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "PostgreSQL server binaries not found; installing the Debian package 'postgresql'"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
    if bindir=$(find_bindir); then echo "$bindir"; return 0; fi
  fi
  die "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found. Install PostgreSQL 14 or newer:
  Debian/Ubuntu: sudo apt-get install -y postgresql
  Fedora/RHEL:   sudo dnf install -y postgresql-server
  macOS:         brew install postgresql@16
or set PG_BINDIR to the directory holding initdb and pg_ctl."
}

# as_pg runs a command as the user that owns the cluster (postgres when we are root).
as_pg() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# shellcheck source=hack/lib.sh
. "$(dirname "$0")/lib.sh"

cmd_start() {
  local bindir dir port tries
  bindir=$(ensure_server)
  if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    die "running as root but there is no 'postgres' system user to run the server as (install the postgresql package, or run as an ordinary user)"
  fi
  mkdir -p "$base"
  chmod 0755 "$base"
  dir=$(mktemp -d "$base/cluster.XXXXXX")
  chmod 0755 "$dir"
  if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; fi

  as_pg "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 \
    >"$dir/initdb.log" 2>&1 || as_pg "$bindir/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C \
    >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; rm -rf "$dir"; die "initdb failed"; }

  cat >>"$dir/data/postgresql.conf" <<EOF

# --- renderqueue throwaway test cluster (hack/postgres.sh) ---
listen_addresses = '127.0.0.1${RENDERQUEUE_PG_LISTEN:+,$RENDERQUEUE_PG_LISTEN}'
unix_socket_directories = '$dir'
max_connections = 200
shared_buffers = ${RENDERQUEUE_PG_SHARED_BUFFERS:-512MB}
work_mem = 16MB
maintenance_work_mem = 256MB
fsync = off
synchronous_commit = off
full_page_writes = off
wal_level = minimal
max_wal_senders = 0
max_wal_size = 4GB
checkpoint_timeout = 30min
log_min_messages = warning
log_line_prefix = '%m [%p] '
EOF

  if [ -n "${RENDERQUEUE_PG_CLIENTS:-}" ]; then
    echo "host all all $RENDERQUEUE_PG_CLIENTS trust" >>"$dir/data/pg_hba.conf"
  fi

  tries=0
  while :; do
    tries=$((tries + 1))
    port=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
    if port_in_use "$port"; then continue; fi
    if as_pg "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -o "-p $port" -w -t 60 start >"$dir/pg_ctl.log" 2>&1; then
      break
    fi
    if [ "$tries" -ge 5 ]; then
      cat "$dir/pg_ctl.log" "$dir/server.log" >&2 || true
      rm -rf "$dir"
      die "could not start PostgreSQL"
    fi
    log "start on port $port failed, retrying on another port"
  done
  echo "$bindir" >"$dir/bindir"
  echo "$port" >"$dir/port"
  echo "$dir" >"$base/last"

  as_pg "$bindir/psql" -h "$dir" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -q \
    -c "CREATE ROLE $pg_user LOGIN SUPERUSER" \
    -c "CREATE DATABASE $pg_db OWNER $pg_user" >&2 ||
    { cmd_stop_dir "$dir"; die "could not create the test role and database"; }

  log "started PostgreSQL ($("$bindir/postgres" --version)) in $dir on 127.0.0.1:$port"
  # The DSN uses the unix socket (faster than TCP); the server also listens on 127.0.0.1:$port.
  echo "host=$dir port=$port user=$pg_user dbname=$pg_db sslmode=disable"
}

cmd_stop_dir() {
  local dir=$1 bindir
  case "$dir" in "$base"/cluster.*) ;; *) die "refusing to remove $dir: not a cluster of this script" ;; esac
  if [ -d "$dir" ]; then
    bindir=$(cat "$dir/bindir" 2>/dev/null || find_bindir || true)
    if [ -n "$bindir" ] && [ -f "$dir/data/postmaster.pid" ]; then
      as_pg "$bindir/pg_ctl" -D "$dir/data" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
    log "stopped and removed $dir"
  fi
  if [ "$(cat "$base/last" 2>/dev/null || true)" = "$dir" ]; then rm -f "$base/last"; fi
}

cmd_stop() {
  local dsn=${1:-${RENDERQUEUE_TEST_DSN:-}} dir=""
  if [ -n "$dsn" ]; then
    dir=$(sed -n 's/.*host=\([^ ]*\).*/\1/p' <<<"$dsn")
    case "$dir" in "$base"/cluster.*) ;; *) dir="" ;; esac
  fi
  if [ -z "$dir" ]; then dir=$(cat "$base/last" 2>/dev/null || true); fi
  if [ -z "$dir" ]; then log "no cluster to stop"; return 0; fi
  cmd_stop_dir "$dir"
}

cmd_stop_all() {
  local d
  for d in "$base"/cluster.*; do
    [ -d "$d" ] && cmd_stop_dir "$d"
  done
  return 0
}

case "${1:-}" in
  start) cmd_start ;;
  stop) shift; cmd_stop "${1:-}" ;;
  stop-all) cmd_stop_all ;;
  *) echo "usage: $0 start|stop [DSN]|stop-all" >&2; exit 2 ;;
esac
