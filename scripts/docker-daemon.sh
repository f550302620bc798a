#!/usr/bin/env bash
# A Docker daemon for `make compose-check` on a machine that has Debian's docker.io but runs no daemon
# (ENVIRONMENT.md, "Docker"): its state in a directory of its own, no iptables rules and no default
# bridge (the compose stack makes its own network), the vfs storage driver (no overlay support needed).
#
#   scripts/docker-daemon.sh start DIR   starts one in DIR unless one answers; prints the DOCKER_HOST to use
#   scripts/docker-daemon.sh stop DIR    stops the one this script started in DIR (by its pid file)
set -euo pipefail

command=${1:?usage: docker-daemon.sh start|stop DIR}
state=${2:?usage: docker-daemon.sh start|stop DIR}

case "$command" in
start)
    if docker info > /dev/null 2>&1; then
        echo "${DOCKER_HOST:-unix:///var/run/docker.sock}"  # one answers already: use it
        exit 0
    fi
    if ! command -v dockerd > /dev/null; then
        echo "docker-daemon.sh: no Docker daemon answers and dockerd is not installed (Debian: apt-get install docker.io)" >&2
        exit 1
    fi
    mkdir -p "$state/data" "$state/exec"
    socket="unix://$state/docker.sock"
    dockerd --data-root "$state/data" --exec-root "$state/exec" -H "$socket" --pidfile "$state/docker.pid" \
        --storage-driver vfs --iptables=false --bridge=none > "$state/dockerd.log" 2>&1 &
    for _ in $(seq 120); do
        if DOCKER_HOST="$socket" docker info > /dev/null 2>&1; then
            echo "$socket"
            exit 0
        fi
        sleep 0.5
    done
    echo "docker-daemon.sh: dockerd did not answer within 60 s; its log: $state/dockerd.log" >&2
    tail -n 20 "$state/dockerd.log" >&2
    exit 1
    ;;
stop)
    if [ -f "$state/docker.pid" ]; then
        pid=$(cat "$state/docker.pid")
        if kill "$pid" 2> /dev/null; then
            for _ in $(seq 60); do
                kill -0 "$pid" 2> /dev/null || break
                sleep 0.5
            done
            kill -9 "$pid" 2> /dev/null || true
        fi
    fi
    # What the daemon left mounted under its directories (its network namespace's bind mount), deepest
    # first, so that the directory can be removed.
    awk -v state="$state/" 'index($2, state) == 1 { print $2 }' /proc/mounts | sort -r | xargs -r -n 1 umount -l
    ;;
*)
    echo "docker-daemon.sh: unknown command '$command' (valid: start, stop)" >&2
    exit 2
    ;;
esac
