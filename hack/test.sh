#!/usr/bin/env bash
# Runs the whole test suite with everything it needs: a throwaway PostgreSQL cluster (unless
# RENDERQUEUE_TEST_DSN already names one), the envtest binaries, headless Chromium for the
# console's browser tests and, for the monitoring tests and the end-to-end test, promtool and
# prometheus (each installed when missing: hack/chromium.sh, hack/prometheus.sh).
# Usage: hack/test.sh [go test flags/packages...]   (default: ./...)
set -euo pipefail
cd "$(dirname "$0")/.."

started_pg=""
cleanup() {
  if [ -n "$started_pg" ]; then hack/postgres.sh stop "$RENDERQUEUE_TEST_DSN" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

if [ -z "${RENDERQUEUE_TEST_DSN:-}" ] && [ -x hack/postgres.sh ]; then
  echo "test: starting a throwaway PostgreSQL cluster" >&2
  RENDERQUEUE_TEST_DSN=$(hack/postgres.sh start | tail -n 1)
  export RENDERQUEUE_TEST_DSN
  started_pg=1
fi

if [ -z "${KUBEBUILDER_ASSETS:-}" ] && [ -x hack/setup-envtest.sh ]; then
  echo "test: locating the Kubernetes binaries and CoreDNS (built once, then cached)" >&2
  KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)
  export KUBEBUILDER_ASSETS
fi

# The real node of the local cluster (test/e2e/cluster: its own tests, the end-to-end test) needs
# Debian's containerd, runc and CNI plugins: installed when missing, as root (hack/node.sh).
if [ "$(id -u)" = 0 ]; then
  echo "test: locating containerd, runc and the CNI plugins for the local cluster's node" >&2
  hack/node.sh install >/dev/null
fi

# Helm for the chart's tests (charts/) and the end-to-end Helm install: built once through the
# Go module proxy and cached (hack/helm.sh); RENDERQUEUE_HELM=/path/to/helm uses another binary.
if [ -z "${RENDERQUEUE_HELM:-}" ]; then
  echo "test: locating helm (built once, then cached)" >&2
  RENDERQUEUE_HELM=$(hack/helm.sh | tail -n 1)
  export RENDERQUEUE_HELM
fi

# Headless Chromium for the console's browser tests (pkg/console, test/e2e): installed with
# apt-get when missing (hack/chromium.sh); a setup that cannot provide it fails here, loudly,
# rather than letting the browser tests skip. CHROMIUM=/path/to/chromium uses another binary.
echo "test: locating Chromium for the browser tests" >&2
CHROMIUM=$(hack/chromium.sh | tail -n 1)
export CHROMIUM
# Screenshots of the browser tests are kept here (ARTIFACTS=dir to choose).
ARTIFACTS=${ARTIFACTS:-${TMPDIR:-/tmp}/renderqueue-artifacts}
export ARTIFACTS
echo "test: browser screenshots go to $ARTIFACTS" >&2

# The end-to-end test and the monitoring tests (test/monitoring, a module of its own) run after
# the unit tests when the whole suite runs (no arguments, or just ./...), or whenever E2E=1 /
# MONITORING=1; E2E=0 / MONITORING=0 leave them out.
run_e2e=${E2E:-}
run_monitoring=${MONITORING:-}
if [ $# -eq 0 ]; then set -- ./...; fi
if [ $# -eq 1 ] && [ "$1" = ./... ]; then
  run_e2e=${run_e2e:-1}
  run_monitoring=${run_monitoring:-1}
fi

# promtool and prometheus are required, not optional, when the monitoring tests or the end-to-end
# test (which runs a Prometheus against the local cluster) run: a machine that cannot get them
# fails here rather than skipping those checks.
need_prom=0
if [ "${run_monitoring:-0}" = 1 ] || [ "${run_e2e:-0}" = 1 ]; then need_prom=1; fi
if [ "$need_prom" = 1 ] && [ -z "${RENDERQUEUE_PROMTOOL:-}" ]; then
  echo "test: locating promtool and prometheus (installing Debian's prometheus package when missing)" >&2
  RENDERQUEUE_PROMTOOL=$(hack/prometheus.sh promtool | tail -n 1)
  export RENDERQUEUE_PROMTOOL
fi
if [ "$need_prom" = 1 ] && [ -z "${RENDERQUEUE_PROMETHEUS:-}" ]; then
  RENDERQUEUE_PROMETHEUS=$(hack/prometheus.sh prometheus | tail -n 1)
  export RENDERQUEUE_PROMETHEUS
fi

# The whole suite as root runs the end-to-end test beside the unit tests rather than after them:
# it spends most of its ~15 minutes waiting on the cluster (Pods starting, handoffs, alerts
# firing), so the machine's cores have room for the rest. Its output comes prefixed with "e2e| ".
# The local cluster's own tests (test/e2e/cluster) start the same node, of which a machine runs
# one at a time (test/e2e/cluster/node: its lock), so they run after the end-to-end test ends.
e2e_pid=""
node_pkg=github.com/renderqueue/renderqueue/test/e2e/cluster
if [ "${run_e2e:-0}" = 1 ] && [ "$*" = ./... ] && [ "$(id -u)" = 0 ]; then
  echo "test: starting the end-to-end test (go test -tags e2e ./test/e2e) beside the unit tests" >&2
  e2e_log=$(mktemp "${TMPDIR:-/tmp}/renderqueue-e2e.XXXXXX.log")
  ( set +e; go test -tags e2e -count=1 -timeout 30m ./test/e2e >"$e2e_log" 2>&1; echo $? >"$e2e_log.rc" ) &
  e2e_pid=$!
  ( tail -n +1 -F --pid="$e2e_pid" "$e2e_log" 2>/dev/null | sed -u 's/^/e2e| /' ) &
  e2e_tail=$!
  # every package but the node's own tests now; those after the end-to-end test
  mapfile -t pkgs < <(go list ./... | grep -vx "$node_pkg")
  set -- "${pkgs[@]}"
fi

# The local cluster's own tests (test/e2e/cluster, as root) build the images and start a real
# node: more than go test's default 10 minutes on a cold machine.
unit_status=0
go test -count=1 -timeout 30m "$@" || unit_status=$?
if [ -n "$e2e_pid" ]; then set -- ./...; fi

# --- monitoring (test/monitoring) ----------------------------------------------------------------
# promtool check/test of the alert rules of config/prometheus; the metrics the alerts and the
# Grafana dashboard name checked against the keeper's and the operator's registries (PromQL
# parsed with Prometheus's own parser, which is why this is a module of its own); and a real
# Prometheus (hack/prometheus.sh start) scraping a keeper shard and firing alerts.
if [ "${run_monitoring:-0}" = 1 ]; then
  echo "test: running the monitoring tests (test/monitoring, promtool $RENDERQUEUE_PROMTOOL)" >&2
  (cd test/monitoring && go test -count=1 ./...) || unit_status=$?
fi

# --- image (hack/image, a module of its own): the builder, the Dockerfile's agreement with it, and
# `make image` twice (one digest) and `make pause-image` (docs/image.md), when the whole suite runs.
if [ "$*" = ./... ]; then
  echo "test: running the image tests (hack/image)" >&2
  (cd hack/image && go test -count=1 -timeout 40m ./...) || unit_status=$?
fi

# --- end-to-end (test/e2e, build tag e2e) --------------------------------------------------------
# A one-node cluster of real components (test/e2e/cluster: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, containerd + runc, the kubelet, kube-proxy, CoreDNS),
# the renderqueue image of `make image` imported into containerd, a throwaway PostgreSQL of its
# own, config/default applied as shipped, kubectl and an HPA, and a Prometheus
# (RENDERQUEUE_PROMETHEUS) scraping the operator and the shards with the alert rules. As root; see
# `make e2e` and docs/local-cluster.md. Started above, beside the unit tests, for the whole suite
# as root; otherwise run here.
if [ -n "$e2e_pid" ]; then
  wait "$e2e_pid" || true
  wait "$e2e_tail" || true # the tail above ends once it has printed the last lines
  e2e_status=$(cat "$e2e_log.rc" 2>/dev/null || echo 1)
  rm -f "$e2e_log" "$e2e_log.rc"
  echo "test: the end-to-end test ended (status $e2e_status); now the local cluster's own tests ($node_pkg)" >&2
  node_status=0
  go test -count=1 -timeout 30m ./test/e2e/cluster || node_status=$?
  if [ "$unit_status" != 0 ] || [ "$e2e_status" != 0 ] || [ "$node_status" != 0 ]; then
    echo "test: FAILED — unit tests status $unit_status, end-to-end $e2e_status, local cluster $node_status" >&2
    exit 1
  fi
elif [ "${run_e2e:-0}" = 1 ]; then
  if [ "$unit_status" != 0 ]; then exit "$unit_status"; fi
  echo "test: running the end-to-end test (go test -tags e2e ./test/e2e)" >&2
  go test -tags e2e -count=1 -timeout 30m ./test/e2e
fi
if [ "$unit_status" != 0 ]; then exit "$unit_status"; fi
