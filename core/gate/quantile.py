"""The tail's own test: an always-valid confidence sequence for the ratio of two latency quantiles.

The mean-log-latency test (`core.gate.sequential.latency_shift`) answers "is the canary slower
on the whole?". The SLO is a P95, and a regression carried by a few per cent of requests (a cold
path, a pause, a cache miss) moves the P95 a lot and the mean little: x1.2 at the P95 is ~x1.05
on the geometric mean, inside the tolerance. So the step also tests the P95 ratio (and the P99,
once a cohort has enough requests for its tail to be estimated), canary against baseline.

Method. ClickHouse computes each cohort's quantiles where the rows are (`quantilesExactIf` at
p-h, p and p+h: `logstore.slo`), so only a handful of numbers per cohort leave the database.
The log of a sample quantile is asymptotically normal (Bahadur 1966) with variance
p (1 - p) / n · s_log(p)², where the sparsity s_log(p) = d log Q(p) / dp is estimated by the
difference quotient (log Q(p+h) - log Q(p-h)) / 2h (Siddiqui 1960; Bloch & Gastwirth 1968).
Requests are clustered (sticky users, a slot's queue), so the request-level variance is
multiplied by the design effect the mean test measured on the same rows: the two-way clustered,
second-paired variance of the mean log-latency difference over its request-level variance (the
quantile's influence function is an indicator of the same requests; the approximation is that
clustering inflates both alike). The difference of the two cohorts' log quantiles then enters
the same normal-mixture confidence sequence as the mean (Johari et al. 2022), valid at every look
asymptotically (Waudby-Smith et al., "Time-uniform central limit theory", 2021).

Howard & Ramdas ("Sequential estimation of quantiles with applications to A/B testing and
best-arm identification", Bernoulli 2022) give a non-asymptotic confidence sequence for a
quantile from order statistics alone; it needs every row's rank, not ClickHouse's summaries,
and at the few hundred requests a thin step has it is several times wider. It is the reference
this test is checked against in spirit: a confidence sequence on quantiles, looked at after
every window, with no fixed sample size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.gate.sequential import Estimate

P95_BANDWIDTH = 0.02  # the sparsity's difference quotient: Q(0.93) and Q(0.97)
P99_BANDWIDTH = 0.005  # Q(0.985) and Q(0.995)


@dataclass(frozen=True)
class TailQuantiles:
    """One cohort's quantile and its two neighbours, in ms, over `answered` requests."""

    level: float  # 0.95 or 0.99
    below_ms: float  # Q(level - h)
    at_ms: float  # Q(level)
    above_ms: float  # Q(level + h)
    answered: float
    bandwidth: float

    @property
    def usable(self) -> bool:
        values = (self.below_ms, self.at_ms, self.above_ms)
        return self.answered >= 2 and all(math.isfinite(v) and v > 0 for v in values)


def log_quantile(q: TailQuantiles) -> Estimate:
    """log Q(p) and its request-level variance p (1 - p) / n · s_log(p)² (Siddiqui-Bloch-Gastwirth).

    The sparsity is floored at a quantile step of one request (log Q moving by 1/n of its own
    size), so a cohort whose neighbouring quantiles tie is not taken as exact.
    """
    if not q.usable:
        return Estimate(math.nan, math.inf)
    p, n = q.level, q.answered
    spread = (math.log(q.above_ms) - math.log(q.below_ms)) / (2 * q.bandwidth)
    floor = 1.0 / (n * q.bandwidth)
    sparsity = max(spread, floor)
    return Estimate(math.log(q.at_ms), p * (1 - p) / n * sparsity * sparsity)


def quantile_shift(
    canary: TailQuantiles, baseline: TailQuantiles, design_effect: float
) -> Estimate:
    """log(canary quantile / baseline quantile), its variance inflated by the clustering's effect.

    The cohorts' requests are disjoint, so their variances add; `design_effect` (>= 1) carries
    the clustering the mean test measured on the same rows.
    """
    c, b = log_quantile(canary), log_quantile(baseline)
    if not (math.isfinite(c.variance) and math.isfinite(b.variance)):
        return Estimate(math.nan, math.inf)
    return Estimate(c.value - b.value, (c.variance + b.variance) * max(design_effect, 1.0))


def design_effect(clustered_variance: float, request_level_variance: float) -> float:
    """How much clustering widens an estimate: clustered over request-level variance, at least 1."""
    if not (request_level_variance > 0 and math.isfinite(clustered_variance)):
        return 1.0
    return max(clustered_variance / request_level_variance, 1.0)
