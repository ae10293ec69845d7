"""Why latency rose: the change in mean latency between two populations, split into its causes,
each with a bootstrap interval, and a decision on which causes the data names.

Uncertainty: both populations' rows are resampled with replacement and the attribution is
repeated `resamples` times (never fewer than `min_resamples`). When that many resamples of every
row would not fit the time budget, the bootstrap draws `m` rows per population instead (an
m-out-of-n bootstrap) and scales the spread by sqrt(m / n) to the full sample's; the resamples
are never cut. Intervals are normal-approximation: estimate +- z * bootstrap SE, so each point
estimate lies inside its own interval, as a stated interval must.

Decision (see `AttributionStatus`): no cause is claimed when the change's interval includes 0;
a cause is named when its share's lower bound is at least `min_share`; when the change is real
but no cause's share is established, the statement says the data cannot separate the
candidates, and lists them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from core.attribution.decision import decide
from core.attribution.graph import NODES, PLAYERS, TARGET, contributions_ms
from core.attribution.types import (
    DEFAULT_CONFIG,
    AttributionConfig,
    AttributionStatus,
    Bootstrap,
    LatencyAttribution,
)


def bootstrap(
    a: np.ndarray,
    b: np.ndarray,
    config: AttributionConfig,
    clock: Callable[[], float] = time.monotonic,
) -> Bootstrap:
    """`config.resamples` resampled attributions, rows subsampled to fit `config.budget_s`."""
    rng = np.random.default_rng(config.seed)
    n = min(len(a), len(b))
    started = clock()
    _ = contributions_ms(a[rng.integers(0, len(a), n)], b[rng.integers(0, len(b), n)])
    per_row = max(clock() - started, 1e-6) / n  # the fits are linear in rows
    m = int(min(n, max(config.min_rows, config.budget_s / (config.resamples * per_row))))
    ms: dict[str, list[float]] = {player: [] for player in PLAYERS}
    changes = []
    for _ in range(config.resamples):
        ia, ib = rng.integers(0, len(a), m), rng.integers(0, len(b), m)
        for node, value in contributions_ms(a[ia], b[ib]).items():
            ms[node].append(value)
        changes.append(b[ib, -1].mean() - a[ia, -1].mean())
    change_draws = np.array(changes)
    with np.errstate(divide="ignore", invalid="ignore"):
        shares = {node: np.array(v) / change_draws for node, v in ms.items()}
    return Bootstrap(
        {node: np.array(v) for node, v in ms.items()}, shares, change_draws, m, math.sqrt(m / n)
    )


def as_matrix(frame: pd.DataFrame) -> np.ndarray:
    """A population's rows as floats in NODES' order (the target last)."""
    return frame[list(NODES)].to_numpy(dtype=float)


def attribute_latency(
    before: pd.DataFrame,
    after: pd.DataFrame,
    config: AttributionConfig = DEFAULT_CONFIG,
    *,
    population: tuple[int, int] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> LatencyAttribution:
    """Split the latency change from `before` to `after` (frames with NODES' columns)."""
    started = clock()
    a, b = as_matrix(before), as_matrix(after)
    sizes: dict[str, Any] = {
        "rows_before": len(a),
        "rows_after": len(b),
        "population_before": population[0] if population else len(a),
        "population_after": population[1] if population else len(b),
        "config": config,
    }
    if min(len(a), len(b)) < config.min_rows:
        return LatencyAttribution(
            AttributionStatus.too_few_rows,
            f"too few requests to attribute: {len(a)} before and {len(b)} after, fewer than "
            f"the {config.min_rows} each needs",
            **sizes,
        )
    point = contributions_ms(a, b)
    draws = bootstrap(a, b, config, clock)
    return decide(point, draws, a[:, -1], b[:, -1], clock() - started, sizes, config)


def failed_attribution(exc: Exception) -> LatencyAttribution:
    """An attribution that raised: said as data; the verdict it was to explain stands."""
    return LatencyAttribution(
        AttributionStatus.failed, f"root-cause attribution failed: {type(exc).__name__}: {exc}"
    )


assert NODES[-1] == TARGET  # as_matrix puts latency last; bootstrap reads it there
