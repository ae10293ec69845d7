#!/usr/bin/env bash
# Start or stop the local serving fleet: two `python -m serving` workers on 127.0.0.1.
# The admin token is generated once into $RELAY_HOME/serving-admin-token (mode 600).
set -euo pipefail
home="${RELAY_HOME:-$PWD/.relay}"
bin="${VENV_BIN:-$PWD/.venv/bin}"
ports=(${RELAY_LOCAL_SERVING_PORTS:-8711 8712})
mkdir -p "$home/serving"
token_file="$home/serving-admin-token"

case "${1:-}" in
  start)
    if [[ ! -s "$token_file" ]]; then
      (umask 077; "$bin/python" -c "import secrets; print(secrets.token_urlsafe(32))" >"$token_file")
    fi
    for i in "${!ports[@]}"; do
      port="${ports[$i]}"; pidfile="$home/serving/worker-$port.pid"
      if curl -fsS -m 2 "http://127.0.0.1:$port/healthz" >/dev/null 2>&1; then
        echo "serving worker already up on http://127.0.0.1:$port"; continue
      fi
      RELAY_HOME="$home" RELAY_SERVING_PORT="$port" RELAY_SERVING_BINARY_PORT="$((port + 10))" \
        RELAY_SERVING_ADMIN_TOKEN="$(cat "$token_file")" RELAY_SERVING_STABLE_REF=champion \
        nohup "$bin/python" -m serving >"$home/serving/worker-$port.log" 2>&1 &
      echo $! >"$pidfile"
      for _ in $(seq 1 60); do
        curl -fsS -m 2 "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
        kill -0 "$(cat "$pidfile")" 2>/dev/null || { echo "worker on $port exited:" >&2; tail -20 "$home/serving/worker-$port.log" >&2; exit 1; }
        sleep 0.5
      done
      echo "serving worker up on http://127.0.0.1:$port (binary tcp://127.0.0.1:$((port + 10)))"
    done ;;
  stop)
    for port in "${ports[@]}"; do
      pidfile="$home/serving/worker-$port.pid"
      if [[ -f "$pidfile" ]]; then
        kill "$(cat "$pidfile")" 2>/dev/null || true; rm -f "$pidfile"; echo "serving worker on $port stopped"
      fi
    done ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
