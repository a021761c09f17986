#!/usr/bin/env bash
# make demo: the whole system on this machine, as a user would drive it with kubectl.
#
#   1. builds bin/renderqueue and bin/localcluster
#   2. finds (first run: builds, ~10-20 min on 2 cores) the Kubernetes binaries and CoreDNS
#      (hack/setup-envtest.sh) and installs Debian's containerd, runc and CNI plugins when missing
#      (hack/node.sh install)
#   3. starts the local stack (test/e2e/cluster via bin/localcluster): the images (`make image`,
#      the sandbox, CoreDNS), a throwaway PostgreSQL, and a one-node cluster of real components —
#      etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd + runc, the
#      kubelet, kube-proxy and CoreDNS (docs/local-cluster.md)
#   4. kubectl apply --server-side -k config/default as shipped (CRD, RBAC, the operator
#      Deployment, the metrics API component) and waits for the operator's rollout
#   5. seeds $ROWS rows (default 200,000), applies config/samples (3 shards, 24 h window), waits
#      for Ready, shows `kubectl renderqueue web` (the plugin), applies config/samples/workers (render
#      worker Pods on pkg/client and their HPA on renderqueue_due) and lets them render
#   6. prints what a user looks at: kubectl get renderqueues, kubectl get pods -A -o wide,
#      kubectl describe renderqueue, the external metric, the HPA — before and after the workers ran
#      — and the web console's URL (config/console is applied with config/default: see step 4)
#
# Everything it started is stopped on exit (Ctrl-C included), unless KEEP=1 or --keep: then it
# stays up and the script prints how to reach and stop it.
# Tunables (env): ROWS, OVERDUE, SIM_SECONDS (how long the workers render), KEEP, DEMO_BINARY (a
# prebuilt renderqueue binary for the host-side commands instead of building bin/renderqueue). Needs
# root (a real node: containerd, the kubelet, network namespaces, iptables).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

ROWS=${ROWS:-200000}
OVERDUE=${OVERDUE:-2000}
SIM_SECONDS=${SIM_SECONDS:-20}
KEEP=${KEEP:-0}
for a in "$@"; do
  case "$a" in
    --keep) KEEP=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo: unknown argument $a (try --help)" >&2; exit 2 ;;
  esac
done

t0=$SECONDS
step() { printf '\n== [%3ds] %s\n' "$((SECONDS - t0))" "$*"; }
note() { printf 'demo: %s\n' "$*"; }
die() { printf 'demo: error: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run it as root: the local cluster is a real node (containerd, the kubelet, network namespaces, iptables; docs/local-cluster.md)"
# show prints a command as the user would type it (k is kubectl), then runs it.
show() {
  local shown=("$@")
  if [ "$1" = k ]; then shown[0]=kubectl; fi
  if [ "$1" = "${rq:-}" ]; then shown[0]=bin/renderqueue; fi
  if [ "$1" = kr ]; then shown=(kubectl renderqueue "${@:2}"); fi
  printf '\n$ %s\n' "${shown[*]}"
  "$@"
}

work=$(mktemp -d /tmp/renderqueue-demo.XXXXXX)
cluster_pid=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$rc" != 0 ]; then
    if [ -s "$work/localcluster.log" ]; then
      printf '\n-- last lines of %s:\n' "$work/localcluster.log" >&2
      tail -n 25 "$work/localcluster.log" >&2
    fi
    if [ -n "${KUBECONFIG:-}" ] && [ -n "${kubectl:-}" ] && kill -0 "$cluster_pid" 2>/dev/null; then
      printf '\n-- kubectl get pods -A -o wide:\n' >&2
      "$kubectl" get pods -A -o wide >&2 || true
      printf '\n-- kubectl -n renderqueue-system logs deployment/renderqueue-operator --tail=25:\n' >&2
      "$kubectl" -n renderqueue-system logs deployment/renderqueue-operator --tail=25 >&2 || true
    fi
  fi
  if [ "$KEEP" = 1 ] && [ "$rc" = 0 ]; then return 0; fi
  if [ -n "$cluster_pid" ] && kill -0 "$cluster_pid" 2>/dev/null; then
    note "stopping the local cluster: the Pods, the node, the control plane, PostgreSQL; then the node is swept away (pid $cluster_pid)"
    kill -TERM "$cluster_pid" 2>/dev/null || true
    for _ in $(seq 1 1500); do kill -0 "$cluster_pid" 2>/dev/null || break; sleep 0.1; done
    if kill -KILL "$cluster_pid" 2>/dev/null; then
      note "the local cluster did not stop in time; sweeping the node away (hack/node.sh sweep)"
      sleep 1
      hack/node.sh sweep >&2 || true
    fi
  fi
  rm -rf "$work"
  note "everything stopped"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------------------------
step "building bin/renderqueue and bin/localcluster"
go build -o bin/localcluster ./test/e2e/cmd/localcluster
if [ -n "${DEMO_BINARY:-}" ]; then
  rq=$(cd "$(dirname "$DEMO_BINARY")" && pwd)/$(basename "$DEMO_BINARY")
  note "using DEMO_BINARY=$rq instead of building bin/renderqueue"
else
  go build -o bin/renderqueue ./cmd/renderqueue
  rq=$repo/bin/renderqueue
fi

step "locating the Kubernetes binaries and CoreDNS; containerd, runc and the CNI plugins"
if [ -z "${KUBEBUILDER_ASSETS:-}" ]; then
  cache=${ENVTEST_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/renderqueue/envtest}
  if ! ls "$cache"/v1.*/kubelet "$cache"/v1.*/coredns >/dev/null 2>&1; then
    note "first run: building the Kubernetes binaries and CoreDNS from source through the Go module proxy."
    note "This takes about 10-20 minutes on 2 cores, once; they are cached in $cache."
  fi
  KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)
fi
hack/node.sh install >/dev/null
export KUBEBUILDER_ASSETS
kubectl="$KUBEBUILDER_ASSETS/kubectl"
[ -x "$kubectl" ] || die "no kubectl in $KUBEBUILDER_ASSETS"
k() { "$kubectl" "$@"; }

op_help=$("$rq" operator --help 2>&1 || true)
[[ $op_help == *-metrics-api-secure-port* ]] || die "this build's \`renderqueue operator\` has no external metrics API (--metrics-api)"

# ---------------------------------------------------------------------------------------------
step "starting the local stack: the images, PostgreSQL, the control plane, the node (containerd, kubelet, kube-proxy, CoreDNS)"
bin/localcluster --repo "$repo" --assets "$KUBEBUILDER_ASSETS" --dir "$work/cluster" \
  --env-file "$work/env" >"$work/localcluster.log" 2>&1 &
cluster_pid=$!
for _ in $(seq 1 9000); do
  [ -f "$work/env" ] && break
  kill -0 "$cluster_pid" 2>/dev/null || { wait "$cluster_pid" || true; die "the local cluster did not start (log above)"; }
  sleep 0.1
done
[ -f "$work/env" ] || die "the local cluster was not up after 15 minutes (log above)"
# shellcheck disable=SC1091 # written by localcluster: KUBECONFIG, RENDERQUEUE_DSN, ...
. "$work/env"
sed 's/^/  /' "$work/localcluster.log"
note "KUBECONFIG=$KUBECONFIG"

step "installing renderqueue: config/default with the config/console component (kubectl apply --server-side -k)"
# The web console (docs/console.md) is a kustomize Component of config/default: an overlay of the
# two, as shipped, plus the token Secret it needs.
console_token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
overlay="$work/install" # kustomize wants relative paths
mkdir -p "$overlay"
config=$(realpath --relative-to="$overlay" "$repo/config")
printf '%s\n' 'apiVersion: kustomize.config.k8s.io/v1beta1' 'kind: Kustomization' \
  "resources: [$config/default]" "components: [$config/console]" >"$overlay/kustomization.yaml"
k create namespace renderqueue-system >/dev/null
k -n renderqueue-system create secret generic renderqueue-console-token --from-literal=token="$console_token" >/dev/null
k apply --server-side -k "$overlay" | sed 's/^/  /'
k wait --for=condition=Established --timeout=60s crd/renderqueues.renderqueue.dev >/dev/null
show k -n renderqueue-system rollout status deployment/renderqueue-operator --timeout=180s
console_url="http://127.0.0.1:8090/"
console_howto="kubectl -n renderqueue-system port-forward deployment/renderqueue-operator 8090:8090, then open $console_url"

step "database: migrate the schema, seed $ROWS rows ($OVERDUE overdue backlog)"
"$rq" schema migrate --dsn "$RENDERQUEUE_DSN"
"$rq" seed --dsn "$RENDERQUEUE_DSN" --rows "$ROWS" --overdue "$OVERDUE" --progress 0
# The shard Pods reach PostgreSQL over TCP at the node's address (RENDERQUEUE_POD_DSN), as they
# would reach a database server in a cluster.
k create secret generic renderqueue-db --from-literal=dsn="$RENDERQUEUE_POD_DSN" >/dev/null
note "store Secret renderqueue-db created (key dsn: $RENDERQUEUE_POD_DSN)"

step "applying config/samples: RenderQueue web (3 shards, 24 h window)"
k apply -k config/samples | sed 's/^/  /'
note "waiting for the shards to load (kubectl wait --for=condition=Ready renderqueue/web)"
k wait --for=condition=Ready --timeout=180s renderqueue/web >/dev/null
for _ in $(seq 1 120); do
  [ "$(k get renderqueue web -o jsonpath='{.status.dueExact}')" = true ] && break
  sleep 0.5
done

step "what a user looks at"
note "web console: $console_howto; token $console_token (KEEP=1 keeps it up)"
show k get renderqueues
show k get pods -A -o wide
show k describe renderqueue web

metric_path="/apis/external.metrics.k8s.io/v1beta1/namespaces/default/renderqueue_due?labelSelector=renderqueue.dev%2Fname%3Dweb"
k wait --for=condition=Available --timeout=60s apiservice/v1beta1.external.metrics.k8s.io >/dev/null
show k get --raw "$metric_path"
echo
step "kubectl renderqueue web: every shard read through the API server's Pod proxy (the kubectl plugin)"
plugin_dir=$work/plugin
mkdir -p "$plugin_dir"
ln -sf "$rq" "$plugin_dir/kubectl-renderqueue"
kr() { PATH="$plugin_dir:$PATH" k renderqueue "$@"; }
show kr web

step "render workers as Pods: config/samples/workers (worker-sim on pkg/client, shards found through the RenderQueue) and their HPA on renderqueue_due (one worker per 500 due rows)"
k apply -k config/samples/workers | sed 's/^/  /'
note "waiting for the HPA controller to read the metric (ScalingActive) and scale"
# (Its first status after a rescale still averages over the old replica count; wait until the
# status reports the replicas it asked for.)
for _ in $(seq 1 120); do
  hpa=$(k get hpa render-workers -o jsonpath='{.status.conditions[?(@.type=="ScalingActive")].status} {.status.currentReplicas} {.status.desiredReplicas}')
  read -r active current desired <<<"$hpa"
  [ "$active" = True ] && [ "${current:-0}" -gt 1 ] && [ "$current" = "$desired" ] && break
  sleep 0.5
done
show k get hpa render-workers
show k get pods -l app.kubernetes.io/name=render-workers -o wide
note "letting the workers render for ${SIM_SECONDS}s"
sleep "$SIM_SECONDS"
show k logs -l app.kubernetes.io/name=render-workers --tail=2 --prefix
sim_end=$(date -u +%Y-%m-%dT%H:%M:%SZ)
note "waiting for a shard poll after that (the operator polls every 10 s: --shard-poll-interval in config/manager)"
for _ in $(seq 1 50); do
  [[ "$(k get renderqueue web -o jsonpath='{.status.dueAsOf}')" > "$sim_end" ]] && break
  sleep 0.5
done

step "after the workers ran for ${SIM_SECONDS}s"
show k get renderqueues
show k get --raw "$metric_path"
echo
show k get hpa render-workers
show kr web

if [ "$KEEP" = 1 ]; then
  step "still running (KEEP=1)"
  cat <<EOF
  export KUBECONFIG=$KUBECONFIG
  export PATH=$KUBEBUILDER_ASSETS:\$PATH      # kubectl
  kubectl get renderqueues; kubectl describe renderqueue web; kubectl get hpa
  web console: $console_howto (token: $console_token)
  kubectl get pods -A -o wide; kubectl -n renderqueue-system logs deployment/renderqueue-operator
  PATH=$plugin_dir:\$PATH kubectl renderqueue web
  PostgreSQL: $RENDERQUEUE_DSN
  logs: $work (localcluster.log, cluster/logs: control plane and node), $LOCALCLUSTER_POD_LOGS (containers)
Stop it all with:
  kill $cluster_pid   # it stops everything and sweeps the node away (after a kill -9: hack/node.sh sweep)
  rm -rf $work
EOF
else
  step "done; stopping everything (KEEP=1 or --keep leaves it running)"
fi
