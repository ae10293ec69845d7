#!/usr/bin/env bash
# Start or stop the local shop: `python -m simulation.shop_service`, shoppers calling the fleet
# (RELAY_SERVING_FLEET_URLS) at RELAY_SHOP_RPS (20) feeds/s until stopped, for at most 12 h;
# RELAY_SHOP_ARGS (empty) passes more flags, e.g. "--shop-seed 51 --n-users 3000 --n-items 1000".
# Plant drift while it runs: echo '{"kind": "device_mix", "magnitude": 0.5}' > $RELAY_HOME/shop/drift.json
set -euo pipefail
home="${RELAY_HOME:-$PWD/.relay}"
bin="${VENV_BIN:-$PWD/.venv/bin}"
mkdir -p "$home/shop"
pidfile="$home/shop/shop.pid"

case "${1:-}" in
  start)
    if [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      echo "shop already running (pid $(cat "$pidfile"))"; exit 0
    fi
    RELAY_HOME="$home" nohup "$bin/python" -m simulation.shop_service \
      --rate-rps "${RELAY_SHOP_RPS:-20}" --drift-file "$home/shop/drift.json" ${RELAY_SHOP_ARGS:-} \
      >"$home/shop/shop.log" 2>&1 &
    echo $! >"$pidfile"
    sleep 1
    kill -0 "$(cat "$pidfile")" 2>/dev/null || { echo "shop exited:" >&2; tail -20 "$home/shop/shop.log" >&2; exit 1; }
    echo "shop up: ${RELAY_SHOP_RPS:-20} feeds/s against $RELAY_SERVING_FLEET_URLS (log: $home/shop/shop.log)" ;;
  stop)
    # SIGTERM: the shop ends its round (at most --round-s plus a request's timeout), then exits
    if [[ -f "$pidfile" ]]; then
      pid="$(cat "$pidfile")"
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -9 "$pid" 2>/dev/null && echo "shop did not stop within 30 s: killed" >&2
      rm -f "$pidfile"; echo "shop stopped"
    fi ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
