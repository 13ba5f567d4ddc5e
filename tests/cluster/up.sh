#!/usr/bin/env bash
# Start a real Kubernetes control plane on this machine for Shoal's cluster tests:
#   tests/cluster/up.sh DIR        (DIR/kubeconfig is cluster-admin; tests/cluster/down.sh DIR stops it)
# etcd (Debian's etcd-server, data in DIR/etcd), kube-apiserver, kube-controller-manager and
# kube-scheduler (built from the Go module proxy by build.sh), and tests/cluster/node_agent.py,
# which keeps fake GPU nodes Ready and runs the pods bound to them as local processes, each in a
# network namespace of its own (EndpointSlices refuse loopback addresses, so pods cannot be
# 127.0.x.y; see docs/kubernetes.md). Why so: no kubelet, container runtime or Docker engine runs
# here, and the cluster code must meet a real API server, real admission, controllers and scheduler.
# Everything listens on 127.0.0.1 only, on free ports; the pods' addresses live on a bridge that
# up.sh makes (SHOAL_POD_NET, a free 10.x.0.0/16) and that only this machine routes to.
# Every process runs in its own process group with a pid file in DIR; logs are DIR/*.log.
# Knobs: SHOAL_NODES_PER_MODE (default 1), SHOAL_ARTIFACTS_DIR (the artifacts PVC's directory,
# default DIR/artifacts), SHOAL_UP_TIMEOUT_S (default 120).
# kubectl: Debian's kubernetes-client is 1.20, seventeen minors behind the server and outside the
# supported skew (+-1), and on these machines /usr/bin/kubectl belongs to another package, so
# build.sh builds kubectl 1.37 from the same module (DIR/env: KUBECTL); Debian's is not used.
set -euo pipefail
DIR="${1:?usage: up.sh DIR}"
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
PY="${SHOAL_PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=/work/main/.venv/bin/python
TIMEOUT_S="${SHOAL_UP_TIMEOUT_S:-120}"
NODES_PER_MODE="${SHOAL_NODES_PER_MODE:-1}"
ARTIFACTS="${SHOAL_ARTIFACTS_DIR:-$DIR/artifacts}"
log() { echo "up.sh: $*" >&2; }
fail() { log "$*"; "$HERE/down.sh" "$DIR" >&2 || true; exit 1; }
unset WATCH  # wait_for's, set per call (WATCH=NAME wait_for ...), never from the environment

if [ -e "$DIR/apiserver.pid" ] && kill -0 "$(cat "$DIR/apiserver.pid")" 2>/dev/null; then
    fail "a cluster already runs from $DIR (down.sh it first)"
fi

# --- packages and binaries -------------------------------------------------------------------
if ! command -v etcd >/dev/null; then
    log "installing etcd-server from Debian"
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server >&2
fi
# Prometheus for the end-to-end test (tests/cluster/test_end_to_end.py starts its own on 127.0.0.1)
if ! command -v prometheus >/dev/null; then
    log "installing prometheus from Debian"
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >&2
fi
BIN="$("$HERE/build.sh")"
KUBECTL="$BIN/kubectl"

# --- ports and the pod network ----------------------------------------------------------------
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ETCD_PORT=$(free_port); ETCD_PEER_PORT=$(free_port); API_PORT=$(free_port)
CM_PORT=$(free_port); SCHED_PORT=$(free_port)
POD_NET="${SHOAL_POD_NET:-}"
if [ -z "$POD_NET" ]; then   # the first 10.N.0.0/16 (N in 200..249) no interface here uses
    # Read once, then grep the text: under pipefail, `ip ... | grep -q` fails when grep stops at
    # a match before ip has written all (SIGPIPE, 141), which took a cluster's net for a free one
    # once another cluster's pods had made more than a pipe write of interfaces.
    ADDRS="$(ip -o addr show)" || fail "ip -o addr show failed: cannot choose a pod network"
    for n in $(seq 200 249); do
        grep -q " 10\.$n\." <<<"$ADDRS" || { POD_NET="10.$n.0.0/16"; break; }
    done
fi
[ -n "$POD_NET" ] || fail "no free 10.N.0.0/16 for the pod network (N in 200..249)"
POD_GW="${POD_NET%.0.0/16}.0.1"
TAG="$(echo -n "$DIR" | sha1sum | cut -c1-6)"   # names this cluster's bridge and netns
cat > "$DIR/env" <<EOF
API_PORT=$API_PORT
ETCD_PORT=$ETCD_PORT
POD_NET=$POD_NET
POD_GW=$POD_GW
TAG=$TAG
KUBECTL=$KUBECTL
BIN=$BIN
EOF

# --- PKI: a CA, the serving cert, client certs, service-account keys --------------------------
PKI="$DIR/pki"
mkdir -p "$PKI"
ossl() { openssl "$@" >/dev/null 2>&1 || fail "openssl $1 failed"; }
if [ ! -e "$PKI/ca.crt" ]; then
    ossl req -x509 -newkey rsa:2048 -nodes -days 30 -keyout "$PKI/ca.key" -out "$PKI/ca.crt" \
        -subj "/CN=shoal-test-ca" -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
    ossl genrsa -out "$PKI/sa.key" 2048
    ossl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
fi
sign() {  # sign NAME SUBJECT EXT: a key and a cert signed by the CA
    ossl req -newkey rsa:2048 -nodes -keyout "$PKI/$1.key" -out "$PKI/$1.csr" -subj "$2"
    printf '%s\n' "$3" > "$PKI/$1.ext"
    ossl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
        -days 30 -out "$PKI/$1.crt" -extfile "$PKI/$1.ext"
}
CLIENT_EXT="keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
# The pods reach the API at the pod network's gateway (the agent forwards it to 127.0.0.1).
sign apiserver "/CN=kube-apiserver" "keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1,IP:$POD_GW,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
sign admin "/O=system:masters/CN=shoal-test-admin" "$CLIENT_EXT"
sign controller-manager "/CN=system:kube-controller-manager" "$CLIENT_EXT"
sign scheduler "/CN=system:kube-scheduler" "$CLIENT_EXT"
# The agent keeps many nodes, as KWOK does, so it is no single system:node:NAME: it runs as admin.
sign node-agent "/O=system:masters/CN=shoal-node-agent" "$CLIENT_EXT"

kubeconfig() {  # kubeconfig FILE CERTNAME
    cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: shoal-test
  cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$PKI/ca.crt"}
users:
- name: $2
  user: {client-certificate: "$PKI/$2.crt", client-key: "$PKI/$2.key"}
contexts:
- name: shoal-test
  context: {cluster: shoal-test, user: $2}
current-context: shoal-test
EOF
}
kubeconfig "$DIR/kubeconfig" admin
kubeconfig "$DIR/controller-manager.kubeconfig" controller-manager
kubeconfig "$DIR/scheduler.kubeconfig" scheduler
kubeconfig "$DIR/node-agent.kubeconfig" node-agent

# --- processes ----------------------------------------------------------------------------------
start() {  # start NAME CMD...: own session and process group (setsid), pid file, log
    local name="$1"; shift
    setsid "$@" >"$DIR/$name.log" 2>&1 < /dev/null &
    echo $! > "$DIR/$name.pid"
}
wait_for() {  # [WATCH=NAME] wait_for WHAT CMD...: until CMD succeeds, at most TIMEOUT_S
    local what="$1"; shift                 # (and fail at once, with its log, if NAME exits)
    local deadline=$((SECONDS + TIMEOUT_S))
    until "$@" >/dev/null 2>&1; do
        [ -z "${WATCH:-}" ] || alive "$WATCH"
        [ $SECONDS -lt $deadline ] || fail "$what not ready after ${TIMEOUT_S}s (logs in $DIR)"
        sleep 0.5
    done
}
alive() { kill -0 "$(cat "$DIR/$1.pid")" 2>/dev/null || fail "$1 exited: $(tail -5 "$DIR/$1.log")"; }

start etcd etcd --name shoal-test --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "shoal-test=http://127.0.0.1:$ETCD_PEER_PORT" \
    --listen-metrics-urls "" --quota-backend-bytes 2147483648
WATCH=etcd wait_for etcd curl -sf "http://127.0.0.1:$ETCD_PORT/health"
alive etcd  # and the answer was its own

# The audit log: every request of a service account outside kube-system (Shoal's roles run as
# theirs), at Metadata level (user, verb, resource, subresource, response code; no bodies), one
# JSON event per line in DIR/audit.log, written before the response (the log backend's default
# "blocking" mode), so a test that reads it after a request sees that request. The RBAC test
# compares what a role did with what its Role grants from here (tests/cluster/test_rbac.py).
cat > "$DIR/audit-policy.yaml" <<EOF2
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  userGroups: ["system:serviceaccounts:kube-system"]
- level: Metadata
  userGroups: ["system:serviceaccounts"]
- level: None
EOF2

start apiserver "$BIN/kube-apiserver" \
    --audit-policy-file "$DIR/audit-policy.yaml" --audit-log-path "$DIR/audit.log" \
    --audit-log-format json --audit-log-maxsize 0 \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --secure-port "$API_PORT" --advertise-address "$POD_GW" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range 10.96.0.0/16 \
    --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction,PodSecurity \
    --allow-privileged=false --profiling=false --v=1
WATCH=apiserver wait_for kube-apiserver curl -sf --cacert "$PKI/ca.crt" \
    --cert "$PKI/admin.crt" --key "$PKI/admin.key" "https://127.0.0.1:$API_PORT/readyz"
alive apiserver

cat > "$DIR/scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: "$DIR/scheduler.kubeconfig"}
leaderElection: {leaderElect: false}
profiles:
- schedulerName: default-scheduler
# HAMi's replicas ask for schedulerName hami-scheduler. HAMi's own extender (GPU memory and core
# accounting per card) is not here; this profile fits its extended resources as plain ones.
- schedulerName: hami-scheduler
EOF
start scheduler "$BIN/kube-scheduler" --config "$DIR/scheduler.yaml" \
    --authentication-kubeconfig "$DIR/scheduler.kubeconfig" \
    --authorization-kubeconfig "$DIR/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --v=1

start controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$DIR/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$CM_PORT" \
    --root-ca-file "$PKI/ca.crt" --service-account-private-key-file "$PKI/sa.key" \
    --use-service-account-credentials=true \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --service-cluster-ip-range 10.96.0.0/16 \
    --leader-elect=false --controllers '*' --v=1
WATCH=scheduler wait_for kube-scheduler curl -skf "https://127.0.0.1:$SCHED_PORT/healthz"
WATCH=controller-manager wait_for kube-controller-manager curl -skf "https://127.0.0.1:$CM_PORT/healthz"
alive scheduler; alive controller-manager
# The controllers are working once the serviceaccount controller has made default/default
# (before that, every pod in "default" is refused).
wait_for "the default service account" "$KUBECTL" --kubeconfig "$DIR/kubeconfig" get serviceaccount default

# --- nodes ----------------------------------------------------------------------------------------
mkdir -p "$ARTIFACTS"
start node-agent "$PY" "$HERE/node_agent.py" --dir "$DIR" \
    --kubeconfig "$DIR/node-agent.kubeconfig" --nodes-per-mode "$NODES_PER_MODE" \
    --pod-net "$POD_NET" --tag "$TAG" --artifacts "$ARTIFACTS" \
    --api "127.0.0.1:$API_PORT"
WATCH=node-agent wait_for "the node agent's nodes" "$PY" "$HERE/node_agent.py" --dir "$DIR" --check-ready \
    --kubeconfig "$DIR/kubeconfig" --nodes-per-mode "$NODES_PER_MODE"
alive node-agent
log "ready: KUBECONFIG=$DIR/kubeconfig (API https://127.0.0.1:$API_PORT, pods on $POD_NET)"
