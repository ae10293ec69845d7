"""Benchmark the canary gate: its false-rollback rate and detection power, offline and live.

    python -m bench.gate [--releases 2000] [--record-s 45] [--live-aa 10] [--live-ab 10]

1. **Record.** Two real serving workers (`python -m serving`) serve two trained versions of
   equal cost as canary and baseline (50 % each) while simulated shoppers drive them, at a light
   and at a heavy load; the rows come back through the real spool and embedded ClickHouse.
2. **Offline operating characteristic.** Thousands of simulated releases replay those rows
   through the same decision code the flow runs (`judge_window`, default `CanaryRules`, steps
   5/25/50 %, 20 s windows): A/A, and A/B with the canary's latencies multiplied by 1.10, 1.25,
   1.50, 2.00 or 1 pt more errors, at 50 and 500 req/s. Each window takes consecutive recorded
   rows of both slots from one random moment, so canary and baseline share the recording's load
   swings as they do live. Today's rule (a window's point P95 ratio > 1.2 and > 10 ms, 3 windows)
   runs on the same draws, side by side.
3. **Live.** Releases on the same two workers through the real analysis task
   (`analyse_canary_step`, real traffic, real log store, default rules and steps): A/A
   (two equal versions) and A/B (canary slowed x1.5 by the worker's multiplicative injection).

Writes bench/results/gate.json. Everything is bounded: record time, releases, a live time budget.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from logstore.slo import cohort_sums_of, paired_seconds_of
from relay.types import Verdict
from tasks.canary_analysis import CanaryRules, StepEvidence, StepFigures, judge_window

RESULTS = Path(__file__).parent / "results"
TOKEN = "bench-gate-token"
STEPS = (5, 25, 50)
WINDOW_S = 20.0
REGRESSIONS: dict[str, tuple[float, float]] = {  # name -> (latency factor, extra error rate)
    "aa": (1.0, 0.0),
    "+10%": (1.10, 0.0),
    "+25%": (1.25, 0.0),
    "+50%": (1.50, 0.0),
    "+100%": (2.00, 0.0),
    "+1pt errors": (1.0, 0.01),
}


# -- the recording ---------------------------------------------------------------------------


@dataclass
class Recording:
    """Rows the real workers logged for one slot, in time order."""

    ts: np.ndarray  # seconds
    user: np.ndarray
    latency_ms: np.ndarray
    status: np.ndarray

    @classmethod
    def of(cls, rows: list[tuple]) -> Recording:
        ts, user, latency, status = (np.asarray(c) for c in zip(*rows, strict=True))
        return cls(
            ts.astype(float), user.astype(np.int64), latency.astype(float), status.astype(int)
        )

    def sample(
        self, rng: np.random.Generator, start: float, n: int, offset: float
    ) -> tuple[np.ndarray, ...]:
        """n rows drawn from the WINDOW_S seconds after `start`, re-timed to begin at `offset`."""
        lo, hi = np.searchsorted(self.ts, [start, start + WINDOW_S])
        if hi - lo < 1:
            lo, hi = 0, len(self.ts)
        idx = rng.integers(lo, hi, n)
        return (
            self.user[idx],
            self.latency_ms[idx],
            self.status[idx],
            self.ts[idx] - start + offset,
        )


@dataclass
class Load:
    """A paired recording of canary and baseline rows at one load level."""

    name: str
    canary: Recording
    baseline: Recording
    rps: float

    def draw(
        self, rng: np.random.Generator, n_canary: int, n_baseline: int, window: int
    ) -> tuple[Any, Any]:
        """n rows of each slot from one random WINDOW_S-second stretch of the recording.

        Both slots come from the same stretch, so they share its load swings as canary and
        baseline do live; each keeps its own queue's ups and downs at their real time scale.
        """
        first, last = self.canary.ts[0], self.canary.ts[-1]
        start = float(rng.uniform(first, max(first, last - WINDOW_S)))
        offset = window * WINDOW_S  # windows follow each other in time
        return (
            self.canary.sample(rng, start, n_canary, offset),
            self.baseline.sample(rng, start, n_baseline, offset),
        )

    def summary(self) -> dict[str, float]:
        lat = np.concatenate([self.canary.latency_ms, self.baseline.latency_ms])
        return {
            "rows": int(len(lat)),
            "rps": round(self.rps, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 2),
            "p95_ms": round(float(np.percentile(lat, 95)), 2),
            "p99_ms": round(float(np.percentile(lat, 99)), 2),
            "canary_p95_ms": round(float(np.percentile(self.canary.latency_ms, 95)), 2),
            "baseline_p95_ms": round(float(np.percentile(self.baseline.latency_ms, 95)), 2),
        }


def apply(
    rows: tuple[np.ndarray, ...], regression: tuple[float, float], rng: np.random.Generator
) -> tuple[np.ndarray, ...]:
    factor, extra_errors = regression
    users, latency, status, ts = rows
    if extra_errors:
        status = np.where(rng.random(len(status)) < extra_errors, 500, status)
    return users, latency * factor, status, ts


# -- the two rules, on the same draws --------------------------------------------------------


@dataclass
class ReleaseResult:
    outcome: str  # promoted | rolled_back | paused
    windows: int  # analysis windows until the release's last verdict


def sequential_release(
    load: Load, rps: float, regression: tuple[float, float], rules: CanaryRules, rng: Any
) -> ReleaseResult:
    """Steps 5/25/50 under the sequential gate, as `analyse_canary_step` runs them."""
    windows = 0
    for weight in STEPS:
        evidence = StepEvidence()
        cum: list[list[tuple]] = [[], []]
        for _ in range(rules.max_windows):
            windows += 1
            n = rng.poisson(rps * weight / 100 * WINDOW_S, 2)
            c_rows, b_rows = load.draw(rng, int(n[0]), int(n[1]), windows)
            cum[0].append(apply(c_rows, regression, rng))
            cum[1].append(b_rows)
            canary = tuple(np.concatenate(x) for x in zip(*cum[0], strict=True))
            baseline = tuple(np.concatenate(x) for x in zip(*cum[1], strict=True))
            figures = StepFigures(
                cohort_sums_of("canary", "b", *canary),
                cohort_sums_of("baseline", "a", *baseline),
                paired_seconds_of(canary, baseline),
            )
            gate, evidence = judge_window(figures, rules, evidence)
            if gate.verdict is not Verdict.inconclusive:
                break
        if gate.verdict is Verdict.failed:
            return ReleaseResult("rolled_back", windows)
        if gate.verdict is not Verdict.passed:
            return ReleaseResult("paused", windows)
    return ReleaseResult("promoted", windows)


def point_p95_release(
    load: Load, rps: float, regression: tuple[float, float], rules: CanaryRules, rng: Any
) -> ReleaseResult:
    """Today's rule: each window alone, point P95 ratio > 1.2 and > 10 ms, at most 3 windows."""
    windows = 0
    for weight in STEPS:
        verdict = "inconclusive"
        for _ in range(3):
            windows += 1
            n_canary = int(rng.poisson(rps * weight / 100 * WINDOW_S))
            n_stable = int(rng.poisson(rps * (100 - weight) / 100 * WINDOW_S))
            c_rows, s_rows = load.draw(rng, n_canary, n_stable, windows)
            _, c_lat, c_status, _ = apply(c_rows, regression, rng)
            _, s_lat, _, _ = s_rows
            if n_canary < 200 or n_stable < 200:
                continue
            c_p95, s_p95 = np.percentile(c_lat, 95), np.percentile(s_lat, 95)
            errors = float(np.mean(c_status >= 500))
            relative = c_p95 / s_p95 > 1.2 and c_p95 - s_p95 > 10.0
            verdict = (
                "failed"
                if c_p95 > rules.max_p95_ms or errors > rules.max_error_rate or relative
                else "passed"
            )
            break
        if verdict == "failed":
            return ReleaseResult("rolled_back", windows)
        if verdict != "passed":
            return ReleaseResult("paused", windows)
    return ReleaseResult("promoted", windows)


RULES: dict[str, Callable[..., ReleaseResult]] = {
    "sequential": sequential_release,
    "point_p95": point_p95_release,
}


def exceeds_tolerance(load: Load, regression: tuple[float, float], rules: CanaryRules) -> bool:
    """Whether the planted regression is one the gate exists to catch at this load."""
    factor, extra_errors = regression
    if extra_errors:
        return extra_errors * 100 > rules.error_tolerance_pt
    base_p95 = float(np.percentile(load.baseline.latency_ms, 95))
    return factor > rules.latency_tolerance(base_p95)


def operating_characteristic(loads: list[Load], releases: int, seed: int) -> dict[str, Any]:
    rules = CanaryRules()
    cases = []
    for load in loads:
        for rps in (50.0, 500.0):
            for name, regression in REGRESSIONS.items():
                for rule_name, run in RULES.items():
                    rng = np.random.default_rng([seed, len(cases)])
                    started = time.perf_counter()
                    results = [run(load, rps, regression, rules, rng) for _ in range(releases)]
                    outcomes = [r.outcome for r in results]
                    cases.append(
                        {
                            "load": load.name,
                            "traffic_rps": rps,
                            "regression": name,
                            "rule": rule_name,
                            "releases": releases,
                            "exceeds_tolerance": name != "aa"
                            and exceeds_tolerance(load, regression, rules),
                            "rolled_back": outcomes.count("rolled_back") / releases,
                            "paused": outcomes.count("paused") / releases,
                            "promoted": outcomes.count("promoted") / releases,
                            "median_windows_to_verdict": float(
                                np.median([r.windows for r in results])
                            ),
                            "seconds": round(time.perf_counter() - started, 1),
                        }
                    )
                    print(json.dumps(cases[-1]))
    return {"cases": cases, **{rule: summarise(cases, rule) for rule in RULES}}


def summarise(cases: list[dict[str, Any]], rule: str) -> dict[str, Any]:
    mine = [c for c in cases if c["rule"] == rule]
    aa = [c for c in mine if c["regression"] == "aa"]
    detection: dict[str, float | None] = {}
    for name in REGRESSIONS:
        if name == "aa":
            continue
        counted = [c for c in mine if c["regression"] == name and c["exceeds_tolerance"]]
        detection[name] = (
            round(float(np.mean([c["rolled_back"] for c in counted])), 4) if counted else None
        )
    return {
        "aa_false_rollback_rate": round(float(np.mean([c["rolled_back"] for c in aa])), 4),
        "aa_false_rollback_rate_worst_case": round(max(c["rolled_back"] for c in aa), 4),
        "aa_paused_rate": round(float(np.mean([c["paused"] for c in aa])), 4),
        "detection_rate_by_regression": detection,
        "median_windows_to_verdict": float(
            np.median([c["median_windows_to_verdict"] for c in mine])
        ),
        "note": "detection pooled over the cases where the regression exceeds the tolerance",
    }


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


def record_loads(bench: Bench, seconds: float) -> list[Load]:
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
            for name, rps, concurrency in (("light", 40.0, 8), ("heavy", 1000.0, 32)):
                start = datetime.now(UTC)
                report = drive(
                    bench.urls,
                    LiveTraffic(
                        rate_rps=rps,
                        duration_s=seconds,
                        concurrency=concurrency,
                        seed=11,
                        max_requests=int(rps * seconds),
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
                    Load(name, by_slot["canary"], by_slot["baseline"], report.requests / seconds)
                )
                print(f"recorded {name}: {json.dumps(loads[-1].summary())}")
        fleet.rollback()
    return loads


def save_loads(loads: list[Load], path: Path) -> None:
    arrays = {}
    for load in loads:
        arrays[f"{load.name}.rps"] = np.array([load.rps])
        for slot in ("canary", "baseline"):
            rec = getattr(load, slot)
            for col in ("ts", "user", "latency_ms", "status"):
                arrays[f"{load.name}.{slot}.{col}"] = getattr(rec, col)
    np.savez_compressed(path, **arrays)


def read_loads(path: Path) -> list[Load]:
    data = np.load(path)
    names = sorted({k.split(".")[0] for k in data.files}, key=["light", "heavy"].index)
    return [
        Load(
            name,
            *(
                Recording(
                    *(
                        data[f"{name}.{slot}.{col}"]
                        for col in ("ts", "user", "latency_ms", "status")
                    )
                )
                for slot in ("canary", "baseline")
            ),
            float(data[f"{name}.rps"][0]),
        )
        for name in names
    ]


def live_releases(
    bench: Bench, n_aa: int, n_ab: int, rps: float, budget_s: float
) -> dict[str, Any]:
    """A/A and A/B releases through the real analysis task, alternating, within a time budget."""
    from prefect.testing.utilities import prefect_test_harness

    from relay.settings import get_settings
    from relay.types import Release
    from serving.fleet import FleetClient
    from simulation.traffic import LiveTraffic, in_background
    from tasks.canary_analysis import analyse_canary_step

    settings = get_settings()
    rules = CanaryRules()
    plan = ["aa"] * n_aa + ["ab"] * n_ab
    order = [plan[i] for i in np.random.default_rng(1).permutation(len(plan))]
    runs: list[dict[str, Any]] = []
    deadline = time.monotonic() + budget_s
    with prefect_test_harness(server_startup_timeout=120), FleetClient(bench.urls, TOKEN) as fleet:
        for i, kind in enumerate(order):
            if time.monotonic() > deadline:
                break
            release = Release(f"bench-gate-{i}", bench.twin, "bench")
            deployed = fleet.deploy_canary(bench.twin, weight=0, baseline=bench.stable)
            if not deployed.ok:
                raise SystemExit(f"canary deploy failed: {deployed.reason}")
            if kind == "ab":
                fleet.set_injected_latency("canary", 0.0, factor=1.5)
            started = time.monotonic()
            outcome, windows, reason = "promoted", 0, ""
            for weight in STEPS:
                fleet.set_weight(weight)
                # shoppers call the fleet while the step runs, as the shop process would; the
                # analysis only reads what the fleet logged (up to its max windows of traffic)
                traffic = LiveTraffic(
                    rate_rps=rps,
                    duration_s=min(WINDOW_S * rules.max_windows, 3_600),
                    concurrency=32,
                    seed=i,
                    max_requests=1_000_000,
                )
                with in_background(bench.urls, traffic):
                    gate = analyse_canary_step.fn(
                        settings, release, bench.stable, weight, rules, WINDOW_S
                    )
                windows += int(gate.measurements.get("look", 1))
                reason = gate.reason
                if gate.verdict is Verdict.failed:
                    outcome = "rolled_back"
                    break
                if gate.verdict is not Verdict.passed:
                    outcome = "paused" if gate.verdict is Verdict.inconclusive else "error"
                    break
            fleet.set_injected_latency("canary", 0.0)
            fleet.rollback()
            runs.append(
                {
                    "kind": kind,
                    "outcome": outcome,
                    "windows": windows,
                    "seconds": round(time.monotonic() - started, 1),
                    "reason": reason[:300],
                }
            )
            print(json.dumps(runs[-1]))
    aa = [r for r in runs if r["kind"] == "aa"]
    ab = [r for r in runs if r["kind"] == "ab"]
    return {
        "traffic_rps": rps,
        "window_s": WINDOW_S,
        "steps": list(STEPS),
        "live_aa_releases": len(aa),
        "live_ab_releases": len(ab),
        "live_aa_false_rollbacks": sum(r["outcome"] == "rolled_back" for r in aa),
        "live_aa_paused": sum(r["outcome"] == "paused" for r in aa),
        "live_ab_detected": sum(r["outcome"] == "rolled_back" for r in ab),
        "median_seconds_to_verdict_aa": float(np.median([r["seconds"] for r in aa]))
        if aa
        else None,
        "median_seconds_to_verdict_ab": float(np.median([r["seconds"] for r in ab]))
        if ab
        else None,
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--releases", type=int, default=2000, help="simulated releases per case")
    parser.add_argument("--record-s", type=float, default=90.0, help="seconds per load recording")
    parser.add_argument("--live-aa", type=int, default=10)
    parser.add_argument("--live-ab", type=int, default=10)
    parser.add_argument("--live-rps", type=float, default=400.0)
    parser.add_argument("--live-budget-s", type=float, default=1500.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "gate.json")
    parser.add_argument(
        "--recordings", type=Path, help="save the recordings here (.npz); reuse them if it exists"
    )
    args = parser.parse_args()

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="relay-bench-gate-") as tmp_name:
        bench = start_fleet(Path(tmp_name))
        try:
            if args.recordings and args.recordings.exists():
                loads = read_loads(args.recordings)
            else:
                loads = record_loads(bench, args.record_s)
                if args.recordings:
                    save_loads(loads, args.recordings)
            offline_started = time.monotonic()
            offline = operating_characteristic(loads, args.releases, seed=7)
            offline["seconds"] = round(time.monotonic() - offline_started, 1)
            live = (
                live_releases(bench, args.live_aa, args.live_ab, args.live_rps, args.live_budget_s)
                if args.live_aa + args.live_ab
                else {}
            )
        finally:
            for w in bench.workers:
                w.stop()
    figures = {
        "recordings": {load.name: load.summary() for load in loads},
        "rules": CanaryRules().thresholds(),
        "steps": list(STEPS),
        "window_s": WINDOW_S,
        "offline": offline,
        "live": live,
        "total_seconds": round(time.monotonic() - started, 1),
        "cpu_count": os.cpu_count(),
        "measured_at": datetime.now(UTC).isoformat(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2, default=_finite) + "\n")
    print(
        json.dumps(
            {k: v for k, v in figures.items() if k != "offline"}
            | {"sequential": offline["sequential"], "point_p95": offline["point_p95"]},
            indent=2,
            default=_finite,
        )
    )


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    return str(value)


if __name__ == "__main__":
    main()
