"""Prefect shell of data validation: read the training window from ClickHouse, run the rules
(core.data.validation) and publish their outcome."""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd
from prefect import task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

import logstore

# The window and its rules live in the pure core; re-exported for existing callers.
from core.data.validation import (
    DataLimits,
    DataReport,
    ExpectationOutcome,
    TrainingWindow,
    build_suite,
    failure_message,
    validate_frame,
    window_ending,
    with_served,
)
from logstore.events import read_window
from logstore.feedback import LABEL_DELAY, read_labelled_window
from logstore.reading import connect_for_reading
from relay.errors import DataValidationFailed, LogStoreError
from relay.settings import Settings

__all__ = [
    "DataLimits",
    "DataReport",
    "ExpectationOutcome",
    "TrainingWindow",
    "build_suite",
    "failure_message",
    "read_training_window",
    "validate_frame",
    "validate_training_data",
    "window_ending",
    "with_served",
]


@task(name="read-training-window", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def read_training_window(
    settings: Settings, window: TrainingWindow, served: bool = False
) -> pd.DataFrame:
    """The window's events from ClickHouse, by SQL; with `served`, plus its labelled impressions.

    Feedback on traffic seconds old has not all arrived, so served impressions newer than
    LABEL_DELAY are left out rather than read as unclicked.
    """
    try:
        if not served:
            client = logstore.connect(settings.resolved_clickhouse_dsn)
            return read_window(client, window.start, window.end)
        client = connect_for_reading(settings.resolved_clickhouse_dsn, settings.resolved_spool_dir)
        labelled_end = min(window.end, datetime.now(UTC) - LABEL_DELAY)
        events = read_window(client, window.start, window.end)
        served_events = read_labelled_window(client, window.start, labelled_end)
        print(
            f"training window {window}: {len(events):,} events and {len(served_events):,} "
            f"served impressions labelled by feedback (older than {LABEL_DELAY})"
        )
        return with_served(events, served_events)
    except LogStoreError:
        raise
    except Exception as exc:
        raise LogStoreError(
            f"reading training window {window} from {logstore.redact(settings.resolved_clickhouse_dsn)} failed: {exc}"
        ) from exc


@task(name="validate-training-data", cache_policy=NO_CACHE)
def validate_training_data(
    frame: pd.DataFrame, window: TrainingWindow, limits: DataLimits
) -> DataReport:
    """Run the suite, publish its results as a table artifact, and stop the run if it fails."""
    report = validate_frame(frame, limits)
    create_table_artifact(
        key="data-validation",
        table=[
            {
                "expectation": o.expectation,
                "column": o.column,
                "success": o.success,
                "observed": o.observed,
            }
            for o in report.outcomes
        ],
        description=f"Great Expectations over training window {window}: "
        f"{'passed' if report.success else f'{len(report.failures)} failed'}",
    )
    if not report.success:
        raise DataValidationFailed(failure_message(report, window))
    return report
