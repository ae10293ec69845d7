"""drift_watch: does live traffic still look like the champion's training window?"""

from __future__ import annotations

from typing import Annotated

from prefect import flow
from prefect.runtime import flow_run
from pydantic import Field

from core.drift.analysis import DriftRules
from relay.settings import get_settings
from relay.types import GateResult, Verdict
from tasks.drift import (
    announce_drift,
    assess_live_drift,
    read_drift_reference,
    read_live_impressions,
)
from tasks.guard import read_champion


@flow(name="drift-watch", log_prints=True)
def drift_watch(
    window_minutes: Annotated[float, Field(gt=0, le=24 * 60)] = 15.0,
    rules: DriftRules = DriftRules(),  # noqa: B008 - frozen; the run form shows its fields
) -> GateResult:
    """Compare the last window's impressions with the champion's training window; on drift, say so."""
    settings = get_settings()
    champion = read_champion(settings, f"drift-{flow_run.id}")
    if champion is None:
        return GateResult(
            gate="drift", verdict=Verdict.inconclusive, reason="no champion yet: nothing to watch"
        )
    reference = read_drift_reference(settings, champion)
    live = read_live_impressions(settings, window_minutes)
    report = assess_live_drift(settings, champion, reference, live, window_minutes, rules)
    if report.gate.verdict is Verdict.failed:
        announce_drift(settings, champion, report, rules.cooldown_hours)
    return report.gate
