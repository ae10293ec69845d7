"""Queries behind the business-impact report: sessions joined to their requests, in ClickHouse.

Only per-session rows (and small per-version summaries) leave the database; the join and the
aggregation over log rows run where the rows are, so memory in Python follows the number of
sessions, never the number of requests.

The unit of analysis is the session: a session belongs to a window when it *starts* in
[start, end), and its requests are counted up to `end + max_session` so a session that starts
just before `end` is not cut short.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import pandas as pd
from clickhouse_connect.driver.client import Client

SESSION_COLUMNS: tuple[str, ...] = (
    "session_id",
    "user_id",
    "started_at",
    "user_age",
    "device_type",
    "session_length_s",
    "orders",
    "gmv",
)
INFERENCE_LOG_COLUMNS: tuple[str, ...] = (
    "ts",
    "request_id",
    "user_id",
    "session_id",
    "slot",
    "model_version",
    "lineage_id",
    "latency_ms",
    "queue_ms",
    "preprocess_ms",
    "compute_ms",
    "postprocess_ms",
    "batch_size",
    "input_bytes",
    "status",
    "error_code",
)
SESSION_OUTCOME_COLUMNS: tuple[str, ...] = (
    *SESSION_COLUMNS,
    "requests",
    "failed_requests",
    "latency_mean_ms",
    "latency_p95_ms",
    "model_version",
    "slot",
    "mixed_versions",
)

# Every value below is a bound server-side parameter; no SQL text is built from input.
_WINDOW_SESSIONS = (
    "SELECT session_id FROM user_sessions "
    "WHERE started_at >= {start:DateTime64(3, 'UTC')} AND started_at < {end:DateTime64(3, 'UTC')}"
)
_SESSION_OUTCOMES_SQL = (
    """
    WITH per_session AS (
        SELECT
            session_id,
            count() AS requests,
            countIf(status >= 500) AS failed_requests,
            avg(latency_ms) AS latency_mean_ms,
            -- a reservoir of at most 8,192 latencies per session: exact for real sessions,
            -- bounded for a runaway one
            quantile(0.95)(latency_ms) AS latency_p95_ms,
            -- the version and slot that served the majority of the session's requests; a
            -- constant-size state (topK's per-session hash tables took 4 GB at 500k sessions).
            -- Aliases differ from the columns so later aggregates read the raw columns.
            anyHeavy(model_version) AS primary_version,
            toString(anyHeavy(slot)) AS primary_slot,
            min(model_version) != max(model_version) AS mixed_versions
        FROM inference_logs
        WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {rows_end:DateTime64(3, 'UTC')}
          AND session_id IN ("""
    + _WINDOW_SESSIONS
    + """)
        GROUP BY session_id
    )
    SELECT
        s.session_id AS session_id,
        s.user_id AS user_id,
        s.started_at AS started_at,
        s.user_age AS user_age,
        toString(s.device_type) AS device_type,
        s.session_length_s AS session_length_s,
        s.orders AS orders,
        s.gmv AS gmv,
        r.requests AS requests,
        r.failed_requests AS failed_requests,
        r.latency_mean_ms AS latency_mean_ms,
        r.latency_p95_ms AS latency_p95_ms,
        r.primary_version AS model_version,
        r.primary_slot AS slot,
        r.mixed_versions AS mixed_versions
    FROM (
        SELECT session_id, user_id, started_at, user_age, device_type, session_length_s, orders, gmv
        FROM user_sessions
        WHERE started_at >= {start:DateTime64(3, 'UTC')} AND started_at < {end:DateTime64(3, 'UTC')}
        LIMIT 1 BY session_id
    ) AS s
    INNER JOIN per_session AS r ON r.session_id = s.session_id
    WHERE empty({versions:Array(String)}) OR has({versions:Array(String)}, r.primary_version)
    ORDER BY started_at, session_id
    """
)
_COVERAGE_SQL = """
    SELECT
        (SELECT count() FROM user_sessions
         WHERE started_at >= {start:DateTime64(3, 'UTC')}
           AND started_at < {end:DateTime64(3, 'UTC')}) AS session_rows,
        (SELECT uniqExact(session_id) FROM user_sessions
         WHERE started_at >= {start:DateTime64(3, 'UTC')}
           AND started_at < {end:DateTime64(3, 'UTC')}) AS sessions,
        (SELECT uniqExact(session_id) FROM user_sessions
         WHERE started_at >= {start:DateTime64(3, 'UTC')}
           AND started_at < {end:DateTime64(3, 'UTC')}
           AND session_id NOT IN (
               SELECT session_id FROM inference_logs
               WHERE ts >= {start:DateTime64(3, 'UTC')}
                 AND ts < {rows_end:DateTime64(3, 'UTC')})) AS sessions_without_requests,
        (SELECT count() FROM inference_logs
         WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')}
           AND slot != 'loadtest') AS requests,
        (SELECT count() FROM inference_logs
         WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')}
           AND slot != 'loadtest' AND session_id NOT IN (
               SELECT session_id FROM user_sessions
               WHERE started_at >= {sessions_from:DateTime64(3, 'UTC')}
                 AND started_at < {end:DateTime64(3, 'UTC')})) AS requests_without_session,
        (SELECT uniqExact(session_id) FROM inference_logs
         WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')}
           AND session_id NOT IN (
               SELECT session_id FROM user_sessions
               WHERE started_at >= {sessions_from:DateTime64(3, 'UTC')}
                 AND started_at < {end:DateTime64(3, 'UTC')})) AS unknown_session_ids
    """
# A load test's rows (slot 'loadtest', the capacity check's) were shown to nobody.
_VERSION_FILTER = (
    "(empty({versions:Array(String)}) OR has({versions:Array(String)}, model_version))"
    " AND slot != 'loadtest'"
)
_LATENCY_PROFILE_SQL = (
    "SELECT model_version, toString(slot) AS slot, count() AS requests, "
    "avg(latency_ms) AS mean_ms, "
    "quantilesTDigest(0.5, 0.95, 0.99)(latency_ms) AS q "
    "FROM inference_logs "
    "WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')} AND "
    + _VERSION_FILTER
    + " GROUP BY model_version, slot ORDER BY model_version, slot"
)
_LATENCY_HISTOGRAM_SQL = (
    "SELECT model_version, "
    "least(toUInt32(floor(latency_ms / {bin_ms:Float64})), {last_bin:UInt32}) AS bin, "
    "count() AS requests "
    "FROM inference_logs "
    "WHERE ts >= {start:DateTime64(3, 'UTC')} AND ts < {end:DateTime64(3, 'UTC')} AND "
    + _VERSION_FILTER
    + " GROUP BY model_version, bin ORDER BY model_version, bin"
)


@dataclass(frozen=True)
class JoinCoverage:
    """How completely the window's sessions and requests match each other."""

    session_rows: int  # user_sessions rows starting in the window (duplicates included)
    sessions: int  # distinct session ids starting in the window
    sessions_without_requests: int  # of those, how many logged no request at all
    requests: int  # inference_logs rows in the window, every version
    requests_without_session: int  # rows whose session_id has no user_sessions row
    unknown_session_ids: int  # distinct session ids among those rows

    @property
    def duplicate_session_rows(self) -> int:
        return self.session_rows - self.sessions


def _params(
    start: datetime, end: datetime, max_session: timedelta, versions: Sequence[str] = ()
) -> dict[str, object]:
    if end <= start:
        raise ValueError(f"window end must be after its start, got [{start}, {end})")
    return {
        "start": start,
        "end": end,
        "rows_end": end + max_session,
        "sessions_from": start - max_session,
        "versions": list(versions),
    }


def read_session_outcomes(
    client: Client,
    start: datetime,
    end: datetime,
    versions: Sequence[str] = (),
    max_session: timedelta = timedelta(hours=1),
) -> pd.DataFrame:
    """One row per session that started in [start, end) and logged requests, with its outcomes.

    With `versions`, only sessions mostly served by one of them. Columns: SESSION_OUTCOME_COLUMNS.
    """
    frame = client.query_df(
        _SESSION_OUTCOMES_SQL, parameters=_params(start, end, max_session, versions)
    )
    if frame.empty:  # an empty result carries no usable dtypes; give callers the real shape
        return empty_session_outcomes()
    return frame[list(SESSION_OUTCOME_COLUMNS)]


def empty_session_outcomes() -> pd.DataFrame:
    """A zero-row frame with the columns and dtypes `read_session_outcomes` returns."""
    dtypes = {
        "session_id": "str",
        "user_id": "uint64",
        "started_at": "datetime64[ms]",
        "user_age": "float32",
        "device_type": "str",
        "session_length_s": "float32",
        "orders": "uint16",
        "gmv": "float64",
        "requests": "uint64",
        "failed_requests": "uint64",
        "latency_mean_ms": "float64",
        "latency_p95_ms": "float32",
        "model_version": "str",
        "slot": "str",
        "mixed_versions": "uint8",
    }
    return pd.DataFrame({c: pd.Series(dtype=dtypes[c]) for c in SESSION_OUTCOME_COLUMNS})


def count_join_coverage(
    client: Client, start: datetime, end: datetime, max_session: timedelta = timedelta(hours=1)
) -> JoinCoverage:
    """Counts of sessions without requests and requests without sessions in [start, end).

    A request's session may have started up to `max_session` before `start` and still count as
    known; a session's requests may arrive up to `max_session` after `end`.
    """
    row = client.query(_COVERAGE_SQL, parameters=_params(start, end, max_session)).result_rows[0]
    return JoinCoverage(*(int(v) for v in row))


def read_latency_profile(
    client: Client, start: datetime, end: datetime, versions: Sequence[str] = ()
) -> pd.DataFrame:
    """Per (model_version, slot): requests, mean, p50, p95, p99 latency of requests in the window."""
    result = client.query(
        _LATENCY_PROFILE_SQL, parameters=_params(start, end, timedelta(0), versions)
    )
    records = [
        {
            "model_version": version,
            "slot": slot,
            "requests": int(requests),
            "mean_ms": float(mean),
            "p50_ms": float(q[0]),
            "p95_ms": float(q[1]),
            "p99_ms": float(q[2]),
        }
        for version, slot, requests, mean, q in result.result_rows
    ]
    columns = ["model_version", "slot", "requests", "mean_ms", "p50_ms", "p95_ms", "p99_ms"]
    return pd.DataFrame.from_records(records, columns=columns)


def read_latency_histogram(
    client: Client,
    start: datetime,
    end: datetime,
    bin_ms: float,
    bins: int,
    versions: Sequence[str] = (),
) -> pd.DataFrame:
    """Request counts per (model_version, latency bin); the last bin collects everything above.

    Columns: model_version, bin_start_ms, requests.
    """
    if bin_ms <= 0 or bins < 1:
        raise ValueError(f"need bin_ms > 0 and bins >= 1, got {bin_ms}, {bins}")
    params = _params(start, end, timedelta(0), versions) | {"bin_ms": bin_ms, "last_bin": bins - 1}
    rows = client.query(_LATENCY_HISTOGRAM_SQL, parameters=params).result_rows
    return pd.DataFrame.from_records(
        [(v, int(b) * bin_ms, int(n)) for v, b, n in rows],
        columns=["model_version", "bin_start_ms", "requests"],
    )


def insert_user_sessions(client: Client, frame: pd.DataFrame, chunk_rows: int = 250_000) -> int:
    """Append user_sessions rows (columns as in SESSION_COLUMNS) in chunks; return rows written."""
    return _insert(client, "user_sessions", SESSION_COLUMNS, frame, chunk_rows)


def insert_inference_logs(client: Client, frame: pd.DataFrame, chunk_rows: int = 500_000) -> int:
    """Append inference_logs rows (INFERENCE_LOG_COLUMNS) in chunks; return rows written."""
    return _insert(client, "inference_logs", INFERENCE_LOG_COLUMNS, frame, chunk_rows)


def _insert(
    client: Client, table: str, columns: tuple[str, ...], frame: pd.DataFrame, chunk_rows: int
) -> int:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{table} frame lacks columns: {', '.join(missing)}")
    ordered = frame[list(columns)]
    for lo in range(0, len(ordered), chunk_rows):
        client.insert_df(table, ordered.iloc[lo : lo + chunk_rows])
    return len(ordered)
