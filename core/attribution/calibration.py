"""Do the stated intervals hold? Plant a known effect many times and count how often they cover it.

A synthetic population follows a known linear SCM over the attribution graph, with skewed
(exponential) noise as stage timings have. The planted cause adds `effect_ms` to the engine's
compute, for this request and the requests ahead of it; with queue = 0.8 x (the work ahead) +
..., the true contribution of compute to mean latency is effect_ms x (1 + 0.8), and every
other mechanism is unchanged (true contribution 0). Each run draws fresh before/after populations, attributes, and checks whether
compute's interval contains the truth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from core.attribution.attribute import attribute_latency
from core.attribution.graph import NODES
from core.attribution.types import DEFAULT_CONFIG, AttributionConfig

QUEUE_PER_ENGINE_MS = 0.8  # queue's coefficient on preprocess + compute in the synthetic SCM


def synthetic_population(
    rng: np.random.Generator,
    n: int,
    *,
    compute_ms: float = 0.0,
    preprocess_ms: float = 0.0,
    load: float = 0.0,
    extra_bytes: float = 0.0,
    rows: tuple[int, int] = (10, 60),
    contention_ms_per_krps: float = 0.0,
) -> pd.DataFrame:
    """`n` requests from the known SCM; the keyword arguments plant causes.

    `contention_ms_per_krps` makes every stage slower by that many ms per 1,000 req/s of offered
    load, as stages sharing a small host's cores with the traffic are: a load-only change then
    slows the stages through their unchanged mechanisms.
    """
    load_rps = rng.normal(1_000, 150, n) + load
    busy = contention_ms_per_krps * load_rps / 1_000

    def request_rows() -> np.ndarray:
        return rng.integers(rows[0], rows[1] + 1, n).astype(float)

    def engine(n_rows: np.ndarray, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        size = n_rows * 400 + rng.normal(0, 2_000, n) + extra_bytes
        pre = 0.1 + 0.01 * n_rows + 0.0001 * size + rng.exponential(0.1, n) + preprocess_ms + busy
        compute = 0.5 + 0.01 * n_rows + 0.2 * batch + rng.exponential(0.2, n) + compute_ms + busy
        return size, pre, compute

    n_rows, ahead_rows = request_rows(), np.mean([request_rows() for _ in range(4)], axis=0)
    batch = 0.005 * load_rps + rng.normal(0, 1, n)
    size, pre, compute = engine(n_rows, batch)
    ahead_size, ahead_pre, ahead_compute = engine(ahead_rows, batch)
    queue = (
        0.001 * load_rps
        + QUEUE_PER_ENGINE_MS * (ahead_pre + ahead_compute)
        + rng.exponential(0.3, n)
    )
    post = 0.05 + rng.exponential(0.05, n) + busy
    latency = queue + pre + compute + post + rng.exponential(0.02, n)
    columns = {
        "load_rps": load_rps,
        "rows": n_rows,
        "ahead_rows": ahead_rows,
        "input_bytes": size,
        "ahead_input_bytes": ahead_size,
        "batch_size": batch,
        "preprocess_ms": pre,
        "compute_ms": compute,
        "ahead_preprocess_ms": ahead_pre,
        "ahead_compute_ms": ahead_compute,
        "queue_ms": queue,
        "postprocess_ms": post,
        "latency_ms": latency,
    }
    return pd.DataFrame({node: columns[node] for node in NODES})


@dataclass(frozen=True)
class Coverage:
    """How often the stated interval contained the planted truth."""

    runs: int
    covered: int
    truth_ms: float
    confidence: float
    rows: int
    resamples_min: int
    point_inside_interval: bool  # every run's estimate lay inside its own interval

    @property
    def rate(self) -> float:
        return self.covered / self.runs


def interval_coverage(
    runs: int = 200,
    *,
    rows: int = 2_000,
    effect_ms: float = 1.0,
    config: AttributionConfig = DEFAULT_CONFIG,
    seed: int = 0,
) -> Coverage:
    """Plant +effect_ms in compute `runs` times; count the runs whose interval covers the truth."""
    truth = effect_ms * (1 + QUEUE_PER_ENGINE_MS)
    rng = np.random.default_rng(seed)
    covered, inside, resamples = 0, True, []
    for run in range(runs):
        before = synthetic_population(rng, rows)
        after = synthetic_population(rng, rows, compute_ms=effect_ms)
        result = attribute_latency(
            before, after, AttributionConfig(**{**vars(config), "seed": seed + run})
        )
        compute = next(c for c in result.contributions if c.cause == "compute_ms")
        covered += compute.ms_low <= truth <= compute.ms_high
        inside &= all(c.ms_low <= c.ms <= c.ms_high for c in result.contributions)
        resamples.append(result.resamples)
    return Coverage(runs, covered, truth, config.confidence, rows, min(resamples), inside)
