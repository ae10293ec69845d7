"""The release experiment's estimator on synthetic users with a known answer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from core.impact.experiment import estimate_experiment, estimate_metric, sample_ratio
from core.impact.experiment_types import (
    BASELINE,
    CANARY,
    METRICS,
    ExperimentFinding,
    ExperimentOptions,
)
from logstore.experiment import CohortMoments, ExperimentData

START = datetime(2026, 3, 2, 12, tzinfo=UTC)
OPTIONS = ExperimentOptions()
SPEC = {m.key: m for m in METRICS}


def users(rng: np.random.Generator, n: int, order_lift: float = 0.0) -> dict[str, np.ndarray]:
    """Users whose orders persist from the pre-canary period: orders = 2 + 3·taste + noise."""
    taste = rng.normal(0, 1, n)
    pre = 2.0 + 3.0 * taste + rng.normal(0, 1, n)
    during = (2.0 + 3.0 * taste + rng.normal(0, 1, n)) * (1 + order_lift)
    impressions = rng.integers(5, 40, n).astype(float)
    pre_impressions = rng.integers(5, 40, n).astype(float)
    p = 1 / (1 + np.exp(-(-2.0 + 0.8 * taste)))
    return {
        "orders": during,
        "pre_orders": pre,
        "gmv": 40 * during,
        "pre_gmv": 40 * pre,
        "impressions": impressions,
        "clicked": rng.binomial(impressions.astype(int), p).astype(float),
        "pre_impressions": pre_impressions,
        "pre_clicked": rng.binomial(pre_impressions.astype(int), p).astype(float),
        "requests": impressions / 5,
        "latency_sum": impressions / 5 * rng.normal(120, 10, n),
        "pre_requests": pre_impressions / 5,
        "pre_latency_sum": pre_impressions / 5 * rng.normal(120, 10, n),
    }


def data(canary: CohortMoments, baseline: CohortMoments) -> ExperimentData:
    return ExperimentData(
        START, START + timedelta(hours=1), START - timedelta(hours=1), START, "v-new", "v-old",
        {CANARY: canary, BASELINE: baseline}, crossed_users=0,
    )  # fmt: skip


def test_cuped_matches_regression_adjustment_and_removes_the_explained_variance() -> None:
    rng = np.random.default_rng(1)
    c, b = users(rng, 4_000, order_lift=0.03), users(rng, 4_000)
    effect = estimate_metric(
        SPEC["orders_per_user"],
        CohortMoments.from_users(CANARY, c),
        CohortMoments.from_users(BASELINE, b),
        ExperimentOptions(covariates="own"),
    )
    # The known answer by hand: theta = pooled within-cohort slope of orders on pre_orders.
    xc, xb = c["pre_orders"] - c["pre_orders"].mean(), b["pre_orders"] - b["pre_orders"].mean()
    yc, yb = c["orders"] - c["orders"].mean(), b["orders"] - b["orders"].mean()
    theta = (xc @ yc + xb @ yb) / (xc @ xc + xb @ xb)
    x_bar = np.concatenate([c["pre_orders"], b["pre_orders"]]).mean()
    adjusted = (c["orders"].mean() - theta * (c["pre_orders"].mean() - x_bar)) - (
        b["orders"].mean() - theta * (b["pre_orders"].mean() - x_bar)
    )
    assert effect.theta == [pytest.approx(theta, rel=1e-9)]
    assert effect.effect == pytest.approx(adjusted, rel=1e-9)
    # corr(pre, during) = 9 / 10 here, so CUPED removes about rho² = 81 % of the variance.
    assert effect.variance_reduction == pytest.approx(0.81, abs=0.03)
    assert effect.covers_relative(0.03)
    assert effect.raw_std_error is not None and effect.std_error is not None
    assert effect.std_error < 0.5 * effect.raw_std_error


def test_cuped_with_every_pre_canary_metric_is_pooled_least_squares() -> None:
    """covariates="all": theta is the within-cohort OLS of GMV on every pre-canary metric."""
    rng = np.random.default_rng(9)
    c, b = users(rng, 3_000), users(rng, 3_000)
    effect = estimate_metric(
        SPEC["gmv_per_user"],
        CohortMoments.from_users(CANARY, c),
        CohortMoments.from_users(BASELINE, b),
        ExperimentOptions(covariates="all"),
    )

    def covariates(u: dict[str, np.ndarray]) -> np.ndarray:
        pooled = {k: c[k].sum() + b[k].sum() for k in c}
        ctr = (
            u["pre_clicked"]
            - pooled["pre_clicked"] / pooled["pre_impressions"] * u["pre_impressions"]
        )
        lat = (
            u["pre_latency_sum"]
            - pooled["pre_latency_sum"] / pooled["pre_requests"] * u["pre_requests"]
        )
        return np.column_stack([u["pre_gmv"], ctr, u["pre_orders"], lat])

    xs = [covariates(u) - covariates(u).mean(axis=0) for u in (c, b)]
    ys = [u["gmv"] - u["gmv"].mean() for u in (c, b)]
    slope = np.linalg.lstsq(np.vstack(xs), np.concatenate(ys), rcond=None)[0]
    # the same fit up to each covariate's scale (the estimator divides by the mean denominator)
    assert effect.theta[0] == pytest.approx(slope[0], rel=1e-6)
    assert effect.theta[2] == pytest.approx(slope[2], rel=1e-6)
    own = estimate_metric(
        SPEC["gmv_per_user"],
        CohortMoments.from_users(CANARY, c),
        CohortMoments.from_users(BASELINE, b),
        ExperimentOptions(covariates="own"),
    )
    assert effect.variance_reduction >= own.variance_reduction - 1e-9


def test_ratio_metric_interval_is_clustered_by_user() -> None:
    """Click-through's SE from moments equals the delta method on the per-user rows."""
    rng = np.random.default_rng(2)
    c, b = users(rng, 3_000), users(rng, 3_000)
    effect = estimate_metric(
        SPEC["click_through"],
        CohortMoments.from_users(CANARY, c),
        CohortMoments.from_users(BASELINE, b),
        OPTIONS,
    )

    def raw_var(u: dict[str, np.ndarray]) -> float:
        r = u["clicked"].sum() / u["impressions"].sum()
        lin = (u["clicked"] - r * u["impressions"]) / u["impressions"].mean()
        return lin.var(ddof=1) / len(lin)

    assert effect.raw_std_error == pytest.approx(np.sqrt(raw_var(c) + raw_var(b)), rel=1e-9)
    assert effect.canary_mean == pytest.approx(c["clicked"].sum() / c["impressions"].sum())


def test_intervals_cover_the_planted_lift_at_the_stated_rate() -> None:
    rng = np.random.default_rng(3)
    covered = 0
    for _ in range(300):
        c, b = users(rng, 600, order_lift=0.05), users(rng, 600)
        effect = estimate_metric(
            SPEC["orders_per_user"],
            CohortMoments.from_users(CANARY, c),
            CohortMoments.from_users(BASELINE, b),
            OPTIONS,
        )
        covered += effect.covers_relative(0.05)
    assert 0.91 <= covered / 300 <= 0.98


def test_experiment_with_planted_order_lift_is_detected_and_says_so_in_words() -> None:
    rng = np.random.default_rng(4)
    c, b = users(rng, 5_000, order_lift=0.05), users(rng, 5_000)
    experiment = estimate_experiment(
        data(CohortMoments.from_users(CANARY, c), CohortMoments.from_users(BASELINE, b)),
        ("r1", "v-new", "lin", "promoted"),
        OPTIONS,
        now=START,
    )
    assert experiment.finding is ExperimentFinding.effect_detected
    orders = experiment.metric("orders_per_user")
    assert orders is not None and orders.detected
    assert orders.covers_relative(0.05)
    assert f"orders per user by {orders.relative * 100:+.1f} %" in experiment.headline
    assert any("not a forecast for a day or a year" in a for a in experiment.assumptions)
    latency = experiment.metric("latency_ms")  # nothing planted there
    assert latency is not None and latency.covers_relative(0.0) and not latency.detected
    assert "would have been detected" in experiment.statements[3]


def test_a_metric_with_no_events_is_not_measured_rather_than_zero() -> None:
    rng = np.random.default_rng(5)
    c, b = users(rng, 500), users(rng, 500)
    for u in (c, b):
        u["impressions"] = np.zeros(500)
        u["clicked"] = np.zeros(500)
    experiment = estimate_experiment(
        data(CohortMoments.from_users(CANARY, c), CohortMoments.from_users(BASELINE, b)),
        ("r1", "v-new", "lin", "promoted"),
        OPTIONS,
        now=START,
    )
    clicks = experiment.metric("click_through")
    assert clicks is not None and not clicks.measured and clicks.effect is None
    assert "not measured" in clicks.reason
    assert "not measured" in experiment.statements[0]


def test_cohorts_failing_the_sample_ratio_check_make_the_effect_not_valid() -> None:
    rng = np.random.default_rng(6)
    c, b = users(rng, 1_300, order_lift=0.2), users(rng, 1_000)
    experiment = estimate_experiment(
        data(CohortMoments.from_users(CANARY, c), CohortMoments.from_users(BASELINE, b)),
        ("r1", "v-new", "lin", "promoted"),
        OPTIONS,
        now=START,
    )
    assert experiment.finding is ExperimentFinding.not_valid
    assert experiment.sample_ratio is not None and not experiment.sample_ratio.passed
    assert experiment.headline.startswith("Effect not valid")


def test_sample_ratio_of_an_even_split_passes() -> None:
    assert sample_ratio(1_000, 1_010, 0.5, 0.001).passed
    assert not sample_ratio(1_000, 1_200, 0.5, 0.001).passed


def test_too_few_users_is_no_experiment_with_the_reason() -> None:
    rng = np.random.default_rng(7)
    experiment = estimate_experiment(
        data(
            CohortMoments.from_users(CANARY, users(rng, 5)),
            CohortMoments.from_users(BASELINE, users(rng, 500)),
        ),
        ("r1", "v-new", "lin", "rolled_back"),
        OPTIONS,
        now=START,
    )
    assert experiment.finding is ExperimentFinding.no_experiment
    assert "the canary had 5 and the baseline 500 users" in experiment.headline
    assert experiment.metrics == []


def test_no_effect_is_rarely_called_detected_across_the_business_metrics() -> None:
    rng = np.random.default_rng(8)
    called = 0
    for _ in range(200):
        c, b = users(rng, 400), users(rng, 400)
        experiment = estimate_experiment(
            data(CohortMoments.from_users(CANARY, c), CohortMoments.from_users(BASELINE, b)),
            ("r", "v", "l", "promoted"),
            OPTIONS,
            now=START,
        )
        called += experiment.finding is ExperimentFinding.effect_detected
    assert called / 200 <= 0.06
