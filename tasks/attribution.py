"""Why latency rose, as Prefect task shells: read two populations' stage timings from the log
store, attribute the change in `core.attribution`, and record the statement with the verdict.

The statistics (the causal graph, exact Shapley contributions, bootstrap intervals, the decision
on which causes are named) live in `core.attribution`; see docs/attribution.md. It reads the
log store only after the decision it explains, so it never delays a rollback (the task shells
run it after the weight is 0).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from core.attribution import (
    AttributionConfig,
    AttributionStatus,
    LatencyAttribution,
    attribute_latency,
    failed_attribution,
)
from core.attribution.types import DEFAULT_CONFIG
from logstore.reading import connect_for_reading
from logstore.release_events import EventKind
from logstore.stage_samples import StageSample, sample_stage_rows
from relay.settings import Settings
from relay.types import GateResult, Release, Verdict
from tasks.canary import canary_period, record
from tasks.canary_analysis import LOG_STORE_ERRORS, latency_regressed

log = logging.getLogger("relay.attribution")

__all__ = [
    "AttributionConfig",
    "AttributionStatus",
    "LatencyAttribution",
    "explain_canary_rejection",
    "explain_guard_decision",
    "window_attribution",
]

# (slot, version, start, end) -> a sample of that population's answered requests
Reader = Callable[[str, str, datetime, datetime], StageSample]


def window_attribution(
    read: Reader,
    before: tuple[str, str, datetime, datetime],
    after: tuple[str, str, datetime, datetime],
    config: AttributionConfig = DEFAULT_CONFIG,
) -> LatencyAttribution:
    """Attribution between two (slot, version, start, end) populations read through `read`.

    Never raises: a failed query or analysis is a `failed` attribution, so the verdict it
    explains is recorded and acted on all the same.
    """
    try:
        a, b = read(*before), read(*after)
        return attribute_latency(a.frame, b.frame, config, population=(a.population, b.population))
    except Exception as exc:  # explaining must never stop the decision it explains
        log.exception("root-cause attribution failed")
        return failed_attribution(exc)


# -- task shells: run after the decision they explain, never before it --------------------------


def _reader(settings: Settings, config: AttributionConfig) -> Reader:
    """Samples from the log store, connected on first use (inside the attribution's guard)."""
    client: list[Any] = []

    def read(slot: str, version: str, start: datetime, end: datetime) -> StageSample:
        if not client:
            client.append(
                connect_for_reading(settings.resolved_clickhouse_dsn, settings.resolved_spool_dir)
            )
        return sample_stage_rows(client[0], start, end, slot, config.max_rows, version)

    return read


def explained(
    settings: Settings, release: Release, gate: GateResult, attribution: LatencyAttribution
) -> GateResult:
    """`gate` carrying its attribution, which is also recorded as an `attribution` release event."""
    try:
        record(
            settings,
            release,
            EventKind.attribution,
            attribution.status,
            attribution.statement,
            gate=gate.gate,
            **attribution.as_dict(),
        )
    except LOG_STORE_ERRORS:  # the verdict stands and carries it; only the event is missing
        log.exception("could not record the attribution of %s", release.version)
    return gate.model_copy(
        update={
            "attribution": attribution.as_dict(),
            "reason": f"{gate.reason}; why: {attribution.statement}",
            "measurements": gate.measurements | attribution.measurements(),
        }
    )


@task(name="explain-canary-rejection", cache_policy=NO_CACHE)
def explain_canary_rejection(
    settings: Settings,
    release: Release,
    baseline_version: str,
    gate: GateResult,
    config: AttributionConfig = DEFAULT_CONFIG,
) -> GateResult:
    """A rejected canary's verdict with why its latency regressed (canary vs baseline, since deploy).

    Called once the canary is out of traffic; a verdict that was not a latency regression is
    returned as it is.
    """
    if not latency_regressed(gate):
        return gate
    start, end = canary_period.fn(settings, release)
    attribution = window_attribution(
        _reader(settings, config),
        ("baseline", baseline_version, start, end),
        ("canary", release.version, start, end),
        config,
    )
    return explained(settings, release, gate, attribution)


@task(name="explain-guard-decision", cache_policy=NO_CACHE)
def explain_guard_decision(
    settings: Settings,
    champion: Release,
    decision: GateResult,
    live: GateResult,
    window_minutes: float,
    config: AttributionConfig = DEFAULT_CONFIG,
) -> GateResult:
    """The guard's decision with why the champion's latency rose: its window before vs now.

    Called after the guard acted; without a live P95 breach the decision is returned as it is.
    """
    p95, limit = live.measurements.get("p95_ms"), live.thresholds.get("max_p95_ms")
    if live.verdict is not Verdict.failed or p95 is None or limit is None or p95 <= limit:
        return decision
    end = datetime.now(UTC)
    window = timedelta(minutes=window_minutes)
    attribution = window_attribution(
        _reader(settings, config),
        ("stable", champion.version, end - 2 * window, end - window),
        ("stable", champion.version, end - window, end),
        config,
    )
    return explained(settings, champion, decision, attribution)
