#!/usr/bin/env bash
# Start or stop a local Docker engine for the client image and the container tests.
#   scripts/docker_engine.sh start   install Debian's docker.io if missing, start dockerd, wait for the socket
#   scripts/docker_engine.sh stop    stop the dockerd this script started (pid file)
#   scripts/docker_engine.sh status  exit 0 when the engine answers
# Must run as root (dockerd needs it). Idempotent: "start" on a running engine does nothing.
set -euo pipefail

SOCKET=/var/run/docker.sock
PID_FILE=/var/run/psyche-dockerd.pid
LOG_FILE=/var/log/psyche-dockerd.log
WAIT_SECONDS=${DOCKER_ENGINE_WAIT_SECONDS:-60}

engine_answers() {
    # The HTTP API's /_ping answers "OK" once the daemon is ready; curl may be missing, python3 is not.
    python3 - "$SOCKET" <<'PY' 2>/dev/null
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(2)
s.connect(sys.argv[1])
s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
sys.exit(0 if b"OK" in s.recv(4096) else 1)
PY
}

install_engine() {
    if command -v dockerd >/dev/null 2>&1; then
        return
    fi
    echo "docker_engine: installing Debian's docker.io"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends docker.io iptables >/dev/null
}

start_engine() {
    if engine_answers; then
        echo "docker_engine: already running ($SOCKET)"
        return
    fi
    [ "$(id -u)" = 0 ] || { echo "docker_engine: must run as root to start dockerd" >&2; exit 1; }
    install_engine
    # overlay2 when the kernel and filesystem allow it (vfs copies every layer whole).
    local driver=overlay2
    if ! grep -qw overlay /proc/filesystems; then driver=vfs; fi
    # setsid: its own session, so the engine outlives the shell (or CI step) that started it
    # and a signal to that shell's process group does not take it down.
    setsid nohup dockerd --storage-driver="$driver" --host="unix://$SOCKET" >"$LOG_FILE" 2>&1 </dev/null &
    echo $! >"$PID_FILE"
    for _ in $(seq 1 "$WAIT_SECONDS"); do
        if engine_answers; then
            echo "docker_engine: dockerd ready (pid $(cat "$PID_FILE"), storage $driver)"
            return
        fi
        if ! kill -0 "$(cat "$PID_FILE")" 2>/dev/null; then
            echo "docker_engine: dockerd exited; last log lines:" >&2
            tail -n 20 "$LOG_FILE" >&2
            exit 1
        fi
        sleep 1
    done
    echo "docker_engine: dockerd did not answer on $SOCKET within ${WAIT_SECONDS}s; see $LOG_FILE" >&2
    exit 1
}

stop_engine() {
    if [ ! -f "$PID_FILE" ]; then
        echo "docker_engine: no dockerd started by this script"
        return
    fi
    local pid
    pid=$(cat "$PID_FILE")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 1 30); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 1
        done
    fi
    rm -f "$PID_FILE"
    echo "docker_engine: stopped"
}

case "${1:-}" in
    start) start_engine ;;
    stop) stop_engine ;;
    status) engine_answers && echo "docker_engine: running" || { echo "docker_engine: not running"; exit 1; } ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
