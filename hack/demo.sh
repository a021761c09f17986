#!/usr/bin/env bash
# make demo: the whole system on this machine, as a user would drive it with kubectl.
#
#   1. builds bin/renderqueue and bin/localcluster
#   2. finds (first run: builds, ~10 min on 2 cores) kube-apiserver, etcd, kube-controller-manager
#      and kubectl (hack/setup-envtest.sh)
#   3. starts the local stack (test/e2e/cluster via bin/localcluster): a throwaway PostgreSQL, etcd,
#      kube-apiserver with the aggregation layer, kube-controller-manager (Deployments, HPAs, ...),
#      and a runner that plays kubelet for shard Pods: each runs the real keeper on 127.0.0.<n>
#   4. kubectl apply -k config/default (CRD, RBAC, operator Deployment, metrics API component);
#      there is no container runtime, so the operator runs here as a local process, authenticated
#      as its ServiceAccount, and the metrics API's Service points at it (ExternalName 127.0.0.1)
#   5. seeds $ROWS rows (default 200,000), applies config/samples (3 shards, 24 h window), waits
#      for Ready, points an HPA at renderqueue_due, runs worker-sim against the shards
#   6. prints what a user looks at: kubectl get renderqueues, kubectl describe renderqueue, the
#      external metric, the HPA — before and after the workers ran — and the web console's URL
#
# Everything it started is stopped on exit (Ctrl-C included), unless KEEP=1 or --keep: then it
# stays up and the script prints how to reach and stop it.
# Tunables (env): ROWS, OVERDUE, SIM_SECONDS, SIM_CONCURRENCY, SIM_RENDER_TIME, KEEP, DEMO_BINARY (a
# prebuilt renderqueue binary instead of building bin/renderqueue).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=hack/lib.sh
. hack/lib.sh
repo=$(pwd)

ROWS=${ROWS:-200000}
OVERDUE=${OVERDUE:-2000}
SIM_SECONDS=${SIM_SECONDS:-20}
SIM_CONCURRENCY=${SIM_CONCURRENCY:-8}
SIM_RENDER_TIME=${SIM_RENDER_TIME:-50ms}
KEEP=${KEEP:-0}
for a in "$@"; do
  case "$a" in
    --keep) KEEP=1 ;;
    -h | --help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo: unknown argument $a (try --help)" >&2; exit 2 ;;
  esac
done

t0=$SECONDS
step() { printf '\n== [%3ds] %s\n' "$((SECONDS - t0))" "$*"; }
note() { printf 'demo: %s\n' "$*"; }
die() { printf 'demo: error: %s\n' "$*" >&2; exit 1; }
# show prints a command as the user would type it (k is kubectl), then runs it.
show() {
  local shown=("$@")
  if [ "$1" = k ]; then shown[0]=kubectl; fi
  if [ "$1" = "${rq:-}" ]; then shown[0]=bin/renderqueue; fi
  printf '\n$ %s\n' "${shown[*]}"
  "$@"
}

work=$(mktemp -d /tmp/renderqueue-demo.XXXXXX)
cluster_pid=""
operator_pid=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$rc" != 0 ]; then
    for f in "$work/operator.log" "$work/localcluster.log"; do
      if [ -s "$f" ]; then printf '\n-- last lines of %s:\n' "$f" >&2; tail -n 25 "$f" >&2; fi
    done
  fi
  if [ "$KEEP" = 1 ] && [ "$rc" = 0 ]; then return 0; fi
  if [ -n "$operator_pid" ] && kill -0 "$operator_pid" 2>/dev/null; then
    note "stopping the operator (pid $operator_pid)"
    kill -TERM "$operator_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$operator_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$operator_pid" 2>/dev/null || true
  fi
  if [ -n "$cluster_pid" ] && kill -0 "$cluster_pid" 2>/dev/null; then
    note "stopping the local cluster: shard processes, kube-controller-manager, kube-apiserver, etcd, PostgreSQL (pid $cluster_pid)"
    kill -TERM "$cluster_pid" 2>/dev/null || true
    for _ in $(seq 1 600); do kill -0 "$cluster_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$cluster_pid" 2>/dev/null || true
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

step "locating the control plane binaries (kube-apiserver, etcd, kube-controller-manager, kubectl)"
if [ -z "${KUBEBUILDER_ASSETS:-}" ]; then
  cache=${ENVTEST_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/renderqueue/envtest}
  if ! ls "$cache"/v1.*/kube-controller-manager >/dev/null 2>&1; then
    note "first run: building the control plane binaries from source through the Go module proxy."
    note "This takes about 10 minutes on 2 cores, once; they are cached in $cache."
  fi
  KUBEBUILDER_ASSETS=$(hack/setup-envtest.sh | tail -n 1)
fi
export KUBEBUILDER_ASSETS
kubectl="$KUBEBUILDER_ASSETS/kubectl"
[ -x "$kubectl" ] || die "no kubectl in $KUBEBUILDER_ASSETS"
k() { "$kubectl" "$@"; }

op_help=$("$rq" operator --help 2>&1 || true)
[[ $op_help == *-metrics-api-secure-port* ]] || die "this build's \`renderqueue operator\` has no external metrics API (--metrics-api)"

# ---------------------------------------------------------------------------------------------
step "starting the local stack: PostgreSQL, etcd, kube-apiserver, kube-controller-manager, pod runner"
bin/localcluster --repo "$repo" --assets "$KUBEBUILDER_ASSETS" --binary "$rq" --dir "$work/cluster" \
  --env-file "$work/env" >"$work/localcluster.log" 2>&1 &
cluster_pid=$!
for _ in $(seq 1 1800); do
  [ -f "$work/env" ] && break
  kill -0 "$cluster_pid" 2>/dev/null || { wait "$cluster_pid" || true; die "the local cluster did not start (log above)"; }
  sleep 0.1
done
[ -f "$work/env" ] || die "the local cluster was not up after 180 s"
# shellcheck disable=SC1091 # written by localcluster: KUBECONFIG, RENDERQUEUE_DSN, ...
. "$work/env"
sed 's/^/  /' "$work/localcluster.log"
note "KUBECONFIG=$KUBECONFIG"

step "installing renderqueue: kubectl apply -k config/default"
k apply --server-side -k config/default | sed 's/^/  /'
k wait --for=condition=Established --timeout=60s crd/renderqueues.renderqueue.dev >/dev/null
note "nothing here runs containers: the operator Deployment is scaled to 0 and the operator runs as a local process"
k -n renderqueue-system scale deployment/renderqueue-operator --replicas=0 >/dev/null

step "database: migrate the schema, seed $ROWS rows ($OVERDUE overdue backlog)"
"$rq" schema migrate --dsn "$RENDERQUEUE_DSN"
"$rq" seed --dsn "$RENDERQUEUE_DSN" --rows "$ROWS" --overdue "$OVERDUE" --progress 0
k create secret generic renderqueue-db --from-literal=dsn="$RENDERQUEUE_DSN" >/dev/null
note "store Secret renderqueue-db created (key dsn)"

step "starting the operator as ServiceAccount renderqueue-system/renderqueue-operator"
opkc="$work/operator.kubeconfig"
cp "$KUBECONFIG" "$opkc"
token=$(k -n renderqueue-system create token renderqueue-operator --duration=24h)
KUBECONFIG=$opkc k config unset users.user.client-certificate >/dev/null
KUBECONFIG=$opkc k config unset users.user.client-key >/dev/null
KUBECONFIG=$opkc k config set-credentials user --token="$token" >/dev/null
mport=$(free_port)
cport=$(free_port) # the web console (docs/console.md): on loopback, so no token
console_url="http://127.0.0.1:$cport/"
op_args=(operator --kubeconfig "$opkc" --keeper-image renderqueue:local --metrics-bind-address 0
  --health-probe-bind-address "127.0.0.1:$(free_port)" --shard-poll-interval 2s
  --metrics-api --metrics-api-bind-address 127.0.0.1 --metrics-api-secure-port "$mport"
  --console --console-bind-address "127.0.0.1:$cport")
"$rq" "${op_args[@]}" >"$work/operator.log" 2>&1 &
operator_pid=$!
note "operator pid $operator_pid, log $work/operator.log"
# The aggregator cannot route to EndpointSlices on loopback addresses (the API server rejects
  # them), so the metrics API's Service becomes an ExternalName Service naming 127.0.0.1, and the
  # APIService uses the operator's port.
k -n renderqueue-system delete service renderqueue-metrics-api --wait >/dev/null
k -n renderqueue-system create service externalname renderqueue-metrics-api --external-name 127.0.0.1 >/dev/null
k patch apiservice v1beta1.external.metrics.k8s.io --type=merge -p "{\"spec\":{\"service\":{\"port\":$mport}}}" >/dev/null
note "external.metrics.k8s.io -> the operator's metrics API on https://127.0.0.1:$mport"

step "applying config/samples: RenderQueue web (3 shards, 24 h window)"
k apply -k config/samples | sed 's/^/  /'
note "waiting for the shards to load (kubectl wait --for=condition=Ready renderqueue/web)"
k wait --for=condition=Ready --timeout=180s renderqueue/web >/dev/null
for _ in $(seq 1 120); do
  [ "$(k get renderqueue web -o jsonpath='{.status.dueExact}')" = true ] && break
  sleep 0.5
done

step "what a user looks at"
note "web console: $console_url (KEEP=1 keeps it up)"
show k get renderqueues
show k get pods -l renderqueue.dev/queue=web -o wide
show k describe renderqueue web

metric_path="/apis/external.metrics.k8s.io/v1beta1/namespaces/default/renderqueue_due?labelSelector=renderqueue.dev%2Fname%3Dweb"
k wait --for=condition=Available --timeout=60s apiservice/v1beta1.external.metrics.k8s.io >/dev/null
show k get --raw "$metric_path"
echo
step "an HPA on renderqueue_due: one render worker per 500 due rows"
k apply -f - >/dev/null <<'EOF'
apiVersion: apps/v1
kind: Deployment
metadata:
  name: render-workers
spec:
  replicas: 1
  selector: {matchLabels: {app: render-workers}}
  template:
    metadata: {labels: {app: render-workers}}
    spec:
      containers:
        - {name: worker, image: "renderqueue:local", args: ["worker-sim"]}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: render-workers
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: render-workers}
  minReplicas: 1
  maxReplicas: 20
  metrics:
    - type: External
      external:
        metric:
          name: renderqueue_due
          selector: {matchLabels: {renderqueue.dev/name: web}}
        target: {type: AverageValue, averageValue: "500"}
EOF
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
note "(the worker Deployment's Pods stay Pending here: nothing runs containers but the shard runner)"

step "worker-sim: $SIM_CONCURRENCY simulated render workers claiming from the 3 shards for ${SIM_SECONDS}s"
k get secret web-api-token -o jsonpath='{.data.token}' | base64 -d >"$work/token"
shards=$(k get pods -l renderqueue.dev/queue=web -o jsonpath='{range .items[*]}http://{.status.podIP}:8080,{end}')
shards=${shards%,}
note "shards: $shards (token from Secret web-api-token)"
"$rq" worker-sim --shard "$shards" --token-file "$work/token" --duration "${SIM_SECONDS}s" \
  --concurrency "$SIM_CONCURRENCY" --render-time "$SIM_RENDER_TIME" --progress 5s
sleep 3 # two operator polls, so the status below includes the last completions

step "after the workers ran"
show k get renderqueues
show k get --raw "$metric_path"
echo
show k get hpa render-workers
show "$rq" status --url "${shards%%,*}"

if [ "$KEEP" = 1 ]; then
  step "still running (KEEP=1)"
  cat <<EOF
  export KUBECONFIG=$KUBECONFIG
  export PATH=$KUBEBUILDER_ASSETS:\$PATH      # kubectl
  kubectl get renderqueues; kubectl describe renderqueue web; kubectl get hpa
  web console: $console_url
  bin/renderqueue status --url ${shards%%,*}
  PostgreSQL: $RENDERQUEUE_DSN
  logs: $work (operator.log, localcluster.log, cluster/logs, cluster/pods/*/container.log)
Stop it all with:
  kill $operator_pid $cluster_pid; sleep 5; rm -rf $work
EOF
else
  step "done; stopping everything (KEEP=1 or --keep leaves it running)"
fi
