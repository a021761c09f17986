#!/usr/bin/env bash
# Prints (as the last line of stdout) the path of a helm binary for the chart's tests and the
# end-to-end Helm install: $HELM when set; else the cache
# ${XDG_CACHE_HOME:-$HOME/.cache}/renderqueue/helm/$HELM_VERSION/helm; else a build of
# helm.sh/helm/v4/cmd/helm@$HELM_VERSION through the Go module proxy into that cache (about 4
# minutes on 2 cores the first time). It never skips: a setup that cannot get helm fails.
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v4.3.2}
log() { printf 'helm.sh: [%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -n "${HELM:-}" ]; then
  echo "$HELM"
  exit 0
fi
command -v go >/dev/null || { log "go is not on PATH"; exit 1; }
dir=${XDG_CACHE_HOME:-$HOME/.cache}/renderqueue/helm/$HELM_VERSION
if [ -x "$dir/helm" ]; then
  echo "$dir/helm"
  exit 0
fi
mkdir -p "$dir"
exec 9>"$dir.lock"
flock 9
if [ ! -x "$dir/helm" ]; then
  log "building helm $HELM_VERSION (helm.sh/helm/v4/cmd/helm) into $dir"
  tmp=$(mktemp -d "$dir.XXXXXX")
  # outside this module: go install pkg@version uses helm's own module graph
  (cd "$tmp" && GOBIN="$tmp" GOFLAGS=-mod=mod go install "helm.sh/helm/v4/cmd/helm@$HELM_VERSION")
  mv "$tmp/helm" "$dir/helm"
  rm -rf "$tmp"
fi
"$dir/helm" version --short >&2
echo "$dir/helm"
