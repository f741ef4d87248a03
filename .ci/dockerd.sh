#!/usr/bin/env bash
# A private Docker engine for the harness's docker peers, usable by CI and by hand.
#
#   eval "$(.ci/dockerd.sh start)"   installs docker.io when absent, starts dockerd under a
#                                    fresh temp dir, prints `export DOCKER_HOST=...` and
#                                    `export GGML_RPC_DOCKERD_DIR=...`
#   .ci/dockerd.sh stop [DIR]        stops that engine by its pid and removes DIR
#                                    (default: $GGML_RPC_DOCKERD_DIR)
#
# The engine has no bridge and no iptables rules: containers run with --network host and
# their servers bind 127.0.0.1, so every byte stays on loopback. Its data root lives in DIR,
# its exec root and socket in a short-named dir beside it (DIR/sock_dir names it), so it
# never touches a system engine.
set -euo pipefail

READY_TIMEOUT=${GGML_RPC_DOCKERD_TIMEOUT:-60}

die() { echo "dockerd.sh: $*" >&2; exit 1; }

install_engine() {
    command -v dockerd >/dev/null && return 0
    [ "$(id -u)" = 0 ] || die "dockerd not found and not root: install Debian's docker.io"
    echo "dockerd.sh: installing docker.io from Debian's packages" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >&2
}

start() {
    install_engine
    local dir sock_dir
    dir=$(mktemp -d "${TMPDIR:-/tmp}/ggml-rpc-dockerd.XXXXXX")
    # the sockets (the engine's, containerd's under the exec root) need a short path: a unix
    # socket's path must fit in about 104 bytes, which a deep TMPDIR does not
    sock_dir=$(mktemp -d /tmp/grd.XXXXXX)
    echo "$sock_dir" >"$dir/sock_dir"
    dockerd --bridge=none --iptables=false --ip6tables=false \
        --data-root "$dir/data" --exec-root "$sock_dir/x" --pidfile "$dir/dockerd.pid" \
        -H "unix://$sock_dir/docker.sock" </dev/null >"$dir/dockerd.log" 2>&1 &
    local pid=$!
    echo "$pid" >"$dir/pid"
    local waited=0
    until DOCKER_HOST="unix://$sock_dir/docker.sock" docker version >/dev/null 2>&1; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 20 "$dir/dockerd.log" >&2
            rm -rf "$dir" "$sock_dir"
            die "dockerd exited during start-up (log above)"
        fi
        if [ "$waited" -ge "$((READY_TIMEOUT * 5))" ]; then
            tail -n 20 "$dir/dockerd.log" >&2
            stop "$dir"
            die "dockerd not ready within ${READY_TIMEOUT} s (log above)"
        fi
        sleep 0.2
        waited=$((waited + 1))
    done
    echo "export DOCKER_HOST=unix://$sock_dir/docker.sock"
    echo "export GGML_RPC_DOCKERD_DIR=$dir"
}

stop() {
    local dir=${1:-${GGML_RPC_DOCKERD_DIR:-}}
    [ -n "$dir" ] || die "stop: no engine dir (argument or GGML_RPC_DOCKERD_DIR)"
    [ -f "$dir/pid" ] || die "stop: $dir is not an engine dir started by this script"
    local pid sock_dir
    pid=$(cat "$dir/pid")
    sock_dir=$(cat "$dir/sock_dir")
    if kill -0 "$pid" 2>/dev/null; then
        # our containers first (the engine would leave them in its data root otherwise)
        local ids
        ids=$(DOCKER_HOST="unix://$sock_dir/docker.sock" docker ps -aq 2>/dev/null || true)
        [ -z "$ids" ] || DOCKER_HOST="unix://$sock_dir/docker.sock" docker rm -f $ids >/dev/null 2>&1 || true
        kill -TERM "$pid"
        local i
        for i in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi
        # dockerd is our child only in the start shell; elsewhere wait on its disappearance
        wait "$pid" 2>/dev/null || true
    fi
    # overlay mounts under the data root must go before the tree can be removed
    { grep -oE " ($dir|$sock_dir)/[^ ]*" /proc/mounts || true; } | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done
    rm -rf "$dir" "$sock_dir"
}

case "${1:-}" in
    start) start ;;
    stop) stop "${2:-}" ;;
    *) die "usage: $0 start | stop [DIR]" ;;
esac
