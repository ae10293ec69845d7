"""Benchmark the canary gate, one row per case: what share of releases ended which way, and when.

    python -m bench.gate [--releases 300] [--record-s 60] [--live-aa 3] [--live-ab 3] [--quick]
    python -m bench.gate --srm-only   (only the sample-ratio check; keeps the rest of gate.json)
    python -m bench.gate --live-only --live-budget-s 5400   (only the live releases; likewise)

1. **Record.** Two real serving workers (`python -m serving`) serve two trained versions of
   equal cost as canary and baseline (50 % each) while simulated shoppers drive them, at a light
   and at a heavy (peak) load; the rows come back through the real spool and embedded ClickHouse.
2. **Offline operating characteristic.** Simulated releases replay those rows through the loop
   the flow runs (`core.gate.plan.plan_canary` for the step lengths, `core.gate.step.run_step`
   and `judge_window` for every look; default `CanaryRules` with `peak_p95_ms` the peak
   recording's baseline P95, as a release sets it from its capacity check (`anchored_rules`),
   steps 5/25/50 %, 20 s windows), for
   light and heavy x 50 and 500 req/s x A/A, uniform x1.10/1.25/1.5/2, a tail (3 % of requests
   x4), a per-user shape (a tenth of users x2), a load-dependent cost (x1.5 at peak, x1 + 0.5 x
   rate/peak elsewhere) and +1 pt errors. Each window draws both cohorts (fresh users, a cluster
   bootstrap: `Recording.sample`) from the pooled rows
   of one random stretch (`Load.pooled` says why), so they share the recording's load swings.
   `p95_ratio_at_peak` is what the regression does to the peak recording's P95.
3. **Split.** The sample-ratio check on requests of fresh users drawn from the peak recording at
   500 req/s and routed by the workers' bucket function: a 5 % canary served 6 %, and an even
   split.
4. **Live.** Releases on the same two workers through the real plan, shadow and analysis tasks
   (real traffic, real log store): A/A, and A/B taking `AB_KINDS` in turn (uniform x1.5, a tail,
   a cost that shows only under load), planted by the worker's injection. Each runs the shadow
   stage at weight 0 first, as a default release does; a failed shadow is `refused` (no user saw
   it). A release takes 2-8 minutes here, some far longer (docs/gate.md), so the default budget
   (900 s) fits about four; `--live-only` runs them alone with the budget it is given.

Writes bench/results/gate.json. Everything is bounded: record time, releases, a live time budget.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.gate_replay import (
    STEPS,
    WINDOW_S,
    Load,
    Recording,
    anchored_rules,
    operating_characteristic,
    read_loads,
    save_loads,
    split_check,
)
from bench.saved import save
from bench.scratch import scratch_dir
from core.gate.capacity import CapacityRules
from core.gate.plan import CanaryPlan
from core.gate.rules import CanaryRules
from relay.types import Verdict

RESULTS = Path(__file__).parent / "results"
TOKEN = "bench-gate-token"


# -- the real fleet --------------------------------------------------------------------------


@dataclass
class Bench:
    tmp: Path
    urls: list[str]
    stable: str
    twin: str  # a second trained version of equal cost
    workers: list[Any]


def start_fleet(tmp: Path) -> Bench:
    from model_store import ModelStore
    from model_store.local import LocalBackend
    from relay_testing.versions import train_and_publish
    from serving.process import start_worker
    from simulation.shop import ShopConfig, generate_events
    from tasks.training import TrainConfig

    store = ModelStore(LocalBackend(tmp / "store"))
    frame = generate_events(ShopConfig(seed=3), 30_000, datetime(2026, 11, 1, tzinfo=UTC))
    versions = [
        train_and_publish(store, frame, TrainConfig(seed=s, epochs=1), tmp / f"v{s}", "bench")[0]
        for s in (1, 2)
    ]
    env = {
        "RELAY_HOME": str(tmp / "home"),
        "RELAY_MODEL_STORE_URL": f"file://{tmp / 'store'}",
        "RELAY_CLICKHOUSE_DSN": f"chdb://{tmp / 'home' / 'clickhouse'}",
        "RELAY_SERVING_PORT": "0",
        "RELAY_SERVING_BINARY_PORT": "0",
        "RELAY_SERVING_ADMIN_TOKEN": TOKEN,
        "RELAY_SERVING_FAULT_INJECTION": "true",  # this run injects latency or rankings
        "RELAY_SERVING_STABLE_REF": versions[0].version,
        "RELAY_SERVING_LOG_FLUSH_MS": "200",
    }
    workers = [start_worker(env, tmp / f"worker{i}.log") for i in range(2)]
    for w in workers:
        w.wait_ready()
    urls = [w.http_url for w in workers]
    os.environ.update(
        {
            k: v
            for k, v in env.items()
            if k not in ("RELAY_SERVING_PORT", "RELAY_SERVING_STABLE_REF")
        }
    )
    os.environ["RELAY_SERVING_FLEET_URLS"] = ",".join(urls)
    return Bench(tmp, urls, versions[0].version, versions[1].version, workers)


# name, offered req/s, connections, record time as a multiple of --record-s. Light: twice as
# long at a low rate, so its replay has rows enough for the P95.
LOAD_LEVELS = (("light", 80.0, 8, 2.0), ("heavy", 1000.0, 32, 1.0))


def record_loads(
    bench: Bench, seconds: float, names: tuple[str, ...] = ("light", "heavy")
) -> list[Load]:
    from logstore.reading import connect_for_reading
    from relay.settings import get_settings
    from serving.fleet import FleetClient
    from simulation.traffic import LiveTraffic, drive

    settings = get_settings()
    loads = []
    with FleetClient(bench.urls, TOKEN) as fleet:
        deployed = fleet.deploy_canary(bench.twin, weight=50, baseline=bench.stable)
        if not deployed.ok:
            raise SystemExit(f"canary deploy failed: {deployed.reason}")
        # the weight is leased: renewed while the loads run, or it lapses after a lease
        with fleet.renewing():
            for name, rps, concurrency, scale in (lv for lv in LOAD_LEVELS if lv[0] in names):
                start = datetime.now(UTC)
                report = drive(
                    bench.urls,
                    LiveTraffic(
                        rate_rps=rps,
                        duration_s=seconds * scale,
                        concurrency=concurrency,
                        seed=11,
                        max_requests=int(rps * seconds * scale),
                    ),
                )
                end = datetime.now(UTC)
                time.sleep(1.0)
                client = connect_for_reading(
                    settings.resolved_clickhouse_dsn, settings.resolved_spool_dir
                )
                rows = client.query(
                    "SELECT slot, toUnixTimestamp64Milli(ts) / 1000, user_id, latency_ms, status "
                    "FROM inference_logs WHERE ts >= {s:DateTime64(3, 'UTC')} "
                    "AND ts < {e:DateTime64(3, 'UTC')} AND slot IN ('canary', 'baseline') ORDER BY ts",
                    parameters={"s": start, "e": end},
                ).result_rows
                by_slot = {
                    slot: Recording.of([r[1:] for r in rows if r[0] == slot])
                    for slot in ("canary", "baseline")
                }
                loads.append(
                    Load(
                        name,
                        by_slot["canary"],
                        by_slot["baseline"],
                        report.requests / (seconds * scale),
                    )
                )
                print(f"recorded {name}: {json.dumps(loads[-1].summary())}")
        fleet.rollback()
    return loads


# The canary's injection per live case (None: an A/A release). The A/B kinds take turns: a
# uniform slowdown (held after scoring), a tail (5 % of requests x5, held), and a cost that
# shows only under load (compute x1.5 spent on the engine thread, so it queues at peak).
LIVE_KINDS: dict[str, dict[str, Any] | None] = {
    "aa": None,
    "uniform x1.5": {"factor": 1.5},
    "tail 5% x5": {"factor": 5.0, "share": 0.05},
    "load-dependent: compute x1.5 on the engine": {"factor": 1.5, "mode": "engine"},
}
AB_KINDS = [k for k, v in LIVE_KINDS.items() if v is not None]


def live_releases(
    bench: Bench, n_aa: int, n_ab: int, rps: float, budget_s: float
) -> dict[str, list[dict[str, Any]]]:
    """A/A and A/B releases on the real workers, alternating, within a time budget.

    Each is anchored as a default release is (`anchor_at_history_peak`: the champion's P95 in
    the busiest ten minutes of the fleet's logs), planned (`plan_canary_steps`, from the
    fleet's own recent traffic), shadowed (`shadow_candidate`, default `ShadowRules`) and stepped
    through the real analysis task (`analyse_canary_step`, its plan's step lengths) while
    simulated shoppers drive the fleet; each A/B release plants the next of `AB_KINDS` with the
    worker's injection. Releases that the budget leaves out are not run (the counts say so).
    """
    from prefect.testing.utilities import prefect_test_harness

    from relay.settings import get_settings
    from relay.types import Release
    from serving.fleet import FleetClient
    from tasks.canary_plan import anchor_at_history_peak, plan_canary_steps

    settings = get_settings()
    rules = CanaryRules()
    history_days = CapacityRules().history_days
    order: list[str] = []
    for i in range(max(n_aa, n_ab)):
        order += (["aa"] if i < n_aa else []) + ([AB_KINDS[i % len(AB_KINDS)]] if i < n_ab else [])
    runs: dict[str, list[dict[str, Any]]] = {"aa": [], "ab": []}
    deadline = time.monotonic() + budget_s
    with prefect_test_harness(server_startup_timeout=120), FleetClient(bench.urls, TOKEN) as fleet:
        for i, kind in enumerate(order):
            if time.monotonic() > deadline:
                break
            release = Release(f"bench-gate-{i}", bench.twin, "bench")
            started = time.monotonic()
            # anchored as a default release anchors them (its capacity check is off)
            anchored = anchor_at_history_peak.fn(settings, rules, bench.stable, history_days)
            plan = plan_canary_steps.fn(
                settings, release, list(STEPS), WINDOW_S, anchored, champion=bench.stable
            )
            run = _live_release(bench, fleet, release, plan, anchored, rps, LIVE_KINDS[kind], i)
            run["peak_p95_ms"] = anchored.peak_p95_ms
            run |= {"kind": kind, "seconds": round(time.monotonic() - started, 1)}
            runs["aa" if kind == "aa" else "ab"].append(run | {"plan": plan.summary})
            print(json.dumps(run))
    return runs


def _live_release(
    bench: Bench,
    fleet: Any,
    release: Any,
    plan: CanaryPlan,
    rules: CanaryRules,
    rps: float,
    injection: dict[str, Any] | None,
    seed: int,
) -> dict[str, Any]:
    from relay.settings import get_settings
    from simulation.traffic import in_background
    from tasks.canary_analysis import analyse_canary_step

    if not plan.reachable:
        return {"outcome": "paused", "windows": 0, "reason": f"plan: {plan.summary}"[:300]}
    deployed = fleet.deploy_canary(bench.twin, weight=0, baseline=bench.stable)
    if not deployed.ok:
        raise SystemExit(f"canary deploy failed: {deployed.reason}")
    if injection is not None:
        planted = fleet.set_injected_latency("canary", 0.0, **injection)
        if not planted.ok:
            raise SystemExit(f"injection {injection} failed: {planted.reason}")
    outcome, windows, reason = "promoted", 0, ""
    try:
        shadowed = _live_shadow(bench, release, rules, rps, seed)
        shadow = {"shadow": shadowed.verdict.value}
        if shadowed.verdict in (Verdict.failed, Verdict.error):  # as the flow: refused
            return {"outcome": "refused", "windows": 0, "reason": shadowed.reason[:300]} | shadow
        shadow["shadow_reason"] = shadowed.reason[:300]
        for weight in STEPS:
            step = plan.step(weight)
            length = step.length(rules) if step is not None else None
            moved = fleet.set_weight(weight)
            if not moved.ok:  # a worker left out of the split would bias every comparison
                outcome, reason = "error", f"set_weight {weight} %: {moved.reason}"
                break
            windows_s = WINDOW_S * ((length.windows if length else rules.max_windows) + 1)
            with in_background(bench.urls, _shoppers(rps, windows_s, seed * 10 + weight)):
                gate = analyse_canary_step.fn(
                    get_settings(), release, bench.stable, weight, rules, WINDOW_S, length
                )
            windows += int(gate.measurements.get("look", 1))
            reason = gate.reason
            if gate.verdict is not Verdict.passed:
                outcome = {Verdict.failed: "rolled_back", Verdict.error: "error"}.get(
                    gate.verdict, "paused"
                )
                break
    finally:
        fleet.set_injected_latency("canary", 0.0)
        fleet.rollback()
    return {"outcome": outcome, "windows": windows, "reason": reason[:300]} | shadow


def _live_shadow(bench: Bench, release: Any, rules: CanaryRules, rps: float, seed: int) -> Any:
    """The release's shadow stage at weight 0, as the flow runs it (default `ShadowRules`), with
    the shoppers driving stable meanwhile: every user still sees stable."""
    from core.gate.rules import ShadowRules
    from relay.settings import get_settings
    from simulation.traffic import in_background
    from tasks.shadow import shadow_candidate

    settings, shadow = get_settings(), ShadowRules()
    look_s = shadow.window_s + 2 * settings.serving_log_flush_ms / 1000
    with in_background(bench.urls, _shoppers(rps, look_s * (shadow.max_windows + 1), seed * 10)):
        return shadow_candidate.fn(settings, release, bench.stable, shadow, rules)


def _shoppers(rps: float, duration_s: float, seed: int) -> Any:
    """The live traffic of one stage: the shop's shoppers at `rps`, bounded in time and count."""
    from simulation.traffic import LiveTraffic

    return LiveTraffic(
        rate_rps=rps, duration_s=duration_s, concurrency=32, seed=seed, max_requests=1_000_000
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--releases", type=int, default=300, help="simulated releases per case")
    parser.add_argument("--record-s", type=float, default=60.0, help="seconds per load recording")
    parser.add_argument("--srm-replays", type=int, default=200)
    parser.add_argument("--live-aa", type=int, default=10)
    parser.add_argument("--live-ab", type=int, default=10, help="taking AB_KINDS in turn")
    parser.add_argument(
        "--live-rps", type=float, default=400.0, help="at most; no more than the fleet served"
    )
    parser.add_argument("--live-budget-s", type=float, default=900.0)
    parser.add_argument("--quick", action="store_true", help="the smoke test's size: seconds")
    parser.add_argument(
        "--srm-only",
        action="store_true",
        help="re-measure only the sample-ratio check (records the heavy load, replays the split) "
        "and replace gate.json's `srm`, keeping every other figure",
    )
    parser.add_argument(
        "--live-only",
        action="store_true",
        help="run only the live releases (records the heavy load for the rate) and replace "
        "gate.json's live figures, keeping every other figure; give it a --live-budget-s that "
        "fits --live-aa + --live-ab releases (each takes 2-8 minutes here, some up to 20)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "gate.json")
    parser.add_argument(
        "--recordings", type=Path, help="save the recordings here (.npz); reuse them if it exists"
    )
    args = parser.parse_args()
    if args.quick:
        args.releases, args.record_s, args.srm_replays = 3, 4.0, 3
        args.live_aa = args.live_ab = 0

    started = time.monotonic()
    with scratch_dir(prefix="relay-bench-gate-") as tmp:
        bench = start_fleet(tmp)
        try:
            if args.srm_only:
                srm_only(bench, args)
                return
            if args.live_only:
                live_only(bench, args)
                return
            if args.recordings and args.recordings.exists():
                loads = read_loads(args.recordings)
            else:
                loads = record_loads(bench, args.record_s)
                if args.recordings:
                    save_loads(loads, args.recordings)
            offline_started = time.monotonic()
            cases = operating_characteristic(loads, args.releases, seed=7)
            offline_s = round(time.monotonic() - offline_started, 1)
            peak = max(loads, key=lambda x: x.rps)
            srm = split_check(peak, args.srm_replays, seed=9)
            print(json.dumps({"srm": srm}))
            figures = _figures(args, loads, cases, offline_s, srm, {"aa": [], "ab": []}, started)
            _save(args.out, figures)  # the offline figures stand even if a live release fails
            if args.live_aa + args.live_ab:
                # plan and drive at what the fleet served at peak, not at a rate it cannot reach
                args.live_rate = min(args.live_rps, round(0.8 * peak.rps))
                live = live_releases(
                    bench, args.live_aa, args.live_ab, args.live_rate, args.live_budget_s
                )
                figures = _figures(args, loads, cases, offline_s, srm, live, started)
                _save(args.out, figures)
        finally:
            for w in bench.workers:
                w.stop()
    print(json.dumps({k: v for k, v in figures.items() if k != "cases"}, indent=2, default=_finite))


def srm_only(bench: Bench, args: argparse.Namespace) -> None:
    """The sample-ratio figures alone, into gate.json's `srm` (dated there); the rest is kept."""
    (peak,) = record_loads(bench, args.record_s, names=("heavy",))
    srm = split_check(peak, args.srm_replays, seed=9)
    figures = _read_json(args.out)
    figures["srm"] = srm | {
        "recording": peak.summary(),
        "measured_at": datetime.now(UTC).isoformat(),
        "source": "python -m bench.gate --srm-only (the rest of gate.json is an earlier run's)",
    }
    _save(args.out, figures)
    print(json.dumps({"srm": figures["srm"]}, indent=2, default=_finite))


def live_only(bench: Bench, args: argparse.Namespace) -> None:
    """The live releases alone, into gate.json's live figures (dated there); the rest is kept."""
    started = time.monotonic()
    (peak,) = record_loads(bench, args.record_s, names=("heavy",))
    args.live_rate = min(args.live_rps, round(0.8 * peak.rps))
    live = live_releases(bench, args.live_aa, args.live_ab, args.live_rate, args.live_budget_s)
    figures = _read_json(args.out)
    figures |= {
        "live_aa": live["aa"],
        "live_ab": live["ab"],
        "live_traffic_rps": args.live_rate,
        "live_budget_s": args.live_budget_s,
        "live_asked": {"aa": args.live_aa, "ab": args.live_ab},
        "live_seconds": round(time.monotonic() - started, 1),
        "live_recording": peak.summary(),
        "live_measured_at": datetime.now(UTC).isoformat(),
        "live_source": "python -m bench.gate --live-only (the rest of gate.json is an earlier run's)",
    }
    _save(args.out, figures)
    print(json.dumps({k: figures[k] for k in ("live_traffic_rps", "live_seconds")}, indent=2))


def _figures(
    args: argparse.Namespace,
    loads: list[Load],
    cases: list[dict[str, Any]],
    offline_s: float,
    srm: dict[str, Any],
    live: dict[str, list[dict[str, Any]]],
    started: float,
) -> dict[str, Any]:
    return {
        "cases": cases,
        **measured_elsewhere(args.out),
        "srm": srm,
        "live_aa": live["aa"],
        "live_ab": live["ab"],
        "live_traffic_rps": getattr(args, "live_rate", None),
        "live_budget_s": args.live_budget_s,
        "recordings": {load.name: load.summary() for load in loads},
        "rules": anchored_rules(max(loads, key=lambda x: x.rps)).thresholds(),
        "steps": list(STEPS),
        "window_s": WINDOW_S,
        "releases_per_case": args.releases,
        "offline_seconds": offline_s,
        "total_seconds": round(time.monotonic() - started, 1),
        "cpu_count": os.cpu_count(),
        "measured_at": datetime.now(UTC).isoformat(),
    }


def measured_elsewhere(out: Path) -> dict[str, Any]:
    """gate.json's figures that other benches measure, as they last measured them.

    `capacity_check` is written into gate.json by `bench.capacity`, `mirror_p95_cost` into
    serving_mirror.json (and its copy here) by `bench.serving --mirror-only`; a gate run keeps both rather than
    erasing them, and says where each comes from (None where it was never measured).
    """
    previous = _read_json(out)
    mirror = _read_json(out.with_name("serving_mirror.json"))
    capacity = previous.get("capacity_check") or {
        "flag_rate_costlier": None,
        "flag_rate_twin": None,
        "wall_s_max": None,
    }
    return {
        "mirror_p95_cost": mirror.get("mirror_p95_cost"),
        "mirror_p95_cost_source": "serving_mirror.json (python -m bench.serving --mirror-only)",
        "capacity_check": capacity | {"source": "written here by python -m bench.capacity"},
    }


def _read_json(path: Path) -> dict[str, Any]:
    """The file's JSON object; {} when it is absent or unreadable (a figure then reads None)."""
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _save(out: Path, figures: dict[str, Any]) -> None:
    """Whole or not at all: a run cut short never leaves a half-written gate.json."""
    save(out, figures, default=_finite)


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    return str(value)


if __name__ == "__main__":
    main()
