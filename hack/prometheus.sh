#!/usr/bin/env bash
# Prometheus for tests: promtool, the renderqueue rule file, and throwaway Prometheus servers.
#
#   hack/prometheus.sh promtool          print the path of promtool as the LAST line of stdout
#                                        (installing Debian's `prometheus` package when missing)
#   hack/prometheus.sh prometheus        the same for the prometheus server binary
#   hack/prometheus.sh rules [FILE]      print the renderqueue alert rules as a plain Prometheus
#                                        rule file (the spec of config/prometheus/prometheusrule.yaml),
#                                        or write them to FILE
#   hack/prometheus.sh start SCRAPE [RULE_FILE...]
#                                        start a throwaway server on a free loopback port with the
#                                        scrape configuration SCRAPE (a YAML file with a top-level
#                                        `scrape_configs:` list and nothing else) and the rule files,
#                                        wait until it is ready, and print its URL as the LAST line
#                                        (http://127.0.0.1:PORT). Data, config and log live in a
#                                        fresh directory under $RENDERQUEUE_PROM_BASE (default
#                                        /tmp/renderqueue-prom). The scrape and evaluation interval is
#                                        $PROM_INTERVAL (default 1s). With PROM_RULES_FOR=DURATION,
#                                        every `for:` of the rule files is replaced by DURATION (in
#                                        copies), so a test can see an alert fire without waiting
#                                        the production `for`.
#   hack/prometheus.sh stop [URL]        stop and remove the server at URL (default: the most
#                                        recently started one)
#   hack/prometheus.sh stop-all          stop and remove every server this script started
#
# Binaries: $PROMTOOL / $PROMETHEUS when set, else on PATH, else installed with
# `apt-get install prometheus` (Debian's package ships both) when running as root on Debian;
# otherwise the script says what to install and fails. It never skips: a test setup that cannot
# get promtool fails.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
base=${RENDERQUEUE_PROM_BASE:-/tmp/renderqueue-prom}
rule_source="$repo/config/prometheus/prometheusrule.yaml"

log() { echo "prometheus.sh: $*" >&2; }
die() { log "$*"; exit 1; }

# shellcheck source=hack/lib.sh
. "$(dirname "$0")/lib.sh"

# find_bin NAME prints the binary's path: on PATH, or where the Debian package puts it.
find_bin() {
  local name=$1
  if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return 0; fi
  if [ -x "/usr/bin/$name" ]; then echo "/usr/bin/$name"; return 0; fi
  return 1
}

# ensure_bin NAME ENVVAR prints the binary's path: $ENVVAR (which must then be executable), else
# find_bin, else after installing the Debian package.
ensure_bin() {
  local name=$1 env=$2 bin
  if [ -n "${!env:-}" ]; then
    [ -x "${!env}" ] || die "\$$env=${!env} is not an executable"
    echo "${!env}"; return 0
  fi
  if bin=$(find_bin "$name"); then echo "$bin"; return 0; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "$name not found; installing the Debian package 'prometheus' (it ships prometheus and promtool)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends prometheus >&2
    if bin=$(find_bin "$name"); then echo "$bin"; return 0; fi
  fi
  die "$name not found. Install Prometheus (2.x or newer; promtool comes with it):
  Debian/Ubuntu: sudo apt-get install -y prometheus
  Fedora/RHEL:   sudo dnf install -y golang-github-prometheus
  macOS:         brew install prometheus
or set $env to its path."
}

# cmd_rules [FILE]: the spec of the PrometheusRule, two spaces less indented.
cmd_rules() {
  local out=${1:-/dev/stdout}
  grep -q '^spec:$' "$rule_source" || die "$rule_source has no top-level 'spec:' line"
  sed -n '/^spec:$/,$p' "$rule_source" | tail -n +2 | sed 's/^  //' >"$out"
}

cmd_start() {
  local scrape=${1:-}
  [ -n "$scrape" ] || die "usage: $0 start SCRAPE_CONFIG [RULE_FILE...]"
  shift
  [ -f "$scrape" ] || die "scrape configuration $scrape does not exist"
  local bin tool dir port tries interval=${PROM_INTERVAL:-1s} r i=0
  bin=$(ensure_bin prometheus PROMETHEUS)
  tool=$(ensure_bin promtool PROMTOOL)
  mkdir -p "$base"
  dir=$(mktemp -d "$base/server.XXXXXX")
  mkdir -p "$dir/rules" "$dir/data"
  {
    echo "# written by hack/prometheus.sh"
    echo "global:"
    echo "  scrape_interval: $interval"
    echo "  evaluation_interval: $interval"
    echo "rule_files:"
    for r in "$@"; do
      [ -f "$r" ] || { rm -rf "$dir"; die "rule file $r does not exist"; }
      i=$((i + 1))
      if [ -n "${PROM_RULES_FOR:-}" ]; then
        sed -E "s/^([[:space:]]*)for:[[:space:]].*/\\1for: ${PROM_RULES_FOR}/" "$r" >"$dir/rules/$i.yaml"
      else
        cp "$r" "$dir/rules/$i.yaml"
      fi
      echo "  - $dir/rules/$i.yaml"
    done
    cat "$scrape"
  } >"$dir/prometheus.yml"
  if ! "$tool" check config "$dir/prometheus.yml" >"$dir/check.log" 2>&1; then
    cat "$dir/check.log" >&2
    rm -rf "$dir"
    die "the configuration does not check (scrape config $scrape, rules: $*)"
  fi

  tries=0
  while :; do
    tries=$((tries + 1))
    port=$(free_port)
    "$bin" --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
      --web.listen-address="127.0.0.1:$port" --web.enable-lifecycle \
      --log.level=warn >"$dir/prometheus.log" 2>&1 &
    echo $! >"$dir/pid"
    echo "$port" >"$dir/port"
    local waited=0
    while [ $waited -lt 300 ]; do
      if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then break; fi
      if (exec 3<>"/dev/tcp/127.0.0.1/$port" && printf 'GET /-/ready HTTP/1.0\r\n\r\n' >&3 && grep -q '200 OK' <&3) 2>/dev/null; then
        echo "$dir" >"$base/last"
        log "started $("$bin" --version 2>&1 | head -n 1) in $dir on 127.0.0.1:$port"
        echo "http://127.0.0.1:$port"
        return 0
      fi
      sleep 0.1
      waited=$((waited + 1))
    done
    kill "$(cat "$dir/pid")" 2>/dev/null || true
    if [ "$tries" -ge 3 ]; then
      cat "$dir/prometheus.log" >&2 || true
      rm -rf "$dir"
      die "could not start Prometheus"
    fi
    log "start on port $port failed, retrying on another port"
  done
}

cmd_stop_dir() {
  local dir=$1 pid
  case "$dir" in "$base"/server.*) ;; *) die "refusing to remove $dir: not a server of this script" ;; esac
  if [ -d "$dir" ]; then
    pid=$(cat "$dir/pid" 2>/dev/null || true)
    if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -rf "$dir"
    log "stopped and removed $dir"
  fi
  if [ "$(cat "$base/last" 2>/dev/null || true)" = "$dir" ]; then rm -f "$base/last"; fi
}

cmd_stop() {
  local url=${1:-} dir="" d
  if [ -n "$url" ]; then
    for d in "$base"/server.*; do
      [ -f "$d/port" ] && [ "http://127.0.0.1:$(cat "$d/port")" = "${url%/}" ] && dir=$d
    done
    [ -n "$dir" ] || die "no server of this script at $url"
  else
    dir=$(cat "$base/last" 2>/dev/null || true)
  fi
  if [ -z "$dir" ]; then log "no server to stop"; return 0; fi
  cmd_stop_dir "$dir"
}

cmd_stop_all() {
  local d
  for d in "$base"/server.*; do
    [ -d "$d" ] && cmd_stop_dir "$d"
  done
  return 0
}

case "${1:-}" in
  promtool) ensure_bin promtool PROMTOOL ;;
  prometheus) ensure_bin prometheus PROMETHEUS ;;
  rules) shift; cmd_rules "${1:-}" ;;
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "${1:-}" ;;
  stop-all) cmd_stop_all ;;
  *) echo "usage: $0 promtool|prometheus|rules [FILE]|start SCRAPE [RULES...]|stop [URL]|stop-all" >&2; exit 2 ;;
esac
