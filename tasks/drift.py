"""drift-watch's I/O: the champion's training window, the live impressions, the verdict's record.

The deciding is in `core.drift.analysis`; these tasks read ClickHouse and the model store,
write the verdict (a `release_events` row of kind `drift`, a markdown artifact) and, on a
failed verdict outside the cool-down, emit `relay.drift.detected`, which the
`retrain-and-release` deployment's trigger (prefect.yaml) answers with a release.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pandas as pd
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event

import logstore
from core.data.validation import TrainingWindow

# The alert decision and the report's text live in the pure core; re-exported for callers.
from core.drift.alerts import (
    DRIFT_EVENT,
    DriftAlert,
    alert_decision,
    drift_resource,
    report_markdown,
    sparkline,
)
from core.drift.analysis import DriftReport, DriftRules, assess_drift, prepare_reference
from logstore.events import sample_window
from logstore.feedback import sample_impressions
from logstore.reading import connect_for_reading
from logstore.release_events import ActionVerdict, EventKind
from model_store import open_store
from relay.settings import Settings
from relay.types import GateResult, Release, Verdict
from tasks.canary import record

__all__ = [
    "DRIFT_EVENT",
    "DriftAlert",
    "alert_decision",
    "announce_drift",
    "assess_live_drift",
    "drift_resource",
    "read_drift_reference",
    "read_live_impressions",
    "report_markdown",
    "sparkline",
]

REFERENCE_ROWS = 100_000  # a sample of the training window: enough sessions for every statistic
LIVE_ROWS = 100_000


@task(name="read-drift-reference", cache_policy=NO_CACHE)
def read_drift_reference(settings: Settings, champion: Release) -> pd.DataFrame | None:
    """A sample of the champion's training window, or None if its lineage names no window."""
    manifest = open_store(settings).get_manifest(champion.version)
    text = str(manifest.lineage_sources.get("data", {}).get("window", ""))
    try:
        window = TrainingWindow.parse(text)
    except ValueError:
        return None
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    return sample_window(client, window.start, window.end, REFERENCE_ROWS).assign(
        reference_window=str(window)
    )


@task(name="read-live-impressions", cache_policy=NO_CACHE)
def read_live_impressions(settings: Settings, window_minutes: float) -> pd.DataFrame:
    """The impressions of the last `window_minutes` (a sample of at most LIVE_ROWS)."""
    client = connect_for_reading(settings.resolved_clickhouse_dsn, settings.resolved_spool_dir)
    end = datetime.now(UTC)
    return sample_impressions(client, end - timedelta(minutes=window_minutes), end, LIVE_ROWS)


@task(name="assess-live-drift", cache_policy=NO_CACHE)
def assess_live_drift(
    settings: Settings,
    champion: Release,
    reference: pd.DataFrame | None,
    live: pd.DataFrame,
    window_minutes: float,
    rules: DriftRules,
) -> DriftReport:
    """The verdict over the live window, recorded as a release event and an artifact."""
    window = f"last {window_minutes:g} min"
    if reference is None or len(reference) == 0:
        gate = GateResult(
            gate="drift",
            verdict=Verdict.inconclusive,
            reason=f"champion {champion.version}'s lineage names no training window with events "
            "to compare with",
            measurements={"rows": float(len(live))},
        )
        report = DriftReport(gate, len(live), None, [])
        reference_text = "(none)"
    else:
        reference_text = str(reference["reference_window"].iloc[0])
        report = assess_drift(prepare_reference(reference, rules), live, rules)
    record(
        settings,
        champion,
        EventKind.drift,
        report.gate.verdict,
        report.gate.reason,
        measurements=report.gate.measurements,
        drifted=report.drifted_features,
        window=window,
    )
    create_markdown_artifact(
        key="drift-watch",
        markdown=report_markdown(report, window, reference_text),
        description=f"drift watch: {report.gate.verdict.value}",
    )
    return report


_LAST_ALERT_SQL = """
SELECT max(ts) FROM release_events WHERE kind = {kind:String} AND verdict = {verdict:String}
"""


@task(name="announce-drift", cache_policy=NO_CACHE)
def announce_drift(
    settings: Settings, champion: Release, report: DriftReport, cooldown_hours: float
) -> DriftAlert:
    """Emit relay.drift.detected naming the drifted features, unless within the cool-down."""
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    rows = client.query(
        _LAST_ALERT_SQL,
        parameters={"kind": EventKind.drift_alert.value, "verdict": ActionVerdict.emitted.value},
    ).result_rows
    last = rows[0][0] if rows and rows[0][0] and rows[0][0].year > 1970 else None
    if last is not None and last.tzinfo is None:
        last = last.replace(tzinfo=UTC)
    now = datetime.now(UTC)
    decision = alert_decision(report.gate.verdict, last, now, timedelta(hours=cooldown_hours))
    if decision.emit:
        emit_event(
            event=DRIFT_EVENT,
            resource=drift_resource(champion.version, champion.lineage_id),
            payload={
                "features": report.drifted_features,
                "reason": report.gate.reason,
                "measurements": json.loads(json.dumps(report.gate.measurements)),
            },
        )
    record(
        settings,
        champion,
        EventKind.drift_alert,
        ActionVerdict.emitted if decision.emit else ActionVerdict.suppressed,
        decision.reason,
        drifted=report.drifted_features,
    )
    return decision
