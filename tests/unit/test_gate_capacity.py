"""The capacity check's decision on synthetic load curves whose throughput at the SLO is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from core.gate.capacity import (
    CANDIDATE,
    CHAMPION,
    CapacityRules,
    Round,
    anchor_at_peak,
    bracket,
    curve,
    judge_capacity,
    throughput_at_slo,
)
from core.gate.rules import CanaryRules
from relay.types import Verdict

RATES = (100.0, 200.0, 400.0, 800.0, 1600.0)
SLO = 300.0


def rounds_for(version: str, capacity_rps: float, pairs: int = 2) -> list[Round]:
    """Rounds of a queue whose P95 is 5 ms below `capacity_rps` and grows linearly above it:
    P95 = 5 + (rate - capacity) ms, so the SLO (300 ms) is crossed at capacity + 295."""
    out = []
    for rate in RATES:
        p95 = 5.0 + max(rate - capacity_rps, 0.0)
        lat = tuple(np.full(100, p95))
        out += [Round(version, rate, lat, 0, min(rate, capacity_rps))] * pairs
    return out


def test_throughput_at_the_slo_is_interpolated_to_the_crossing() -> None:
    points = curve(rounds_for(CHAMPION, 1000.0), CHAMPION)
    got = throughput_at_slo(points, SLO, 0.01)
    # 800 req/s holds (5 ms), 1600 does not (605 ms): crossing at 800 + 800 * 295 / 600
    assert got.censored == "" and got.rps == pytest.approx(800 + 800 * 295 / 600)


def test_a_costlier_candidate_fails_naming_both_throughputs() -> None:
    rounds = rounds_for(CHAMPION, 1000.0) + rounds_for(CANDIDATE, 700.0)
    result = judge_capacity(rounds, 100.0, SLO, CapacityRules())
    assert result.verdict is Verdict.failed
    champ, cand = (
        result.measurements["champion_throughput_rps"],
        result.measurements["candidate_throughput_rps"],
    )
    assert cand < 0.9 * champ
    assert f"candidate {cand:.0f} req/s" in result.reason
    assert f"champion {champ:.0f} req/s" in result.reason


def test_an_equal_cost_twin_passes() -> None:
    rounds = rounds_for(CHAMPION, 1000.0) + rounds_for(CANDIDATE, 980.0)
    assert judge_capacity(rounds, 100.0, SLO, CapacityRules()).verdict is Verdict.passed


def test_the_champions_p95_at_peak_anchors_the_canarys_ms_tolerance_unless_the_run_set_one() -> (
    None
):
    rounds = rounds_for(CHAMPION, 50.0) + rounds_for(CANDIDATE, 49.0)
    checked = judge_capacity(rounds, 400.0, SLO, CapacityRules())
    assert checked.measurements["champion_p95_at_peak_ms"] == pytest.approx(355.0)  # 5 + 350
    anchored = anchor_at_peak(CanaryRules(), checked)
    assert anchored.peak_p95_ms == pytest.approx(355.0)
    assert anchored.latency_tolerance(5.0) == pytest.approx(1.10)  # not 1 + 5 / 5
    chosen = CanaryRules(peak_p95_ms=40.0)
    assert anchor_at_peak(chosen, checked) is chosen
    unmeasured = judge_capacity([], 400.0, SLO, CapacityRules())
    assert anchor_at_peak(CanaryRules(), unmeasured) == CanaryRules()


def test_both_holding_the_slo_at_every_rate_passes_censored() -> None:
    rounds = rounds_for(CHAMPION, 5000.0) + rounds_for(CANDIDATE, 5000.0)
    result = judge_capacity(rounds, 100.0, SLO, CapacityRules())
    assert result.verdict is Verdict.passed and ">= 1600 req/s" in result.reason


def test_a_candidate_that_answers_nothing_is_an_error() -> None:
    dead = [Round(CANDIDATE, r, (math.inf,) * 50, 50, 0.0) for r in RATES]
    result = judge_capacity(rounds_for(CHAMPION, 1000.0) + dead, 100.0, SLO, CapacityRules())
    assert result.verdict is Verdict.error and "answered nothing" in result.reason


def test_errors_above_the_limit_fail_a_rate() -> None:
    flaky = [Round(CANDIDATE, r, (5.0,) * 100, 5 if r >= 400 else 0, r) for r in RATES]
    result = judge_capacity(rounds_for(CHAMPION, 5000.0) + flaky, 100.0, SLO, CapacityRules())
    assert result.verdict is Verdict.failed
    assert result.measurements["candidate_throughput_rps"] == 200.0


def test_no_rounds_or_a_fault_is_never_a_pass() -> None:
    rules = CapacityRules()
    assert judge_capacity([], 100.0, SLO, rules).verdict is Verdict.inconclusive
    faulted = judge_capacity([], 100.0, SLO, rules, fault="worker unreachable")
    assert faulted.verdict is Verdict.error and "worker unreachable" in faulted.reason


def test_the_rate_ladder_starts_at_the_peak_doubles_and_is_capped() -> None:
    rules = CapacityRules(max_rate_rps=500)
    assert rules.bracket_rates(100.0) == [100.0, 200.0, 400.0, 500.0]
    assert rules.refined_rates(400.0, 500.0) == [425.0, 450.0, 475.0]


def test_the_bracket_is_where_either_version_first_misses_the_slo() -> None:
    rounds = rounds_for(CHAMPION, 1000.0) + rounds_for(CANDIDATE, 300.0)
    # the candidate: 400 req/s -> 105 ms, 800 -> 505 ms (missed); the champion holds at 800
    assert bracket(rounds, SLO, CapacityRules()) == (400.0, 800.0)


def test_a_peak_the_run_sets_is_the_ladder_start_and_the_log_store_is_not_read() -> None:
    from relay.settings import Settings
    from tasks.capacity import read_peak_per_worker

    unreachable = Settings(clickhouse_dsn="clickhouse://127.0.0.1:9/none")  # never dialled
    peak, basis = read_peak_per_worker(unreachable, CapacityRules(peak_rps=60.0), workers=2)
    assert peak == 60.0 and "as the run set it" in basis
