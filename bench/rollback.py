"""Benchmark rollback: repeated canary-then-rollback cycles on 2 local workers under live traffic.

    python -m bench.rollback [--cycles 20] [--rps 150] [--events 30000] [--out PATH]

A separate process sends predict requests to both workers the whole time and records each
request's start, end and outcome. Each cycle deploys a canary at 50 %, lets traffic reach it,
then takes the "verdict" and rolls back; rollback latency is verdict -> weight 0 and canary
unloaded on every worker (the fleet client returns only when all have answered). The two
versions are trained on --events simulated events. Writes bench/results/rollback.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"
TOKEN = "bench-rollback-token"


def load(urls: list[str], bodies_path: str, rps: float, stop_at: float, out_path: str) -> None:
    """Paced predict requests round-robin to the workers until stop_at; outcomes to out_path."""
    import httpx

    bodies = json.loads(Path(bodies_path).read_text())
    records = []
    interval = 1.0 / rps
    with httpx.Client(timeout=5.0) as client:
        i = 0
        next_at = time.time()
        while time.time() < stop_at:
            next_at += interval
            sent = time.time()
            try:
                ok = (
                    client.post(
                        f"{urls[i % len(urls)]}/v1/predict", json=bodies[i % len(bodies)]
                    ).status_code
                    == 200
                )
            except httpx.HTTPError:
                ok = False
            records.append((sent, time.time(), ok))
            i += 1
            time.sleep(max(0.0, next_at - time.time()))
    Path(out_path).write_text(json.dumps(records))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--rps", type=float, default=150.0)
    parser.add_argument("--events", type=int, default=30_000, help="training events per version")
    parser.add_argument("--out", type=Path, default=RESULTS / "rollback.json")
    args = parser.parse_args()

    from model_store import ModelStore
    from model_store.local import LocalBackend
    from relay_testing.versions import train_and_publish
    from serving.fleet import FleetClient
    from serving.process import start_worker
    from simulation.shop import ShopConfig, generate_events
    from simulation.traffic import request_bodies
    from tasks.training import TrainConfig

    with tempfile.TemporaryDirectory(prefix="relay-bench-rollback-") as tmp_name:
        tmp = Path(tmp_name)
        store = ModelStore(LocalBackend(tmp / "store"))
        frame = generate_events(ShopConfig(seed=3), args.events, datetime(2026, 11, 1, tzinfo=UTC))
        stable, _ = train_and_publish(
            store, frame, TrainConfig(seed=1, epochs=1), tmp / "v1", "bench"
        )
        canary, _ = train_and_publish(
            store, frame, TrainConfig(seed=2, epochs=1), tmp / "v2", "bench"
        )
        bodies_path = tmp / "bodies.json"
        bodies = request_bodies(frame.iloc[:4000], 20)
        for i, body in enumerate(bodies):
            body["session"]["session_id"] = f"bench-{i // 4}"
        bodies_path.write_text(json.dumps(bodies))

        env = {
            "RELAY_HOME": str(tmp / "home"),
            "RELAY_MODEL_STORE_URL": f"file://{tmp / 'store'}",
            "RELAY_CLICKHOUSE_DSN": f"chdb://{tmp / 'never-opened'}",
            "RELAY_SERVING_PORT": "0",
            "RELAY_SERVING_BINARY_PORT": "0",
            "RELAY_SERVING_ADMIN_TOKEN": TOKEN,
            "RELAY_SERVING_STABLE_REF": stable.version,
        }
        workers = [start_worker(env, tmp / f"worker{i}.log") for i in range(2)]
        try:
            for w in workers:
                w.wait_ready()
            urls = [w.http_url for w in workers]
            duration = args.cycles * 4.0 + 5.0
            stop_at = time.time() + duration
            traffic_out = tmp / "traffic.json"
            traffic = mp.get_context("spawn").Process(
                target=load, args=(urls, str(bodies_path), args.rps, stop_at, str(traffic_out))
            )
            traffic.start()
            windows = []
            rollback_ms = []
            with FleetClient(urls, TOKEN) as fleet:
                for _ in range(args.cycles):
                    if time.time() > stop_at - 4.0:
                        break
                    deployed = fleet.deploy_canary(canary.version, weight=50)
                    if not deployed.ok:
                        raise SystemExit(f"canary deploy failed: {deployed.reason}")
                    time.sleep(1.0)  # traffic reaches the canary
                    verdict_at = time.time()
                    started = time.perf_counter()
                    result = fleet.rollback()
                    elapsed = (time.perf_counter() - started) * 1000
                    if not result.ok:
                        raise SystemExit(f"rollback failed: {result.reason}")
                    rollback_ms.append(elapsed)
                    windows.append((verdict_at, time.time()))
                    time.sleep(1.0)
            traffic.join(timeout=duration + 30)
            records = json.loads(traffic_out.read_text())
        finally:
            for w in workers:
                w.stop()

    during = [r for r in records if any(r[0] <= end and r[1] >= start for start, end in windows)]
    if sum(1 for r in records if r[2]) < 0.99 * len(records) - len(during):
        raise SystemExit("most requests failed outside rollbacks: the load generator is broken")
    figures = {
        "cycles": len(rollback_ms),
        "workers": 2,
        "traffic_rps": args.rps,
        "rollback_ms_p50": round(float(np.percentile(rollback_ms, 50)), 2),
        "rollback_ms_p95": round(float(np.percentile(rollback_ms, 95)), 2),
        "rollback_ms_max": round(max(rollback_ms), 2),
        "requests_during_rollback": len(during),
        "requests_failed_during_rollback": sum(1 for r in during if not r[2]),
        "requests_total": len(records),
        "requests_failed_total": sum(1 for r in records if not r[2]),
        "cpu_count": os.cpu_count(),
        "measured_at": datetime.now(UTC).isoformat(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
