"""`mirror_p95_cost`: stable's P95 at 2,000 req/s offered with and without the shadow, side by side.

One worker with the request log on and the same version loaded into its canary slot (so the
mirrored requests cost what a candidate's would); rounds alternate the shadow off and on
(`/admin/shadow`, share RELAY_SERVING_SHADOW_SHARE's default 0.2, queue bound the default), the
order flipping each round so drift on a shared host hits both alike. Each round gives one paired
ratio (its on-P95 over its off-P95, measured seconds apart); the figure is the median of those
ratios minus 1 (target ≤ 0.05), with a distribution-free 95 % interval for that median (order
statistics of the rounds, `median_interval`). Until 2026-12-07 it was the ratio of the two
modes' median P95s over 3 rounds, with no interval: its tries spread 5.4–8.4 ms within one mode,
wider than the effect. Every try is kept beside it, with what the worker mirrored and dropped. Part of `python -m bench.serving` (its full run), or alone with
`python -m bench.serving --mirror-only` (writes bench/results/serving_mirror.json).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from bench.baselines import resolve_version
from bench.load import http_load, http_requests, request_docs, run_async
from bench.saved import save, update_key
from serving.process import WorkerProcess, start_worker

TOKEN = "bench-mirror-cost"
RATE = 2000.0
SHARE = 0.2
TARGET = 0.05
# 6 rounds are the fewest with a 95 % interval for the median (their extremes: 1 - 2/2^6 = 96.9 %);
# 8 leave one round to spare for a host burst and still bracket it (99.2 %).
ROUNDS = 8


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval for the median: the widest-inside order statistics
    (x_(k), x_(n+1-k)) whose binomial coverage is at least `confidence`; None if n is too small.

    The number of values below the median is Binomial(n, 1/2), so the interval misses it with
    probability 2 P(B < k).
    """
    xs, n = sorted(values), len(values)
    best = None
    for k in range(1, n // 2 + 1):
        miss = 2 * sum(math.comb(n, i) for i in range(k)) / 2**n
        if 1 - miss < confidence:
            break
        best = (xs[k - 1], xs[n - k])
    return best


def mirror_worker(
    stack: ExitStack, home: Path, store: Any, manifest: Any, cpu: int
) -> WorkerProcess:
    """A logging worker pinned to `cpu`, the version in both its stable and canary slots."""
    env = {
        "RELAY_HOME": str(home / "worker_mirror"),
        "RELAY_MODEL_STORE_URL": store.backend.describe(),
        "RELAY_SERVING_PORT": "0",
        "RELAY_SERVING_BINARY_PORT": "0",
        "RELAY_SERVING_STABLE_REF": manifest.version,
        "RELAY_SERVING_ADMIN_TOKEN": TOKEN,
        "RELAY_CLICKHOUSE_DSN": f"chdb://{home / 'worker_mirror' / 'clickhouse'}",
    }
    worker = stack.enter_context(start_worker(env, home / "worker_mirror.log", cpu=cpu))
    worker.wait_ready()
    loaded = _admin(worker, "load", {"slot": "canary", "version": manifest.version})
    loaded.raise_for_status()
    return worker


def _admin(worker: WorkerProcess, name: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"authorization": f"Bearer {TOKEN}"}
    return httpx.post(f"{worker.http_url}/admin/{name}", json=body, headers=headers, timeout=30)


def _p95_at_rate(worker: WorkerProcess, docs: list[dict[str, Any]], seconds: float) -> float:
    host, port = worker.http_url.removeprefix("http://").split(":")
    requests = http_requests(docs, host, int(port))
    load = http_load(host, int(port), requests, 256, seconds, 1.0, rate=RATE)
    return float(run_async(load).figures()["p95_ms"])


def mirror_cost_figures(
    worker: WorkerProcess, docs: list[dict[str, Any]], rounds: int, seconds: float
) -> dict[str, Any]:
    """The figures, from `rounds` alternating tries of `seconds` each per mode."""
    tries: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(rounds):
        for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
            body = {"share": SHARE, "lease_s": 600} if mode == "on" else {"share": 0}
            _admin(worker, "shadow", body).raise_for_status()
            tries[mode].append(round(_p95_at_rate(worker, docs, seconds), 3))
            print(
                f"mirror round {r + 1} shadow {mode:3s}: p95 {tries[mode][-1]:.2f} ms", flush=True
            )
    shadow = _admin(worker, "shadow", {"share": 0}).json()["shadow"]
    off, on = statistics.median(tries["off"]), statistics.median(tries["on"])
    paired = [a / b for a, b in zip(tries["on"], tries["off"], strict=True) if b > 0]
    interval = median_interval(paired)
    return {
        "mirror_p95_cost": round(statistics.median(paired) - 1, 4) if paired else None,
        "mirror_p95_cost_interval": None
        if interval is None
        else [round(interval[0] - 1, 4), round(interval[1] - 1, 4)],
        "mirror_p95_cost_method": (
            f"median over {len(paired)} rounds of the round's shadow-on P95 / shadow-off P95, "
            "minus 1; interval: distribution-free 95 % for the median (binomial order statistics)"
        ),
        "mirror_p95_cost_rounds": [round(x - 1, 4) for x in paired],
        "mirror_p95_ms_by_mode": {"off": off, "on": on},
        "mirror_p95_tries_ms": tries,
        "mirror_config": {"rate_rps": RATE, "share": SHARE, "rounds": rounds, "seconds": seconds},
        "mirror_counts": {k: shadow[k] for k in ("mirrored", "dropped", "errors")},
    }


def run_mirror_only(args: argparse.Namespace, server_cpu: int, load_cpu: int, out: Path) -> int:
    """`bench.serving --mirror-only`: the model, one worker, the figures, the JSON."""
    os.sched_setaffinity(0, {load_cpu})
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="relay-bench-mirror-") as tmp, ExitStack() as stack:
        home = Path(tmp)
        store, manifest = resolve_version(args.version, home, args.train_events)
        worker = mirror_worker(stack, home, store, manifest, server_cpu)
        figures = mirror_cost_figures(
            worker, request_docs(64), args.mirror_rounds, args.sweep_seconds
        )
    cost = figures["mirror_p95_cost"]
    figures["target"] = {
        "name": "mirror_p95_cost",
        "target": f"<= {TARGET}",
        "met": cost is not None and cost <= TARGET,
    }
    figures["wall_s"] = round(time.time() - started, 1)
    save(out, figures)
    # gate.json's copy, kept current: a gate run copies it from serving_mirror.json too
    # (bench.gate.measured_elsewhere); without this, a mirror-only run left gate.json's row
    # showing the figure it replaced.
    update_key(out.with_name("gate.json"), "mirror_p95_cost", cost)
    print(
        f"{'MET ' if figures['target']['met'] else 'MISSED'} mirror_p95_cost: {cost} (target <= {TARGET})"
    )
    print(f"wrote {out}")
    return 0
