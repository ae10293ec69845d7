#!/usr/bin/env bash
# Start or stop the local Prefect process worker of one work pool (default `cpu`) on this host.
# Its flow runs inherit its environment: Relay's home, the serving fleet and the fleet's admin
# token, so a run started from the UI reaches the same workers as `make demo`.
set -euo pipefail
home="${RELAY_HOME:-$PWD/.relay}"
home="$(mkdir -p "$home" && cd "$home" && pwd)"  # flow runs start in another directory
bin="${VENV_BIN:-$PWD/.venv/bin}"
pool="${RELAY_WORKER_POOL:-cpu}"
dir="$home/prefect-worker"
pidfile="$dir/worker-$pool.pid"
log="$dir/worker-$pool.log"
token_file="$home/serving-admin-token"
mkdir -p "$dir"

running() { [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

case "${1:-}" in
  start)
    : "${PREFECT_API_URL:?PREFECT_API_URL must point at the Prefect server (the Makefile sets it)}"
    if running; then echo "Prefect worker ($pool pool) already running, pid $(cat "$pidfile")"; exit 0; fi
    token="${RELAY_SERVING_ADMIN_TOKEN:-}"
    if [[ -z "$token" && -s "$token_file" ]]; then token="$(cat "$token_file")"; fi
    # --limit 1: the embedded ClickHouse (chdb) admits one process per path, so two flow runs
    # of this host must not overlap; production workers (ClickHouse server) raise it.
    RELAY_HOME="$home" RELAY_REPO_DIR="${RELAY_REPO_DIR:-$PWD}" RELAY_SERVING_ADMIN_TOKEN="$token" \
      nohup "$bin/prefect" worker start --pool "$pool" --type process --name "relay-local-$pool" \
      --limit "${RELAY_WORKER_LIMIT:-1}" --install-policy never >"$log" 2>&1 &
    echo $! >"$pidfile"
    for _ in $(seq 1 120); do
      if grep -q "started!" "$log" 2>/dev/null; then
        echo "Prefect worker polling pool $pool (pid $(cat "$pidfile"), log: $log)"; exit 0
      fi
      if ! running; then
        echo "Prefect worker exited during start-up; last lines of $log:" >&2; tail -20 "$log" >&2
        rm -f "$pidfile"; exit 1
      fi
      sleep 0.5
    done
    echo "Prefect worker did not report started within 60 s; see $log" >&2; exit 1 ;;
  stop)
    if [[ -f "$pidfile" ]]; then
      pid="$(cat "$pidfile")"
      # flow runs start in sessions of their own: note them before the worker goes
      children="$(pgrep -P "$pid" 2>/dev/null || true)"
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -9 "$pid" 2>/dev/null || true
      for child in $children; do kill "$child" 2>/dev/null || true; done
      rm -f "$pidfile"; echo "Prefect worker ($pool pool) stopped"
    else
      echo "no Prefect worker started by this script for pool $pool"
    fi ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
