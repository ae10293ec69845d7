"""Benchmark rollback: canary-then-rollback cycles on 2, 8 and 32 local workers under live traffic.

    python -m bench.rollback [--workers 2,8,32] [--cycles 10] [--rps 150] [--events 30000] [--out PATH]

For each fleet size, that many workers start on loopback (one engine thread each, a small model:
32 workers share this machine's cores), a separate process sends predict requests round-robin to
all of them the whole time and records each request's start, end and outcome. Each cycle deploys
a canary at 50 %, lets traffic reach it, then takes the "verdict" and rolls back; rollback latency
is verdict -> weight 0 and canary unloaded on every worker (the fleet client calls all workers in
parallel and returns only when all have answered). The two versions are trained on --events
simulated events. Writes bench/results/rollback.json (or --out): per size its figures, and
`rollback_ms_p95_by_workers` side by side (target: p95 <= 50 ms at 32 workers, 0 failed requests).
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
from typing import Any

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


def cycle_fleet(
    urls: list[str], canary: str, bodies_path: Path, rps: float, cycles: int, out: Path
) -> dict[str, Any]:
    """`cycles` deploy-then-rollback cycles on the workers at `urls` under paced traffic."""
    from serving.fleet import FleetClient

    duration = cycles * 4.0 + 5.0
    stop_at = time.time() + duration
    traffic = mp.get_context("spawn").Process(
        target=load, args=(urls, str(bodies_path), rps, stop_at, str(out))
    )
    traffic.start()
    windows = []
    rollback_ms = []
    with FleetClient(urls, TOKEN) as fleet:
        for _ in range(cycles):
            if time.time() > stop_at - 4.0:
                break
            deployed = fleet.deploy_canary(canary, weight=50)
            if not deployed.ok:
                raise SystemExit(f"canary deploy failed on {len(urls)} workers: {deployed.reason}")
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
    records = json.loads(out.read_text())
    during = [r for r in records if any(r[0] <= end and r[1] >= start for start, end in windows)]
    if sum(1 for r in records if r[2]) < 0.99 * len(records) - len(during):
        raise SystemExit("most requests failed outside rollbacks: the load generator is broken")
    return {
        "workers": len(urls),
        "cycles": len(rollback_ms),
        "rollback_ms_p50": round(float(np.percentile(rollback_ms, 50)), 2),
        "rollback_ms_p95": round(float(np.percentile(rollback_ms, 95)), 2),
        "rollback_ms_max": round(max(rollback_ms), 2),
        "requests_during_rollback": len(during),
        "requests_failed_during_rollback": sum(1 for r in during if not r[2]),
        "requests_total": len(records),
        "requests_failed_total": sum(1 for r in records if not r[2]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", default="2,8,32", help="fleet sizes, comma-separated")
    parser.add_argument("--cycles", type=int, default=10, help="per fleet size")
    parser.add_argument("--rps", type=float, default=150.0)
    parser.add_argument("--events", type=int, default=30_000, help="training events per version")
    parser.add_argument("--out", type=Path, default=RESULTS / "rollback.json")
    args = parser.parse_args()
    sizes = [int(n) for n in args.workers.split(",")]

    from model_store import ModelStore
    from model_store.local import LocalBackend
    from relay_testing.versions import train_and_publish
    from serving.process import start_worker
    from simulation.shop import ShopConfig, generate_events
    from simulation.traffic import request_bodies
    from tasks.training import TrainConfig

    by_size: dict[str, dict[str, Any]] = {}
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
            "RELAY_MODEL_STORE_URL": f"file://{tmp / 'store'}",
            "RELAY_CLICKHOUSE_DSN": f"chdb://{tmp / 'never-opened'}",
            "RELAY_SERVING_PORT": "0",
            "RELAY_SERVING_BINARY_PORT": "0",
            "RELAY_SERVING_ADMIN_TOKEN": TOKEN,
            "RELAY_SERVING_STABLE_REF": stable.version,
            "RELAY_SERVING_ENGINE_THREADS": "1",
            "RELAY_SERVING_MAX_BATCH_ROWS": "256",
        }
        for n in sizes:
            home = tmp / f"fleet-{n}"
            workers = [
                start_worker({**env, "RELAY_HOME": str(home / f"w{i}")}, home / f"w{i}.log")
                for i in range(n)
            ]
            try:
                for w in workers:
                    w.wait_ready(timeout_s=300)
                by_size[str(n)] = cycle_fleet(
                    [w.http_url for w in workers],
                    canary.version,
                    bodies_path,
                    args.rps,
                    args.cycles,
                    home / "traffic.json",
                )
            finally:
                for w in workers:
                    w.stop()
            print(json.dumps(by_size[str(n)]), flush=True)

    figures = {
        "rollback_ms_p95_by_workers": {n: f["rollback_ms_p95"] for n, f in by_size.items()},
        "rollback_ms_p50_by_workers": {n: f["rollback_ms_p50"] for n, f in by_size.items()},
        "requests_failed_by_workers": {n: f["requests_failed_total"] for n, f in by_size.items()},
        "by_workers": by_size,
        "cycles_per_size": args.cycles,
        "traffic_rps": args.rps,
        "engine_threads_per_worker": 1,
        "cpu_count": os.cpu_count(),
        "measured_at": datetime.now(UTC).isoformat(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
