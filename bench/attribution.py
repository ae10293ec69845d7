"""Root-cause attribution benchmark: plant a cause on a real worker, is it the top cause found?

    python -m bench.attribution [--requests 100000] [--window 64] [--train-events 30000]
                                [--out PATH]

One real serving worker (`python -m serving`, ONNX Runtime, request logging on, spooled) serves
`--requests` binary-protocol requests of 20 candidates, pipelined `--window` deep: the "before"
population. Then, one at a time, each planted cause and another `--requests` requests:
  compute     +20 ms injected into the compute stage (POST /admin/latency stage=compute)
  preprocess  +20 ms injected into the preprocess stage
  queue       the worker restarted with RELAY_SERVING_MAX_BATCH_ROWS=20: one request per engine
              call, so requests queue behind each other at the same load
  heavier     80 % of requests of 700-1000 candidates instead of 10 % (the rest 10-60),
              compared at a light load (one request at a time) with the usual mix at that load
The spool is ingested into ClickHouse (chdb, this process) and each case is attributed with
`tasks.attribution` exactly as a failed verdict is: rows sampled in ClickHouse from each window,
DoWhy's distribution-change attribution, bootstrap within the time budget. A case is correct
when the top cause is the planted one. `seconds_per_attribution` is the slowest case, from the
sampling query to the statement.

Writes bench/results/attribution.json (or --out): `cases` (each with its statement),
`top_cause_correct` (how many of them), `seconds_per_attribution`, and the targets.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from bench.serving import Target, build_small_version, save_results

RESULTS = Path(__file__).parent / "results"
TOKEN = "bench-attribution-token"
CASES = {  # case -> (the cause it plants, the population it is compared with)
    "compute": ("compute_ms", "before"),
    "preprocess": ("preprocess_ms", "before"),
    "queue": ("queue_ms", "before"),
    "heavier": ("rows", "before_light_load"),
}
LIGHT, HEAVY = (10, 60), (700, 1000)  # candidates per request
USUAL_HEAVY, HEAVIER_HEAVY = 0.1, 0.8  # share of heavy requests: usual traffic, the heavier case
MAX_SECONDS = 10.0


@dataclass(frozen=True)
class Window:
    """Where one population's rows are in inference_logs."""

    start: datetime
    end: datetime
    requests: int


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


def drive(worker: Any, requests: list[Any], window: int) -> Window:
    """Send every request pipelined; the window its rows fall in."""
    from serving.client import BinaryClient, BinaryResult

    start = datetime.now(UTC)
    with BinaryClient(worker.binary_host, worker.binary_port, heartbeat_s=None) as client:
        answers = client.predict_many(requests, window=window)
    end = datetime.now(UTC) + timedelta(milliseconds=5)
    failed = [a for a in answers if not isinstance(a, BinaryResult)]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(answers)} requests failed: {failed[0]}")
    return Window(start, end, len(answers))


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
        # no waiting for company: batches still form under load, and a lone request is not
        # held 2 ms (the light-load case sends one request at a time)
        "RELAY_SERVING_MAX_BATCH_DELAY_MS": "0",
        **env,
    }
    with start_worker(settings, home / f"{name}.log") as w:
        w.wait_ready()
        yield w


def inject(worker: Any, stage: str, ms: float) -> None:
    response = httpx.post(
        f"{worker.http_url}/admin/latency",
        json={"slot": "stable", "ms": ms, "stage": stage},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=10,
    )
    response.raise_for_status()


def run(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    import logstore
    from logstore.spool import ingest_spool
    from logstore.stage_samples import sample_stage_rows
    from tasks.attribution import AttributionConfig, attribute_latency

    store, manifest = build_small_version(home / "model", args.train_events)
    light = binary_requests(args.requests, 0.0, seed=3)
    usual = binary_requests(args.requests, USUAL_HEAVY, seed=4)
    heavy = binary_requests(args.requests, HEAVIER_HEAVY, seed=5)
    windows: dict[str, Window] = {}
    with worker_process(home, "worker", store, manifest) as w:
        drive(w, light[: min(2_000, len(light))], args.window)  # warm: caches, batch sizes
        windows["before"] = drive(w, light, args.window)
        for case, stage in (("compute", "compute"), ("preprocess", "preprocess")):
            inject(w, stage, 20.0)
            windows[case] = drive(w, light, args.window)
            inject(w, stage, 0.0)
        # Heavier requests, compared at a light load (one at a time): a request's own rows drive
        # its compute and preprocess. Under load their cost shows as everyone's queueing
        # instead, which a per-request graph books to queue (see the README).
        windows["before_light_load"] = drive(w, usual, args.light_window)
        windows["heavier"] = drive(w, heavy, args.light_window)
    with worker_process(
        home, "worker-small-batches", store, manifest, RELAY_SERVING_MAX_BATCH_ROWS="20"
    ) as w:
        drive(w, light[: min(2_000, len(light))], args.window)
        windows["queue"] = drive(w, light, args.window)

    client = logstore.connect(f"chdb://{home / 'clickhouse'}")
    ingest_spool(client, home / "spool")
    config = AttributionConfig()
    cases = []
    for case, (planted, baseline) in CASES.items():
        began = time.monotonic()
        before, after = (
            sample_stage_rows(client, windows[k].start, windows[k].end, "stable", config.max_rows)
            for k in (baseline, case)
        )
        result = attribute_latency(before, after, config)
        seconds = time.monotonic() - began
        cases.append(
            {
                "case": case,
                "planted": planted,
                "top_cause": result.top_cause,
                "correct": result.top_cause == planted,
                "seconds": round(seconds, 2),
                "compared_with": baseline,
                "requests_before": windows[baseline].requests,
                "requests_after": windows[case].requests,
                **result.as_dict(),
            }
        )
        print(f"{case:10s} {seconds:5.1f} s  {result.statement}", flush=True)
    return {
        "cases": cases,
        "top_cause_correct": sum(c["correct"] for c in cases),
        "seconds_per_attribution": max(c["seconds"] for c in cases),
        "seconds_per_attribution_mean": round(sum(c["seconds"] for c in cases) / len(cases), 2),
        "rows_per_population": args.requests,
    }


def targets(r: dict[str, Any]) -> list[Target]:
    n = len(r["cases"])
    return [
        Target("top_cause_correct", r["top_cause_correct"], f"== {n}", r["top_cause_correct"] == n),
        Target(
            "seconds_per_attribution",
            r["seconds_per_attribution"],
            f"<= {MAX_SECONDS:g}",
            r["seconds_per_attribution"] <= MAX_SECONDS,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.attribution", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--requests", type=int, default=100_000, help="rows per population")
    parser.add_argument("--window", type=int, default=32, help="requests in flight")
    parser.add_argument(
        "--light-window", type=int, default=1, help="requests in flight for the heavier case"
    )
    parser.add_argument(
        "--train-events", type=int, default=30_000, help="events for the model it trains"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "attribution.json")
    args = parser.parse_args(argv)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="relay-bench-attribution-") as tmp:
        results = run(args, Path(tmp))
    checks = targets(results)
    out = {
        **results,
        "targets": [vars(t) for t in checks],
        "config": {
            "window": args.window,
            "light_window": args.light_window,
            "candidates": {"light": LIGHT, "heavy": HEAVY},
            "heavy_share": {"usual": USUAL_HEAVY, "heavier": HEAVIER_HEAVY},
        },
        "host": {"cpus": os.cpu_count(), "loadavg_1m_at_end": round(os.getloadavg()[0], 2)},
        "wall_s": round(time.time() - started, 1),
    }
    save_results(out, checks, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
