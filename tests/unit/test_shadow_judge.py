"""The shadow judge on synthetic pairs with known answers: an equal candidate passes, a uniform
or tail regression, shadow errors and disagreeing rankings fail naming the figure, thin or
biased (dropped) pairs are inconclusive."""

from __future__ import annotations

import numpy as np
import pytest

from core.gate.rules import CanaryRules, ShadowRules
from core.gate.shadow import MirrorCounts, ShadowEvidence, judge_shadow
from logstore.shadow import LEVELS, Clustered, ShadowSums
from relay.types import Verdict

K = 5


def clustered(users: np.ndarray, x: np.ndarray, counted: np.ndarray) -> Clustered:
    """Per-user sums as logstore.shadow's SQL computes them."""
    ids = np.unique(users, return_inverse=True)[1]
    n = np.bincount(ids, weights=counted.astype(float))
    s = np.bincount(ids, weights=np.where(counted, x, 0.0))
    return Clustered(n.sum(), s.sum(), (n * n).sum(), (s * s).sum(), (n * s).sum())


def pairs(
    n: int = 8000,
    users: int = 400,
    slowdown: float = 1.0,
    tail_share: float = 0.0,
    tail_factor: float = 5.0,
    error_share: float = 0.0,
    agreement: float = 1.0,
    seed: int = 7,
) -> ShadowSums:
    rng = np.random.default_rng(seed)
    user = rng.integers(0, users, n)
    per_user = rng.normal(0, 0.2, users)[user]  # a user's requests are alike (their size)
    stable = np.exp(3.0 + per_user + rng.normal(0, 0.5, n))  # ~20 ms, P95 ~50 ms
    shadow = stable * slowdown * np.exp(rng.normal(0, 0.1, n))
    shadow *= np.where(rng.random(n) < tail_share, tail_factor, 1.0)
    failed = rng.random(n) < error_share
    scored = ~failed
    d = np.log(shadow) - np.log(stable)
    overlap = np.where(rng.random(n) < agreement, 1.0, 0.0)
    return ShadowSums(
        users=len(np.unique(user)),
        latency=clustered(user, d, scored),
        latency_request_sq=float((d[scored] ** 2).sum()),
        errors=clustered(user, failed.astype(float), np.ones(n, bool)),
        agreement=clustered(user, overlap, scored),
        stable_quantiles_ms=tuple(np.quantile(stable[scored], LEVELS, method="inverted_cdf")),
        shadow_quantiles_ms=tuple(np.quantile(shadow[scored], LEVELS, method="inverted_cdf")),
    )


def judge(sums: ShadowSums, dropped: int = 0) -> tuple[Verdict, str]:
    counts = MirrorCounts(mirrored=sums.pairs, dropped=dropped)
    gate, _ = judge_shadow(sums, counts, ShadowRules(), CanaryRules(), ShadowEvidence())
    return gate.verdict, gate.reason


def test_an_equal_candidate_passes_in_shadow() -> None:
    verdict, reason = judge(pairs())
    assert verdict is Verdict.passed, reason
    assert "no regression beyond tolerance in shadow" in reason


def test_a_uniformly_slower_candidate_is_refused_in_shadow_naming_its_mean_ratio() -> None:
    verdict, reason = judge(pairs(slowdown=1.3))
    assert verdict is Verdict.failed
    assert "shadow latency x1.3" in reason and "beyond the tolerance" in reason


def test_a_tail_regressed_candidate_is_refused_on_its_p95_though_its_mean_is_within() -> None:
    # 6 % of requests 5x slower: x1.10 on the geometric mean, the P95 far beyond.
    sums = pairs(tail_share=0.06)
    counts = MirrorCounts(sums.pairs, 0)
    gate, _ = judge_shadow(sums, counts, ShadowRules(), CanaryRules(), ShadowEvidence())
    assert gate.verdict is Verdict.failed, gate.reason
    assert "P95" in gate.reason and "with confidence" in gate.reason
    # The mean alone would not have caught it: within the tolerance, not among the failures.
    assert gate.measurements["mean_ratio"] < gate.measurements["tolerance_ratio"]
    assert "shadow latency" not in gate.reason


def test_shadow_errors_count_as_the_candidates_and_fail_it() -> None:
    verdict, reason = judge(pairs(error_share=0.03))
    assert verdict is Verdict.failed
    assert "shadow errors" in reason and "beyond +0.5 pt" in reason


def test_a_candidate_ranking_unlike_stable_is_refused_on_its_top_k_overlap() -> None:
    verdict, reason = judge(pairs(agreement=0.2))
    assert verdict is Verdict.failed
    assert "top-k overlap with stable's answers 0.20" in reason and "below the floor" in reason


def test_too_few_pairs_are_inconclusive_with_the_counts() -> None:
    verdict, reason = judge(pairs(n=150, users=30))
    assert verdict is Verdict.inconclusive
    assert "150 pairs" in reason and "fewer than the 200 pairs" in reason


def test_a_full_mirror_queue_gives_no_pass_on_the_pairs_left() -> None:
    sums = pairs()
    verdict, reason = judge(sums, dropped=sums.pairs)  # half of the chosen requests dropped
    assert verdict is Verdict.inconclusive
    assert "mirror queue full" in reason and "50%" in reason


def test_looks_intersect_so_a_later_look_keeps_what_an_earlier_one_showed() -> None:
    rules, gate = ShadowRules(), CanaryRules()
    first, evidence = judge_shadow(
        pairs(seed=1), MirrorCounts(8000, 0), rules, gate, ShadowEvidence()
    )
    second, evidence = judge_shadow(pairs(seed=2), MirrorCounts(8000, 0), rules, gate, evidence)
    assert evidence.looks == 2
    assert second.measurements["mean_ratio_high"] <= first.measurements["mean_ratio_high"]


@pytest.mark.parametrize("field", ["share", "max_drop_share", "min_agreement"])
def test_bad_shadow_rules_are_refused_naming_the_field(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ShadowRules(**{field: 2.0})
