"""Root-cause attribution benchmark: causes planted in a real worker the way real causes act.

    python -m bench.attribution [--requests 4000] [--train-events 30000]
                                [--calibration-runs 400] [--out PATH]

Real serving workers (`python -m serving`, ONNX Runtime, request logging on, spooled) at the
production defaults (batching delay 2 ms, at most 1,024 rows per engine call) serve binary
requests of the usual mix (3 % of requests 200-400 candidates, the rest 10-60), offered
open-loop as users arrive (`BinaryClient.predict_paced`: Poisson arrivals whatever the latency,
the rate swinging +-25 % around `--load` of the worker's measured capacity): the "before"
population. Each
case's `mean_in_flight` is its arrival rate x mean latency (Little's law). Then each case, with
`--requests` more requests:
  compute      the engine call costs 1 ms more and 1.5x as long on every batch (POST
               /admin/latency mode=engine, stage=compute: the engine thread is busy longer, so
               the requests queued behind each batch wait longer too: nothing is booked to a
               column by hand)
  preprocess   the feature pipeline costs 1 ms more per batch (mode=engine, stage=preprocess)
  queue        a worker with RELAY_SERVING_MAX_BATCH_ROWS=20: one request per engine call
  heavier      30 % of requests heavy instead of 3 % (2.7x the rows), at the same request rate
  two_causes   the compute plant and `--more-load`, at once
  load         `--more-load` of capacity; the model and the mix unchanged
  no_change    the before traffic again (other requests of the same mix)
Each case has its own "before", the usual traffic served just before it (the queue case's on the
default worker, just before the restart), so a shared host's changing load is not compared
across a quarter of an hour. The spool is ingested into ClickHouse (chdb, this process); each
case is attributed against its "before" as a failed verdict is (`tasks.attribution.window_attribution`: rows sampled in
ClickHouse, `core.attribution`). A case is correct when the named causes are exactly the planted
ones (queue may also name batch size: smaller batches are that cause), or, for no_change, when
no cause is claimed. `wall_s` is each case's measured attribution time, query included. Then
`core.attribution.calibration` plants a known effect `--calibration-runs` times in synthetic
populations and reports how often the 90 % interval covers it (`coverage_90`, with its Wilson
95 % interval over the runs, `coverage_90_interval`). 400 runs, not the issue's minimum of 100:
a share near 0.9 counted over 120 runs has a standard error of 0.027, as wide as the target's
whole half-band (0.85-0.95), so 120 runs could not tell a calibrated interval from one that is
not (this seed's first 120 runs covered 83 %, its first 400 about 86 %).

Writes bench/results/attribution.json (or --out): `cases` [{name, planted, status, top_causes,
correct, wall_s, ...}], `coverage_90`, `resamples_min`, and the targets.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from bench.proportions import wilson
from bench.scratch import scratch_dir
from bench.serving import Target, build_small_version, save_results

RESULTS = Path(__file__).parent / "results"
TOKEN = "bench-attribution-token"
LIGHT, HEAVY = (10, 60), (200, 400)  # candidates per request
USUAL_HEAVY, HEAVIER_HEAVY = 0.03, 0.3  # share of heavy requests: usual traffic, the heavier case
LOAD, MORE_LOAD = 0.3, 0.7  # offered requests/s, as fractions of the worker's capacity
# Each plant is sized in terms that do not shrink on a fast host: a fixed cost per engine call as
# well as a factor (a factor alone on a 0.06 ms compute stage planted 0.03 ms, below
# AttributionConfig.min_change_ms, where "no change" is the right answer), a load near peak
# rather than 0.45 of capacity (where queueing barely moves latency), heavy requests 10x as
# common. `plant_material` in each row says whether the measured change cleared min_change_ms.
COMPUTE_MS, COMPUTE_FACTOR, PREPROCESS_MS = 1.0, 1.5, 1.0


@dataclass(frozen=True)
class Case:
    name: str
    planted: tuple[str, ...]  # the causes it plants; () = none
    also: tuple[str, ...] = ()  # named as well without being wrong


CASES = (
    Case("compute", ("compute_ms",)),
    Case("preprocess", ("preprocess_ms",)),
    Case("queue", ("queue_ms",), ("batch_size",)),
    Case("heavier", ("rows",)),
    Case("two_causes", ("compute_ms", "load_rps")),
    Case("load", ("load_rps",)),
    Case("no_change", ()),
)


@dataclass(frozen=True)
class Window:
    """Where one population's rows are in inference_logs."""

    start: datetime
    end: datetime
    requests: int
    offered_rps: float = 0.0
    seconds: float = 0.0


def request_pool(sizes: tuple[int, int], pool: int, seed: int) -> list[Any]:
    """`pool` binary requests of `sizes` (low, high) candidates each, from the simulated shop."""
    import numpy as np

    from serving.client import BinaryRequest, items_matrix
    from simulation.shop import ShopConfig, generate_events
    from simulation.traffic import request_bodies

    low, high = sizes
    events = generate_events(ShopConfig(seed=seed), pool * high, datetime(2026, 11, 1, tzinfo=UTC))
    counts = np.random.default_rng(seed).integers(low, high + 1, pool)
    made = []
    for i, (doc, size) in enumerate(zip(request_bodies(events, high), counts, strict=False)):
        doc["session"]["session_id"] = f"bench-attribution-{seed}-{i}"
        chosen = doc["candidates"][:size]
        for c in chosen:
            c["item_id"] %= 2**24  # the binary payload is float32
        made.append(
            BinaryRequest(doc["user"], doc["session"], doc["context"], items_matrix(chosen))
        )
    return made


def binary_requests(n: int, heavy_share: float, seed: int) -> list[Any]:
    """`n` requests, `heavy_share` of them HEAVY and the rest LIGHT, drawn from small pools.

    Sizes vary, as a feed's do: a causal model can only learn how latency grows with a request's
    rows from requests whose rows differ, and can only credit heavier requests for a change if
    requests that heavy were seen before it too.
    """
    import numpy as np

    light = request_pool(LIGHT, 1_000, seed)
    heavy = request_pool(HEAVY, 100, seed + 1) if heavy_share else []
    rng = np.random.default_rng(seed)
    return [
        heavy[rng.integers(len(heavy))]
        if heavy and rng.random() < heavy_share
        else light[i % 1_000]
        for i in range(n)
    ]


@contextmanager
def worker_process(home: Path, name: str, store: Any, manifest: Any, **env: str) -> Iterator[Any]:
    from serving.process import start_worker

    settings = {
        "RELAY_HOME": str(home),
        "RELAY_MODEL_STORE_URL": store.backend.describe(),
        "RELAY_CLICKHOUSE_DSN": f"chdb://{home / 'clickhouse'}",  # spooled, never opened there
        "RELAY_SERVING_SPOOL_DIR": str(home / "spool"),
        "RELAY_SERVING_PORT": "0",
        "RELAY_SERVING_BINARY_PORT": "0",
        "RELAY_SERVING_ADMIN_TOKEN": TOKEN,
        "RELAY_SERVING_FAULT_INJECTION": "true",  # this run injects latency or rankings
        "RELAY_SERVING_STABLE_REF": manifest.version,
        "RELAY_SERVING_LOG_FLUSH_MS": "200",
        "RELAY_SERVING_MAX_BATCH_DELAY_MS": "2",  # the production default, said out loud
        **env,
    }
    with start_worker(settings, home / f"{name}.log") as w:
        w.wait_ready()
        yield w


def capacity(worker: Any, requests: list[Any]) -> float:
    """Requests/s the worker answers flat out (closed loop, 32 in flight): what rates scale by."""
    from serving.client import BinaryClient

    with BinaryClient(worker.binary_host, worker.binary_port, heartbeat_s=None) as client:
        began = time.perf_counter()
        client.predict_many(requests, window=32)
        return len(requests) / (time.perf_counter() - began)


def arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Poisson arrivals (users come independently) at a rate swinging +-25 % over three cycles,
    as traffic does over a day: offsets in seconds."""
    import numpy as np

    rng = np.random.default_rng(seed)
    phase = np.linspace(0, 6 * np.pi, n)
    gaps = rng.exponential(1.0 / (rate * (1 + 0.25 * np.sin(phase))))
    return list(np.cumsum(gaps) - gaps[0])


def drive(worker: Any, requests: list[Any], rate: float, seed: int = 0) -> Window:
    """Send the requests open-loop at about `rate` per second; the span their rows fall in."""
    from serving.client import BinaryClient, BinaryResult

    start = datetime.now(UTC)
    began = time.perf_counter()
    with BinaryClient(worker.binary_host, worker.binary_port, heartbeat_s=None) as client:
        answers = client.predict_paced(requests, arrivals(len(requests), rate, seed))
    seconds = time.perf_counter() - began
    end = datetime.now(UTC) + timedelta(milliseconds=5)
    failed = [a for a in answers if not isinstance(a, BinaryResult)]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(answers)} requests failed: {failed[0]}")
    return Window(start, end, len(answers), round(rate, 1), round(seconds, 2))


def inject(worker: Any, stage: str, ms: float = 0.0, factor: float = 1.0) -> None:
    """A real cause in the worker: the stage runs slower on the engine thread (mode engine)."""
    response = httpx.post(
        f"{worker.http_url}/admin/latency",
        json={"slot": "stable", "ms": ms, "factor": factor, "stage": stage, "mode": "engine"},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    response.raise_for_status()


def serve_cases(args: argparse.Namespace, home: Path) -> dict[str, Window]:
    """Every case's window and its own baseline's ("before:<case>", served just before it), by
    real workers, offered open-loop. Pairing each case with a baseline minutes, not a quarter of
    an hour, away keeps a shared host's changing load out of the comparison."""
    store, manifest = build_small_version(home / "model", args.train_events)
    mixes = {
        "usual": binary_requests(args.requests, USUAL_HEAVY, seed=4),
        "again": binary_requests(args.requests, USUAL_HEAVY, seed=6),
        "heavy": binary_requests(args.requests, HEAVIER_HEAVY, seed=5),
    }
    warm = mixes["usual"][: min(3_000, args.requests)]
    windows: dict[str, Window] = {}
    with worker_process(home, "worker", store, manifest) as w:
        flat_out = capacity(w, warm)  # also warms caches and batch sizes
        rate, more = args.load * flat_out, args.more_load * flat_out
        print(f"capacity {flat_out:.0f} requests/s; offered {rate:.0f}/s, more load {more:.0f}/s")
        plan = [  # case, its mix, its rate, its engine fault (stage, ms, factor)
            ("no_change", "again", rate, None),
            ("heavier", "heavy", rate, None),
            ("load", "usual", more, None),
            ("compute", "usual", rate, ("compute", COMPUTE_MS, COMPUTE_FACTOR)),
            ("two_causes", "usual", more, ("compute", COMPUTE_MS, COMPUTE_FACTOR)),
            ("preprocess", "usual", rate, ("preprocess", PREPROCESS_MS, 1.0)),
        ]
        for seed, (case, mix, case_rate, fault) in enumerate(plan):
            windows[f"before:{case}"] = drive(w, mixes["usual"], rate, seed=2 * seed)
            if fault:
                inject(w, fault[0], ms=fault[1], factor=fault[2])
            windows[case] = drive(w, mixes[mix], case_rate, seed=2 * seed + 1)
            if fault:
                inject(w, fault[0])
        windows["before:queue"] = drive(w, mixes["usual"], rate, seed=20)
    with worker_process(
        home, "worker-small-batches", store, manifest, RELAY_SERVING_MAX_BATCH_ROWS="20"
    ) as w:
        drive(w, warm, rate)
        windows["queue"] = drive(w, mixes["usual"], rate, seed=21)
    return windows


def attribute_cases(home: Path, windows: dict[str, Window]) -> list[dict[str, Any]]:
    """Each case attributed against `before`, from the log store, timed."""
    import logstore
    from core.attribution import AttributionConfig, AttributionStatus
    from logstore.spool import ingest_spool
    from logstore.stage_samples import sample_stage_rows
    from tasks.attribution import window_attribution

    client = logstore.connect(f"chdb://{home / 'clickhouse'}")
    ingest_spool(client, home / "spool")
    config = AttributionConfig()

    def read(slot: str, version: str, start: datetime, end: datetime) -> Any:
        return sample_stage_rows(client, start, end, slot, config.max_rows, version)

    cases = []
    for case in CASES:
        in_flight = mean_in_flight(client, windows[case.name])
        in_flight_before = mean_in_flight(client, windows[f"before:{case.name}"])
        began = time.monotonic()
        result = window_attribution(
            read,
            (
                "stable",
                "",
                windows[f"before:{case.name}"].start,
                windows[f"before:{case.name}"].end,
            ),
            ("stable", "", windows[case.name].start, windows[case.name].end),
            config,
        )
        wall = time.monotonic() - began
        named = set(result.top_causes)
        if case.planted:
            correct = set(case.planted) <= named <= set(case.planted) | set(case.also)
        else:
            correct = result.status is AttributionStatus.no_change
        cases.append(
            {
                "name": case.name,
                "planted": list(case.planted),
                "status": result.status.value,
                "top_causes": list(result.top_causes),
                "correct": correct,
                # a planted case whose mean latency moved less than min_change_ms could not be
                # answered "changed" by any correct judge: its plant was too small on this host
                "plant_material": bool(
                    not case.planted or abs(result.change_ms) >= config.min_change_ms
                ),
                "wall_s": round(wall, 2),
                "candidates": list(result.candidates),
                "requests_before": windows[f"before:{case.name}"].requests,
                "requests_after": windows[case.name].requests,
                "offered_rps": windows[case.name].offered_rps,
                "mean_in_flight": in_flight,
                "mean_in_flight_before": in_flight_before,
                "traffic_s": windows[case.name].seconds,
                **{k: v for k, v in result.as_dict().items() if k not in ("status", "top_causes")},
            }
        )
        print(f"{case.name:10s} {wall:5.1f} s  {'OK ' if correct else 'NO '} {result.statement}")
    return cases


_IN_FLIGHT_SQL = """
SELECT count() / greatest(dateDiff('millisecond', min(ts), max(ts)) / 1000, 0.001)
       * avg(latency_ms) / 1000
FROM inference_logs
WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')} AND status = 200
"""


def mean_in_flight(client: Any, window: Window) -> float:
    """Requests in the worker on average over a window: arrival rate x mean latency (Little)."""
    value = client.query(_IN_FLIGHT_SQL, parameters={"start": window.start, "end": window.end})
    return round(float(value.result_rows[0][0]), 1)


def calibrate(runs: int) -> dict[str, Any]:
    """Coverage of the 90 % interval over `runs` plantings of a known effect (synthetic SCM)."""
    from core.attribution.calibration import interval_coverage

    began = time.monotonic()
    coverage = interval_coverage(runs, rows=1_000)
    print(
        f"calibration: {coverage.covered}/{coverage.runs} 90 % intervals covered the planted "
        f"{coverage.truth_ms:g} ms ({coverage.rate:.1%}), {time.monotonic() - began:.0f} s"
    )
    return {
        "coverage_90": round(coverage.rate, 4),
        "coverage_90_interval": wilson(coverage.covered, coverage.runs),
        "calibration": {
            "runs": coverage.runs,
            "covered": coverage.covered,
            "truth_ms": coverage.truth_ms,
            "rows_per_population": coverage.rows,
            "resamples_min": coverage.resamples_min,
            "every_estimate_inside_its_interval": coverage.point_inside_interval,
            "planted": "compute +1 ms in a known linear SCM with exponential noise",
        },
    }


def run(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    windows = serve_cases(args, home)
    cases = attribute_cases(home, windows)
    calibration = calibrate(args.calibration_runs) if args.calibration_runs else {}
    resamples = [c["resamples"] for c in cases if c["resamples"]]
    if calibration:
        resamples.append(calibration["calibration"]["resamples_min"])
    return {
        "cases": cases,
        "correct": sum(c["correct"] for c in cases),
        "coverage_90": calibration.get("coverage_90"),
        "coverage_90_interval": calibration.get("coverage_90_interval"),
        "resamples_min": min(resamples) if resamples else 0,
        **({"calibration": calibration["calibration"]} if calibration else {}),
        "rows_per_population": args.requests,
    }


def targets(r: dict[str, Any]) -> list[Target]:
    n = len(r["cases"])
    checks = [
        Target("correct", r["correct"], f"== {n}", r["correct"] == n),
        Target("resamples_min", r["resamples_min"], ">= 200", r["resamples_min"] >= 200),
    ]
    if r["coverage_90"] is not None:
        met = 0.85 <= r["coverage_90"] <= 0.95
        checks.append(Target("coverage_90", r["coverage_90"], "0.85-0.95", met))
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.attribution", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--requests", type=int, default=4_000, help="requests per population")
    parser.add_argument(
        "--train-events", type=int, default=30_000, help="events for the model it trains"
    )
    parser.add_argument(
        "--calibration-runs", type=int, default=400, help="plantings for coverage_90 (0: none)"
    )
    parser.add_argument(
        "--load", type=float, default=LOAD, help="offered load, a fraction of capacity"
    )
    parser.add_argument(
        "--more-load", type=float, default=MORE_LOAD, help="the load cases' offered load"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "attribution.json")
    args = parser.parse_args(argv)
    started = time.time()
    with scratch_dir(prefix="relay-bench-attribution-") as tmp:
        results = run(args, tmp)
    checks = targets(results)
    out = {
        **results,
        "targets": [vars(t) for t in checks],
        "config": {
            "offered_load_of_capacity": {"usual": args.load, "more_load": args.more_load},
            "batching": {"max_batch_delay_ms": 2.0, "max_batch_rows": 1024},
            "candidates": {"light": LIGHT, "heavy": HEAVY},
            "heavy_share": {"usual": USUAL_HEAVY, "heavier": HEAVIER_HEAVY},
            "compute_ms_per_batch": COMPUTE_MS,
            "compute_factor": COMPUTE_FACTOR,
            "preprocess_ms_per_batch": PREPROCESS_MS,
        },
        "wall_s": round(time.time() - started, 1),
    }
    save_results(out, checks, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
