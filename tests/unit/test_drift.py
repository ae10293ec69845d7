"""drift-watch's verdicts: too few impressions is inconclusive, the shop's own traffic passes,
planted shifts fail with the shifted feature ranked first, and alerts respect the cool-down."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from core.data.validation import TrainingWindow, window_ending
from core.drift.alerts import alert_decision, report_markdown, sparkline
from core.drift.analysis import DriftRules, Reference, assess_drift, prepare_reference
from relay.types import Verdict
from simulation.drift import Drift, apply_drift
from simulation.shop import ShopConfig, generate_events
from simulation.traffic import served_impressions

T0 = datetime(2026, 11, 8, tzinfo=UTC)
RULES = DriftRules()


@pytest.fixture(scope="module")
def reference() -> Reference:
    return prepare_reference(generate_events(ShopConfig(), 40_000, T0, days=7), RULES)


def live(rows: int, chunk: int, drift: Drift | None = None) -> pd.DataFrame:
    frame = generate_events(ShopConfig(), rows, T0 + timedelta(hours=2), days=0.01, chunk=chunk)
    return frame if drift is None else apply_drift(frame, drift, np.random.default_rng(chunk))


def test_a_window_with_too_few_impressions_is_inconclusive_with_its_count(
    reference: Reference,
) -> None:
    report = assess_drift(reference, live(150, 1), RULES)
    assert report.gate.verdict is Verdict.inconclusive
    assert "150 impressions" in report.gate.reason and "fewer than 200" in report.gate.reason


def test_a_few_served_sessions_of_clean_traffic_do_not_alarm(reference: Reference) -> None:
    # 400 impressions are five served sessions: the clustered mean test must not take its
    # variance from five clusters at face value (Student's t, not the normal)
    failed = sum(
        assess_drift(reference, served_impressions(live(400, 100 + i)), RULES).gate.verdict
        is Verdict.failed
        for i in range(40)
    )
    assert failed <= 2  # family-wise alpha 1 %: 0.4 expected in 40


def test_a_long_served_window_is_scored_on_a_sample_of_the_rules_size(reference: Reference) -> None:
    # 32,000 served impressions are a 30-second window of the deployed stack's shop: the score's
    # per-batch rule, run over all 1,280 batches, alarmed on 2.3 % of such clean windows
    window = served_impressions(live(32_000, 7))
    report = assess_drift(reference, window, RULES)
    assert report.score is not None and len(report.score.z) == RULES.score_vectors // RULES.batch
    assert report.gate.verdict is Verdict.passed, report.gate.reason
    assert "at most 5,000 of the window's impressions" in report.gate.method
    wider = assess_drift(reference, window, DriftRules(score_vectors=40_000))
    assert wider.score is not None and len(wider.score.z) == 32_000 // RULES.batch


@pytest.mark.parametrize("rows", [2_000, 20_000], ids=["tests", "distances"])
def test_the_shops_own_traffic_passes(reference: Reference, rows: int) -> None:
    report = assess_drift(reference, live(rows, 2), RULES)
    assert report.gate.verdict is Verdict.passed, report.gate.reason
    assert report.drifted_features == []
    method = report.features[0].method
    assert method in (
        ("Kolmogorov-Smirnov", "mean shift (session-clustered z)", "chi-squared")
        if rows < 8_000
        else ("Wasserstein (ref. σ)", "Jensen-Shannon")
    )


@pytest.mark.parametrize(
    ("drift", "first"),
    [
        (Drift("price_inflation", 0.3), {"price", "price_to_user_avg"}),
        (Drift("device_mix", 0.3), {"device_type"}),
        (Drift("category_promotion", 0.2), {"category_id", "discount_pct"}),
    ],
    ids=lambda d: d.kind if isinstance(d, Drift) else "",
)
def test_a_large_planted_shift_fails_with_its_feature_ranked_first(
    reference: Reference, drift: Drift, first: set[str]
) -> None:
    report = assess_drift(reference, live(20_000, 3, drift), RULES)
    assert report.gate.verdict is Verdict.failed
    assert report.drifted_features[0] in first
    assert report.drifted_features[0] in report.gate.reason


def test_drift_planted_from_a_time_leaves_earlier_rows_alone() -> None:
    frame = live(2_000, 4)
    start = frame["ts"].sort_values().iloc[1_000].to_pydatetime()
    shifted = apply_drift(frame, Drift("price_inflation", 0.5, start), np.random.default_rng(0))
    before = frame["ts"] < pd.Timestamp(start)
    assert (shifted.loc[before, "price"] == frame.loc[before, "price"]).all()
    assert np.allclose(shifted.loc[~before, "price"], frame.loc[~before, "price"] * 1.5, rtol=1e-6)


def test_an_alert_goes_out_once_per_cooldown() -> None:
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    cooldown = timedelta(hours=6)
    assert alert_decision(Verdict.failed, None, now, cooldown).emit
    assert alert_decision(Verdict.failed, now - timedelta(hours=7), now, cooldown).emit
    held = alert_decision(Verdict.failed, now - timedelta(hours=1), now, cooldown)
    assert not held.emit and "cool-down" in held.reason
    assert not alert_decision(Verdict.passed, None, now, cooldown).emit
    assert not alert_decision(Verdict.inconclusive, None, now, cooldown).emit


def test_the_artifact_ranks_features_and_plots_the_score(reference: Reference) -> None:
    report = assess_drift(reference, live(2_000, 5, Drift("device_mix", 0.5)), RULES)
    text = report_markdown(report, "last 15 min", "[a, b)")
    assert text.startswith("# Drift watch: failed")
    rows = [line for line in text.splitlines() if line.startswith("| device_type")]
    assert rows and "**yes**" in rows[0]
    assert text.index("| device_type") < text.index("| region_id")
    assert sparkline([0.0, 1.0, 2.0]) == "▁▄█"


def test_a_training_window_reads_back_from_its_lineage_text() -> None:
    window = window_ending(T0, 7)
    assert TrainingWindow.parse(str(window)) == window
    with pytest.raises(ValueError, match="not a training window"):
        TrainingWindow.parse("fixture-window")
