"""impact_report: what latency costs in GMV over a window, stored under the release it covers."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from prefect import flow
from pydantic import Field

from core.impact.types import ImpactOptions, StoredImpactReport
from relay.settings import get_settings
from tasks.impact import (
    analyse_latency_impact,
    check_report_target,
    publish_impact_summary,
    query_impact_sessions,
    resolve_window,
    store_impact_report,
)

OPTIONS = ImpactOptions()  # the analysis' defaults live in its own type; the signature reads them


@flow(name="impact-report", log_prints=True)
def impact_report(
    start: datetime | None = None,
    end: datetime | None = None,
    last_hours: Annotated[float, Field(gt=0, le=24 * 90)] = 24.0,
    model_versions: list[str] | None = None,
    attach_to: str | None = None,
    min_sessions: Annotated[int, Field(ge=10)] = OPTIONS.min_sessions,
    min_sessions_per_slot: Annotated[int, Field(ge=2)] = OPTIONS.min_sessions_per_slot,
    refutation_simulations: Annotated[int, Field(ge=2, le=200)] = OPTIONS.refutation_simulations,
    max_refutation_sessions: Annotated[int, Field(ge=100)] = OPTIONS.max_refutation_sessions,
    seed: int = OPTIONS.seed,
) -> StoredImpactReport:
    """Query the window's sessions, estimate latency's effect on GMV, store and summarise it.

    The window is [start, end), or the `last_hours` before `end` (default now). `model_versions`
    keeps sessions mostly served by those versions (empty: all). `attach_to` files the report
    under that version in the model store (the release's canary at the end of a release).
    """
    settings = get_settings()
    window = resolve_window(start, end, last_hours)
    options = ImpactOptions(
        min_sessions=min_sessions,
        min_sessions_per_slot=min_sessions_per_slot,
        refutation_simulations=refutation_simulations,
        max_refutation_sessions=max_refutation_sessions,
        seed=seed,
    )
    check_report_target(settings, attach_to)
    data = query_impact_sessions(settings, window, model_versions or [], options.max_session)
    report = analyse_latency_impact(data, options)
    stored = store_impact_report(settings, report, attach_to)
    return publish_impact_summary(report, stored)
