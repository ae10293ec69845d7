"""The release guard: after promotion, is the champion still healthy and still good?

Rules (the seed's): roll back to the previous blessed version when the champion's live SLO is
breached over the window, or when its AUC on fresh labelled events (the fleet's impressions joined
with their clicks and orders, `logstore.feedback`) has dropped by more than the limit against the
baseline AND it carries more than the traffic-share limit AND it fails the
calibration check.

No evidence is `inconclusive`, never `passed`, for the live SLO and the quality rule alike. The
guard passes only when both rules pass; an inconclusive guard changes nothing and says why.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from prefect import task
from prefect.cache_policies import NO_CACHE

# The rules are pure core; re-exported for this module's callers.
from core.guard.rules import (
    GuardLimits,
    assess_live_slo,
    decide,
    missing_quality_evidence,
    quality_rule,
)
from logstore.feedback import LABEL_DELAY, sample_labelled_window
from logstore.reading import connect_for_reading
from logstore.release_events import EventKind
from logstore.slo import query_slot_stats
from model_store import open_store
from relay.features import LABEL, to_model_input
from relay.settings import Settings
from relay.types import BlobRef, GateResult, Release, Verdict
from tasks.calibration import CalibrationThresholds, assess_calibration, score_version
from tasks.canary import CHAMPION, record
from tasks.rollback import previous_version


@task(name="decide-guard", cache_policy=NO_CACHE)
def decide_guard(
    settings: Settings, champion: Release, live: GateResult, quality: GateResult, fleet: GateResult
) -> GateResult:
    """The guard's decision, recorded."""
    decision = decide(live, quality, fleet)
    record(settings, champion, EventKind.guard, decision.verdict, decision.reason)
    return decision


@task(name="read-champion", cache_policy=NO_CACHE)
def read_champion(settings: Settings, release_id: str) -> Release | None:
    """The champion as a release to guard, or None before the first release."""
    store = open_store(settings)
    version = store.get_alias(CHAMPION)
    if version is None:
        return None
    return Release(release_id, version, store.get_manifest(version).lineage_id)


@task(name="assess-champion-slo", cache_policy=NO_CACHE)
def assess_champion_slo(
    settings: Settings, champion: Release, window_minutes: float, limits: GuardLimits
) -> GateResult:
    """Live SLO of the champion over the last `window_minutes` of inference logs."""
    client = connect_for_reading(settings.resolved_clickhouse_dsn, settings.resolved_spool_dir)
    end = datetime.now(UTC)
    gate = assess_live_slo(
        query_slot_stats(client, end - timedelta(minutes=window_minutes), end),
        champion.version,
        limits,
    )
    record(
        settings,
        champion,
        EventKind.guard_slo,
        gate.verdict,
        gate.reason,
        measurements=gate.measurements,
    )
    return gate


@task(name="assess-champion-quality", cache_policy=NO_CACHE)
def assess_champion_quality(
    settings: Settings,
    champion: Release,
    recent_hours: float,
    traffic_share: float | None,
    limits: GuardLimits,
    workdir: Path,
) -> GateResult:
    """AUC and calibration of the champion vs the previous champion on fresh labelled events:
    the fleet's impressions of the last `recent_hours` joined with their clicks and orders
    (the newest LABEL_DELAY left out while its feedback arrives)."""
    store = open_store(settings)
    baseline = previous_version(
        [e.version for e in store.alias_history(CHAMPION)], champion.version
    )
    end = datetime.now(UTC) - LABEL_DELAY
    client = connect_for_reading(settings.resolved_clickhouse_dsn, settings.resolved_spool_dir)
    frame = sample_labelled_window(client, end - timedelta(hours=recent_hours), end, 50_000)
    clicks = int(frame[LABEL].sum()) if len(frame) else 0
    why = missing_quality_evidence(baseline, len(frame), clicks, recent_hours, limits)
    if why is not None or baseline is None:
        gate = GateResult(
            gate="quality",
            verdict=Verdict.inconclusive,
            reason=why or "no previous champion to compare with",
            measurements={"labelled_impressions": float(len(frame)), "clicks": float(clicks)},
        )
    else:
        x, labels = to_model_input(frame), frame[LABEL].to_numpy().astype(np.int64)
        champion_scores = score_version(store, store.get_manifest(champion.version), x, workdir)
        baseline_scores = score_version(store, store.get_manifest(baseline), x, workdir)
        report = assess_calibration(
            champion.version,
            labels,
            champion_scores,
            baseline,
            baseline_scores,
            BlobRef(sha256="0" * 64, size=len(frame)),
            CalibrationThresholds(max_auc_drop=limits.max_auc_drop),
        )
        drop = report.baseline.auc - report.candidate.auc if report.baseline else None
        gate = quality_rule(drop, traffic_share, report.blessed, limits)
        gate.measurements |= {"labelled_impressions": float(len(frame)), "clicks": float(clicks)}
    record(
        settings,
        champion,
        EventKind.guard_quality,
        gate.verdict,
        gate.reason,
        measurements=gate.measurements,
    )
    return gate


@task(name="report-no-rollback-target", cache_policy=NO_CACHE)
def report_no_rollback_target(
    settings: Settings, champion: Release, decision: GateResult
) -> GateResult:
    """The guard wanted to roll back but no earlier blessed version exists: an `error`, recorded."""
    reason = f"{decision.reason}; no previous blessed version to roll back to"
    record(settings, champion, EventKind.guard, Verdict.error, reason)
    return decision.model_copy(update={"verdict": Verdict.error, "reason": reason})
