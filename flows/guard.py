"""release_guard: reconcile the fleet with the store, watch the champion, roll back when the rules say so.

Besides its schedule, the guard runs when a `retrain-and-release` run crashes (the deployment
trigger in prefect.yaml): its reconciliation takes the dead release's canary out.
"""

from __future__ import annotations

from typing import Annotated

from prefect import flow
from prefect.runtime import flow_run
from pydantic import Field

from relay.settings import get_settings
from relay.types import GateResult, Release, Verdict
from tasks.attribution import explain_guard_decision
from tasks.guard import (
    GuardLimits,
    assess_champion_quality,
    assess_champion_slo,
    decide_guard,
    read_champion,
    report_no_rollback_target,
)
from tasks.reconcile import find_live_releases, reconcile_fleet
from tasks.rollback import choose_rollback_target, roll_back_champion
from tasks.workdir import run_workdir


@flow(name="release-guard", log_prints=True)
def release_guard(
    window_minutes: Annotated[float, Field(gt=0, le=24 * 60)] = 10.0,
    recent_hours: Annotated[float, Field(gt=0, le=24 * 30)] = 24.0,
    limits: GuardLimits = GuardLimits(),  # noqa: B008 - frozen; the run form shows its fields
) -> GateResult:
    """Reconcile the fleet; check the champion's live SLO and quality; roll back on failure."""
    settings = get_settings()
    guard_id = f"guard-{flow_run.id}"
    champion = read_champion(settings, guard_id)
    fleet = reconcile_fleet(
        settings,
        champion or Release(guard_id, "", ""),
        champion.version if champion else None,
        find_live_releases(),
    )
    if champion is None:
        if fleet.verdict is Verdict.error:
            return fleet
        return GateResult(
            gate="guard", verdict=Verdict.inconclusive, reason="no champion yet: nothing to guard"
        )
    live = assess_champion_slo(settings, champion, window_minutes, limits)
    quality = assess_champion_quality(
        settings,
        champion,
        recent_hours,
        live.measurements.get("traffic_share"),  # absent: too few requests to measure it
        limits,
        run_workdir(settings),
    )
    decision = decide_guard(settings, champion, live, quality, fleet)
    if decision.verdict is not Verdict.failed:
        return decision
    target = choose_rollback_target(settings, None, champion.release_id)
    if target is None:
        decision = report_no_rollback_target(settings, champion, decision)
    else:
        roll_back_champion(settings, target, f"release guard: {decision.reason}", "release-guard")
    # only after acting: why the champion's latency rose, if that is what failed
    return explain_guard_decision(settings, champion, decision, live, window_minutes)
