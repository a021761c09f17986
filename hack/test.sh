#!/usr/bin/env bash
# Runs the whole test suite with everything it needs: a throwaway PostgreSQL cluster (unless
# RENDERQUEUE_TEST_DSN already names one) and, once the operator exists, the envtest binaries.
# Usage: hack/test.sh [go test flags/packages...]   (default: ./...)
set -euo pipefail
cd "$(dirname "$0")/.."

started_pg=""
cleanup() {
  if [ -n "$started_pg" ]; then hack/postgres.sh stop >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

if [ -z "${RENDERQUEUE_TEST_DSN:-}" ] && [ -x hack/postgres.sh ]; then
  echo "test: starting a throwaway PostgreSQL cluster" >&2
  RENDERQUEUE_TEST_DSN=$(hack/postgres.sh start | tail -n 1)
  export RENDERQUEUE_TEST_DSN
  started_pg=1
fi

if [ -z "${KUBEBUILDER_ASSETS:-}" ] && [ -x hack/setup-envtest.sh ]; then
  echo "test: locating envtest binaries (built once, then cached)" >&2
  KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)
  export KUBEBUILDER_ASSETS
fi

if [ $# -eq 0 ]; then set -- ./...; fi
go test -count=1 "$@"
