"""Always-valid inference for the canary: estimates from per-user sums, and confidence sequences.

The canary step looks at its evidence after every analysis window. A fixed-sample test looked
at ten times fires far more often than its level says; a *confidence sequence* is an interval
that holds at every look at once, so the step may stop the moment it is conclusive.

Relay uses the normal-mixture sequential probability ratio test (mSPRT) of Johari, Pekelis and
Walsh, "Always Valid Inference: Continuous Monitoring of A/B Tests" (Operations Research 70(3),
2022), the method Optimizely runs and the one Netflix applied to canary regressions (Lindon et
al., "Rapid Regression Detection in Software Deployments through Sequential Testing", KDD 2022).
For an asymptotically normal estimate θ̂ with variance V, mixing the alternative over
N(θ0, τ²) gives the likelihood ratio

    Λ(θ0) = sqrt(V / (V + τ²)) · exp(τ² (θ̂ - θ0)² / (2 V (V + τ²)))

and {θ0 : Λ(θ0) < 1/α} is a (1 - α) confidence sequence:

    θ̂ ± sqrt(V (V + τ²) / τ² · (log((V + τ²) / V) + 2 log(1/α))).

τ is set to the practical tolerance, the size of effect the gate exists to tell apart.

Requests of one user are correlated (routing is sticky), so estimates are ratios of per-user
sums and their variances come from the delta method over users (Deng, Knoblich and Lu,
"Applying the Delta Method in Metric Analytics", KDD 2018): for m = Σ s_i / Σ a_i,
Var(m) ≈ k/(k-1) · Σ (s_i - m a_i)² / (Σ a_i)² over k users.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from logstore.slo import CohortSums

METHOD = (
    "per-user delta method (users are the unit: routing is sticky), mSPRT normal-mixture "
    "confidence sequence, valid at every look (Johari et al. 2022)"
)


@dataclass(frozen=True)
class Estimate:
    """A point estimate and its (approximately normal) variance."""

    value: float
    variance: float


@dataclass(frozen=True)
class Interval:
    """An always-valid two-sided interval and the always-valid p-value for `value == 0`."""

    low: float
    high: float
    p_value: float


def _ratio_variance(
    k: int, num: float, den: float, num_sq: float, den_sq: float, cross: float
) -> float:
    """Delta-method variance of Σnum/Σden over k independent users."""
    if k < 2 or den <= 0:
        return math.inf
    ratio = num / den
    spread = num_sq - 2 * ratio * cross + ratio * ratio * den_sq  # Σ (num_i - ratio den_i)²
    return k / (k - 1) * max(spread, 0.0) / (den * den)


def mean_log_latency(c: CohortSums) -> Estimate:
    """Mean log latency over answered requests, with its cluster-robust variance."""
    if c.answered <= 0:
        return Estimate(math.nan, math.inf)
    variance = _ratio_variance(
        c.users, c.log_sum, c.answered, c.log_sum_sq, c.answered_sq, c.answered_x_log
    )
    return Estimate(c.log_sum / c.answered, variance)


def error_rate(c: CohortSums) -> Estimate:
    """5xx share of requests, with its cluster-robust variance.

    The variance is floored at the binomial variance of an Agresti-Caffo-adjusted rate, so a
    cohort with no errors yet still has an honest uncertainty instead of zero.
    """
    if c.requests <= 0:
        return Estimate(math.nan, math.inf)
    rate = c.errors / c.requests
    clustered = _ratio_variance(
        c.users, c.errors, c.requests, c.errors_sq, c.requests_sq, c.requests_x_errors
    )
    adjusted = (c.errors + 1) / (c.requests + 2)
    return Estimate(rate, max(clustered, adjusted * (1 - adjusted) / c.requests))


def difference(a: Estimate, b: Estimate) -> Estimate:
    """a - b for independent cohorts."""
    return Estimate(a.value - b.value, a.variance + b.variance)


def half_width(variance: float, tau: float, alpha: float) -> float:
    """Half-width of the (1 - alpha) mSPRT confidence sequence at this variance."""
    if not math.isfinite(variance):
        return math.inf
    v, t2 = max(variance, 1e-300), tau * tau
    return math.sqrt(v * (v + t2) / t2 * (math.log((v + t2) / v) + 2 * math.log(1 / alpha)))


def always_valid_p(estimate: Estimate, tau: float) -> float:
    """1/Λ(0), capped at 1: the smallest alpha whose confidence sequence excludes 0 now."""
    v, t2 = estimate.variance, tau * tau
    if not math.isfinite(v) or not math.isfinite(estimate.value):
        return 1.0
    v = max(v, 1e-300)
    log_lambda = 0.5 * math.log(v / (v + t2)) + t2 * estimate.value**2 / (2 * v * (v + t2))
    return min(1.0, math.exp(-log_lambda)) if log_lambda < 700 else 0.0


def confidence_sequence(estimate: Estimate, tau: float, alpha: float) -> Interval:
    """The always-valid interval for the effect and the always-valid p-value at this look."""
    h = half_width(estimate.variance, tau, alpha)
    return Interval(estimate.value - h, estimate.value + h, always_valid_p(estimate, tau))
