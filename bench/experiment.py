"""Benchmark the release experiment: coverage, CUPED, false detections, query and history speed.

    python -m bench.experiment [--releases N] [--users N] [--rows-10m N] [--out PATH]

Plants `--releases` simulated releases per case (simulation.experiment: a candidate with a known
effect against an equal-cost twin) into one fresh embedded ClickHouse under /tmp, each in its own
3-hour slot of time with its own version names, and runs every one through the real query
(logstore.experiment) and estimator (core.impact.experiment):

- `coverage_by_metric`: share of releases whose 95 % interval on the relative effect covers the
  planted truth, per metric over all cases, with its 95 % Wilson interval over that many
  releases (`coverage_interval_by_metric`: 600 releases tell a share near 95 % to about ±2
  points, 1,500 to about ±1.2), and `coverage_by_case` per case and metric;
- `cuped_variance_reduction`: 1 − Var(CUPED) / Var(raw) of the effect, per metric, the median
  over releases (and each case's in `cuped_by_case`);
- `false_detection_rate_zero`: share of zero-effect releases whose finding is "effect
  detected" (Holm across the business metrics), with each metric's own rate beside it;
- `detection_rate_by_case`: the same share in the planted cases (the power at that size);
- `query_s_10m`: one release of about 10M log rows (inference_logs, impressions, feedback and
  user_sessions together; `rows_10m` says how many exactly), query plus estimate, seconds;
- `history_build_s_100`: the history page (HTML, markdown, rows) for 100 stored releases.

Writes bench/results/experiment.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.saved import save

RESULTS = Path(__file__).parent / "results"
BASE = datetime(2036, 1, 1, tzinfo=UTC)
SLOT = timedelta(hours=3)
CASES: dict[str, dict[str, float]] = {
    "orders_plus_3pct": {"order_lift": 0.03},
    "gmv_minus_2pct": {"order_value_lift": -0.02},
    "zero": {},
}
METRIC_KEYS = ("click_through", "orders_per_user", "gmv_per_user", "latency_ms")
NOW = datetime(2036, 6, 1, tzinfo=UTC)


def _planted(case: str, index: int, users: int) -> Any:
    from simulation.experiment import PlantedRelease

    n = list(CASES).index(case) * 100_000 + index
    return PlantedRelease(
        canary_version=f"bx-{case}-{index}-cand",
        baseline_version=f"bx-{case}-{index}-base",
        start=BASE + SLOT * n + timedelta(hours=1),
        users=users,
        seed=n,
        **CASES[case],
    )


def run_cases(client: Any, releases: int, users: int) -> list[dict[str, Any]]:
    """Plant, insert, query and estimate every release of every case; one record per release."""
    from core.impact.experiment import estimate_experiment
    from core.impact.experiment_types import ExperimentFinding, ExperimentOptions
    from logstore.experiment import query_experiment
    from simulation.experiment import PlantedRows, insert_planted, plant_release
    from simulation.shop import ShopConfig, make_population

    population = make_population(ShopConfig())
    records: list[dict[str, Any]] = []
    for case in CASES:
        started = time.perf_counter()
        planted = [_planted(case, i, users) for i in range(releases)]
        for lo in range(0, releases, 25):  # insert 25 releases at a time: fewer, larger parts
            batch = [plant_release(population, p) for p in planted[lo : lo + 25]]
            tables = ("inference_logs", "impressions", "feedback", "user_sessions")
            insert_planted(
                client, PlantedRows(*(_concat([getattr(b, t) for b in batch]) for t in tables))
            )
        seeded = time.perf_counter() - started
        for p in planted:
            data = query_experiment(
                client, p.start, p.end, p.pre_start, p.canary_version, p.baseline_version
            )
            identity = (p.canary_version, p.canary_version, "-", "promoted")
            record: dict[str, Any] = {"case": case}
            # the default (every pre-canary metric as covariate) and classic single-covariate
            # CUPED, on the very same moments
            for variant, prefix in (("all", ""), ("own", "own_")):
                exp = estimate_experiment(
                    data, identity, ExperimentOptions(covariates=variant), now=NOW
                )
                record[f"{prefix}detected"] = exp.finding is ExperimentFinding.effect_detected
                for key in METRIC_KEYS:
                    m = exp.metric(key)
                    record[f"{prefix}{key}"] = {
                        "covered": bool(m and m.covers_relative(p.truth[key])),
                        "detected": bool(m and m.p_value is not None and m.p_value < 0.05),
                        "variance_reduction": m.variance_reduction if m else None,
                    }
            records.append(record)
        print(f"{case}: {releases} releases seeded in {seeded:.1f} s, "
              f"estimated in {time.perf_counter() - started - seeded:.1f} s", flush=True)  # fmt: skip
    return records


def _concat(frames: list[Any]) -> Any:
    import pandas as pd

    return pd.concat(frames, ignore_index=True)


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Coverage, CUPED reduction and detection rates from the per-release records."""

    def share(rows: list[dict[str, Any]], pick: Any) -> float:
        return round(sum(bool(pick(r)) for r in rows) / len(rows), 4) if rows else float("nan")

    def wilson(rows: list[dict[str, Any]], pick: Any) -> list[float] | None:
        """The 95 % Wilson score interval of the share: what this many releases can tell."""
        n = len(rows)
        if not n:
            return None
        p, z = sum(bool(pick(r)) for r in rows) / n, 1.959964
        centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        return [
            round((centre - half) / (1 + z * z / n), 4),
            round((centre + half) / (1 + z * z / n), 4),
        ]

    def median_vr(rows: list[dict[str, Any]], key: str) -> float | None:
        values = [
            r[key]["variance_reduction"] for r in rows if r[key]["variance_reduction"] is not None
        ]
        return round(statistics.median(values), 4) if values else None

    by_case = {c: [r for r in records if r["case"] == c] for c in CASES}
    zero = by_case["zero"]
    return {
        "coverage_by_metric": {k: share(records, lambda r, k=k: r[k]["covered"]) for k in METRIC_KEYS},
        "coverage_interval_by_metric": {
            k: wilson(records, lambda r, k=k: r[k]["covered"]) for k in METRIC_KEYS
        },
        "coverage_by_case": {
            c: {k: share(rows, lambda r, k=k: r[k]["covered"]) for k in METRIC_KEYS}
            for c, rows in by_case.items()
        },
        "cuped_variance_reduction": {k: median_vr(records, k) for k in METRIC_KEYS},
        "cuped_by_case": {c: {k: median_vr(rows, k) for k in METRIC_KEYS} for c, rows in by_case.items()},
        "false_detection_rate_zero": share(zero, lambda r: r["detected"]),
        "false_detection_by_metric_zero": {
            k: share(zero, lambda r, k=k: r[k]["detected"]) for k in METRIC_KEYS
        },
        "detection_rate_by_case": {c: share(rows, lambda r: r["detected"]) for c, rows in by_case.items()},
        "releases_per_case": {c: len(rows) for c, rows in by_case.items()},
        "single_covariate_cuped": {
            "coverage_by_metric": {
                k: share(records, lambda r, k=k: r[f"own_{k}"]["covered"]) for k in METRIC_KEYS
            },
            "cuped_variance_reduction": {k: median_vr(records, f"own_{k}") for k in METRIC_KEYS},
            "false_detection_rate_zero": share(zero, lambda r: r["own_detected"]),
        },
    }  # fmt: skip


def time_query_10m(client: Any, rows_target: int) -> dict[str, Any]:
    """One release of about `rows_target` log rows: the query and estimate, timed."""
    from core.impact.experiment import estimate_experiment
    from core.impact.experiment_types import ExperimentOptions
    from logstore.experiment import query_experiment
    from simulation.experiment import PlantedRelease, insert_planted, plant_release
    from simulation.shop import ShopConfig, make_population

    block = 20_000  # users per insert: memory stays bounded
    population = make_population(ShopConfig(n_users=400_000))
    release = PlantedRelease(
        "bx-10m-cand", "bx-10m-base", BASE - timedelta(days=30), users=block, seed=9_000_000,
        order_lift=0.03, users_from=0,
    )  # fmt: skip
    written = 0
    started = time.perf_counter()
    for chunk in range(len(population.user_age) // block):
        part = replace(release, seed=release.seed + chunk, users_from=chunk * block)
        written += insert_planted(client, plant_release(population, part))
        if written >= rows_target:
            break
    print(f"10m: seeded {written:,} rows in {time.perf_counter() - started:.1f} s", flush=True)
    started = time.perf_counter()
    data = query_experiment(
        client, release.start, release.end, release.pre_start, "bx-10m-cand", "bx-10m-base"
    )
    queried = time.perf_counter() - started
    exp = estimate_experiment(
        data, ("10m", "bx-10m-cand", "-", "promoted"), ExperimentOptions(), NOW
    )
    total = time.perf_counter() - started
    users = exp.canary_users + exp.baseline_users
    print(f"10m: {written:,} rows, {users:,} users: query {queried:.2f} s, total {total:.2f} s")
    return {"query_s_10m": round(total, 3), "query_only_s_10m": round(queried, 3),
            "rows_10m": written, "users_10m": users}  # fmt: skip


def _history_store(workdir: Path, releases: int) -> Any:
    """A fresh local model store with `releases` versions, each with an experiment and a report."""
    import numpy as np

    from core.impact.experiment import estimate_experiment
    from core.impact.experiment_types import ExperimentOptions
    from core.impact.storage import REPORT_KIND, store_experiment
    from core.impact.types import ImpactFinding, ImpactWindow, StoredImpactReport
    from logstore.experiment import CohortMoments, ExperimentData
    from model_store import ModelStore
    from model_store.local import LocalBackend
    from relay.types import LineageId, VersionManifest

    store = ModelStore(LocalBackend(workdir / "history-store"))
    rng = np.random.default_rng(0)
    page = workdir / "report.html"
    for i in range(releases):
        version = f"v{i:04d}"
        digest = f"{i:064x}"
        lineage = LineageId(model=digest, data=digest, env=digest, build=digest)
        store.publish(VersionManifest(version=version, created_at=NOW, lineage=lineage,
                                      lineage_id=str(lineage)))  # fmt: skip
        cohorts = {}
        for name in ("canary", "baseline"):
            orders = rng.poisson(2.0, 500).astype(float)
            cohorts[name] = CohortMoments.from_users(name, {
                "orders": orders, "pre_orders": orders + rng.poisson(1.0, 500),
                "gmv": 40 * orders, "pre_gmv": 40 * orders, "impressions": np.full(500, 20.0),
                "clicked": rng.binomial(20, 0.1, 500).astype(float), "requests": np.full(500, 4.0),
                "latency_sum": rng.normal(480, 40, 500),
            })  # fmt: skip
        start = NOW + timedelta(hours=i)
        data = ExperimentData(start, start + timedelta(minutes=30), start - timedelta(days=1),
                              start, version, "base", cohorts, 0)  # fmt: skip
        store_experiment(store, estimate_experiment(
            data, (f"release-{i}", version, str(lineage), "promoted"), ExperimentOptions(), NOW
        ))  # fmt: skip
        page.write_text(f"<html><body>report {i}</body></html>")
        blob = store.put_blob(page)
        record = StoredImpactReport(
            report_id=f"r{i}", created_at=start, attached_to=version, record_key="-",
            window=ImpactWindow(start=start, end=start + timedelta(minutes=30)), versions=[version],
            finding=ImpactFinding.effect_detected, headline="-", blobs={"report.html": blob},
            html_url=store.locate_blob(blob), json_url="-", elasticity=-0.05,
            elasticity_ci=(-0.06, -0.04),
        )  # fmt: skip
        store.put_attachment(version, REPORT_KIND, f"r{i}", record.model_dump_json().encode())
    return store


def time_history(workdir: Path, releases: int = 100) -> dict[str, Any]:
    """Time building the history page (rows read from the store, HTML, markdown) for `releases`."""
    from core.impact.history import build_history

    store = _history_store(workdir, releases)
    started = time.perf_counter()
    page = build_history(store, NOW)
    elapsed = time.perf_counter() - started
    print(f"history: {len(page.rows)} releases built in {elapsed:.3f} s")
    return {"history_build_s_100": round(elapsed, 3), "history_releases": len(page.rows)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiment", description=__doc__)
    parser.add_argument(
        "--releases",
        type=int,
        default=500,
        help="releases per case (at 200 a case's coverage is known to ±3 points only)",
    )
    parser.add_argument("--users", type=int, default=1_000, help="users per release")
    parser.add_argument("--rows-10m", type=int, default=10_000_000)
    parser.add_argument("--out", type=Path, default=RESULTS / "experiment.json")
    args = parser.parse_args(argv)

    import logstore

    workdir = Path(tempfile.mkdtemp(prefix="relay-bench-experiment-", dir="/tmp"))
    started = time.perf_counter()
    try:
        client = logstore.connect(f"chdb://{workdir / 'clickhouse'}")
        figures: dict[str, Any] = {"users_per_release": args.users}
        figures |= summarise(run_cases(client, args.releases, args.users))
        figures |= time_query_10m(client, args.rows_10m)
        logstore.close_all()
        figures |= time_history(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    figures["total_s"] = round(time.perf_counter() - started, 1)
    figures["method"] = (
        "95 % normal intervals on the relative effect (delta method, clustered by user, CUPED "
        "with every pre-canary metric of the user as covariates, theta by pooled within-cohort "
        "least squares; single_covariate_cuped: each metric's own pre-canary value only); "
        "'effect detected' is Holm-corrected across click-through, orders and GMV per user; "
        "cuped_variance_reduction is the median over releases of 1 - Var(CUPED)/Var(raw)"
    )
    save(args.out, figures)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
