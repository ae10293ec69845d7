"""The tables the durable log path (logstore.spool) writes besides inference_logs.

Serving workers write `impressions` (one row per candidate answered: what the model saw and
where it ranked it) and `feedback` (what users did with an impression, from POST /v1/feedback)
through the same write-ahead file → Parquet segment → ingestion path as request rows, each in
its own subfolder of the spool, so every answered impression and every accepted feedback event
is in ClickHouse exactly once. `logstore.feedback` joins the two into labelled events.

The shop process (`simulation.shop_service`) writes `user_sessions` (one row per shopper
session, with its orders and GMV) the same way: it cannot open the embedded ClickHouse either,
which the log store's owner holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from relay.features import CATEGORICAL, DENSE


@dataclass(frozen=True)
class LogTable:
    """A table the durable log path writes: its Arrow schema and what identifies a row.

    `time_column` names the row's time (`ts` for the serving tables, `started_at` for sessions):
    rows carry it as Unix seconds and the table holds it in milliseconds. `key` names the
    columns whose values tell one row from every other of the table: a segment whose ingestion
    may have half-happened is looked for by its first and last row's key, within its rows' time.
    `subdir` is where its files live in the spool folder ("" = the folder itself, where
    inference_logs has always been). `later` lists the columns added after rows were first
    written, with the value (ClickHouse's column default) a row or segment from a worker that
    predates them gets.
    """

    name: str
    schema: pa.Schema
    key: tuple[str, ...]
    subdir: str = ""
    later: tuple[tuple[str, Any], ...] = ()
    time_column: str = "ts"

    def complete(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        """`row` with the later columns it lacks (it was written before them) at their defaults."""
        missing = len(self.schema) - len(row)
        if missing <= 0 or missing > len(self.later):
            return row
        return row + tuple(default for _, default in self.later[-missing:])

    def spool_dir(self, spool_root: Path) -> Path:
        return spool_root / self.subdir if self.subdir else spool_root

    def key_sql(self) -> str:
        """The key as one ClickHouse String expression (column names are this module's own)."""
        if len(self.key) == 1:
            return f"toString({self.key[0]})"
        return "concat(" + ", '#', ".join(f"toString({c})" for c in self.key) + ")"

    def key_of(self, rows: pa.Table, row: int) -> str:
        """The same key, from one row of an Arrow table of this schema."""
        return "#".join(str(rows.column(c)[row].as_py()) for c in self.key)


# Categorical features are kept as the request carried them (any whole number the worker
# accepted), so they are UInt64 here; dense ones are float32, as the worker rounds them.
IMPRESSION_FEATURES = [(c.name, pa.uint64()) for c in CATEGORICAL] + [
    (d.name, pa.float32()) for d in DENSE
]
IMPRESSIONS = LogTable(
    "impressions",
    pa.schema(
        [
            ("ts", pa.timestamp("ms", tz="UTC")),
            ("request_id", pa.string()),
            ("rank", pa.uint16()),
            ("slot", pa.string()),
            ("model_version", pa.string()),
            ("lineage_id", pa.string()),
            ("session_id", pa.string()),
            ("score", pa.float32()),
            *IMPRESSION_FEATURES,
        ]
    ),
    key=("request_id", "rank"),
    subdir="impressions",
)
IMPRESSION_COLUMNS: tuple[str, ...] = tuple(IMPRESSIONS.schema.names)

FEEDBACK_EVENTS: tuple[str, ...] = ("click", "order")
FEEDBACK = LogTable(
    "feedback",
    pa.schema(
        [
            ("ts", pa.timestamp("ms", tz="UTC")),
            ("feedback_id", pa.string()),
            ("request_id", pa.string()),
            ("item_id", pa.uint64()),
            ("event", pa.string()),
            ("order_value", pa.float64()),
        ]
    ),
    key=("feedback_id",),
    subdir="feedback",
)
FEEDBACK_COLUMNS: tuple[str, ...] = tuple(FEEDBACK.schema.names)

# One row per shopper session that got an answer, as `simulation.traffic.drive` reports it; the
# columns and their order are the user_sessions table's (logstore.impact.SESSION_COLUMNS).
USER_SESSIONS = LogTable(
    "user_sessions",
    pa.schema(
        [
            ("session_id", pa.string()),
            ("user_id", pa.uint64()),
            ("started_at", pa.timestamp("ms", tz="UTC")),
            ("user_age", pa.float32()),
            ("device_type", pa.string()),
            ("session_length_s", pa.float32()),
            ("orders", pa.uint16()),
            ("gmv", pa.float64()),
        ]
    ),
    key=("session_id",),
    subdir="sessions",
    time_column="started_at",
)
USER_SESSION_COLUMNS: tuple[str, ...] = tuple(USER_SESSIONS.schema.names)
