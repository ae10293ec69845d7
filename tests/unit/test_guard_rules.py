"""The release guard's rules: no evidence is inconclusive, never passed, and changes nothing."""

import pytest

from core.guard.rules import assess_live_slo, decide, quality_rule
from logstore.slo import SlotStats
from relay.types import GateResult, Verdict
from tasks.canary import CanaryDecision, decision_verdict
from tasks.guard import GuardLimits
from tasks.rollback import previous_version

LIMITS = GuardLimits(min_requests=100)


def stats(slot, version, requests=1_000, p95=50.0, error_rate=0.0):
    return SlotStats(slot, version, requests, p95 / 2, p95, p95 * 1.5, error_rate)


def gate(name, verdict, reason="why"):
    return GateResult(gate=name, verdict=verdict, reason=reason)


# assess_live_slo


def test_live_slo_too_few_champion_requests_is_inconclusive():
    result = assess_live_slo([stats("stable", "v1", requests=99)], "v1", LIMITS)
    assert result.verdict is Verdict.inconclusive and "99 requests" in result.reason


def test_live_slo_rows_of_another_version_do_not_count_as_the_champion():
    result = assess_live_slo([stats("stable", "old", p95=900.0)], "v1", LIMITS)
    assert result.verdict is Verdict.inconclusive and "0 requests" in result.reason


def test_live_slo_p95_breach_fails_and_names_it():
    result = assess_live_slo([stats("stable", "v1", p95=301.0)], "v1", LIMITS)
    assert result.verdict is Verdict.failed and "live P95 301.0 ms > 300 ms" in result.reason


def test_live_slo_error_rate_breach_fails_and_names_it():
    result = assess_live_slo([stats("stable", "v1", error_rate=0.02)], "v1", LIMITS)
    assert result.verdict is Verdict.failed and "live error rate 2.00% > 1.00%" in result.reason


def test_live_slo_healthy_champion_passes_with_its_measurements():
    result = assess_live_slo([stats("stable", "v1", p95=80.0)], "v1", LIMITS)
    assert result.verdict is Verdict.passed
    assert result.measurements["p95_ms"] == 80.0 and result.measurements["error_rate"] == 0.0
    assert result.thresholds["max_p95_ms"] == 300.0


def test_live_slo_traffic_share_is_the_champions_part_of_the_window():
    rows = [stats("stable", "v1", requests=750), stats("canary", "v2", requests=250)]
    result = assess_live_slo(rows, "v1", LIMITS)
    assert result.measurements["traffic_share"] == pytest.approx(0.75)
    assert result.measurements["window_requests"] == 1_000.0


def test_live_slo_traffic_share_of_a_near_empty_window_is_not_measured():
    # Absent, not 0.0: the quality rule must see "not measured", not "carries no traffic".
    for rows in ([], [stats("stable", "v1", requests=60), stats("canary", "v2", requests=30)]):
        result = assess_live_slo(rows, "v1", LIMITS)
        assert "traffic_share" not in result.measurements


# quality_rule


def test_quality_all_three_conditions_hold_is_failed():
    result = quality_rule(0.05, 0.8, False, LIMITS)
    assert result.verdict is Verdict.failed
    assert "AUC drop 0.050 > 0.02" in result.reason and "traffic share 80% > 30%" in result.reason
    assert result.measurements == {
        "auc_drop": 0.05,
        "traffic_share": 0.8,
        "calibration_blessed": 0.0,
    }


@pytest.mark.parametrize(
    ("auc_drop", "traffic_share", "blessed", "needle"),
    [
        (0.01, 0.8, False, "AUC drop 0.010 <= 0.02"),
        (0.05, 0.2, False, "traffic share 20% <= 30%"),
        (0.05, 0.8, True, "calibration passes"),
    ],
    ids=["auc-within-limit", "little-traffic", "calibration-passes"],
)
def test_quality_one_condition_missing_is_passed_with_each_value(
    auc_drop, traffic_share, blessed, needle
):
    result = quality_rule(auc_drop, traffic_share, blessed, LIMITS)
    assert result.verdict is Verdict.passed
    assert needle in result.reason and "not all rollback conditions hold" in result.reason


def test_quality_traffic_not_measured_but_others_hold_is_inconclusive_and_names_it():
    result = quality_rule(0.05, None, False, LIMITS)
    assert result.verdict is Verdict.inconclusive
    assert "no traffic share" in result.reason and "fewer than 100 requests" in result.reason
    assert "traffic_share" not in result.measurements


def test_quality_auc_not_measured_but_others_hold_is_inconclusive_and_names_it():
    result = quality_rule(None, 0.8, False, LIMITS)
    assert result.verdict is Verdict.inconclusive and "no AUC drop" in result.reason


def test_quality_nothing_but_calibration_measured_is_inconclusive_and_names_both():
    result = quality_rule(None, None, False, LIMITS)
    assert result.verdict is Verdict.inconclusive
    assert "no AUC drop" in result.reason and "no traffic share" in result.reason


def test_quality_auc_within_limit_on_enough_events_is_evidence_even_without_traffic_share():
    # One measured condition that does not hold settles the conjunction.
    result = quality_rule(0.0, None, True, LIMITS)
    assert result.verdict is Verdict.passed and "traffic share not measured" in result.reason


# decide


def test_guard_both_passed_is_passed():
    assert decide(gate("live_slo", Verdict.passed), gate("quality", Verdict.passed)).verdict is (
        Verdict.passed
    )


@pytest.mark.parametrize(
    ("live", "quality"),
    [
        (Verdict.inconclusive, Verdict.passed),
        (Verdict.passed, Verdict.inconclusive),
        (Verdict.inconclusive, Verdict.inconclusive),
    ],
    ids=["live-inconclusive", "quality-inconclusive", "both-inconclusive"],
)
def test_guard_any_inconclusive_without_failure_is_inconclusive_and_changes_nothing(live, quality):
    result = decide(gate("live_slo", live, "thin"), gate("quality", quality, "thin"))
    assert result.verdict is Verdict.inconclusive and "changes nothing" in result.reason
    for name, verdict in (("live_slo", live), ("quality", quality)):
        assert (f"{name} lacked evidence" in result.reason) is (verdict is Verdict.inconclusive)


def test_guard_live_inconclusive_quality_passed_is_inconclusive():
    live = gate("live_slo", Verdict.inconclusive, "champion served 12 requests, fewer than 100")
    result = decide(live, gate("quality", Verdict.passed))
    assert result.verdict is Verdict.inconclusive
    assert "live_slo lacked evidence: champion served 12 requests" in result.reason


@pytest.mark.parametrize(
    ("live", "quality"),
    [
        (Verdict.failed, Verdict.passed),
        (Verdict.failed, Verdict.inconclusive),
        (Verdict.passed, Verdict.failed),
        (Verdict.inconclusive, Verdict.failed),
        (Verdict.failed, Verdict.failed),
    ],
    ids=["live", "live-quality-thin", "quality", "quality-live-thin", "both"],
)
def test_guard_any_failed_rule_is_failed_and_names_it(live, quality):
    result = decide(gate("live_slo", live, "P95 high"), gate("quality", quality, "AUC low"))
    assert result.verdict is Verdict.failed
    assert ("live_slo failed: P95 high" in result.reason) is (live is Verdict.failed)
    assert ("quality failed: AUC low" in result.reason) is (quality is Verdict.failed)


@pytest.mark.parametrize(
    ("live", "quality", "named"),
    [
        (Verdict.error, Verdict.passed, "live_slo error"),
        (Verdict.passed, Verdict.error, "quality error"),
        (Verdict.error, Verdict.failed, "live_slo error"),
        (Verdict.failed, Verdict.error, "quality error"),
        (Verdict.inconclusive, Verdict.error, "quality error"),
    ],
    ids=["live", "quality", "live-over-failed", "quality-over-failed", "quality-live-thin"],
)
def test_guard_any_error_is_error_and_names_which(live, quality, named):
    result = decide(gate("live_slo", live), gate("quality", quality))
    assert result.verdict is Verdict.error and named in result.reason


# tasks.canary: the approval verdict and the rollback target


def test_approval_promote_is_passed_with_the_comment():
    result = decision_verdict(CanaryDecision(decision="promote", comment="looks fine"), False)
    assert result.verdict is Verdict.passed and "looks fine" in result.reason


def test_approval_roll_back_is_failed_with_the_comment():
    result = decision_verdict(CanaryDecision(decision="roll back", comment="CTR dipped"), False)
    assert result.verdict is Verdict.failed and "CTR dipped" in result.reason


def test_approval_timed_out_is_failed_whatever_the_form_says():
    result = decision_verdict(CanaryDecision(decision="promote"), True)
    assert result.verdict is Verdict.failed and "timeout" in result.reason


def test_rollback_target_is_the_most_recent_other_version():
    assert previous_version(["v1", "v2", "v3", "v4"], "v4") == "v3"


def test_rollback_target_skips_cleared_entries_and_the_current_version():
    assert previous_version(["v1", "v2", None, "v3", None, "v3"], "v3") == "v2"


def test_rollback_target_is_none_when_history_holds_only_the_current_version():
    assert previous_version(["v3", None, "v3"], "v3") is None
    assert previous_version([], "v3") is None
