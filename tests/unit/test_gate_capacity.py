"""The capacity check's decision on synthetic load curves whose throughput at the SLO is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from core.gate.capacity import (
    CANDIDATE,
    CHAMPION,
    CapacityRules,
    CurvePoint,
    Round,
    anchor_at_peak,
    brackets,
    curve,
    judge_capacity,
    monotone,
    refined_plan,
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


def test_a_champion_censored_at_the_cap_cannot_clear_a_candidate_that_crossed_below_it() -> None:
    # the champion holds at every rate up to 1,600; the candidate crosses at 1,595 (within
    # 10 % of 1,600), but the champion's true throughput may be far higher
    rounds = rounds_for(CHAMPION, 5000.0) + rounds_for(CANDIDATE, 1300.0)
    result = judge_capacity(rounds, 100.0, SLO, CapacityRules())
    assert result.verdict is Verdict.inconclusive
    assert "max_rate_rps" in result.reason and "champion >= 1600 req/s" in result.reason
    # far enough below the cap, the shortfall is beyond the tolerance whatever the champion's is
    rounds = rounds_for(CHAMPION, 5000.0) + rounds_for(CANDIDATE, 1000.0)
    assert judge_capacity(rounds, 100.0, SLO, CapacityRules()).verdict is Verdict.failed


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


def test_each_version_has_its_own_bracket_and_both_crossings_are_refined_for_both() -> None:
    rounds = rounds_for(CHAMPION, 1000.0, pairs=1) + rounds_for(CANDIDATE, 300.0, pairs=1)
    # the candidate: 400 req/s -> 105 ms, 800 -> 505 ms (missed); the champion: 800 -> 5 ms,
    # 1600 -> 605 ms (missed). Refining only the first miss would leave the champion's crossing
    # to one interpolation across 800..1600.
    assert brackets(rounds, SLO, CapacityRules()) == {
        CANDIDATE: (400.0, 800.0),
        CHAMPION: (800.0, 1600.0),
    }
    assert refined_plan(rounds, SLO, CapacityRules()) == [
        500.0, 600.0, 700.0, 1000.0, 1200.0, 1400.0
    ]  # fmt: skip


def test_a_version_that_never_crosses_inside_the_ladder_has_no_bracket() -> None:
    held_everywhere = rounds_for(CHAMPION, 5000.0, pairs=1)
    missed_at_once = [Round(CANDIDATE, r, (900.0,) * 50, 0, r) for r in RATES]
    assert brackets(held_everywhere + missed_at_once, SLO, CapacityRules()) == {}


def test_the_monotone_fit_pools_a_rate_measured_below_its_lower_neighbour() -> None:
    def point(rate: float, p95: float, n: int) -> CurvePoint:
        return CurvePoint(rate, n, p95, 0.0, rate)

    # measured: 2,240 req/s 360 ms, 2,560 req/s 161 ms (a short round, not a faster queue)
    raw = [point(1920, 100.0, 3000), point(2240, 360.0, 3000), point(2560, 160.0, 1000)]
    pooled = (360 * 3000 + 160 * 1000) / 4000  # 310 ms, weighted by requests
    assert [p.p95_ms for p in monotone(raw)] == [100.0, pooled, pooled]
    # raw, the SLO is first missed at 2,240; fitted (310 ms at 2,240 and 2,560), also there,
    # but an upper rate no longer reads as holding: 2,560 is not a second crossing
    assert [p.holds(SLO, 0.01) for p in monotone(raw)] == [True, False, False]
    got = throughput_at_slo(raw, SLO, 0.01)
    assert got.rps == pytest.approx(1920 + 320 * (300 - 100) / (310 - 100))
    unanswered = [point(1000, 50.0, 100), point(2000, math.inf, 100), point(3000, 80.0, 100)]
    assert [p.p95_ms for p in monotone(unanswered)] == [50.0, math.inf, math.inf]
    increasing = [point(r, r / 10, 100) for r in (100, 200, 300)]
    assert monotone(increasing) == increasing


def test_a_peak_the_run_sets_is_the_ladder_start_and_the_log_store_is_not_read() -> None:
    from relay.settings import Settings
    from tasks.capacity import read_peak_per_worker

    unreachable = Settings(clickhouse_dsn="clickhouse://127.0.0.1:9/none")  # never dialled
    peak, basis = read_peak_per_worker(unreachable, CapacityRules(peak_rps=60.0), workers=2)
    assert peak == 60.0 and "as the run set it" in basis
