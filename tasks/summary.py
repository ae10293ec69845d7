"""The release summary: what a person reads in the Prefect UI after a run."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel

import logstore
from core.lineage.hashing import LineageRecord
from core.training.model import TrainedModel
from logstore.release_events import EventKind, ReleaseEvent, events_of_release, record_event
from relay.settings import Settings
from relay.types import Release, ReleaseOutcome
from tasks.compilation import CompileOutcome
from tasks.registry import Registration


class ReleaseSummary(BaseModel):
    """The flow's return value: enough to find everything the run produced."""

    version: str
    lineage_id: str
    metrics: dict[str, float]
    engines: list[str]
    rejected_engines: dict[str, str]
    mlflow_run_id: str
    mlflow_model_version: str
    newly_published: bool
    outcome: ReleaseOutcome = ReleaseOutcome.registered
    reason: str = ""


def render_markdown(summary: ReleaseSummary, record: LineageRecord) -> str:
    """The summary as markdown: lineage, metrics, engines."""
    lines = [
        "# Release candidate registered",
        "",
        f"**Lineage id** `{summary.lineage_id}`"
        + ("" if summary.newly_published else " (identical to an existing version: reused)"),
        "",
        "| part | sha256 | from |",
        "|---|---|---|",
    ]
    for part in ("model", "data", "env", "build"):
        source = record.sources[part]
        origin = {
            "model": "exported ONNX bytes",
            "data": f"{source.get('rows', '?')} events in {source.get('window', '?')} + feature pipeline + schema",
            "env": f"Python {source.get('python', '?')}, "
            + ", ".join(f"{k} {v}" for k, v in source.get("packages", {}).items() if v),
            "build": ", ".join(source.get("engines", {})),
        }[part]
        lines.append(f"| {part} | `{getattr(record.lineage, part)[:16]}…` | {origin} |")
    lines += ["", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {v:.5g} |" for k, v in summary.metrics.items()]
    lines += ["", f"**Engines accepted**: {', '.join(summary.engines)}"]
    for name, reason in summary.rejected_engines.items():
        lines.append(f"- rejected `{name}`: {reason}")
    lines += [
        "",
        f"MLflow run `{summary.mlflow_run_id}`, model version {summary.mlflow_model_version}, alias `candidate`.",
    ]
    return "\n".join(lines)


@task(name="publish-release-summary", cache_policy=NO_CACHE)
def publish_release_summary(
    registration: Registration,
    trained: TrainedModel,
    outcome: CompileOutcome,
    record: LineageRecord,
) -> ReleaseSummary:
    """Write the markdown artifact and return the summary."""
    summary = ReleaseSummary(
        version=registration.version,
        lineage_id=registration.lineage_id,
        metrics=trained.metrics,
        engines=[e.name for e in outcome.engines],
        rejected_engines={p.engine: p.reason for p in outcome.parity if not p.accepted},
        mlflow_run_id=registration.mlflow_run_id,
        mlflow_model_version=registration.mlflow_model_version,
        newly_published=registration.newly_published,
    )
    create_markdown_artifact(
        key="release-summary",
        markdown=render_markdown(summary, record),
        description=f"Candidate {summary.lineage_id}",
    )
    return summary


@task(name="finish-release", cache_policy=NO_CACHE)
def finish_release(
    settings: Settings,
    summary: ReleaseSummary,
    release: Release,
    outcome: ReleaseOutcome,
    reason: str,
) -> ReleaseSummary:
    """Record how the release ended, in ClickHouse and as the run's outcome artifact."""
    ended = summary.model_copy(update={"outcome": outcome, "reason": reason})
    client = logstore.connect(settings.resolved_clickhouse_dsn)
    events = events_of_release(client, release.release_id)
    record_event(
        client,
        ReleaseEvent(
            release.release_id,
            release.version,
            release.lineage_id,
            EventKind.outcome,
            outcome.value,
            reason,
        ),
    )
    lines = [
        f"# Release {outcome.value.replace('_', ' ')}",
        "",
        f"**{release.version}**: {reason}",
        "",
        "| time | kind | verdict | reason |",
        "|---|---|---|---|",
    ]
    lines += [f"| {e.ts:%H:%M:%S} | {e.kind} | {e.verdict} | {e.reason} |" for e in events]
    create_markdown_artifact(
        key="release-outcome", markdown="\n".join(lines), description=f"{outcome.value}: {reason}"
    )
    print(f"release {release.version}: {outcome.value} ({reason})")
    return ended
