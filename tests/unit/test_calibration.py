import numpy as np
import pytest

from core.calibration.assessment import (
    CalibrationThresholds,
    assess_calibration,
    expected_calibration_error,
    score_distribution_kl,
)
from relay.types import BlobRef, Verdict

SET = BlobRef(sha256="0" * 64, size=1)
LIMITS = CalibrationThresholds()


@pytest.fixture(scope="module")
def world():
    """Labels drawn from known probabilities, and a model that predicts exactly those."""
    rng = np.random.default_rng(0)
    logit = rng.normal(-3.0, 1.0, 20_000)
    truth = 1 / (1 + np.exp(-logit))
    labels = (rng.random(len(truth)) < truth).astype(int)
    return labels, truth.astype(np.float32), logit


def by_check(report):
    return {c.gate: c.verdict for c in report.checks}


def test_first_release_is_blessed_on_absolute_floors_and_says_relative_checks_were_skipped(world):
    labels, truth, _ = world
    report = assess_calibration("v1", labels, truth, None, None, SET, LIMITS)
    assert report.blessed
    assert "kl_divergence" not in by_check(report)
    assert any("no blessed baseline" in n for n in report.notes)


def test_same_quality_candidate_is_blessed_against_the_baseline(world):
    labels, truth, logit = world
    rng = np.random.default_rng(1)
    close = 1 / (1 + np.exp(-(logit + rng.normal(0, 0.05, len(logit)))))
    report = assess_calibration("v2", labels, close, "v1", truth, SET, LIMITS)
    assert report.blessed, report.checks
    assert report.kl_divergence is not None and report.kl_divergence < 0.01


def test_shifted_score_distribution_fails_kl_and_calibration(world):
    labels, truth, logit = world
    shifted = 1 / (1 + np.exp(-(logit + 1.0)))  # same ranking, CTRs ~2.7x too high
    report = assess_calibration("v2", labels, shifted, "v1", truth, SET, LIMITS)
    assert not report.blessed
    assert by_check(report)["kl_divergence"] is Verdict.failed
    assert by_check(report)["ece"] is Verdict.failed
    assert by_check(report)["auc_drop"] is Verdict.passed  # ranking unchanged


def test_worse_ranking_fails_the_auc_drop(world):
    labels, truth, logit = world
    rng = np.random.default_rng(2)
    noisy = 1 / (1 + np.exp(-(logit + rng.normal(0, 1.5, len(logit)))))
    report = assess_calibration("v2", labels, noisy, "v1", truth, SET, LIMITS)
    assert by_check(report)["auc_drop"] is Verdict.failed and not report.blessed


@pytest.mark.parametrize(
    "broken",
    [lambda t: np.where(np.arange(len(t)) == 3, np.nan, t), lambda t: np.full_like(t, 0.05)],
    ids=["nan-scores", "degenerate-constant"],
)
def test_numerically_broken_candidate_is_never_blessed(world, broken):
    labels, truth, _ = world
    report = assess_calibration("bad", labels, broken(truth), "v1", truth, SET, LIMITS)
    assert not report.blessed


def test_ece_is_zero_for_perfectly_calibrated_bins_and_large_when_off():
    scores = np.repeat([0.1, 0.5], 1000)
    labels = np.concatenate(
        [np.r_[np.ones(100), np.zeros(900)], np.r_[np.ones(500), np.zeros(500)]]
    )
    assert expected_calibration_error(labels, scores, bins=2) == pytest.approx(0.0)
    assert expected_calibration_error(labels, np.clip(scores + 0.2, 0, 1), bins=2) == pytest.approx(
        0.2
    )


def test_kl_is_zero_for_identical_distributions_and_grows_with_shift():
    rng = np.random.default_rng(3)
    base = rng.beta(1, 20, 10_000)
    assert score_distribution_kl(base, base) == pytest.approx(0.0, abs=1e-12)
    assert score_distribution_kl(base * 1.5, base) > score_distribution_kl(base * 1.1, base) > 0
