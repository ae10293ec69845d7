"""drift-watch's I/O: the champion's training window, the live impressions, the verdict's record.

The deciding is in `core.drift.analysis`; these tasks read ClickHouse and the model store,
write the verdict (a `release_events` row of kind `drift`, a markdown artifact) and, on a
failed verdict outside the cool-down, emit `relay.drift.detected`, which the
`retrain-and-release` deployment's trigger (prefect.yaml) answers with a release.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pandas as pd
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event

import logstore
from core.drift.analysis import DriftReport, DriftRules, assess_drift, prepare_reference
from logstore.events import sample_window
from logstore.feedback import sample_impressions
from logstore.reading import connect_for_reading
from model_store import open_store
from relay.settings import Settings
from relay.types import GateResult, Release, Verdict
from tasks.canary import record
from tasks.data import TrainingWindow

DRIFT_EVENT = "relay.drift.detected"
REFERENCE_ROWS = 100_000  # a sample of the training window: enough sessions for every statistic
LIVE_ROWS = 100_000
_SPARK = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class DriftAlert:
    """Whether a failed verdict becomes an event now, or falls in the cool-down of the last."""

    emit: bool
    reason: str


def alert_decision(
    verdict: Verdict, last_alert: datetime | None, now: datetime, cooldown: timedelta
) -> DriftAlert:
    """Emit on failed, unless an alert went out less than `cooldown` ago (no release storm)."""
    if verdict is not Verdict.failed:
        return DriftAlert(False, f"verdict {verdict.value}: nothing to announce")
    if last_alert is not None and now - last_alert < cooldown:
        return DriftAlert(
            False,
            f"drift persists, but an alert went out at {last_alert.isoformat()}, within the "
            f"{cooldown.total_seconds() / 3600:g} h cool-down: no new retrain",
        )
    return DriftAlert(True, f"emitting {DRIFT_EVENT}")


def drift_resource(version: str, lineage_id: str) -> dict[str, str]:
    """The Prefect resource a drift event is about: the champion model version."""
    return {
        "prefect.resource.id": f"relay.model.{version}",
        "prefect.resource.name": version,
        "relay.lineage-id": lineage_id,
    }


def sparkline(values: list[float]) -> str:
    """A one-line plot of a series (the score's batch z values), scaled to its own range."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    return "".join(_SPARK[int((v - lo) / span * (len(_SPARK) - 1))] for v in values)


def report_markdown(report: DriftReport, window: str, reference: str) -> str:
    """The artifact: verdict, the score's trace, and every feature's statistic, most severe first."""
    lines = [
        f"# Drift watch: {report.gate.verdict.value}",
        "",
        report.gate.reason,
        "",
        f"Live window {window} ({report.rows} impressions) against the champion's training "
        f"window {reference}. Method: {report.gate.method}.",
    ]
    if report.score is not None and report.score.z:
        z = report.score.z
        lines += [
            "",
            f"Distance-decay score, batch z ({len(z)} batches, max {max(z):.2f} σ): "
            f"`{sparkline(z[:200])}`",
        ]
    if report.features:
        lines += [
            "",
            "| feature | method | statistic | limit | p | drifted | severity |",
            "|---|---|---|---|---|---|---|",
        ]
        for f in report.features:
            bar = "█" * min(20, round(f.severity * 5))
            p = f"{f.p_value:.2g}" if f.p_value is not None else ""
            lines.append(
                f"| {f.feature} | {f.method} | {f.statistic:.4g} | {f.limit:.4g} | {p} | "
                f"{'**yes**' if f.drifted else 'no'} | `{bar}` {f.severity:.2f} |"
            )
    return "\n".join(lines)


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
        "drift",
        report.gate.verdict.value,
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
SELECT max(ts) FROM release_events WHERE kind = 'drift_alert' AND verdict = 'emitted'
"""


@task(name="announce-drift", cache_policy=NO_CACHE)
def announce_drift(
    settings: Settings, champion: Release, report: DriftReport, cooldown_hours: float
) -> DriftAlert:
    """Emit relay.drift.detected naming the drifted features, unless within the cool-down."""
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    rows = client.query(_LAST_ALERT_SQL).result_rows
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
        "drift_alert",
        "emitted" if decision.emit else "suppressed",
        decision.reason,
        drifted=report.drifted_features,
    )
    return decision
