#!/usr/bin/env bash
# Stop everything tests/cluster/up.sh DIR started, and leave nothing running:
#   tests/cluster/down.sh DIR
# The node agent first (it stops its pods' processes and removes their network namespaces),
# then the controllers, the API server and etcd last. Each ran in its own process group (setsid),
# so the whole group gets SIGTERM, then SIGKILL after a few seconds. Whatever a killed agent left
# (pod processes by their pid files, this cluster's netns and bridge) is removed after.
# Idempotent: a second run, or a run on a half-started DIR, finds nothing and succeeds. Keeps
# DIR's logs and data for a post-mortem; delete DIR yourself.
set -uo pipefail
DIR="${1:?usage: down.sh DIR}"
[ -d "$DIR" ] || exit 0
DIR="$(cd "$DIR" && pwd)"
GRACE_S="${SHOAL_DOWN_GRACE_S:-10}"

stop_group() {  # stop_group PIDFILE: SIGTERM the process group, SIGKILL after GRACE_S
    local pidfile="$1" pid
    [ -f "$pidfile" ] || return 0
    pid="$(cat "$pidfile" 2>/dev/null)"
    rm -f "$pidfile"            # the node agent exits when its pid file goes, too
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    kill -0 "$pid" 2>/dev/null || return 0
    # up.sh's setsid made each process a group leader (pgid == pid); signal the group
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    for _ in $(seq $((GRACE_S * 10))); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
}

stop_group "$DIR/node-agent.pid"
# Pod processes a SIGKILLed agent could not stop (each its own group, pid files by container).
for f in "$DIR"/pods/*/*.pid; do
    [ -e "$f" ] || continue
    pid="$(cat "$f")"
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -KILL -- "-$pid" 2>/dev/null
    rm -f "$f"
done
stop_group "$DIR/controller-manager.pid" & stop_group "$DIR/scheduler.pid" & wait   # about 2 s each
stop_group "$DIR/apiserver.pid"
stop_group "$DIR/etcd.pid"

if [ -f "$DIR/env" ]; then
    TAG="$(sed -n 's/^TAG=//p' "$DIR/env")"
    if [ -n "$TAG" ]; then
        for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^shoal-$TAG-"); do ip netns del "$ns"; done
        ip link del "sb$TAG" 2>/dev/null || true
        rm -rf "/run/shoal-$TAG"   # the agent's empty staging mount points
    fi
fi
exit 0
