#!/usr/bin/env bash
# Prints (as the last line of stdout) a KUBEBUILDER_ASSETS directory holding kube-apiserver, etcd,
# kubectl and kube-controller-manager for the Kubernetes version matching k8s.io/api in go.mod
# (k8s.io/api v0.Y.Z -> Kubernetes v1.Y.Z).
#
# Order of preference:
#   1. $KUBEBUILDER_ASSETS when it is set (printed as is);
#   2. the cache ${XDG_CACHE_HOME:-$HOME/.cache}/renderqueue/envtest/<version>;
#   3. a build from source through the Go module proxy (no binary download site is reachable from
#      CI): a throwaway module requires k8s.io/kubernetes vX.Y.Z and replaces every staging module
#      (the replace block of kubernetes' own go.mod) with its published v0.Y.Z; kube-apiserver,
#      kube-controller-manager and kubectl are built from kubernetes' own main packages, etcd from
#      go.etcd.io/etcd/server/v3/etcdmain at the version kubernetes' go.mod uses. The result is built
#      into a temporary directory and renamed into the cache, so a cache entry is always complete.
#
# The first build takes about 6-16 minutes on 2 cores (16 on a fresh machine with an empty Go
# build cache, December 2026); progress goes to stderr.
# Environment: ENVTEST_K8S_VERSION overrides the version (vX.Y.Z); ENVTEST_CACHE_DIR the cache root.
set -euo pipefail

log() { printf 'setup-envtest: [%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

binaries=(kube-apiserver etcd kubectl kube-controller-manager)

complete_dir() {
  local d=$1 b
  for b in "${binaries[@]}"; do [ -x "$d/$b" ] || return 1; done
}

if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
  for b in kube-apiserver etcd kubectl; do
    [ -x "$KUBEBUILDER_ASSETS/$b" ] || log "warning: \$KUBEBUILDER_ASSETS/$b is missing"
  done
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

repo=$(cd "$(dirname "$0")/.." && pwd)
command -v go >/dev/null || die "go is not on PATH"

version=${ENVTEST_K8S_VERSION:-}
if [ -z "$version" ]; then
  api=$(cd "$repo" && go list -m -f '{{.Version}}' k8s.io/api 2>/dev/null || true)
  if [ -z "$api" ]; then
    api=$(awk '$1 == "k8s.io/api" { print $2; exit }' "$repo/go.mod")
  fi
  [ -n "$api" ] || die "k8s.io/api is not required by $repo/go.mod; set ENVTEST_K8S_VERSION"
  [[ $api =~ ^v0\.([0-9]+)\.([0-9]+)$ ]] || die "unexpected k8s.io/api version $api"
  version="v1.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
fi
[[ $version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "unexpected Kubernetes version $version"
minor=${BASH_REMATCH[1]}
staging="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"

root=${ENVTEST_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/renderqueue/envtest}
dest="$root/$version"
if complete_dir "$dest"; then
  log "using cached $version binaries in $dest"
  echo "$dest"
  exit 0
fi

mkdir -p "$root"
# One builder at a time; a second caller waits and then finds the cache filled.
exec 9>"$root/.lock"
if ! flock -n 9; then
  log "another build of the envtest binaries is running; waiting for it"
  flock 9
fi
if complete_dir "$dest"; then
  log "using cached $version binaries in $dest"
  echo "$dest"
  exit 0
fi

start=$(date +%s)
work=$(mktemp -d "$root/.build-$version.XXXXXX")
trap 'rm -rf "$work"' EXIT
out="$work/bin"
mkdir -p "$out"
export GOFLAGS="-mod=mod ${GOFLAGS:-}"
export CGO_ENABLED=0
# A developer's GOWORK or a surrounding module must not leak into the throwaway modules.
export GOWORK=off

log "building Kubernetes $version test binaries from the Go module proxy (first time: ~6-16 minutes on 2 cores)"
log "downloading k8s.io/kubernetes@$version"
kdir=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$version" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -n "$kdir" ] && [ -f "$kdir/go.mod" ] || die "could not download k8s.io/kubernetes@$version"

etcd_version=$(awk '$1 == "go.etcd.io/etcd/server/v3" { print $2; exit }' "$kdir/go.mod")
[ -n "$etcd_version" ] || etcd_version=v$(sed -n 's/^ETCD_VERSION=\${ETCD_VERSION:-\(.*\)}$/\1/p' "$kdir/hack/lib/etcd.sh")
[[ $etcd_version =~ ^v3\. ]] || die "could not tell which etcd Kubernetes $version uses"

# --- kube-apiserver, kube-controller-manager, kubectl -------------------------------------------
kmod="$work/kubernetes"
mkdir -p "$kmod"
{
  echo "module renderqueue.local/envtest"
  echo
  sed -n 's/^go \(.*\)$/go \1/p' "$kdir/go.mod" | head -n 1
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  echo "replace ("
  # Every staging module (k8s.io/x => ./staging/src/k8s.io/x) points at its published release;
  # any other replace of kubernetes' go.mod is kept as it is.
  awk -v v="$staging" '
    /^replace \($/ { inblock = 1; next }
    inblock && /^\)$/ { inblock = 0; next }
    inblock && $2 == "=>" {
      if ($3 ~ /^\.\/staging\//) print "\t" $1 " => " $1 " " v
      else { $1 = $1; print "\t" $0 }
    }
  ' "$kdir/go.mod"
  echo ")"
} >"$kmod/go.mod"
grep -q '=> k8s.io/api ' "$kmod/go.mod" || die "no staging replace block found in kubernetes' go.mod"
cat >"$kmod/tools.go" <<'EOF'
//go:build tools

// Package tools pins the packages whose main programs are built from the module cache.
package tools

import (
	_ "k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	_ "k8s.io/kubectl/pkg/cmd"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
)
EOF
log "resolving the module graph of k8s.io/kubernetes@$version (staging modules at $staging)"
(cd "$kmod" && go mod tidy >&2)

vpkg=k8s.io/component-base/version
cvpkg=k8s.io/client-go/pkg/version
ldflags="-s -w"
for p in $vpkg $cvpkg; do
  ldflags+=" -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitVersion=$version"
  ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
log "compiling kube-apiserver, kube-controller-manager and kubectl (the slow part)"
(cd "$kmod" && go build -trimpath -ldflags "$ldflags" -o "$out/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kubectl)
log "kube-apiserver, kube-controller-manager, kubectl built ($(($(date +%s) - start))s so far)"

# --- etcd -----------------------------------------------------------------------------------------
emod="$work/etcd"
mkdir -p "$emod"
cat >"$emod/go.mod" <<EOF
module renderqueue.local/etcd

go 1.26

require go.etcd.io/etcd/server/v3 $etcd_version
EOF
cat >"$emod/main.go" <<'EOF'
// Command etcd is etcd's own main, built for the envtest control plane.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
log "building etcd $etcd_version"
(cd "$emod" && go mod tidy >&2 && go build -trimpath -ldflags "-s -w" -o "$out/etcd" .)

for b in "${binaries[@]}"; do [ -x "$out/$b" ] || die "$b was not built"; done
"$out/kube-apiserver" --version >&2 || die "kube-apiserver does not run"
"$out/etcd" --version >&2 || die "etcd does not run"

# Publish atomically: a cache entry either is complete or does not exist.
rm -rf "$dest"
mv "$out" "$dest"
log "built Kubernetes $version (etcd $etcd_version) in $(($(date +%s) - start))s into $dest"
echo "$dest"
