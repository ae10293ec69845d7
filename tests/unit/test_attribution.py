"""Root-cause attribution on synthetic request populations with a planted cause: the planted cause
comes first, two equal causes are reported as inseparable, no change is said to be none, and the
time budget bounds the bootstrap."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from logstore.stage_samples import StageSample
from tasks.attribution import AttributionConfig, AttributionStatus, attribute_latency

N = 1_500
FAST = AttributionConfig(resamples=5, min_resamples=5, budget_s=30.0)


def population(
    seed: int,
    *,
    compute_ms: float = 0.0,
    preprocess_ms: float = 0.0,
    rows: float = 20,
    queue_scale: float = 1.0,
    batch: float = 8,
) -> StageSample:
    """Requests like the worker's: stages grow with rows and batch size, latency is their sum."""
    rng = np.random.default_rng(seed)
    n_rows = rng.poisson(rows, N) + 1.0
    size = n_rows * 40 + rng.normal(0, 20, N)
    batch_size = np.maximum(1.0, rng.poisson(batch, N))
    queue = rng.gamma(2, 1.0, N) * queue_scale + 0.05 * batch_size
    pre = 0.2 + 0.01 * n_rows + 0.0002 * size + rng.exponential(0.1, N) + preprocess_ms
    compute = 0.5 + 0.02 * n_rows + 0.05 * batch_size + rng.exponential(0.2, N) + compute_ms
    post = rng.exponential(0.05, N)
    frame = pd.DataFrame(
        {
            "rows": n_rows,
            "input_bytes": size,
            "batch_size": batch_size,
            "queue_ms": queue,
            "preprocess_ms": pre,
            "compute_ms": compute,
            "postprocess_ms": post,
            "latency_ms": queue + pre + compute + post,
        }
    )
    return StageSample(frame, N * 10)


BEFORE = population(1)


@pytest.mark.parametrize(
    ("planted", "after"),
    [
        ("compute_ms", population(2, compute_ms=20)),
        ("preprocess_ms", population(3, preprocess_ms=20)),
        ("queue_ms", population(4, queue_scale=10, batch=2)),
        ("rows", population(5, rows=200)),
    ],
)
def test_the_planted_cause_is_the_top_cause_with_an_interval(
    planted: str, after: StageSample
) -> None:
    result = attribute_latency(BEFORE, after, FAST)
    assert result.status is AttributionStatus.attributed, result.statement
    assert result.top_cause == planted
    top = result.contributions[0]
    assert 0.5 < top.share_low <= top.share_high
    assert result.change_low_ms > 0 and result.resamples >= FAST.min_resamples
    assert sum(c.ms for c in result.contributions) == pytest.approx(result.change_ms, rel=0.1)
    assert top.name in result.statement and "bootstrap" in result.statement


def test_two_equal_causes_are_reported_as_inseparable() -> None:
    after = population(6, compute_ms=10, preprocess_ms=10)
    result = attribute_latency(BEFORE, after, FAST)
    assert result.status is AttributionStatus.cannot_separate
    assert result.top_cause is None
    assert {c.cause for c in result.contributions[:2]} == {"compute_ms", "preprocess_ms"}
    assert "cannot separate" in result.statement


def test_no_change_is_said_to_be_none() -> None:
    result = attribute_latency(BEFORE, population(7), FAST)
    assert result.status is AttributionStatus.no_change and result.top_cause is None
    assert abs(result.change_ms) < 0.5 and "no latency change" in result.statement


def test_too_few_rows_attributes_nothing() -> None:
    few = StageSample(BEFORE.frame.head(50), 50)
    result = attribute_latency(few, population(8, compute_ms=20), FAST)
    assert result.status is AttributionStatus.too_few_rows and "50 before" in result.statement


def test_the_time_budget_bounds_the_bootstrap_and_says_so() -> None:
    ticks = iter(range(0, 10_000, 5))  # every clock read: 5 s later
    result = attribute_latency(
        BEFORE,
        population(9, compute_ms=20),
        AttributionConfig(resamples=30, budget_s=8.0),
        clock=lambda: float(next(ticks)),
    )
    assert result.resamples < 5 and "no interval" in result.statement
    assert result.top_cause == "compute_ms"  # the point estimate still names it
    assert result.as_dict()["contributions"][0]["share_interval"] == [None, None]
