"""What drift-watch says and when: the alert decision with its cool-down, the event's resource,
and the markdown report. Pure; emitting the event and publishing the artifact is `tasks.drift`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from core.drift.analysis import DriftReport
from relay.types import Verdict

DRIFT_EVENT = "relay.drift.detected"
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
