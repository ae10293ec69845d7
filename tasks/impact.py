"""The impact stage's task shells: query the window from ClickHouse, analyse, store, publish.

Business impact of latency: what a millisecond costs in GMV, with causal estimates. The pure
work lives beside this module: the report's types (core/impact/types.py), statistics and causal
estimation (core/impact/estimation.py), the report's assembly (core/impact/analysis.py), its
renderings (core/impact/report.py) and how it is filed in the model store
(core/impact/storage.py). The shells here do the I/O (ClickHouse, the model store, Prefect
artifacts, the clock) and call those.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from core.impact.analysis import analyse_impact
from core.impact.canary_window import canary_window, recorded_sample_ratio
from core.impact.estimation import histogram_bin_ms
from core.impact.experiment import estimate_experiment, no_experiment
from core.impact.experiment_report import with_experiment_section
from core.impact.experiment_types import ExperimentOptions, ReleaseExperiment
from core.impact.history import build_history, render_history_markdown, store_history_page
from core.impact.report import render_html, render_json, render_markdown
from core.impact.storage import REPORT_KIND, list_experiments, store_experiment, store_report_files
from core.impact.types import (
    ImpactData,
    ImpactOptions,
    ImpactReport,
    ImpactWindow,
    StoredImpactReport,
)
from logstore.experiment import query_experiment
from logstore.impact import (
    count_join_coverage,
    read_latency_histogram,
    read_latency_profile,
    read_session_outcomes,
)
from logstore.reading import connect_for_reading
from logstore.release_events import events_of_release
from model_store import open_store
from relay.errors import VersionNotFound
from relay.settings import Settings
from relay.types import Release, ReleaseOutcome
from tasks.workdir import run_workdir


def resolve_window(
    start: datetime | None,
    end: datetime | None,
    last_hours: float | None,
    now: datetime | None = None,
) -> ImpactWindow:
    """The window from explicit bounds, or the `last_hours` before `end` (default now, UTC)."""
    end = (end or now or datetime.now(UTC)).astimezone(UTC)
    if start is None:
        if last_hours is None or last_hours <= 0:
            raise ValueError(f"give start or a positive last_hours, got last_hours={last_hours}")
        start = end - timedelta(hours=last_hours)
    start = start.astimezone(UTC)
    if end <= start:
        raise ValueError(f"window end {end.isoformat()} must be after start {start.isoformat()}")
    return ImpactWindow(start=start, end=end)


@task(name="query-impact-sessions", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def query_impact_sessions(
    settings: Settings, window: ImpactWindow, versions: list[str], max_session: timedelta
) -> ImpactData:
    """Per-session rows, join coverage and latency summaries for the window, from ClickHouse."""
    client = connect_for_reading(settings.resolved_clickhouse_dsn, settings.resolved_spool_dir)
    profile = read_latency_profile(client, window.start, window.end, versions)
    bin_ms = histogram_bin_ms(profile)
    return ImpactData(
        window=window,
        versions=list(versions),
        sessions=read_session_outcomes(client, window.start, window.end, versions, max_session),
        coverage=count_join_coverage(client, window.start, window.end, max_session),
        latency_profile=profile,
        latency_histogram=read_latency_histogram(
            client, window.start, window.end, bin_ms, 50, versions
        ),
        histogram_bin_ms=bin_ms,
    )


def _worth_retrying(task: Any, task_run: Any, state: Any) -> bool:
    """Retry transient store failures, never a missing version (it will still be missing)."""
    try:
        state.result()
    except VersionNotFound:
        return False
    except Exception:
        return True
    return True


@task(
    name="check-report-target",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=_worth_retrying,
    cache_policy=NO_CACHE,
)
def check_report_target(settings: Settings, attach_to: str | None) -> None:
    """Fail before any work when the report is to be filed under a version that does not exist."""
    if attach_to:
        open_store(settings).get_manifest(attach_to)  # raises VersionNotFound


@task(name="analyse-impact", cache_policy=NO_CACHE)
def analyse_latency_impact(data: ImpactData, options: ImpactOptions) -> ImpactReport:
    """The report's numbers, stamped now (a task so the UI shows its duration and failures)."""
    # The clock is read here, in the shell, so the core stays a function of its arguments.
    return analyse_impact(data, options, now=datetime.now(UTC))


@task(
    name="store-impact-report",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=_worth_retrying,
    cache_policy=NO_CACHE,
)
def store_impact_report(
    settings: Settings, report: ImpactReport, attach_to: str | None
) -> StoredImpactReport:
    """Render HTML and JSON, store them in the model store, attached to a version if given."""
    folder = run_workdir(settings) / "impact"
    folder.mkdir(parents=True, exist_ok=True)
    html_path, json_path = folder / "impact-report.html", folder / "impact-report.json"
    experiments = list_experiments(open_store(settings), attach_to) if attach_to else []
    html_path.write_text(
        with_experiment_section(render_html(report), report, experiments, attach_to),
        encoding="utf-8",
    )
    json_path.write_text(render_json(report), encoding="utf-8")
    return store_report_files(open_store(settings), report, html_path, json_path, attach_to)


@task(name="publish-impact-summary", cache_policy=NO_CACHE)
def publish_impact_summary(report: ImpactReport, stored: StoredImpactReport) -> StoredImpactReport:
    """The markdown artifact with the headline numbers and links to the stored report."""
    create_markdown_artifact(
        key=REPORT_KIND,
        markdown=render_markdown(report, stored),
        description=f"Latency → GMV impact over {report.window}: {report.finding.value}",
    )
    return stored


@task(name="measure-release-experiment", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def measure_release_experiment(
    settings: Settings,
    release: Release,
    baseline: str | None,
    outcome: ReleaseOutcome,
    options: ExperimentOptions | None = None,
) -> ReleaseExperiment:
    """Canary vs baseline over the canary's last step, from ClickHouse; filed beside the version.

    A release without a comparable canary (the first, or one rolled back before its cohorts
    grew) is filed too, as "no experiment" with the reason, so the history shows every release.
    """
    options = options or ExperimentOptions()
    now = datetime.now(UTC)
    identity = (release.release_id, release.version, release.lineage_id, outcome.value)
    if baseline is None:
        why = "first release: no stable version to compare the candidate against"
        experiment = no_experiment(*identity, why, now)
    else:
        client = connect_for_reading(settings.resolved_clickhouse_dsn, settings.resolved_spool_dir)
        events = events_of_release(client, release.release_id)
        window = canary_window(events, now, timedelta(hours=options.pre_period_h))
        if isinstance(window, str):
            experiment = no_experiment(*identity, window, now, baseline_version=baseline)
        else:
            data = query_experiment(
                client, window.start, window.end, window.pre_start, release.version, baseline,
                pre_end=window.pre_end,
            )  # fmt: skip
            experiment = estimate_experiment(
                data, identity, options, now, recorded_sample_ratio(events), window.describe()
            )
    store_experiment(open_store(settings), experiment)
    print(f"experiment {release.version}: {experiment.headline}")
    return experiment


@task(name="publish-impact-history", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def publish_impact_history(settings: Settings) -> str:
    """Rebuild the history page of every release, file it in the model store, publish its table.

    Returns the page's address (the release summary links to it).
    """
    store = open_store(settings)
    page = build_history(store, datetime.now(UTC))
    url = store_history_page(store, page)
    create_markdown_artifact(
        key="impact-history",
        markdown=render_history_markdown(page.rows, url),
        description=f"Impact history: {len(page.rows)} releases",
    )
    return url
