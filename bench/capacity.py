"""Benchmark the capacity check: does it flag a costlier candidate, and leave an equal twin alone?

    python -m bench.capacity [--runs 20] [--quick]

One real serving worker (`python -m serving`, fault injection on) serves a trained version as
stable and a second trained version of equal cost in the canary slot at weight 0 (no user
traffic). Each run is one `tasks.capacity.run_capacity_check` against that worker with the
default `CapacityRules` (the flow's), its SLO the gate's default P95 (300 ms), and no
inference-log history (so the ladder starts at the floor):

- **costlier**: the canary 30 % costlier per request by construction. Before each pair of runs,
  the champion's CPU per request is measured on this worker (the worker process's CPU time over a
  round of pinned stable requests offered faster than it can answer them, divided by the
  requests answered: its cost flat out, the one that sets its capacity); the canary then
  burns 0.3 x that much CPU on every request (`/admin/latency` mode `cpu`, booked to
  `compute`), on the event loop like any costlier request path, so its cost per request is
  1.3 x the champion's whatever this host's speed;
- **twin**: no injection, the equal-cost twin.

(An earlier plant slowed the canary's compute x1.3 on its engine thread, mode `engine`: that
thread is not where this worker's time goes, so it added ~0.02 ms to a ~0.4 ms request, not
30 %: immaterial by construction, and the check rightly saw nothing.)

Runs alternate costlier / twin so host noise falls on both. `--quick` (the smoke test) runs
one of each with shorter rounds and one refined rate, not the default rules; the summary's
`rules` says which ran. Writes bench/results/capacity.json (one row per run, with its curve)
and the `capacity_check` key of bench/results/gate.json (read-modify-write: the rest of
gate.json is kept): `flag_rate_costlier`, `flag_rate_twin`, `wall_s_max`, the runs per case,
the median throughput shortfall per case and how many runs' champion was censored at the
ladder's cap, and the plant (`champion_cpu_ms_per_request`, `plant_cpu_ms_per_request`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.saved import stamped, write_whole
from bench.scratch import scratch_dir

RESULTS = Path(__file__).parent / "results"
TOKEN = "bench-capacity-token"
COSTLIER_FACTOR = 1.3  # the costlier canary's CPU per request, as a multiple of the champion's
# The round that measures the champion's CPU per request offers more than the worker can answer:
# flat out, batches are full and the cost per request is the one that sets its capacity. At a
# paced 1,000 req/s this host measured 0.98 ms (fixed per-batch and idle costs spread over few
# requests), flat out 0.36 ms. 6,000 req/s was once above capacity here; on 2026-12-07 the
# worker answered all of it, so the probe offers twice that.
COST_PROBE_RPS = 12000.0
COST_PROBE_S = 4.0
PROBE_BODIES = 500  # distinct request bodies the probe cycles through
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


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds the process has used so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def probe_requests(worker: Any) -> list[bytes]:
    """The cost probe's requests: shop bodies as the capacity check makes them, pinned to stable."""
    from serving.load_test import pinned_requests
    from tasks.capacity import request_docs

    return pinned_requests(request_docs(PROBE_BODIES), worker.http_url, "stable", TOKEN)


def champion_cpu_ms_per_request(worker: Any, requests: list[bytes]) -> dict[str, float]:
    """The worker's CPU per answered stable request, over one round offered above its capacity."""
    import asyncio

    from serving.load_test import run_round

    pid = worker.process.pid
    before = process_cpu_s(pid)
    got = asyncio.run(run_round(worker.http_url, requests, COST_PROBE_RPS, COST_PROBE_S, 32))
    used = process_cpu_s(pid) - before
    if got.ok <= 0:
        raise SystemExit("the cost probe got no answers from the worker")
    # CPU spent on requests answered with an error (503 log back-pressure) is charged to the OK
    # ones: counted, so a reader can see how much that inflates the estimate
    rejected = sum(n for status, n in got.statuses.items() if status != 200)
    if rejected > 0.01 * got.ok:
        print(f"cost probe: {rejected} error answers beside {got.ok} OK ones (over 1 %)")
    return {
        "cpu_ms_per_request": 1000 * used / got.ok,
        "requests": float(got.ok),
        "rejected": float(rejected),
    }


def probe_summary(probes: list[dict[str, float]]) -> dict[str, Any]:
    """The probes' medians (the costlier plant is 0.3 x each pair's own), range and counts."""
    costs = [p["cpu_ms_per_request"] for p in probes]
    return {
        "champion_cpu_ms_per_request": round(statistics.median(costs), 4),
        "champion_cpu_ms_per_request_range": [round(min(costs), 4), round(max(costs), 4)],
        "plant_cpu_ms_per_request": round((COSTLIER_FACTOR - 1) * statistics.median(costs), 4),
        "cost_probes": len(probes),
        "cost_probe_requests": int(sum(p["requests"] for p in probes)),
        "cost_probe_rejected": int(sum(p["rejected"] for p in probes)),
    }


def set_cost(url: str, cpu_ms: float) -> None:
    """The canary burns `cpu_ms` of CPU per request after scoring (0: none)."""
    import httpx

    reply = httpx.post(
        f"{url}/admin/latency",
        json={"slot": "canary", "ms": cpu_ms, "factor": 1.0, "stage": "compute", "mode": "cpu"},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    reply.raise_for_status()


def _finite(value: float | None) -> float | None:
    """None for a figure that is not a number (a P95 of rounds nothing answered): strict JSON."""
    return value if value is not None and math.isfinite(value) else None


def one_run(url: str, case: str, rules: Any, plant_ms: float) -> dict[str, Any]:
    from core.gate.capacity import CANDIDATE, CHAMPION, curve
    from relay.settings import get_settings
    from relay.types import Verdict
    from tasks.capacity import run_capacity_check

    set_cost(url, plant_ms if case == "costlier" else 0.0)
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
        "champion_p95_at_peak_ms": _finite(m.get("champion_p95_at_peak_ms")),
        "candidate_p95_at_peak_ms": _finite(m.get("candidate_p95_at_peak_ms")),
        "reason": run.result.reason,
        "curve": [
            {
                "version": version,
                "offered_rps": p.offered_rps,
                "p95_ms": round(p.p95_ms, 2) if math.isfinite(p.p95_ms) else None,
                "achieved_rps": round(p.achieved_rps, 1),
                "requests": p.requests,
            }
            for version in (CHAMPION, CANDIDATE)
            for p in curve(run.rounds, version)
        ],
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def rate(case: str) -> float | None:
        mine = [r for r in rows if r["case"] == case]
        return round(sum(r["flagged"] for r in mine) / len(mine), 4) if mine else None

    def censored(case: str) -> int:
        from core.gate.capacity import CapacityRules

        cap = CapacityRules().max_rate_rps
        return sum(r["case"] == case and r["champion_throughput_rps"] == cap for r in rows)

    def median_shortfall(case: str) -> float | None:
        """The median of 1 - candidate / champion throughput at the SLO over the case's runs."""
        got = [
            1 - r["candidate_throughput_rps"] / r["champion_throughput_rps"]
            for r in rows
            if r["case"] == case and r["candidate_throughput_rps"] and r["champion_throughput_rps"]
        ]
        return round(statistics.median(got), 4) if got else None

    return {
        "flag_rate_costlier": rate("costlier"),
        "flag_rate_twin": rate("twin"),
        "wall_s_max": max((r["wall_s"] for r in rows), default=None),
        "runs_costlier": sum(r["case"] == "costlier" for r in rows),
        "runs_twin": sum(r["case"] == "twin" for r in rows),
        "median_shortfall_costlier": median_shortfall("costlier"),
        "median_shortfall_twin": median_shortfall("twin"),
        # runs whose champion held the SLO at every rate up to max_rate_rps: its throughput is a
        # lower bound there, and so is the shortfall
        "champion_censored_costlier": censored("costlier"),
        "champion_censored_twin": censored("twin"),
        "costlier_factor": COSTLIER_FACTOR,
        "plant": (
            "costlier: the canary burns (costlier_factor - 1) x the champion's CPU per request, "
            "measured flat out just before its pair of runs, on every request (/admin/latency "
            "mode cpu); twin: nothing planted"
        ),
        "method": (
            "each run: tasks.capacity.run_capacity_check with `rules` (the defaults unless --quick) on one "
            "real worker, champion (stable) and candidate (canary, weight 0) in alternating "
            "rounds; flagged = verdict failed"
        ),
    }


def write_results(summary: dict[str, Any], rows: list[dict[str, Any]], out: Path) -> None:
    """`out` (capacity.json, one row per run), and the `capacity_check` key of gate.json beside it."""
    # one line per run (each carries its curve): readable, and two thirds of the size indented
    head = json.dumps(stamped(summary), indent=2, allow_nan=False)[:-2]
    body = ",\n".join("    " + json.dumps(row, allow_nan=False) for row in rows)
    write_whole(out, f'{head},\n  "runs": [\n{body}\n  ]\n}}\n')
    gate_path = out.with_name("gate.json")
    gate = json.loads(gate_path.read_text()) if gate_path.exists() else {}
    gate["capacity_check"] = (
        {
            k: summary[k]
            for k in ("flag_rate_costlier", "flag_rate_twin", "wall_s_max", "measured_at")
        }
        | {
            k: summary[k]
            for k in (
                "runs_costlier",
                "runs_twin",
                "median_shortfall_costlier",
                "median_shortfall_twin",
                "champion_censored_costlier",
                "champion_censored_twin",
                "champion_cpu_ms_per_request",
                "champion_cpu_ms_per_request_range",
                "cost_probes",
                "plant_cpu_ms_per_request",
            )
            if k in summary
        }
        | {"source": "written here by python -m bench.capacity"}
    )
    write_whole(gate_path, json.dumps(gate, indent=2) + "\n")  # the rest is never half-written


def main() -> None:
    from core.gate.capacity import CapacityRules
    from core.gate.rules import CanaryRules

    global SLO_P95_MS
    SLO_P95_MS = CanaryRules().max_p95_ms
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per case")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 1 run per case, shorter rounds and one refined rate (not the default rules)",
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS / "capacity.json", help="gate.json is written beside it"
    )
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    # the smoke checks that the bench runs end to end; its figures are not the check's
    rules = CapacityRules(round_s=0.3, refine_rates=1) if args.quick else CapacityRules()
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    with scratch_dir(prefix="bench-capacity-") as tmp:
        worker, _, _ = start_worker_pair(tmp)
        try:
            plant: dict[str, Any] = {"rules": dataclasses.asdict(rules)}
            probes: list[dict[str, float]] = []
            requests = probe_requests(worker)
            for i in range(runs):
                # the host's speed drifts over a quarter of an hour (the champion's flat-out cost
                # ranged 0.34-0.57 ms here within an hour): each pair's plant is sized just before it
                probes.append(champion_cpu_ms_per_request(worker, requests))
                cost = probes[-1]["cpu_ms_per_request"]
                plant |= probe_summary(probes)
                print(f"cost probe {i}: {json.dumps(probes[-1])}", flush=True)
                for case in ("costlier", "twin") if i % 2 == 0 else ("twin", "costlier"):
                    planted = (COSTLIER_FACTOR - 1) * cost if case == "costlier" else 0.0
                    row = one_run(worker.http_url, case, rules, planted)
                    row |= {
                        "champion_cpu_ms_per_request": round(cost, 4),
                        "plant_cpu_ms_per_request": round(planted, 4),
                    }
                    rows.append(row)
                    # after every run: a run cut short still leaves the figures so far
                    write_results({**summarise(rows), **plant}, rows, args.out)
                    print(
                        f"{case:8s} {row['verdict']:12s} {row['wall_s']:6.1f} s  "
                        f"cand {row['candidate_throughput_rps']} champ "
                        f"{row['champion_throughput_rps']} req/s",
                        flush=True,
                    )
        finally:
            worker.stop()
    summary = {**summarise(rows), **plant, "total_seconds": round(time.monotonic() - started, 1)}
    write_results(summary, rows, args.out)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
