"""From a point attribution and its bootstrap to a statement: intervals, named causes, status."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import numpy as np

from core.attribution.types import (
    AttributionConfig,
    AttributionStatus,
    Bootstrap,
    Contribution,
    LatencyAttribution,
)


def normal_interval(
    point: float, draws: np.ndarray, scale: float, confidence: float
) -> tuple[float, float]:
    """point +- z * SE, SE the draws' standard deviation times `scale`; NaN without draws."""
    finite = draws[np.isfinite(draws)]
    if len(finite) < 2 or not math.isfinite(point):
        return math.nan, math.nan
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    half = z * float(np.std(finite, ddof=1)) * scale
    return point - half, point + half


def contributions(
    point: dict[str, float], draws: Bootstrap, change: float, config: AttributionConfig
) -> tuple[Contribution, ...]:
    """Every cause with its ms and share and their intervals, largest contribution first."""
    out = []
    for cause in sorted(point, key=lambda c: -point[c]):
        ms_low, ms_high = normal_interval(
            point[cause], draws.ms[cause], draws.scale, config.confidence
        )
        share = point[cause] / change if change else math.nan
        s_low, s_high = normal_interval(share, draws.shares[cause], draws.scale, config.confidence)
        out.append(Contribution(cause, point[cause], share, s_low, s_high, ms_low, ms_high))
    return tuple(out)


def _shown(c: Contribution) -> str:
    interval = f" [{c.share_low:.0%}, {c.share_high:.0%}]" if math.isfinite(c.share_low) else ""
    return f"{c.name} {c.share:.0%}{interval}"


def decide(
    point: dict[str, float],
    draws: Bootstrap,
    before_ms: np.ndarray,
    after_ms: np.ndarray,
    seconds: float,
    sizes: dict[str, Any],
    config: AttributionConfig,
) -> LatencyAttribution:
    """The attribution's status and statement from its point estimate and bootstrap."""
    change = float(after_ms.mean() - before_ms.mean())
    p95 = float(np.percentile(after_ms, 95) - np.percentile(before_ms, 95))
    enough = len(draws.changes) >= config.min_resamples
    low, high = (
        normal_interval(change, draws.changes, draws.scale, config.confidence)
        if enough
        else (math.nan, math.nan)
    )
    ranked = contributions(point, draws, change, config) if enough else ()
    figures = f"mean latency {change:+.2f} ms [{low:+.2f}, {high:+.2f}] (P95 {p95:+.1f} ms)"
    evidence = (
        f"{sizes['rows_before']:,} vs {sizes['rows_after']:,} requests sampled from "
        f"{sizes['population_before']:,} vs {sizes['population_after']:,}; "
        f"{config.confidence:.0%} normal bootstrap intervals over {len(draws.changes)} "
        f"resamples of {draws.rows:,} rows each"
    )
    named = tuple(c.cause for c in ranked if c.share_low >= config.min_share)
    candidates: tuple[str, ...] = ()
    if not enough:
        status = AttributionStatus.too_few_rows
        text = f"no interval: {len(draws.changes)} resamples, fewer than {config.min_resamples}"
    elif abs(change) < config.min_change_ms or low <= 0 <= high:
        status, text = AttributionStatus.no_change, f"no latency change to attribute: {figures}"
    elif named:
        status = AttributionStatus.attributed
        text = f"{figures}: " + ", ".join(_shown(c) for c in ranked if c.cause in named)
        others = [c for c in ranked if c.cause not in named and abs(c.share) >= 0.05][:3]
        if others:
            text += "; also " + ", ".join(_shown(c) for c in others)
    else:
        status = AttributionStatus.cannot_separate
        candidates = tuple(c.cause for c in ranked if c.share_high >= config.min_share)
        text = (
            f"{figures}: the data cannot separate the causes: no share is established at "
            f"{config.min_share:.0%}; candidates "
            + ", ".join(_shown(c) for c in ranked if c.cause in candidates)
        )
    return LatencyAttribution(
        status,
        f"{text} ({evidence})",
        change,
        low,
        high,
        p95,
        ranked,
        named if status is AttributionStatus.attributed else (),
        candidates,
        resamples=len(draws.changes),
        resample_rows=draws.rows,
        seconds=seconds,
        **sizes,
    )
