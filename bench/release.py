"""Benchmark the release flow on 1,000,000 events and lineage hashing against openssl.

    python -m bench.release [--events N] [--epochs 2] [--hash-mb MB] [--out PATH]

The flow runs with `deploy=False`: validate, train, export, compile with parity, lineage,
registration (store + MLflow) and the calibration blessing, then it stops, with outcome
`blessed` (or `not_deployed` and the failed checks). The canary needs a serving fleet and
minutes of live traffic (bench.rollback and bench.gate measure those stages); without one
this benchmark still measures what the release costs up to that point.

Runs in a fresh Relay home under a temp directory (its own embedded ClickHouse, model store and
MLflow) against Prefect's local test server unless PREFECT_API_URL points at one. Writes
bench/results/release.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from uuid import UUID

from bench.saved import save

RESULTS = Path(__file__).parent / "results"


def openssl_sha256_gb_s(seconds: int = 3) -> float:
    """`openssl speed sha256` on 16 KiB blocks, single thread: the hashing ceiling."""
    out = subprocess.run(
        ["openssl", "speed", "-seconds", str(seconds), "-bytes", "16384", "sha256"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    match = re.search(r"^sha256\s+([\d.]+)k", out, re.MULTILINE)
    if not match:
        raise RuntimeError(f"could not parse openssl speed output:\n{out}")
    return float(match.group(1)) * 1000 / 1e9


def hash_figures(workdir: Path, size_mb: int) -> dict[str, float]:
    """Throughput of the store's streaming hash on one big file and on four files in parallel."""
    from model_store.hashing import sha256_file, sha256_files

    block = os.urandom(4 * 1024 * 1024)
    big = workdir / "one.bin"
    with open(big, "wb") as f:
        for _ in range(size_mb // 4):
            f.write(block)
    parts = [workdir / f"part{i}.bin" for i in range(4)]
    for part in parts:
        with open(part, "wb") as f:
            for _ in range(size_mb // 16):
                f.write(block)
    sha256_file(big)  # warm the page cache: we measure hashing, not the disk
    started = time.perf_counter()
    sha256_file(big)
    single = time.perf_counter() - started
    started = time.perf_counter()
    sha256_files(parts)
    parallel = time.perf_counter() - started
    with ThreadPoolExecutor(1) as pool:  # the naive loop: 64 KiB reads, one stream
        import hashlib

        def naive(path: Path) -> str:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(65_536):
                    h.update(chunk)
            return h.hexdigest()

        started = time.perf_counter()
        pool.submit(naive, big).result()
        naive_s = time.perf_counter() - started
    gb = size_mb * 1024 * 1024 / 1e9
    return {
        "hash_file_gb": round(gb, 3),
        "hash_gb_s": round(gb / single, 3),
        "hash_parallel_4_files_gb_s": round(gb / parallel, 3),
        "naive_hashlib_64k_gb_s": round(gb / naive_s, 3),
    }


def stage_times(flow_run_id: UUID) -> dict[str, float]:
    """Seconds each task spent running, from the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    return {r.name.rsplit("-", 1)[0]: round(r.total_run_time.total_seconds(), 3) for r in runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--hash-mb", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "release.json")
    args = parser.parse_args()

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="relay-bench-")))
        os.environ["RELAY_HOME"] = str(tmp / "home")  # a private Relay home for this run
        import logstore
        from flows.release import retrain_and_release
        from relay.settings import get_settings
        from simulation.seed import seed_events

        get_settings.cache_clear()
        settings = get_settings()
        from prefect.settings import get_current_settings

        if not get_current_settings().api.url:  # no server configured: use a temporary one
            from prefect.testing.utilities import prefect_test_harness

            stack.enter_context(prefect_test_harness(server_startup_timeout=120))

        end = datetime.now(UTC)
        client = logstore.connect(settings.resolved_clickhouse_dsn)
        started = time.perf_counter()
        seed_events(client, args.events, end)
        seed_s = time.perf_counter() - started

        started = time.perf_counter()
        # No fleet here: stop after the blessing (see the docstring).
        state = retrain_and_release(
            window_end=end,
            training={"epochs": args.epochs},
            actor="bench",
            deploy=False,
            return_state=True,
        )
        wall = time.perf_counter() - started
        if not state.is_completed():
            raise SystemExit(f"release flow failed: {state.message}")
        run_id = state.state_details.flow_run_id
        assert run_id is not None  # a flow run that completed has an id
        stages = stage_times(run_id)
        task_total = sum(stages.values())
        summary = state.result()
        figures = {
            "events": args.events,
            "deploy": False,
            "outcome": summary.outcome.value,
            "outcome_reason": summary.reason,
            "seed_s": round(seed_s, 2),
            "wall_s": round(wall, 2),
            "stage_s": stages,
            "task_body_s": round(task_total, 2),
            "prefect_overhead_fraction": round((wall - task_total) / wall, 4),
            "holdout_auc": round(summary.metrics["holdout_auc"], 4),
            "lineage_id": summary.lineage_id,
            **hash_figures(tmp, args.hash_mb),
            "openssl_sha256_gb_s": round(openssl_sha256_gb_s(), 3),
            "cpu_count": os.cpu_count(),
        }
        figures["hash_vs_openssl"] = round(figures["hash_gb_s"] / figures["openssl_sha256_gb_s"], 3)
        logstore.close_all()

    save(args.out, figures)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
