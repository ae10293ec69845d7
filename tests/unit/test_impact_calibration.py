"""The intervals the report quotes are calibrated: over many seeds they cover the planted effect
about 95 % of the time and the estimate is unbiased, while the naive slope is not.

The integration tests use one fixed seed each; this is what licenses reading them as more than
luck. Pure pandas and statsmodels (the back-door point estimate is this OLS fit; DoWhy's
estimate equals it, which tasks.impact checks on every run).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from core.impact.estimation import fit_ols, prepare_sessions
from simulation.sessions import TrafficConfig, simulate_traffic

START = datetime(2030, 6, 1, tzinfo=UTC)
REPLICATES = 80


def _estimates(effect: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    values, covered, naive_covered = [], [], []
    for seed in range(REPLICATES):
        config = TrafficConfig(n_sessions=2_000, seed=10_000 + seed, gmv_per_ms=effect)
        traffic = simulate_traffic(config, START, START + timedelta(hours=6))
        latency = traffic.logs.groupby("session_id")["latency_ms"].mean().rename("latency_mean_ms")
        prepared = prepare_sessions(traffic.sessions.join(latency, on="session_id"))
        frame = prepared.frame
        fit = fit_ols(frame, "gmv", prepared.adjustment, "ols", "OLS")
        naive = fit_ols(frame, "gmv", [], "naive", "naive")
        values.append(fit.value)
        covered.append(fit.covers(effect))
        naive_covered.append(naive.covers(effect))
    return np.array(values), np.array(covered), np.array(naive_covered)


@pytest.mark.slow
@pytest.mark.parametrize("effect", [0.0, -0.1])
def test_adjusted_interval_covers_the_planted_effect_95_percent_of_the_time(effect):
    values, covered, naive_covered = _estimates(effect)
    # Binomial sd of the coverage over 80 seeds is 2.4 points; 0.85 is four of them below 0.95.
    assert covered.mean() >= 0.85, covered.mean()
    assert abs(values.mean() - effect) < 3 * values.std(ddof=1) / np.sqrt(REPLICATES)
    assert naive_covered.mean() < 0.2  # the unadjusted slope is biased, seed after seed
