"""The pure analyses of the impact report, on per-session frames built without ClickHouse."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from core.impact.analysis import analyse_impact, decide_finding
from core.impact.estimation import (
    bin_by_latency,
    correlate,
    fit_ols,
    histogram_bin_ms,
    prepare_sessions,
)
from core.impact.translation import compare_slots, translate_to_business
from core.impact.types import (
    EffectEstimate,
    ImpactData,
    ImpactFinding,
    ImpactOptions,
    ImpactWindow,
    Refutation,
)
from logstore.impact import JoinCoverage, empty_session_outcomes
from simulation.sessions import TrafficConfig, simulate_traffic
from tasks.impact import resolve_window

NOW = datetime(2033, 6, 1, tzinfo=UTC)  # the clock the analyses are stamped with

START = datetime(2030, 4, 1, tzinfo=UTC)
END = START + timedelta(hours=12)
WINDOW = ImpactWindow(start=START, end=END)


def session_frame(config: TrafficConfig) -> pd.DataFrame:
    """What logstore.impact.read_session_outcomes returns, computed with pandas instead."""
    traffic = simulate_traffic(config, START, END)
    logs = traffic.logs.assign(failed=traffic.logs["status"] >= 500)
    grouped = logs.groupby("session_id")
    per = grouped.agg(
        requests=("latency_ms", "size"),
        failed_requests=("failed", "sum"),
        latency_mean_ms=("latency_ms", "mean"),
        model_version=("model_version", "first"),
        slot=("slot", "first"),
        mixed_versions=("model_version", "nunique"),
    )
    per["mixed_versions"] = (per["mixed_versions"] > 1).astype("uint8")
    per["latency_p95_ms"] = grouped["latency_ms"].quantile(0.95)
    return traffic.sessions.join(per, on="session_id", how="inner").reset_index(drop=True)


def coverage_for(frame: pd.DataFrame) -> JoinCoverage:
    n = len(frame)
    return JoinCoverage(n, n, 0, int(frame["requests"].sum()) if n else 0, 0, 0)


def data_for(frame: pd.DataFrame, coverage: JoinCoverage | None = None) -> ImpactData:
    empty = pd.DataFrame(
        columns=["model_version", "slot", "requests", "mean_ms", "p50_ms", "p95_ms", "p99_ms"]
    )
    return ImpactData(
        window=WINDOW,
        versions=[],
        sessions=frame,
        coverage=coverage or coverage_for(frame),
        latency_profile=empty,
        latency_histogram=pd.DataFrame(columns=["model_version", "bin_start_ms", "requests"]),
        histogram_bin_ms=10.0,
    )


def estimate(value: float, low: float, high: float, key: str = "dowhy_backdoor") -> EffectEstimate:
    return EffectEstimate(
        key=key,
        label=key,
        outcome="gmv",
        unit="GMV per session per ms",
        value=value,
        ci_low=low,
        ci_high=high,
        std_error=(high - low) / 3.92,
        p_value=None,
        n=1000,
        interval_method="test",
    )


def refutation(passed: bool) -> Refutation:
    return Refutation(
        key="placebo",
        label="Placebo",
        expected=0.0,
        new_effect=0.0 if passed else 1.0,
        tolerance=0.1,
        passed=passed,
        dowhy_p_value=None,
        simulations=2,
        sessions=10,
        criterion="test",
    )


# -- window and bins -------------------------------------------------------------------------
def test_window_from_last_hours_ends_now_or_at_end():
    now = datetime(2030, 1, 2, 12, tzinfo=UTC)
    assert resolve_window(None, None, 6, now=now) == ImpactWindow(
        start=now - timedelta(hours=6), end=now
    )
    explicit = resolve_window(START, END, None)
    assert (explicit.start, explicit.end, explicit.days) == (START, END, 0.5)


def test_window_refuses_reversed_bounds_and_missing_length():
    with pytest.raises(ValueError, match="must be after start"):
        resolve_window(END, START, None)
    with pytest.raises(ValueError, match="last_hours"):
        resolve_window(None, END, None)


def test_histogram_bin_is_a_round_width_spanning_p99():
    profile = pd.DataFrame({"p99_ms": [480.0, 730.0]})
    width = histogram_bin_ms(profile, bins=50)
    assert width == 20.0 and 49 * width >= 730.0
    assert histogram_bin_ms(profile.iloc[0:0]) == 10.0


# -- preparation and descriptive -------------------------------------------------------------
def test_one_level_covariate_is_dropped_with_a_note():
    frame = session_frame(TrafficConfig(n_sessions=400, seed=1))
    frame["device_type"] = "ios"
    prepared = prepare_sessions(frame)
    assert prepared.covariates == ["user_age"] and prepared.adjustment == ["user_age"]
    assert any("device_type has a single value (ios)" in n for n in prepared.notes)


def test_device_type_becomes_indicators_against_a_reference_level():
    frame = session_frame(TrafficConfig(n_sessions=400, seed=1))
    prepared = prepare_sessions(frame)
    assert prepared.confounders == ["device_ios", "device_web"]  # android is the reference
    assert prepared.adjustment == ["device_ios", "device_web", "user_age"]
    ios = prepared.frame["device_type"] == "ios"
    assert (prepared.frame.loc[ios, "device_ios"] == 1).all()
    assert (prepared.frame.loc[~ios, "device_ios"] == 0).all()


def test_rows_with_missing_values_are_excluded_and_counted():
    frame = session_frame(TrafficConfig(n_sessions=300, seed=2))
    frame.loc[:4, "user_age"] = np.nan
    frame.loc[5, "gmv"] = np.inf
    prepared = prepare_sessions(frame)
    assert len(prepared.frame) == 294
    assert any(n.startswith("6 sessions with missing") for n in prepared.notes)


def test_correlation_has_p_value_and_interval_and_is_none_when_constant():
    frame = session_frame(TrafficConfig(n_sessions=2_000, seed=3))
    corr = correlate(frame, "latency_mean_ms", "gmv")
    assert corr is not None and corr.n == 2_000
    assert corr.r < 0 and corr.p_value < 0.01 and corr.ci_low < corr.r < corr.ci_high
    frame["gmv"] = 5.0
    assert correlate(frame, "latency_mean_ms", "gmv") is None


def test_ols_recovers_an_exact_linear_slope():
    rng = np.random.default_rng(4)
    n = 3_000
    frame = pd.DataFrame(
        {
            "latency_mean_ms": rng.uniform(50, 300, n),
            "user_age": rng.uniform(18, 70, n),
            "device_type": rng.choice(["web", "ios"], n),
            "user_id": np.arange(n),
        }
    )
    frame["gmv"] = (
        20
        - 0.1 * frame["latency_mean_ms"]
        + 0.5 * frame["user_age"]
        + np.where(frame["device_type"] == "ios", 10.0, 0.0)
        + rng.normal(0, 1, n)
    )
    frame["device_ios"] = (frame["device_type"] == "ios").astype(float)
    fit = fit_ols(frame, "gmv", ["device_ios", "user_age"], "ols", "OLS")
    assert fit.covers(-0.1) and fit.ci_high - fit.ci_low < 0.01
    assert fit.interval_method == "cluster-robust (user)" and fit.n == n


def test_binned_outcome_covers_every_session_in_latency_order():
    frame = session_frame(TrafficConfig(n_sessions=1_000, seed=5))
    bins = bin_by_latency(frame, "gmv", 10)
    assert sum(b.sessions for b in bins) == 1_000 and len(bins) == 10
    assert all(a.high_ms <= b.low_ms for a, b in zip(bins, bins[1:], strict=False))
    assert all(b.ci_low <= b.mean <= b.ci_high for b in bins)


# -- translation and slots -------------------------------------------------------------------
def test_business_translation_scales_effect_and_interval_by_traffic():
    t = translate_to_business(
        estimate(-0.05, -0.08, -0.02), sessions_per_day=10_000, gmv_per_day=1e6
    )
    assert (t.gmv_per_day_per_ms, t.ci_low, t.ci_high) == pytest.approx((-500, -800, -200))
    assert t.gmv_per_day_per_100ms == pytest.approx(-50_000)


def test_slot_comparison_without_canary_says_so():
    frame = session_frame(TrafficConfig(n_sessions=500, seed=6))
    frame["slot"] = "stable"
    result = compare_slots(frame, estimate(-0.05, -0.08, -0.02), 1_000.0, 50)
    assert not result.available and result.reason == "no canary sessions in the window"


def test_slot_comparison_with_too_few_canary_sessions_is_unavailable():
    frame = session_frame(TrafficConfig(n_sessions=500, seed=6))
    result = compare_slots(frame, estimate(-0.05, -0.08, -0.02), 1_000.0, 200)
    assert not result.available and "too few sessions" in result.reason


def test_slot_comparison_implies_gmv_from_latency_difference_and_causal_effect():
    frame = session_frame(TrafficConfig(n_sessions=4_000, seed=7))
    causal = estimate(-0.05, -0.08, -0.02)
    result = compare_slots(frame, causal, 20_000.0, 50)
    assert result.available and result.canary_version == "v-canary"
    assert result.latency_diff_ms is not None and result.latency_diff_ci is not None
    low, high = result.latency_diff_ci
    assert low < result.latency_diff_ms < high and low > 0  # the canary is 15 ms slower
    assert result.implied_gmv_per_session == pytest.approx(result.latency_diff_ms * -0.05)
    assert result.implied_gmv_per_day == pytest.approx(result.implied_gmv_per_session * 20_000)
    day_low, day_high = result.implied_gmv_per_day_ci or (0, 0)
    assert day_low < result.implied_gmv_per_day < day_high
    assert result.measured_gmv_diff_ci is not None


# -- the finding -----------------------------------------------------------------------------
def test_finding_prefers_caution():
    detected = estimate(-0.05, -0.08, -0.02)
    assert decide_finding(detected, None, [refutation(True)]) is ImpactFinding.effect_detected
    assert decide_finding(detected, None, [refutation(False)]) is ImpactFinding.refuted
    far = estimate(0.10, 0.08, 0.12, key="dowhy_frontdoor")
    assert decide_finding(detected, far, [refutation(True)]) is ImpactFinding.estimators_disagree
    covering = estimate(-0.01, -0.04, 0.02)
    assert decide_finding(covering, None, []) is ImpactFinding.no_detectable_effect


def test_empty_window_reports_no_data_and_why():
    coverage = JoinCoverage(0, 0, 0, 0, 0, 0)
    report = analyse_impact(data_for(empty_session_outcomes(), coverage), ImpactOptions(), now=NOW)
    assert report.finding is ImpactFinding.no_data
    assert "no sessions and no requests" in report.headline
    assert report.estimates == [] and report.translation is None


def test_requests_without_sessions_explain_an_empty_join():
    coverage = JoinCoverage(0, 0, 0, 1_200, 1_200, 60)
    report = analyse_impact(data_for(empty_session_outcomes(), coverage), ImpactOptions(), now=NOW)
    assert report.finding is ImpactFinding.no_data
    assert "1,200 requests have no session" in report.headline
    assert any("(60 session ids) have no user_sessions row" in c for c in report.caveats)


def test_too_few_sessions_is_insufficient_data_but_still_descriptive():
    frame = session_frame(TrafficConfig(n_sessions=120, seed=8))
    report = analyse_impact(data_for(frame), ImpactOptions(min_sessions=500), now=NOW)
    assert report.finding is ImpactFinding.insufficient_data
    assert "only 120 usable sessions" in report.headline and "at least 500" in report.headline
    assert report.estimates == [] and len(report.correlations) == 2 and report.gmv_by_latency


def test_constant_latency_cannot_be_analysed():
    frame = session_frame(TrafficConfig(n_sessions=600, seed=9))
    frame["latency_mean_ms"] = 120.0
    report = analyse_impact(data_for(frame), ImpactOptions(min_sessions=100), now=NOW)
    assert report.finding is ImpactFinding.insufficient_data
    assert "same latency" in report.headline
