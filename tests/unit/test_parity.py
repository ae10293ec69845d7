import numpy as np
import pytest

from tasks.compilation import TOLERANCES, assess_parity, topk_overlap


@pytest.fixture
def holdout():
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(200), 10)
    reference = rng.uniform(0.0, 0.3, len(groups)).astype(np.float32)
    labels = (rng.random(len(groups)) < reference).astype(int)
    return reference, labels, groups


def test_identical_scores_pass_the_fp32_gate(holdout):
    reference, labels, groups = holdout
    result = assess_parity(
        "ort-fp32", reference, reference.copy(), labels, groups, TOLERANCES["ort-fp32"]
    )
    assert result.accepted and result.max_abs_diff == 0 and result.topk_overlap == 1.0


def test_tiny_float_noise_passes_fp32_but_1e4_does_not(holdout):
    reference, labels, groups = holdout
    ok = assess_parity(
        "ort-fp32", reference, reference + 1e-7, labels, groups, TOLERANCES["ort-fp32"]
    )
    bad = assess_parity(
        "ort-fp32", reference, reference + 1e-4, labels, groups, TOLERANCES["ort-fp32"]
    )
    assert ok.accepted
    assert not bad.accepted and "max |Δscore|" in bad.reason


def test_quantisation_that_reorders_results_is_rejected_even_when_scores_are_close(holdout):
    _, labels, groups = holdout
    # Each request's 10 scores sit 0.004 apart; the candidate reverses their order, so no score
    # moves more than 0.036 (< int8's 0.05 tolerance) yet every top-5 is replaced.
    steps = np.tile(np.arange(10), 200).astype(np.float32)
    reference = 0.1 + 0.004 * steps
    reordered = 0.1 + 0.004 * (9 - steps)
    result = assess_parity("ort-int8", reference, reordered, labels, groups, TOLERANCES["ort-int8"])
    assert result.max_abs_diff <= TOLERANCES["ort-int8"].max_abs_diff
    assert not result.accepted and "top-5 overlap" in result.reason


def test_nan_scores_are_rejected(holdout):
    reference, labels, groups = holdout
    broken = reference.copy()
    broken[3] = np.nan
    result = assess_parity("ort-fp32", reference, broken, labels, groups, TOLERANCES["ort-fp32"])
    assert not result.accepted


def test_topk_overlap_counts_shared_items_per_request():
    groups = np.array([0] * 6 + [1] * 6)
    ref = np.array([6, 5, 4, 3, 2, 1, 6, 5, 4, 3, 2, 1], dtype=float)
    new = ref.copy()
    new[[4, 5]] = [10, 9]  # request 0: two outsiders enter its top 2
    assert topk_overlap(ref, new, groups, k=2) == pytest.approx((0 + 1) / 2)
