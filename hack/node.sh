#!/usr/bin/env bash
# The host side of the local cluster's real node (test/e2e/cluster/node).
#
#   hack/node.sh install   make sure this machine can run the node: Debian's containerd, runc,
#                          containernetworking-plugins (the CNI plugins in /usr/lib/cni), iptables,
#                          conntrack and iproute2, installed with apt-get when missing and we are
#                          root; the kernel's bridge netfilter on. Prints "ok" as the LAST line.
#   hack/node.sh sweep     remove what a node left on this machine (a run killed with SIGKILL
#                          leaves containerd's shims and the containers running): processes,
#                          mounts, iptables chains, the bridge, cgroups, state directories; the next
#                          run does the same by itself. Refuses while a node runs.
#
# The node itself (containerd, the kubelet, kube-proxy, CoreDNS) is started by the Go package,
# through the end-to-end tests, `make demo` and test/e2e/cmd/localcluster; see
# docs/local-cluster.md.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "node.sh: $*" >&2; }
die() { log "$*"; exit 1; }

need=(containerd:containerd runc:runc ctr:containerd iptables:iptables ip6tables:iptables
  iptables-save:iptables iptables-restore:iptables conntrack:conntrack ip:iproute2 nsenter:util-linux)

install() {
  local missing=() c pkg
  for c in "${need[@]}"; do
    pkg=${c#*:}
    command -v "${c%%:*}" >/dev/null 2>&1 || missing+=("$pkg")
  done
  [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] ||
    missing+=(containernetworking-plugins)
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      # shellcheck disable=SC2207 # package names have no spaces
      missing=($(printf '%s\n' "${missing[@]}" | sort -u))
      log "installing Debian's ${missing[*]}"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq >&2
      apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
    else
      die "missing: ${missing[*]} (as root on Debian: apt-get install -y ${missing[*]})"
    fi
  fi
  # Service traffic between two Pods on the bridge must pass iptables (kube-proxy's DNAT).
  if [ ! -e /proc/sys/net/bridge/bridge-nf-call-iptables ]; then
    command -v modprobe >/dev/null 2>&1 && modprobe br_netfilter 2>/dev/null || true
  fi
  [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] ||
    die "the kernel's bridge netfilter (br_netfilter) is not available: Pods could not reach Services"
  echo ok
}

case "${1:-}" in
  install) install ;;
  sweep)
    go build -o bin/localcluster ./test/e2e/cmd/localcluster
    bin/localcluster --sweep
    ;;
  *) die "usage: hack/node.sh install|sweep" ;;
esac
