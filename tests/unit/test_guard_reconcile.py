"""The guard's fleet reconciliation decisions: what it repairs, leaves alone, and cannot repair."""

from __future__ import annotations

import pytest

from core.guard.rules import decide
from relay.types import GateResult, Verdict
from tasks.reconcile import (
    PlannedRepair,
    Reconciliation,
    Repair,
    WorkerView,
    plan_reconciliation,
    reconciliation_verdict,
)

A, B = "http://127.0.0.1:1", "http://127.0.0.1:2"
LIVE = ["brave-otter (run-1, Running)"]


def up(url, stable="v1", canary=None, weight=0, baseline=None):
    return WorkerView(
        url, True, stable=stable, canary=canary, baseline=baseline, canary_weight=weight
    )


def down(url):
    return WorkerView(url, False, "unreachable ConnectError")


# (scenario, workers, champion, live releases, expected repairs [(action, urls)], problems naming)
CASES = [
    ("matching fleet needs nothing", [up(A), up(B)], "v1", [], [], []),
    (
        "orphaned canary with no live release is taken out where it is",
        [up(A, canary="v2", weight=5, baseline="v1"), up(B)],
        "v1",
        [],
        [(Repair.take_canary_out, (A,))],
        [],
    ),
    (
        "a lapsed canary (weight 0, still loaded) is an orphan too",
        [up(A, canary="v2", baseline="v1"), up(B, canary="v2", baseline="v1")],
        "v1",
        [],
        [(Repair.take_canary_out, (A, B))],
        [],
    ),
    (
        "a baseline left behind without its canary is taken out",
        [up(A, baseline="v1"), up(B)],
        "v1",
        [],
        [(Repair.take_canary_out, (A,))],
        [],
    ),
    (
        "a live release's canary is left alone",
        [up(A, canary="v2", weight=25), up(B, canary="v2", weight=25)],
        "v1",
        LIVE,
        [],
        [],
    ),
    (
        "a worker serving another stable gets the champion back",
        [up(A), up(B, stable="v0")],
        "v1",
        [],
        [(Repair.restore_stable, (B,))],
        [],
    ),
    (
        "a restarted worker with no stable gets the champion",
        [up(A, stable=None), up(B)],
        "v1",
        [],
        [(Repair.restore_stable, (A,))],
        [],
    ),
    (
        "a stable that is not the champion anywhere is restored everywhere",
        [up(A, stable="v2"), up(B, stable="v2")],
        "v1",
        [],
        [(Repair.restore_stable, (A, B))],
        [],
    ),
    (
        "during a live release a stable off the champion may be a promotion: left alone",
        [up(A, stable="v2"), up(B)],
        "v1",
        LIVE,
        [],
        [],
    ),
    (
        "orphan canary and a wrong stable: both repaired, canary first",
        [up(A, canary="v3", weight=5), up(B, stable="v0")],
        "v1",
        [],
        [(Repair.take_canary_out, (A,)), (Repair.restore_stable, (B,))],
        [],
    ),
    (
        "an unreachable worker cannot be repaired and is named; the others still are",
        [down(A), up(B, canary="v2", weight=5)],
        "v1",
        [],
        [(Repair.take_canary_out, (B,))],
        [A],
    ),
    (
        "no champion and workers that disagree: nothing to restore, both named",
        [up(A, stable="v1"), up(B, stable="v2")],
        None,
        [],
        [],
        [A, B],
    ),
    (
        "no champion and no stable anywhere (before the first release)",
        [up(A, None)],
        None,
        [],
        [],
        [],
    ),
]


@pytest.mark.parametrize(
    ("workers", "champion", "live", "repairs", "named"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_reconciliation_decisions(workers, champion, live, repairs, named):
    plan = plan_reconciliation(workers, champion, live)
    assert [(r.action, r.urls) for r in plan.repairs] == repairs
    problems = " ".join(plan.problems)
    assert all(url in problems for url in named), plan.problems
    assert bool(plan.problems) == bool(named)


def test_left_alone_says_which_release_owns_the_canary():
    plan = plan_reconciliation([up(A, canary="v2", weight=5)], "v1", LIVE)
    assert plan.left_alone and "brave-otter" in plan.left_alone[0] and "v2" in plan.left_alone[0]


def test_repair_reason_names_canary_worker_and_weight():
    plan = plan_reconciliation([up(A, canary="v2", weight=5)], "v1", [])
    assert plan.repairs[0].reason == f"canary v2 on {A} (weight 5) with no live release"
    assert plan.canary == "v2"


def test_verdict_passes_on_a_repaired_fleet_and_lists_the_repairs():
    plan = plan_reconciliation([up(A, canary="v2", weight=5), up(B)], "v1", [])
    gate = reconciliation_verdict(plan, failed_repairs=[])
    assert gate.verdict is Verdict.passed and gate.reason.startswith("repaired: canary v2")
    assert gate.measurements == {"workers": 2.0, "repairs": 1.0, "problems": 0.0}


def test_verdict_is_error_when_a_repair_failed_naming_it():
    repair = PlannedRepair(
        Repair.restore_stable, (B,), f"stable is not champion v1 on {B} serves v0"
    )
    gate = reconciliation_verdict(Reconciliation((repair,), checked=2), [repair.reason])
    assert (
        gate.verdict is Verdict.error
        and f"repair failed: stable is not champion v1 on {B}" in gate.reason
    )


def test_verdict_is_error_for_an_unreachable_worker():
    gate = reconciliation_verdict(plan_reconciliation([down(A), up(B)], "v1", []), [])
    assert gate.verdict is Verdict.error and A in gate.reason


def test_clean_fleet_verdict_says_so():
    gate = reconciliation_verdict(plan_reconciliation([up(A), up(B)], "v1", []), [])
    assert gate.verdict is Verdict.passed and "all 2 workers serve the champion" in gate.reason


def test_fleet_error_is_the_guards_error_even_when_the_champion_rules_would_roll_back():
    fleet = GateResult(gate="fleet", verdict=Verdict.error, reason=f"{A}: unreachable")
    failed = GateResult(gate="live_slo", verdict=Verdict.failed, reason="P95 high")
    result = decide(failed, GateResult(gate="quality", verdict=Verdict.passed, reason="ok"), fleet)
    assert result.verdict is Verdict.error and A in result.reason


def test_repaired_fleet_does_not_stop_the_guard_from_passing():
    fleet = GateResult(gate="fleet", verdict=Verdict.passed, reason="repaired: canary v2")
    ok = GateResult(gate="live_slo", verdict=Verdict.passed, reason="fine")
    result = decide(ok, ok.model_copy(update={"gate": "quality"}), fleet)
    assert result.verdict is Verdict.passed and "fleet passed: repaired" in result.reason
