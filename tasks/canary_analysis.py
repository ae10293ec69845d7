"""The canary gate's task shell: each step's looks read from ClickHouse, judged, recorded.

The deciding lives in `core.gate` (pure, no Prefect): `core.gate.judge` (one look's verdict:
split, mean, P95/P99, errors, clicks), `core.gate.step` (a step's looks, full or guard),
`core.gate.plan` (how long each step should take), `core.gate.rules` (the one home of the
defaults). This module reads the log store, waits out windows while the fleet serves, and
records every look as a release event and a row of the step's table artifact.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from typing import Any

from clickhouse_connect.driver.exceptions import ClickHouseError
from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from core.gate.evidence import StepEvidence, StepFigures
from core.gate.judge import JUDGE_METHOD, judge_window, latency_regressed
from core.gate.rules import MIN_USERS, CanaryRules
from core.gate.step import StepIO, StepLength, run_step
from logstore.feedback import query_click_cohorts
from logstore.reading import connect_for_reading
from logstore.release_events import EventKind, events_of_release
from logstore.slo import (
    CohortSums,
    query_cohorts,
    query_paired_seconds,
    query_rank_test,
)
from relay.errors import LogStoreError
from relay.settings import Settings
from relay.types import GateResult, Release, Verdict
from serving.fleet import FleetClient
from tasks.canary import record
from tasks.tracing import release_tracer, traced

__all__ = [  # the core's names, where callers of the canary stage have always found them
    "MIN_USERS",
    "CanaryRules",
    "StepEvidence",
    "StepFigures",
    "StepIO",
    "StepLength",
    "judge_window",
    "latency_regressed",
    "run_step",
]

log = logging.getLogger("relay.canary")

LOG_STORE_ERRORS = (ClickHouseError, LogStoreError, OSError)  # evidence of nothing: counted
SLOTS = ("canary", "baseline", "stable")


# -- task shells -----------------------------------------------------------------------------


def reader(settings: Settings) -> Any:
    return connect_for_reading(settings.resolved_clickhouse_dsn, settings.resolved_spool_dir)


def read_step_figures(
    client: Any,
    step_start: datetime,
    start: datetime,
    end: datetime,
    canary: str,
    baseline: str,
    canary_start: datetime | None = None,
) -> StepFigures:
    """Cumulative and last-window figures of one step, and clicks since `canary_start`."""

    def pick(cohorts: list[CohortSums], slot: str, version: str | None) -> CohortSums | None:
        rows = [
            c for c in cohorts if c.slot == slot and (version is None or c.model_version == version)
        ]
        return max(rows, key=lambda c: c.requests) if rows else None

    step = query_cohorts(client, step_start, end, SLOTS)
    clicks = query_click_cohorts(client, canary_start or step_start, end, canary, baseline)
    window = query_cohorts(client, start, end, ("canary", "baseline"))
    return StepFigures(
        canary=pick(step, "canary", canary),
        baseline=pick(step, "baseline", baseline),
        paired=query_paired_seconds(client, step_start, end, canary, baseline),
        stable=pick(step, "stable", None),
        rank=query_rank_test(client, step_start, end, canary, baseline),
        window_canary=pick(window, "canary", canary),
        window_baseline=pick(window, "baseline", baseline),
        window_rank=query_rank_test(client, start, end, canary, baseline),
        clicks_canary=clicks.get("canary"),
        clicks_baseline=clicks.get("baseline"),
    )


def canary_started_at(client: Any, release: Release) -> datetime | None:
    """When this release's canary first took users (its first weight above 0), if it has."""
    for event in events_of_release(client, release.release_id):
        if (
            event.kind == EventKind.weight
            and event.verdict == Verdict.passed
            and event.details.get("weight")
        ):
            return event.ts if event.ts.tzinfo else event.ts.replace(tzinfo=UTC)
    return None


def unreachable_workers(settings: Settings) -> list[str]:
    """URLs of workers that do not answer their admin API."""
    with FleetClient.from_settings(settings) as fleet:
        return [w.url for w in fleet.state().workers if w.status is None]


def _table_row(weight: int, window: int, gate: GateResult) -> dict[str, Any]:
    measured = gate.measurements
    return {
        "weight": weight,
        "window": window,
        "verdict": gate.verdict.value,
        **{
            k: round(measured[k], 4)
            for k in _TABLE_COLUMNS
            if k in measured and math.isfinite(measured[k])
        },
        "reason": gate.reason,
    }


@task(name="analyse-canary-step", cache_policy=NO_CACHE)
@traced("canary step")
def analyse_canary_step(
    settings: Settings,
    release: Release,
    baseline_version: str,
    weight: int,
    rules: CanaryRules,
    window_s: float,
    length: StepLength | None = None,
) -> GateResult:
    """Look after every window until the step is conclusive or its planned windows pass.

    `length` comes from the canary plan (a guard step, or a longer last step at thin traffic);
    without it the step is full and looks at most `rules.max_windows` times.

    Each window: wait while the fleet serves whatever traffic it gets (the shop's, embedded; real
    users', in production), ingest the workers' logs, judge the step's cumulative evidence; every
    look is a release event and a row of the step's table artifact.
    """
    tracer = release_tracer(settings)  # each window a span of the release's trace

    def run_window() -> tuple[datetime, datetime]:
        with tracer.start_as_current_span("analysis window"):
            start = datetime.now(UTC)
            time.sleep(window_s)
            end = datetime.now(UTC)
        time.sleep(2 * settings.serving_log_flush_ms / 1000)  # let workers write the window's rows
        return start, end

    canary_start: list[datetime] = []  # found once, at the first look whose query succeeds

    def read_figures(step_start: datetime, start: datetime, end: datetime) -> StepFigures:
        client = reader(settings)
        if not canary_start:  # a failed lookup is a failed log query, counted like the others
            canary_start.append(canary_started_at(client, release) or step_start)
        return read_step_figures(
            client, step_start, start, end, release.version, baseline_version, canary_start[0]
        )

    def on_look(window: int, gate: GateResult) -> None:  # visible while the step still runs
        record(
            settings,
            release,
            EventKind.slo_window,
            gate.verdict,
            gate.reason,
            weight=weight,
            window=window,
            method=gate.method,
            measurements=gate.measurements,
            thresholds=gate.thresholds,
        )

    io = StepIO(
        run_window, read_figures, lambda: unreachable_workers(settings), on_look, LOG_STORE_ERRORS
    )
    # The canary's weight is leased: renewed while the step runs, its windows and its reads
    # alike (a read of a busy embedded store can outlast a lease: renewing only during the
    # windows let the weight lapse on a worker mid-step, which the split check then flagged),
    # so that it lapses on every worker within one lease of this process dying.
    with ExitStack() as renewal:
        if weight > 0:
            fleet = renewal.enter_context(FleetClient.from_settings(settings))
            renewal.enter_context(fleet.renewing(settings.serving_canary_lease_s))
        looks = run_step(io, rules, weight, length)
    create_table_artifact(
        key=f"canary-weight-{weight}",
        table=[_table_row(weight, i, g) for i, g in enumerate(looks, 1)],
        description=(
            f"Canary {release.version} vs baseline {baseline_version} at {weight} %: one row per "
            f"look, cumulative over the step. Method: {JUDGE_METHOD}."
        ),
    )
    return looks[-1]


_TABLE_COLUMNS = (
    "canary_requests",
    "baseline_requests",
    "canary_p95_ms",
    "baseline_p95_ms",
    "stable_p95_ms",
    "latency_ratio",
    "latency_ratio_low",
    "latency_ratio_high",
    "latency_tolerance_ratio",
    "latency_p_always_valid",
    "p95_ratio",
    "p95_ratio_low",
    "p95_ratio_high",
    "p99_ratio",
    "canary_user_share",
    "canary_request_share",
    "split_p_users",
    "split_p_requests",
    "error_diff",
    "ctr_ratio",
    "ctr_ratio_low",
    "ctr_ratio_high",
    "mwu_p",
    "window_mwu_p",
)
