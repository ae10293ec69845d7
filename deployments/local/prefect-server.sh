#!/usr/bin/env bash
# Start or stop the local Prefect server (SQLite under $PREFECT_HOME) on 127.0.0.1.
# `start` reuses a server that already answers; `stop` stops the one this script started.
set -euo pipefail
port="${PREFECT_PORT:-4200}"
home="${PREFECT_HOME:-$PWD/.relay/prefect}"
bin="${VENV_BIN:-$PWD/.venv/bin}"
pidfile="$home/server-$port.pid"
log="$home/server-$port.log"
url="http://127.0.0.1:$port/api/health"
mkdir -p "$home"

healthy() { curl -fsS -m 2 "$url" >/dev/null 2>&1; }

case "${1:-}" in
  start)
    if healthy; then echo "Prefect server already up on http://127.0.0.1:$port"; exit 0; fi
    PREFECT_HOME="$home" PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_UI_URL="http://127.0.0.1:$port" \
      nohup "$bin/prefect" server start --host 127.0.0.1 --port "$port" >"$log" 2>&1 &
    echo $! >"$pidfile"
    for _ in $(seq 1 120); do
      if healthy; then echo "Prefect server up on http://127.0.0.1:$port (log: $log)"; exit 0; fi
      if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        echo "Prefect server exited during start-up; last lines of $log:" >&2; tail -20 "$log" >&2; exit 1
      fi
      sleep 1
    done
    echo "Prefect server did not answer $url within 120 s; see $log" >&2; exit 1 ;;
  stop)
    if [[ -f "$pidfile" ]]; then
      pid="$(cat "$pidfile")"
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$pidfile"; echo "Prefect server on port $port stopped"
    else
      echo "no Prefect server started by this script on port $port"
    fi ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
