"""Benchmark the capacity check: does it flag a costlier candidate, and leave an equal twin alone?

    python -m bench.capacity [--runs 20] [--quick]

One real serving worker (`python -m serving`, fault injection on) serves a trained version as
stable and a second trained version of equal cost in the canary slot at weight 0 (no user
traffic). Each run is one `tasks.capacity.run_capacity_check` against that worker with the
default `CapacityRules` (the flow's), its SLO the gate's default P95 (300 ms), and no
inference-log history (so the ladder starts at the floor):

- **costlier**: the canary's compute slowed x1.3 on its engine thread (`/admin/latency` mode
  `engine`, stage `compute`, factor 1.3): a real cost, measured by the stage's timer;
- **twin**: no injection, the equal-cost twin.

Runs alternate costlier / twin so host noise falls on both. Writes bench/results/capacity.json
(one row per run) and the `capacity_check` key of bench/results/gate.json (read-modify-write:
the rest of gate.json is kept): `flag_rate_costlier`, `flag_rate_twin`, `wall_s_max`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.scratch import scratch_dir

RESULTS = Path(__file__).parent / "results"
TOKEN = "bench-capacity-token"
COSTLIER_FACTOR = 1.3
SLO_P95_MS = 300.0  # CanaryRules().max_p95_ms, read below so the two cannot drift apart


def start_worker_pair(tmp: Path) -> tuple[Any, str, str]:
    """One worker with two trained versions: (worker, stable, twin in the canary slot)."""
    from model_store import ModelStore
    from model_store.local import LocalBackend
    from relay_testing.versions import train_and_publish
    from serving.fleet import FleetClient
    from serving.process import start_worker
    from simulation.shop import ShopConfig, generate_events
    from tasks.training import TrainConfig

    store = ModelStore(LocalBackend(tmp / "store"))
    frame = generate_events(ShopConfig(seed=3), 20_000, datetime(2026, 11, 1, tzinfo=UTC))
    stable, twin = (
        train_and_publish(store, frame, TrainConfig(seed=s, epochs=1), tmp / f"v{s}", "bench")[0]
        for s in (1, 2)
    )
    env = {
        "RELAY_HOME": str(tmp / "home"),
        "RELAY_MODEL_STORE_URL": f"file://{tmp / 'store'}",
        "RELAY_CLICKHOUSE_DSN": f"chdb://{tmp / 'home' / 'clickhouse'}",
        "RELAY_SERVING_PORT": "0",
        "RELAY_SERVING_BINARY_PORT": "0",
        "RELAY_SERVING_ADMIN_TOKEN": TOKEN,
        "RELAY_SERVING_FAULT_INJECTION": "true",
        "RELAY_SERVING_STABLE_REF": stable.version,
        "RELAY_SERVING_LOG_FLUSH_MS": "200",
    }
    worker = start_worker(env, tmp / "worker.log")
    worker.wait_ready()
    os.environ.update(
        {
            k: v
            for k, v in env.items()
            if k not in ("RELAY_SERVING_PORT", "RELAY_SERVING_STABLE_REF")
        }
    )
    os.environ["RELAY_SERVING_FLEET_URLS"] = worker.http_url
    with FleetClient([worker.http_url], TOKEN) as fleet:
        loaded = fleet.deploy_canary(twin.version, weight=0)
        if not loaded.ok:
            raise SystemExit(f"could not load the twin into the canary slot: {loaded.reason}")
    return worker, stable.version, twin.version


def set_cost(url: str, factor: float) -> None:
    """The canary's compute x`factor` on its engine thread (1.0: none)."""
    import httpx

    reply = httpx.post(
        f"{url}/admin/latency",
        json={"slot": "canary", "ms": 0, "factor": factor, "stage": "compute", "mode": "engine"},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    reply.raise_for_status()


def one_run(url: str, case: str, rules: Any) -> dict[str, Any]:
    from relay.settings import get_settings
    from relay.types import Verdict
    from tasks.capacity import run_capacity_check

    set_cost(url, COSTLIER_FACTOR if case == "costlier" else 1.0)
    run = run_capacity_check(get_settings(), SLO_P95_MS, rules, url)
    m = run.result.measurements
    return {
        "case": case,
        "verdict": run.result.verdict.value,
        "flagged": run.result.verdict is Verdict.failed,
        "wall_s": round(run.wall_s, 2),
        "rounds": len(run.rounds),
        "peak_rps": run.peak_rps,
        "champion_throughput_rps": m.get("champion_throughput_rps"),
        "candidate_throughput_rps": m.get("candidate_throughput_rps"),
        "champion_p95_at_peak_ms": m.get("champion_p95_at_peak_ms"),
        "candidate_p95_at_peak_ms": m.get("candidate_p95_at_peak_ms"),
        "reason": run.result.reason,
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def rate(case: str) -> float | None:
        mine = [r for r in rows if r["case"] == case]
        return round(sum(r["flagged"] for r in mine) / len(mine), 4) if mine else None

    return {
        "flag_rate_costlier": rate("costlier"),
        "flag_rate_twin": rate("twin"),
        "wall_s_max": max((r["wall_s"] for r in rows), default=None),
        "runs_costlier": sum(r["case"] == "costlier" for r in rows),
        "runs_twin": sum(r["case"] == "twin" for r in rows),
        "costlier_factor": COSTLIER_FACTOR,
        "method": (
            "each run: tasks.capacity.run_capacity_check with the default CapacityRules on one "
            "real worker, champion (stable) and candidate (canary, weight 0) in alternating "
            "rounds; flagged = verdict failed"
        ),
    }


def write_results(summary: dict[str, Any], rows: list[dict[str, Any]], out: Path) -> None:
    """`out` (capacity.json, one row per run), and the `capacity_check` key of gate.json beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**summary, "runs": rows}, indent=2) + "\n")
    gate_path = out.with_name("gate.json")
    gate = json.loads(gate_path.read_text()) if gate_path.exists() else {}
    gate["capacity_check"] = {
        k: summary[k] for k in ("flag_rate_costlier", "flag_rate_twin", "wall_s_max")
    } | {"runs_costlier": summary["runs_costlier"], "runs_twin": summary["runs_twin"]}
    tmp = gate_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(gate, indent=2) + "\n")
    tmp.replace(gate_path)  # whole or not at all: the rest of gate.json is never half-written


def main() -> None:
    from core.gate.capacity import CapacityRules
    from core.gate.rules import CanaryRules

    global SLO_P95_MS
    SLO_P95_MS = CanaryRules().max_p95_ms
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per case")
    parser.add_argument("--quick", action="store_true", help="1 run per case (smoke test)")
    parser.add_argument(
        "--out", type=Path, default=RESULTS / "capacity.json", help="gate.json is written beside it"
    )
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    rules = CapacityRules()
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    with scratch_dir(prefix="bench-capacity-") as tmp:
        worker, _, _ = start_worker_pair(tmp)
        try:
            for i in range(runs):
                for case in ("costlier", "twin") if i % 2 == 0 else ("twin", "costlier"):
                    row = one_run(worker.http_url, case, rules)
                    rows.append(row)
                    # after every run: a run cut short still leaves the figures so far
                    write_results(summarise(rows), rows, args.out)
                    print(
                        f"{case:8s} {row['verdict']:12s} {row['wall_s']:6.1f} s  "
                        f"cand {row['candidate_throughput_rps']} champ "
                        f"{row['champion_throughput_rps']} req/s",
                        flush=True,
                    )
        finally:
            worker.stop()
    summary = {**summarise(rows), "total_seconds": round(time.monotonic() - started, 1)}
    write_results(summary, rows, args.out)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
