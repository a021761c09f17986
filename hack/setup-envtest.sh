#!/usr/bin/env bash
# Prints (as the last line of stdout) a KUBEBUILDER_ASSETS directory holding kube-apiserver, etcd,
# kubectl and kube-controller-manager for the Kubernetes version matching k8s.io/api in go.mod
# (k8s.io/api v0.Y.Z -> Kubernetes v1.Y.Z), and beside them the binaries of the real one-node
# cluster the end-to-end tests and `make demo` run (hack/node.sh): kube-scheduler, kubelet and
# kube-proxy of the same version, and CoreDNS ($COREDNS_VERSION, a build with only the plugins a
# cluster.local-only DNS needs).
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
# build cache, December 2026); progress goes to stderr. A cache entry that lacks some binaries (one
# made before the node binaries were added) gets only the missing ones built.
# Environment: ENVTEST_K8S_VERSION overrides the version (vX.Y.Z); ENVTEST_CACHE_DIR the cache root.
set -euo pipefail

log() { printf 'setup-envtest: [%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

binaries=(kube-apiserver etcd kubectl kube-controller-manager kube-scheduler kubelet kube-proxy coredns)
# The Kubernetes binaries, built together in one `go build` (one module graph, one compile of what
# they share).
kube_binaries=(kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet kube-proxy)
COREDNS_VERSION=${COREDNS_VERSION:-v1.15.0}

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

missing() {
  local b
  for b in "$@"; do [ -x "$dest/$b" ] || return 0; done
  return 1
}

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

# --- kube-apiserver, kube-controller-manager, kubectl, kube-scheduler, kubelet, kube-proxy ------
if missing "${kube_binaries[@]}"; then
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
	_ "k8s.io/kubernetes/cmd/kube-proxy/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
	_ "k8s.io/kubernetes/cmd/kubelet/app"
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
log "compiling ${kube_binaries[*]} (the slow part)"
pkgs=()
for b in "${kube_binaries[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
(cd "$kmod" && go build -trimpath -ldflags "$ldflags" -o "$out/" "${pkgs[@]}")
log "${kube_binaries[*]} built ($(($(date +%s) - start))s so far)"
fi

# --- etcd -----------------------------------------------------------------------------------------
if missing etcd; then
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
fi

# --- CoreDNS --------------------------------------------------------------------------------------
# CoreDNS's own main (coremain) with only the plugins the cluster's DNS uses: kubernetes (the
# cluster.local zone from Services and EndpointSlices), errors, log, health, ready, cache,
# loadbalance and prometheus. No forward plugin is linked in at all: the cluster's DNS cannot ask
# any resolver outside this machine, whatever its Corefile says.
if missing coredns; then
cmod="$work/coredns"
mkdir -p "$cmod"
cat >"$cmod/go.mod" <<EOF
module renderqueue.local/coredns

go 1.26

require github.com/coredns/coredns $COREDNS_VERSION
EOF
cat >"$cmod/main.go" <<'EOF'
// Command coredns is CoreDNS's own main with the plugins of a cluster.local-only DNS server.
package main

import (
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func main() { coremain.Run() }
EOF
log "building CoreDNS $COREDNS_VERSION"
(cd "$cmod" && go mod tidy >&2 &&
  go build -trimpath -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" -o "$out/coredns" .)
fi

for b in "${binaries[@]}"; do [ -x "$out/$b" ] || [ -x "$dest/$b" ] || die "$b was not built"; done
[ ! -x "$out/kube-apiserver" ] || "$out/kube-apiserver" --version >&2 || die "kube-apiserver does not run"
[ ! -x "$out/etcd" ] || "$out/etcd" --version >&2 || die "etcd does not run"
[ ! -x "$out/coredns" ] || "$out/coredns" -version >&2 || die "coredns does not run"

# Publish each binary with a rename: a binary in the cache is always whole, and the directory
# counts as an entry only when every binary is there (complete_dir).
mkdir -p "$dest"
for b in "${binaries[@]}"; do
  if [ -x "$out/$b" ]; then mv -f "$out/$b" "$dest/$b"; fi
done
complete_dir "$dest" || die "the cache entry $dest is still incomplete"
log "built Kubernetes $version (etcd $etcd_version) in $(($(date +%s) - start))s into $dest"
echo "$dest"
