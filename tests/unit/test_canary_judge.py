"""The canary gate's pure core: sequential verdicts from per-user sums, and the plan."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from core.gate.sequential import (
    Estimate,
    always_valid_p,
    click_through_shift,
    confidence_sequence,
    latency_shift,
    mean_log_latency,
)
from logstore.feedback import ClickSums
from logstore.slo import CohortSums, cohort_sums_of, paired_seconds_of
from relay.errors import LogStoreError
from relay.types import Verdict
from tasks.canary_analysis import (
    CanaryRules,
    StepEvidence,
    StepFigures,
    StepIO,
    judge_window,
    run_step,
)
from tasks.canary_plan import plan_canary, windows_needed

RULES = CanaryRules()


def cohort(
    slot: str,
    rng: np.random.Generator,
    n: int,
    factor: float = 1.0,
    error_rate: float = 0.0,
    users: int = 400,
    median_ms: float = 20.0,
    user_sd: float = 0.0,
) -> CohortSums:
    """Lognormal latencies (P95 ~ 2.5x median) from `users` sticky users, optionally slowed."""
    user_ids = rng.integers(0, users, n)
    user_effect = rng.normal(0.0, user_sd, users)[user_ids] if user_sd else 0.0
    latency = np.exp(rng.normal(math.log(median_ms), 0.55, n) + user_effect) * factor
    status = np.where(rng.random(n) < error_rate, 500, 200)
    ts = rng.uniform(0, 60, n)  # a minute of traffic
    return cohort_sums_of(slot, "v2" if slot == "canary" else "v1", user_ids, latency, status, ts)


def judge(canary: CohortSums, baseline: CohortSums, rules: CanaryRules = RULES):
    return judge_window(StepFigures(canary, baseline), rules, StepEvidence())


def test_equal_canary_with_enough_traffic_passes_and_says_why() -> None:
    rng = np.random.default_rng(1)
    canary, baseline = (
        cohort("canary", rng, 12_000, users=2000),
        cohort("baseline", rng, 12_000, users=2000),
    )
    gate, evidence = judge(canary, baseline)
    assert gate.verdict is Verdict.passed, gate.reason
    assert "no regression beyond tolerance" in gate.reason and "always-valid 95%" in gate.reason
    m = gate.measurements
    assert m["latency_ratio_low"] < 1.0 < m["latency_ratio_high"] < m["latency_tolerance_ratio"]
    assert m["p95_ratio_low"] < 1.0 < m["p95_ratio_high"] < m["latency_tolerance_ratio"]
    assert "P95 ratio" in gate.reason
    assert m["canary_requests"] == 12_000 and m["look"] == 1 and evidence.looks == 1
    assert "mSPRT" in gate.method and "per-user" in gate.method and "per-second" in gate.method


def test_canary_slower_by_half_fails_by_the_relative_rule_under_the_absolute_slo() -> None:
    rng = np.random.default_rng(2)
    gate, _ = judge(cohort("canary", rng, 1000, factor=1.5), cohort("baseline", rng, 1000))
    assert gate.verdict is Verdict.failed
    assert gate.reason.startswith("relative to baseline") and "absolute" not in gate.reason
    assert gate.measurements["canary_p95_ms"] < RULES.max_p95_ms
    assert gate.measurements["latency_ratio_low"] > 1.0


def test_a_clear_but_small_slowdown_within_tolerance_is_not_a_failure() -> None:
    rng = np.random.default_rng(3)  # +4 %: detectable with this much data, but within +10 %
    gate, _ = judge(cohort("canary", rng, 40_000, factor=1.04), cohort("baseline", rng, 40_000))
    assert gate.measurements["latency_ratio_low"] > 1.0  # statistically clear ...
    assert gate.verdict is Verdict.passed, gate.reason  # ... and practically irrelevant


def test_tolerance_floor_in_ms_applies_when_baseline_is_fast() -> None:
    # baseline P95 ~ 12 ms: 10 % is 1.2 ms, so the +5 ms floor sets the tolerance
    assert RULES.latency_tolerance(12.0) == pytest.approx(1 + 5 / 12)
    assert RULES.latency_tolerance(200.0) == pytest.approx(1.10)


def test_the_ms_floor_counts_at_the_peak_p95_so_a_light_hour_does_not_hide_a_slowdown() -> None:
    # at a light hour the baseline's P95 is ~5 ms: +5 ms of it would let a canary x1.9 through,
    # though at peak (P95 34 ms) the same x1.5 costs 17 ms
    anchored = dataclasses.replace(RULES, peak_p95_ms=34.0)
    assert anchored.latency_tolerance(5.0) == pytest.approx(1 + 5 / 34)
    assert anchored.latency_tolerance(40.0) == pytest.approx(1 + 5 / 40)  # busier now: now's
    assert anchored.thresholds()["peak_p95_ms"] == 34.0
    rng = np.random.default_rng(21)
    canary = cohort("canary", rng, 6_000, factor=1.5, median_ms=2.0, users=1000)
    baseline = cohort("baseline", rng, 6_000, median_ms=2.0, users=1000)
    assert judge(canary, baseline)[0].verdict is Verdict.passed  # within x1.9 at this hour
    gate, _ = judge(canary, baseline, anchored)
    assert gate.verdict is Verdict.failed, gate.reason
    assert gate.measurements["latency_tolerance_ratio"] == pytest.approx(1 + 5 / 34)
    with pytest.raises(ValueError, match="peak_p95_ms"):
        CanaryRules(peak_p95_ms=0.0)


def test_rules_anchor_at_a_measured_peak_only_where_the_run_set_none() -> None:
    assert RULES.anchored(34.0456).peak_p95_ms == 34.046
    chosen = CanaryRules(peak_p95_ms=40.0)
    assert chosen.anchored(34.0) is chosen  # the run's own figure stands
    for missing in (None, 0.0, -3.0, float("nan"), float("inf")):
        assert RULES.anchored(missing) is RULES  # no figure: the baseline's P95 during the step


def test_swapped_cohorts_would_not_fail_a_faster_canary() -> None:
    rng = np.random.default_rng(4)  # a faster canary must never fail the relative rule
    gate, _ = judge(cohort("canary", rng, 1000), cohort("baseline", rng, 1000, factor=1.5))
    assert gate.verdict is Verdict.passed, gate.reason


def test_too_few_requests_is_inconclusive_and_names_the_counts() -> None:
    rng = np.random.default_rng(5)
    gate, evidence = judge(cohort("canary", rng, 150), cohort("baseline", rng, 150))
    assert gate.verdict is Verdict.inconclusive
    assert "150 requests" in gate.reason and "200" in gate.reason
    assert evidence.looks == 0  # nothing was looked at


def test_missing_baseline_is_inconclusive_never_passed() -> None:
    rng = np.random.default_rng(6)
    gate, _ = judge_window(StepFigures(cohort("canary", rng, 900), None), RULES, StepEvidence())
    assert gate.verdict is Verdict.inconclusive and "baseline" in gate.reason


def test_canary_over_the_absolute_slo_fails_even_against_an_equally_slow_baseline() -> None:
    rng = np.random.default_rng(7)
    gate, _ = judge(
        cohort("canary", rng, 1000, median_ms=200), cohort("baseline", rng, 1000, median_ms=200)
    )
    assert gate.verdict is Verdict.failed and gate.reason.startswith("absolute SLO: canary P95")


def test_more_errors_than_baseline_fails_by_the_two_proportion_rule() -> None:
    rng = np.random.default_rng(8)
    rules = CanaryRules(max_error_rate=0.05)  # keep the absolute rule out of the way
    gate, _ = judge(
        cohort("canary", rng, 6000, error_rate=0.02), cohort("baseline", rng, 6000), rules
    )
    assert gate.verdict is Verdict.failed
    assert "canary errors" in gate.reason and "pt tolerance" in gate.reason
    assert gate.measurements["error_diff_low"] > 0


def with_errors(n: int, errors: int, rng: np.random.Generator, users: int = 400) -> CohortSums:
    """A canary cohort of `n` requests, exactly `errors` of them 5xx, each from its own user."""
    user_ids = rng.integers(0, users, n)
    latency = np.exp(rng.normal(math.log(20.0), 0.55, n))
    status = np.full(n, 200)
    status[rng.choice(n, errors, replace=False)] = 500
    return cohort_sums_of("canary", "v2", user_ids, latency, status, rng.uniform(0, 60, n))


def test_the_absolute_error_slo_fails_with_confidence_not_on_three_errors_in_250() -> None:
    rng = np.random.default_rng(10)
    thin = with_errors(250, 3, rng)  # 1.2 %: over 1 %, by chance at 0.1 %
    gate, _ = judge(thin, cohort("baseline", rng, 250))
    assert "absolute SLO: canary error rate" not in gate.reason, gate.reason
    assert gate.verdict is not Verdict.passed  # nor is it a pass: the errors' interval is wide
    rng = np.random.default_rng(11)
    rules = CanaryRules(error_tolerance_pt=50.0)  # the relative rule out of the way
    broken = cohort("canary", rng, 3000, error_rate=0.05)
    gate, _ = judge(broken, cohort("baseline", rng, 3000, error_rate=0.05), rules)
    assert gate.verdict is Verdict.failed
    assert gate.reason.startswith("absolute SLO: canary error rate") and "low end" in gate.reason


def test_a_step_fails_only_at_the_rollback_confidence_and_passes_at_the_step_confidence() -> None:
    """x1.17 on 300 requests each: the always-valid p is 0.017, beyond 95 % but not 99 %."""
    rng = np.random.default_rng(6)
    canary, baseline = cohort("canary", rng, 300, factor=1.25), cohort("baseline", rng, 300)
    at_99, _ = judge(canary, baseline)
    assert 0.01 < at_99.measurements["latency_p_always_valid"] < 0.05
    assert at_99.verdict is Verdict.inconclusive, at_99.reason  # not yet sure enough to roll back
    assert at_99.thresholds["rollback_confidence"] == 0.99
    at_95, _ = judge(canary, baseline, CanaryRules(rollback_confidence=0.951))
    assert at_95.verdict is Verdict.failed and at_95.reason.startswith("relative to baseline")
    with pytest.raises(ValueError, match="rollback_confidence"):
        CanaryRules(rollback_confidence=1.0)
    with pytest.raises(ValueError, match="below confidence"):
        CanaryRules(rollback_confidence=0.9)  # failing on less evidence than passing


def test_a_canary_over_the_error_slo_but_not_yet_surely_does_not_pass() -> None:
    """1.05 % errors against a 1 % SLO, on 40k requests a side: not sure enough to roll back,
    and never a pass (as for a P95 over its SLO)."""
    rng = np.random.default_rng(12)
    canary = with_errors(40_000, 420, rng, users=8000)
    baseline = cohort("baseline", rng, 40_000, error_rate=0.0105, users=8000)
    gate, _ = judge(canary, baseline)
    assert gate.verdict is Verdict.inconclusive, gate.reason
    assert "absolute SLO" not in gate.reason


def test_no_errors_anywhere_still_has_an_honest_interval() -> None:
    rng = np.random.default_rng(9)
    gate, _ = judge(cohort("canary", rng, 300), cohort("baseline", rng, 300))
    assert gate.measurements["error_diff_high"] > 0  # not a zero-width interval from zero errors


def test_evidence_accumulates_across_looks_and_intervals_only_narrow() -> None:
    rng = np.random.default_rng(10)
    evidence = StepEvidence()
    widths = []
    canary, baseline = [], []
    for _ in range(4):
        canary.append(rng.normal(math.log(20), 0.55, 250))
        baseline.append(rng.normal(math.log(20), 0.55, 250))
        figures = StepFigures(
            cohort_sums_of(
                "canary",
                "v2",
                np.arange(len(np.concatenate(canary))) % 300,
                np.exp(np.concatenate(canary)),
                np.full(len(np.concatenate(canary)), 200),
                np.arange(len(np.concatenate(canary))) / 25.0,
            ),
            cohort_sums_of(
                "baseline",
                "v1",
                np.arange(len(np.concatenate(baseline))) % 300,
                np.exp(np.concatenate(baseline)),
                np.full(len(np.concatenate(baseline)), 200),
                np.arange(len(np.concatenate(baseline))) / 25.0,
            ),
        )
        gate, evidence = judge_window(figures, RULES, evidence)
        widths.append(evidence.latency.high - evidence.latency.low)
    assert evidence.looks == 4 and gate.measurements["look"] == 4
    assert all(b <= a for a, b in zip(widths, widths[1:], strict=False))


def test_clustered_users_widen_the_interval() -> None:
    """Sticky routing: heavy users' requests are correlated, so the per-user variance is larger."""
    rng = np.random.default_rng(11)
    independent = mean_log_latency(cohort("canary", rng, 4000, users=4000))
    clustered = mean_log_latency(cohort("canary", rng, 4000, users=40, user_sd=0.5))
    assert clustered.variance > 5 * independent.variance


def test_a_slot_whose_queue_swings_over_time_widens_the_interval() -> None:
    """Each slot has its own batcher: a queue that builds up slows every request of that moment."""
    rng = np.random.default_rng(14)
    n = 6000
    ts = np.sort(rng.uniform(0, 60, n))
    users = rng.integers(0, 3000, n)
    calm = np.exp(rng.normal(math.log(20), 0.5, n))
    swings = calm * np.exp(rng.normal(0, 0.4, 60))[ts.astype(int)]  # one queue state per second
    steady = mean_log_latency(cohort_sums_of("c", "v", users, calm, np.full(n, 200), ts))
    bursty = mean_log_latency(cohort_sums_of("c", "v", users, swings, np.full(n, 200), ts))
    assert bursty.variance > 5 * steady.variance


def test_pairing_by_second_removes_load_swings_canary_and_baseline_share() -> None:
    """A busy second slows both cohorts: their difference should not pay for it twice."""
    rng = np.random.default_rng(15)
    n = 6000
    load = np.exp(rng.normal(0, 0.4, 60))  # the host's load, second by second

    def rows(offset: int) -> tuple[np.ndarray, ...]:
        ts = np.sort(rng.uniform(0, 60, n))
        latency = np.exp(rng.normal(math.log(20), 0.5, n)) * load[ts.astype(int)]
        return rng.integers(0, 3000, n) + offset, latency, np.full(n, 200), ts

    c_rows, b_rows = rows(0), rows(10_000)
    c = cohort_sums_of("canary", "v2", *c_rows)
    b = cohort_sums_of("baseline", "v1", *b_rows)
    unpaired = latency_shift(c, b, None)
    paired = latency_shift(c, b, paired_seconds_of(c_rows, b_rows))
    assert paired.value == unpaired.value
    assert paired.variance < unpaired.variance / 4
    gate, _ = judge_window(
        StepFigures(c, b, paired=paired_seconds_of(c_rows, b_rows)), RULES, StepEvidence()
    )
    assert gate.verdict is Verdict.passed, gate.reason


def test_confidence_sequence_is_wider_than_a_fixed_sample_interval_and_p_matches_it() -> None:
    estimate = Estimate(0.05, 0.0004)  # se 0.02
    cs = confidence_sequence(estimate, tau=0.1, alpha=0.05)
    assert cs.high - estimate.value > 1.96 * 0.02  # paying for looking at every window
    # the interval excludes 0 exactly when the always-valid p-value is below alpha
    assert (cs.low > 0) == (always_valid_p(estimate, 0.1) < 0.05)
    assert always_valid_p(Estimate(0.0, 0.0004), 0.1) == 1.0


def test_aa_false_failures_stay_under_alpha_over_many_looks() -> None:
    """Looking after every window does not inflate false rollbacks (the point of mSPRT)."""
    rng = np.random.default_rng(12)
    failed = 0
    for _ in range(300):
        evidence = StepEvidence()
        c_rows, b_rows = [], []
        for _ in range(10):
            c_rows.append(rng.normal(math.log(40), 0.8, 60))
            b_rows.append(rng.normal(math.log(40), 0.8, 60))
            c, b = np.exp(np.concatenate(c_rows)), np.exp(np.concatenate(b_rows))
            gate, evidence = judge_window(
                StepFigures(
                    cohort_sums_of(
                        "canary",
                        "v2",
                        np.arange(len(c)) % 97,
                        c,
                        np.full(len(c), 200),
                        np.arange(len(c)) / 3.0,
                    ),
                    cohort_sums_of(
                        "baseline",
                        "v1",
                        np.arange(len(b)) % 89,
                        b,
                        np.full(len(b), 200),
                        np.arange(len(b)) / 3.0,
                    ),
                ),
                CanaryRules(tolerance_pct=0.0, tolerance_ms=0.001),  # any clear slowdown fails
                evidence,
            )
            if gate.verdict is not Verdict.inconclusive:
                break
        failed += gate.verdict is Verdict.failed
    assert failed / 300 <= 0.05


@pytest.mark.parametrize(
    ("field", "value"),
    [("confidence", 0.5), ("confidence", 1.0), ("tolerance_pct", -1.0), ("max_windows", 0)],
)
def test_bad_rules_are_refused_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        CanaryRules(**{field: value})


def test_plan_says_how_many_windows_each_step_needs_and_when_it_cannot() -> None:
    rng = np.random.default_rng(13)
    recent = cohort("stable", rng, 5000, users=2000)
    plan = plan_canary(recent, 500.0, [5, 25, 50], 20.0, RULES)
    windows = [s.windows for s in plan.steps]
    assert plan.reachable and all(w is not None for w in windows)
    assert windows[1] >= windows[2]  # more share, fewer windows
    assert plan.summary.startswith("5 %: guard step") and "minutes" in plan.summary
    assert [s.guard for s in plan.steps] == [True, False, False]
    quiet = plan_canary(recent, 2.0, [5, 25, 50], 20.0, RULES)
    assert not quiet.reachable and "5 %: not within 10 windows" in quiet.summary
    assert "50 %: not within 40 windows" in quiet.summary  # the last step may run longer
    unknown = plan_canary(None, 60.0, [5], 20.0, RULES)  # 60 a window: 200 within 40 windows
    assert unknown.reachable and "no recent traffic of the champion" in unknown.summary
    closed = plan_canary(None, 2.0, [5], 20.0, RULES)  # 2 a window: 80 in 40 windows
    assert not closed.reachable and "cannot reach 200 requests per cohort" in closed.summary
    brief = plan_canary(recent, 2.0, [50], 1.0, RULES)  # 1 s windows: seconds, not 0.0 minutes
    assert brief.summary.endswith("about 40 s") or "about 40 s;" in brief.summary


def test_plan_at_30_requests_a_second_guards_the_thin_steps_and_lengthens_the_last() -> None:
    """At 30 req/s no step can show the P95 within tolerance in 10 windows: the plan does not
    ask a person for that; the early steps guard against harm and the last one runs longer."""
    rng = np.random.default_rng(14)
    recent = cohort("stable", rng, 5000, users=2000)
    plan = plan_canary(recent, 30.0, [5, 25, 50], 20.0, RULES)
    first, second, last = plan.steps
    assert plan.reachable and first.guard and second.guard and not last.guard
    assert first.windows * first.requests_per_window >= RULES.min_requests
    assert last.windows is not None and RULES.max_windows < last.windows <= RULES.plan_max_windows
    assert last.length(RULES).windows == RULES.plan_max_windows and not last.length(RULES).guard
    assert "guard step" in plan.summary and "harm only" in plan.summary


# -- the step loop, with fake windows, log store and fleet ---------------------------------


class FakeStep:
    """Windows one second apart; figures from a list (or an exception); a fleet that may die."""

    def __init__(self, figures: list, lost_after: int | None = None) -> None:
        self.figures, self.lost_after, self.windows = list(figures), lost_after, 0
        self.seen: list[tuple[int, Verdict]] = []

    def io(self) -> StepIO:
        def run_window() -> tuple[datetime, datetime]:
            self.windows += 1
            start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=self.windows)
            return start, start + timedelta(seconds=1)

        def read(step_start: datetime, start: datetime, end: datetime) -> StepFigures:
            item = self.figures.pop(0)
            if isinstance(item, Exception):
                raise item
            return item

        def lost() -> list[str]:
            died = self.lost_after is not None and self.windows > self.lost_after
            return ["http://127.0.0.1:9"] if died else []

        return StepIO(run_window, read, lost, lambda w, g: self.seen.append((w, g.verdict)))


def test_step_stops_at_the_first_conclusive_look_and_reports_each_look() -> None:
    rng = np.random.default_rng(20)
    thin = StepFigures(cohort("canary", rng, 50), cohort("baseline", rng, 50))
    enough = StepFigures(cohort("canary", rng, 3000), cohort("baseline", rng, 3000))
    step = FakeStep([thin, enough, enough])
    looks = run_step(step.io(), RULES, 25)
    assert [g.verdict for g in looks] == [Verdict.inconclusive, Verdict.passed]
    assert step.seen == [(1, Verdict.inconclusive), (2, Verdict.passed)]


def test_a_bug_in_the_analysis_is_an_error_at_once_never_inconclusive() -> None:
    broken = StepFigures(canary="not a cohort", baseline="nor this")  # type: ignore[arg-type]
    looks = run_step(FakeStep([broken] * 10).io(), RULES, 5)
    assert len(looks) == 1 and looks[0].verdict is Verdict.error
    assert "the canary analysis itself failed" in looks[0].reason


def test_failed_log_queries_are_an_error_only_after_the_consecutive_limit() -> None:
    failure = LogStoreError("ClickHouse at chdb://x unreachable")
    looks = run_step(FakeStep([failure] * 10).io(), RULES, 5)
    assert [g.verdict for g in looks] == [Verdict.inconclusive] * 3 + [Verdict.error]
    assert "4 consecutive failed log queries" in looks[-1].reason


def test_a_worker_that_stops_answering_is_an_error_naming_it() -> None:
    rng = np.random.default_rng(21)
    thin = StepFigures(cohort("canary", rng, 50), cohort("baseline", rng, 50))
    looks = run_step(FakeStep([thin] * 10, lost_after=2).io(), RULES, 5)
    assert [g.verdict for g in looks] == [Verdict.inconclusive] * 2 + [Verdict.error]
    assert "unreachable mid-canary: http://127.0.0.1:9" in looks[-1].reason


def test_undecided_after_the_last_window_says_so() -> None:
    rng = np.random.default_rng(22)
    thin = StepFigures(cohort("canary", rng, 50), cohort("baseline", rng, 50))
    looks = run_step(FakeStep([thin] * 3).io(), CanaryRules(max_windows=3), 5)
    assert len(looks) == 3 and looks[-1].verdict is Verdict.inconclusive
    assert looks[-1].reason.startswith("still inconclusive after all 3 windows at 5 %")


def clicks_of(
    slot: str,
    rng: np.random.Generator,
    users: int,
    ctr: float,
    impressions_per_user: float = 40.0,
    user_sd: float = 0.8,
) -> ClickSums:
    """Per-user impressions and clicks: each user's own CTR spread around `ctr` (logit normal)."""
    n = rng.poisson(impressions_per_user, users).astype(float) + 1
    logit = math.log(ctr / (1 - ctr)) + rng.normal(0.0, user_sd, users)
    k = rng.binomial(n.astype(int), 1 / (1 + np.exp(-logit))).astype(float)
    version = "v2" if slot == "canary" else "v1"
    return ClickSums(
        slot,
        version,
        users,
        n.sum(),
        k.sum(),
        float((n * n).sum()),
        float((k * k).sum()),
        float((n * k).sum()),
    )


def judge_with_clicks(canary_ctr: float, baseline_ctr: float, users: int, seed: int):
    rng = np.random.default_rng(seed)
    figures = StepFigures(
        cohort("canary", rng, 12_000, users=2000),  # enough for the P95's interval too
        cohort("baseline", rng, 12_000, users=2000),
        clicks_canary=clicks_of("canary", rng, users, canary_ctr),
        clicks_baseline=clicks_of("baseline", rng, users, baseline_ctr),
    )
    return judge_window(figures, RULES, StepEvidence())[0]


def test_a_canary_that_serves_fast_but_loses_clicks_fails_on_click_through() -> None:
    gate = judge_with_clicks(0.03, 0.048, users=800, seed=21)  # x0.62, as a feed upside down
    assert gate.verdict is Verdict.failed, gate.reason
    assert gate.reason.startswith("fewer clicks than baseline: click-through canary")
    assert "-10 % click-through tolerance" in gate.reason and "latency" not in gate.reason
    m = gate.measurements
    assert m["latency_ratio_high"] < m["latency_tolerance_ratio"]  # latency alone would pass
    assert m["ctr_judged"] == 1 and m["ctr_ratio_high"] < 1.0 and m["ctr_ratio"] < 0.9


def test_equal_click_through_passes_and_the_verdict_states_its_interval() -> None:
    gate = judge_with_clicks(0.048, 0.048, users=800, seed=22)
    assert gate.verdict is Verdict.passed, gate.reason
    assert (
        "click-through canary" in gate.reason and "impressions from 800 vs 800 users" in gate.reason
    )
    m = gate.measurements
    assert m["ctr_ratio_low"] < 1.0 < m["ctr_ratio_high"]


def test_a_small_click_loss_within_tolerance_is_not_a_failure() -> None:
    gate = judge_with_clicks(0.046, 0.048, users=20_000, seed=23)  # -4 %, clear with this much
    assert gate.measurements["ctr_ratio_high"] < 1.0  # statistically clear ...
    assert gate.verdict is Verdict.passed, gate.reason  # ... and within the 10 % tolerance


def test_too_few_impressions_leaves_clicks_unjudged_and_says_so() -> None:
    rng = np.random.default_rng(24)
    figures = StepFigures(
        cohort("canary", rng, 12_000, users=2000),  # enough for the P95's interval too
        cohort("baseline", rng, 12_000, users=2000),
        clicks_canary=clicks_of("canary", rng, 30, 0.01, impressions_per_user=10),
        clicks_baseline=clicks_of("baseline", rng, 30, 0.05, impressions_per_user=10),
    )
    gate, _ = judge_window(figures, RULES, StepEvidence())
    assert gate.verdict is Verdict.passed, gate.reason  # on latency and errors alone ...
    assert (
        "clicks not judged yet: canary" in gate.reason and "needs 2000 impressions" in gate.reason
    )
    assert gate.measurements["ctr_judged"] == 0  # ... and saying clicks were not judged
    silent, _ = judge(cohort("canary", rng, 3000), cohort("baseline", rng, 3000))
    assert "no impressions logged for canary or baseline" in silent.reason


def test_users_who_click_alike_widen_the_click_through_interval() -> None:
    rng = np.random.default_rng(25)
    alike = click_through_shift(
        clicks_of("canary", rng, 500, 0.05, user_sd=1.5),
        clicks_of("baseline", rng, 500, 0.05, user_sd=1.5),
    )
    independent = click_through_shift(
        clicks_of("canary", rng, 500, 0.05, user_sd=0.0),
        clicks_of("baseline", rng, 500, 0.05, user_sd=0.0),
    )
    assert alike.variance > 1.5 * independent.variance


def test_aa_click_intervals_cover_equal_click_through_at_every_look() -> None:
    """Equal click-through, judged after every window of a growing canary by the default rules:
    the interval excludes x1 at any look in at most 5 % of canaries (what always-valid means)."""
    rng = np.random.default_rng(26)
    excluded = 0

    def sums(slot: str, n: np.ndarray, k: np.ndarray) -> ClickSums:
        version = "v2" if slot == "canary" else "v1"
        nn, kk, nk = (n * n).sum(), (k * k).sum(), (n * k).sum()
        return ClickSums(slot, version, len(n), n.sum(), k.sum(), nn, kk, nk)

    for _ in range(300):
        evidence = StepEvidence()
        n, k, m, j = (np.zeros(0) for _ in range(4))
        for _ in range(10):  # each look adds 60 users per cohort, each with their own CTR
            new_n = rng.poisson(20, 60).astype(float) + 1
            new_m = rng.poisson(20, 60).astype(float) + 1
            p_c = 1 / (1 + np.exp(-(math.log(0.05 / 0.95) + rng.normal(0, 0.8, 60))))
            p_b = 1 / (1 + np.exp(-(math.log(0.05 / 0.95) + rng.normal(0, 0.8, 60))))
            n, k = np.append(n, new_n), np.append(k, rng.binomial(new_n.astype(int), p_c))
            m, j = np.append(m, new_m), np.append(j, rng.binomial(new_m.astype(int), p_b))
            figures = StepFigures(
                cohort("canary", rng, 400),
                cohort("baseline", rng, 400),
                clicks_canary=sums("canary", n, k),
                clicks_baseline=sums("baseline", m, j),
            )
            gate, evidence = judge_window(figures, RULES, evidence)
            high, low = (
                gate.measurements.get("ctr_ratio_high"),
                gate.measurements.get("ctr_ratio_low"),
            )
            if high is not None and low is not None and not low <= 1.0 <= high:
                excluded += 1
                break
    assert excluded / 300 <= 0.05


def test_a_canary_whose_clicks_stop_altogether_fails() -> None:
    rng = np.random.default_rng(28)
    baseline = clicks_of("baseline", rng, 800, 0.05)
    silent = ClickSums("canary", "v2", 800, baseline.impressions, 0.0, baseline.nn, 0.0, 0.0)
    figures = StepFigures(
        cohort("canary", rng, 12_000, users=2000),  # enough for the P95's interval too
        cohort("baseline", rng, 12_000, users=2000),
        clicks_canary=silent,
        clicks_baseline=baseline,
    )
    gate, _ = judge_window(figures, RULES, StepEvidence())
    assert gate.verdict is Verdict.failed and "fewer clicks than baseline" in gate.reason
    assert gate.measurements["ctr_ratio"] == 0.0 and gate.measurements["ctr_ratio_high"] < 0.1


def test_load_swings_both_cohorts_share_do_not_lengthen_the_plan_beyond_what_the_judge_needs() -> (
    None
):
    """A busy host slows every request of a second alike. The judge subtracts that shared part
    (pairing by second), so the plan must not count it: planned on the two-way variance, a step
    looked several times longer than it is. The plan's count of windows is what the judge needs."""
    rng = np.random.default_rng(31)
    load = np.exp(rng.normal(0, 0.6, 600))  # ten minutes of a busy host, second by second
    rules = CanaryRules(error_tolerance_pt=100.0)  # latency alone sets the length here

    def rows(n: int, offset: int) -> tuple[np.ndarray, ...]:
        ts = np.sort(rng.uniform(0, 600, n))
        latency = np.exp(rng.normal(math.log(8), 0.5, n)) * load[ts.astype(int)]
        return rng.integers(0, 3000, n) + offset, latency, np.full(n, 200), ts

    stable = cohort_sums_of("stable", "v1", *rows(6000, 0))
    tolerance = math.log(rules.latency_tolerance(stable.p95_ms))
    two_way = windows_needed(mean_log_latency(stable).variance * 6000, 200, tolerance, rules)
    plan = plan_canary(stable, 40.0, [50], 10.0, rules)  # 200 requests a window per cohort
    [step] = plan.steps
    assert step.windows is not None and (two_way is None or step.windows * 3 <= two_way)
    n = int(step.windows * step.requests_per_window)
    passed = 0
    for trial in range(40):  # an equal canary, sharing the host's swings with its baseline
        c_rows, b_rows = rows(n, 10_000 * (2 * trial + 1)), rows(n, 10_000 * (2 * trial + 2))
        figures = StepFigures(
            cohort_sums_of("canary", "v2", *c_rows),
            cohort_sums_of("baseline", "v1", *b_rows),
            paired=paired_seconds_of(c_rows, b_rows),
        )
        gate, _ = judge_window(figures, rules, StepEvidence())
        passed += gate.verdict is Verdict.passed
    assert passed / 40 >= 0.65  # the plan's target power is 80 %


def test_plan_waits_for_the_errors_interval_too_not_just_latency() -> None:
    """With no 5xx at all the errors' interval narrows as 1/n: that, not latency, sets the length."""
    rng = np.random.default_rng(27)
    recent = cohort("stable", rng, 5000, users=2000, median_ms=2.5)  # P95 ~6 ms, like the fleet
    tolerance = math.log(RULES.latency_tolerance(recent.p95_ms))
    per_request = mean_log_latency(recent).variance * recent.answered
    latency_only = CanaryRules(error_tolerance_pt=100.0)  # errors cannot hold a step back
    assert windows_needed(per_request, 240, tolerance, latency_only) == 1
    both = windows_needed(per_request, 240, tolerance, RULES)
    assert both is not None and both >= 4  # ~1,000 requests per cohort for +-0.5 pt
    plan = plan_canary(recent, 10.0, [10, 50], 15.0, RULES)  # 15 requests a window at 10 %
    assert not plan.reachable and "10 %: not within 10 windows" in plan.summary
    assert "+0.5 pt in errors" in plan.summary and "5xx 0.00%" in plan.basis
    # and the judge agrees: equal cohorts of 400 requests each, no errors, do not pass yet
    gate, _ = judge(
        cohort("canary", rng, 400, median_ms=2.5), cohort("baseline", rng, 400, median_ms=2.5)
    )
    assert gate.verdict is Verdict.inconclusive and gate.measurements["error_diff_high"] > 0.005
