"""Queries over the `events` table: the training window and the demo's seeding."""

from __future__ import annotations

from datetime import datetime

import pandas as pd
from clickhouse_connect.driver.client import Client

from relay.features import FEATURE_NAMES, LABEL

EVENT_COLUMNS: tuple[str, ...] = ("ts", "session_id", *FEATURE_NAMES, LABEL)

# Column names come from the fixed tuple above, never from input; values are bound parameters.
_WINDOW_SQL = (
    f"SELECT {', '.join(EVENT_COLUMNS)} FROM events "
    "WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')} "
    "ORDER BY ts, user_id"
)
_SAMPLE_SQL = (
    f"SELECT {', '.join(EVENT_COLUMNS)} FROM events "
    "WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')} "
    "ORDER BY cityHash64(session_id, user_id, item_id, ts) LIMIT {rows:UInt32}"
)
_COUNT_SQL = (
    "SELECT count() FROM events "
    "WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')}"
)


def read_window(client: Client, start: datetime, end: datetime) -> pd.DataFrame:
    """Every event with start <= ts < end, oldest first."""
    frame = client.query_df(_WINDOW_SQL, parameters={"start": start, "end": end})
    if frame.empty:  # an empty result carries no columns; give callers the real shape
        return pd.DataFrame({name: pd.Series(dtype="float64") for name in EVENT_COLUMNS})
    return frame


def sample_window(client: Client, start: datetime, end: datetime, rows: int) -> pd.DataFrame:
    """Up to `rows` events of [start, end), a deterministic sample ordered by a content hash."""
    return client.query_df(_SAMPLE_SQL, parameters={"start": start, "end": end, "rows": rows})


def count_window(client: Client, start: datetime, end: datetime) -> int:
    """How many events fall in [start, end)."""
    return int(client.query(_COUNT_SQL, parameters={"start": start, "end": end}).result_rows[0][0])


def insert_events(client: Client, frame: pd.DataFrame, chunk_rows: int = 250_000) -> int:
    """Append events (columns as in EVENT_COLUMNS) in chunks; return rows written."""
    missing = [c for c in EVENT_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"events frame lacks columns: {', '.join(missing)}")
    ordered = frame[list(EVENT_COLUMNS)]
    for start in range(0, len(ordered), chunk_rows):
        client.insert_df("events", ordered.iloc[start : start + chunk_rows])
    return len(ordered)
