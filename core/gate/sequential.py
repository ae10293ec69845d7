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

Requests are correlated two ways: one user's requests (routing is sticky) and one slot's
requests in the same moment (its own batcher and queue). Estimates are ratios of sums and their
variances come from the delta method over clusters (Deng, Knoblich and Lu, "Applying the Delta
Method in Metric Analytics", KDD 2018): for m = Σ s_c / Σ a_c over k clusters,
Var(m) ≈ k/(k-1) · Σ (s_c - m a_c)² / (Σ a_c)², computed clustered by user and by second and
combined two-way (Cameron, Gelbach and Miller, "Robust Inference with Multiway Clustering",
JBES 2011).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from logstore.feedback import ClickSums
from logstore.slo import CohortSums, PairedSeconds

METHOD = (
    "delta method clustered two ways, per-user (routing is sticky) and per-second (a slot's "
    "queue; canary and baseline paired by second), mSPRT normal-mixture confidence sequence "
    "valid at every look (Johari et al. 2022); click-through canary/baseline over the canary "
    "so far, clustered per user, the same confidence sequence"
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
    """Delta-method variance of Σnum/Σden over k independent clusters."""
    if k < 2 or den <= 0:
        return math.inf
    ratio = num / den
    spread = num_sq - 2 * ratio * cross + ratio * ratio * den_sq  # Σ (num_c - ratio den_c)²
    return k / (k - 1) * max(spread, 0.0) / (den * den)


def _two_way(by_user: float, by_second: float, by_request: float) -> float:
    """Clustered by user and by second at once (Cameron, Gelbach & Miller 2011): V_u + V_t - V_ut.

    The intersection (one user within one second) is almost always a single request, so the
    request-level variance stands in for it. Never below either one-way variance.
    """
    return max(by_user + by_second - by_request, by_user, by_second)


def mean_log_latency(c: CohortSums) -> Estimate:
    """Mean log latency over answered requests, with its two-way clustered variance."""
    if c.answered <= 0:
        return Estimate(math.nan, math.inf)
    u, t = c.by_user, c.by_second
    n = c.answered
    per_user = _ratio_variance(u.clusters, c.log_sum, n, u.ss, u.aa, u.a_s)
    per_second = _ratio_variance(t.clusters, c.log_sum, n, t.ss, t.aa, t.a_s)
    per_request = _ratio_variance(int(n), c.log_sum, n, c.log_sq, n, c.log_sum)
    return Estimate(c.log_sum / n, _two_way(per_user, per_second, per_request))


def mean_log_latency_by_user(c: CohortSums) -> Estimate:
    """Mean log latency with its variance clustered by user only, without the per-second part.

    What a cohort's noise leaves in the canary-minus-baseline difference once the swings both
    cohorts share second by second cancel (`latency_shift` subtracts their covariance): the
    canary plan's basis. A busy host makes per-second swings large and shared (on two cores the
    two-way variance ran ~10x the per-user one), so planning on the two-way variance alone
    promised steps several times longer than the judge needed.
    """
    if c.answered <= 0:
        return Estimate(math.nan, math.inf)
    u, n = c.by_user, c.answered
    return Estimate(c.log_sum / n, _ratio_variance(u.clusters, c.log_sum, n, u.ss, u.aa, u.a_s))


def error_rate(c: CohortSums) -> Estimate:
    """5xx share of requests, with its two-way clustered variance.

    The variance is floored at the binomial variance of an Agresti-Caffo-adjusted rate, so a
    cohort with no errors yet still has an honest uncertainty instead of zero.
    """
    if c.requests <= 0:
        return Estimate(math.nan, math.inf)
    u, t = c.by_user, c.by_second
    n, e = c.requests, c.errors
    per_user = _ratio_variance(u.clusters, e, n, u.ee, u.rr, u.re)
    per_second = _ratio_variance(t.clusters, e, n, t.ee, t.rr, t.re)
    per_request = _ratio_variance(int(n), e, n, e, n, e)  # e_j² = e_j, r_j = 1
    adjusted = (e + 1) / (n + 2)
    floor = adjusted * (1 - adjusted) / n
    return Estimate(e / n, max(_two_way(per_user, per_second, per_request), floor))


def click_through(c: ClickSums) -> Estimate:
    """The share of impressions clicked, with its per-user clustered variance.

    Clicks are counted per impression but a user's impressions are correlated, so the variance
    is the delta method over users (requests nest within users), floored at the binomial
    variance of a rate with half a click added (so a cohort without clicks is not certain).
    """
    if c.impressions <= 0:
        return Estimate(math.nan, math.inf)
    n, k = c.impressions, c.clicked
    adjusted = (k + 0.5) / (n + 1)
    per_user = _ratio_variance(c.users, k, n, c.kk, c.nn, c.nk)
    return Estimate(k / n, max(per_user, adjusted * (1 - adjusted) / n))


def click_through_shift(c: ClickSums, b: ClickSums) -> Estimate:
    """canary CTR / baseline CTR - 1, by the delta method: Var ≈ (V_c + R² V_b) / r_b².

    On the ratio's own scale, not the log's: a canary whose clicks fall to none has a ratio of
    0 with a small variance, and fails, where log(0) would have an infinite one. Users who moved
    from baseline to canary when the weight rose count in both cohorts; the positive covariance
    that adds is ignored, which only widens the interval.
    """
    rc, rb = click_through(c), click_through(b)
    if not rb.value > 0:
        return Estimate(math.nan, math.inf)
    ratio = rc.value / rb.value
    return Estimate(ratio - 1, (rc.variance + ratio * ratio * rb.variance) / (rb.value**2))


def difference(a: Estimate, b: Estimate) -> Estimate:
    """a - b for independent cohorts."""
    return Estimate(a.value - b.value, a.variance + b.variance)


def _covariance_by_second(
    k: int, mean_c: float, mean_b: float, total_c: float, total_b: float, cross: tuple[float, ...]
) -> float:
    """Cov of two ratio estimates clustered by the seconds both cohorts served.

    cross = (Σ n_c n_b, Σ n_c d_b, Σ d_c n_b, Σ d_c d_b) for numerators n and denominators d.
    """
    if k < 2 or total_c <= 0 or total_b <= 0:
        return 0.0
    nn, nd, dn, dd = cross
    joint = nn - mean_b * nd - mean_c * dn + mean_c * mean_b * dd
    return k / (k - 1) * joint / (total_c * total_b)


def latency_shift(c: CohortSums, b: CohortSums, paired: PairedSeconds | None) -> Estimate:
    """Δ mean log latency, canary minus baseline.

    Canary and baseline serve at the same moments, so a load swing slows both: the covariance of
    their per-second sums is subtracted. Users are disjoint, so the per-user part has none.
    """
    cross = None if paired is None else (paired.sc_sb, paired.sc_ab, paired.ac_sb, paired.ac_ab)
    return _paired_shift(c, b, paired, mean_log_latency, cross)


def error_shift(c: CohortSums, b: CohortSums, paired: PairedSeconds | None) -> Estimate:
    """Δ 5xx rate, canary minus baseline, paired by second like `latency_shift`."""
    cross = None if paired is None else (paired.ec_eb, paired.ec_rb, paired.rc_eb, paired.rc_rb)
    return _paired_shift(c, b, paired, error_rate, cross)


def _paired_shift(
    c: CohortSums,
    b: CohortSums,
    paired: PairedSeconds | None,
    one: Callable[[CohortSums], Estimate],
    cross: tuple[float, float, float, float] | None,
) -> Estimate:
    shift = difference(one(c), one(b))
    if paired is None or cross is None or not math.isfinite(shift.variance):
        return shift
    (mean_c, total_c), (mean_b, total_b) = (_ratio_of(x, one) for x in (c, b))
    cov = _covariance_by_second(paired.seconds, mean_c, mean_b, total_c, total_b, cross)
    return Estimate(shift.value, _reduced(shift.variance, cov, c, b, one))


def _ratio_of(c: CohortSums, one: Callable[[CohortSums], Estimate]) -> tuple[float, float]:
    """The estimate's ratio and its denominator total: latency per answered, errors per request."""
    if one is error_rate:
        return c.errors / c.requests, c.requests
    return c.log_sum / c.answered, c.answered


def _reduced(
    variance: float, cov: float, c: CohortSums, b: CohortSums, one: Callable[[CohortSums], Estimate]
) -> float:
    """variance - 2 cov, never below what the cohorts' own request-level noise allows.

    The covariance only removes shared swings; the floor keeps an unlucky negative or inflated
    covariance estimate from claiming more precision than independent requests would give.
    """
    floor = _request_level(c, one) + _request_level(b, one)
    return max(variance - 2 * cov, floor)


def _request_level(c: CohortSums, one: Callable[[CohortSums], Estimate]) -> float:
    if one is error_rate:
        rate = (c.errors + 1) / (c.requests + 2)
        return rate * (1 - rate) / c.requests
    n = c.answered
    return _ratio_variance(int(n), c.log_sum, n, c.log_sq, n, c.log_sum)


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
