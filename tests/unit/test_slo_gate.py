import pytest

from logstore.slo import SlotStats
from relay.types import Verdict
from tasks.slo import SloThresholds, assess_slo, error_verdict

LIMITS = SloThresholds(min_requests=100)


def stats(slot, version, requests=1_000, p95=50.0, error_rate=0.0):
    return SlotStats(slot, version, requests, p95 / 2, p95, p95 * 1.5, error_rate)


def test_healthy_canary_passes_with_its_measurements():
    result = assess_slo([stats("stable", "v1"), stats("canary", "v2", p95=55.0)], "v2", LIMITS)
    assert result.verdict is Verdict.passed
    assert (
        result.measurements["canary_p95_ms"] == 55.0
        and result.measurements["stable_p95_ms"] == 50.0
    )


def test_slo_gate_too_few_requests_is_inconclusive_never_passed():
    result = assess_slo([stats("stable", "v1"), stats("canary", "v2", requests=99)], "v2", LIMITS)
    assert result.verdict is Verdict.inconclusive and "99 requests" in result.reason


def test_no_canary_rows_at_all_is_inconclusive():
    assert assess_slo([stats("stable", "v1")], "v2", LIMITS).verdict is Verdict.inconclusive


@pytest.mark.parametrize(
    ("canary", "needle"),
    [
        (stats("canary", "v2", p95=301.0), "P95 301.0 ms > 300 ms"),
        (stats("canary", "v2", error_rate=0.02), "error rate 2.00% > 1.00%"),
        (stats("canary", "v2", p95=61.0), "1.22x stable's"),
    ],
    ids=["absolute-p95", "error-rate", "relative-p95"],
)
def test_breaches_fail_and_name_the_breach(canary, needle):
    result = assess_slo([stats("stable", "v1"), canary], "v2", LIMITS)
    assert result.verdict is Verdict.failed and needle in result.reason


def test_relative_breach_within_the_slack_is_noise_not_failure():
    stable = SlotStats("stable", "v1", 1_000, 7.0, 15.0, 20.0, 0.0)
    canary = SlotStats("canary", "v2", 1_000, 10.0, 21.0, 30.0, 0.0)  # 1.4x, but only +6 ms
    result = assess_slo([stable, canary], "v2", LIMITS)
    assert result.verdict is Verdict.passed and result.measurements["p95_ratio"] == pytest.approx(
        1.4
    )


def test_rows_of_another_canary_version_do_not_count():
    result = assess_slo([stats("stable", "v1"), stats("canary", "old", p95=900.0)], "v2", LIMITS)
    assert result.verdict is Verdict.inconclusive


def test_query_errors_become_error_only_at_the_consecutive_limit():
    assert error_verdict(3, "timeout", LIMITS) is None
    result = error_verdict(4, "timeout", LIMITS)
    assert result is not None and result.verdict is Verdict.error and "timeout" in result.reason
