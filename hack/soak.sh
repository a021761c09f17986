#!/usr/bin/env bash
# Runs the end-to-end chaos test (test/e2e TestChaos) in a loop for DURATION: handoffs with a
# giving shard killed in prepare, a receiving shard killed in its walk, the leading operator
# replica killed between prepare and commit, PostgreSQL restarted and spec.shards changed again
# while a handoff is in flight, with writers and render workers running throughout; then the
# summary (cases, quiescent samples checked, completions acknowledged vs persisted).
# Usage: DURATION=30m hack/soak.sh   (as root; `make soak DURATION=30m`)
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${DURATION:-30m}
# DURATION in seconds (Go's h/m/s units), for go test's -timeout: the loop, plus the cluster's
# setup and the last round
secs=0
rest=$duration
while [ -n "$rest" ]; do
  if [[ $rest =~ ^([0-9]+)(h|m|s)(.*)$ ]]; then
    n=${BASH_REMATCH[1]}
    case ${BASH_REMATCH[2]} in h) n=$((n * 3600)) ;; m) n=$((n * 60)) ;; esac
    secs=$((secs + n))
    rest=${BASH_REMATCH[3]}
  else
    echo "soak: DURATION=$duration: want whole hours, minutes and seconds such as 30m or 1h30m" >&2
    exit 2
  fi
done
if [ "$secs" -le 0 ]; then
  echo "soak: DURATION=$duration is not positive" >&2
  exit 2
fi
KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS:-$(hack/setup-envtest.sh | tail -n 1)}
hack/node.sh install >/dev/null
export KUBEBUILDER_ASSETS
summary=$(mktemp "${TMPDIR:-/tmp}/renderqueue-soak.XXXXXX.md")
# every container's log, copied as it is written (the kubelet deletes a Pod's logs with the Pod)
RENDERQUEUE_E2E_LOG_DIR=${RENDERQUEUE_E2E_LOG_DIR:-${summary%.md}.logs}
export RENDERQUEUE_E2E_LOG_DIR
echo "soak: the containers' logs are kept in $RENDERQUEUE_E2E_LOG_DIR" >&2
status=0
CHAOS_DURATION=$duration CHAOS_SUMMARY=$summary \
  go test -tags e2e -count=1 -timeout "$((secs + 1200))s" -v -run '^TestChaos$' ./test/e2e/ || status=$?
echo
if [ -s "$summary" ]; then
  cat "$summary"
  echo "(summary kept in $summary)"
else
  echo "soak: the test ended before its summary (exit $status); see the output above"
fi
exit $status
