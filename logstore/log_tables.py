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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

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
    predates them gets. `journal` is the compact schema a writer may hand columnar batches in
    instead (segments, memory), and `from_journal` turns such a table into this table's rows;
    `record` is a cheaper form still, built on the request path and written ahead, which
    `from_records` turns, many at a time and off the request path, into one journal table. The
    table itself, and so its readers, never see either form.
    """

    name: str
    schema: pa.Schema
    key: tuple[str, ...]
    subdir: str = ""
    later: tuple[tuple[str, Any], ...] = ()
    time_column: str = "ts"
    journal: pa.Schema | None = None
    from_journal: Callable[[pa.Table], pa.Table] | None = None
    record: pa.Schema | None = None
    from_records: Callable[[Sequence[pa.Table | pa.RecordBatch]], pa.Table] | None = None

    def is_journal(self, schema: pa.Schema) -> bool:
        return self.journal is not None and schema.names == self.journal.names

    def is_record(self, schema: pa.Schema) -> bool:
        return self.record is not None and schema.names == self.record.names

    def expand(self, journal: pa.Table) -> pa.Table:
        """A table in the journal schema (or one write-ahead record) as this table's rows."""
        if self.from_records is not None and self.is_record(journal.schema):
            journal = self.from_records([journal])
        if self.from_journal is None:
            raise ValueError(f"the {self.name} table has no journal form")
        return self.from_journal(journal)

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
# What a segment holds impressions as: the per-request values once, as dictionaries the rows
# index into, and each candidate's raw feature row (float64, as the model saw it) as one
# fixed-size list whose field metadata names its columns, so any reader can expand it.
# `impressions_from_journal` expands it, at ingestion, into the table's rows with exactly the
# types and values the row-wise writer gave them.
_DICT = pa.dictionary(pa.int32(), pa.string())
_REQUEST_COLUMNS = ("request_id", "slot", "model_version", "lineage_id", "session_id")
N_RAW_FEATURES = len(CATEGORICAL) + len(DENSE)
IMPRESSION_JOURNAL = pa.schema(
    [
        ("ts", pa.timestamp("ms", tz="UTC")),
        ("request_id", _DICT),
        ("rank", pa.uint16()),
        ("slot", _DICT),
        ("model_version", _DICT),
        ("lineage_id", _DICT),
        ("session_id", _DICT),
        ("score", pa.float32()),
        ("features", pa.list_(pa.float64(), N_RAW_FEATURES)),
    ]
)


def impression_journal(raw_order: tuple[str, ...]) -> pa.Schema:
    """The journal schema for feature rows whose columns are `raw_order` (27 names, once each)."""
    if sorted(raw_order) != sorted([*(c.name for c in CATEGORICAL), *(d.name for d in DENSE)]):
        raise ValueError(f"a raw feature order names the 27 features once each, not {raw_order}")
    at = IMPRESSION_JOURNAL.get_field_index("features")
    field = IMPRESSION_JOURNAL.field(at).with_metadata({"columns": ",".join(raw_order)})
    return IMPRESSION_JOURNAL.set(at, field)


# What an engine batch's impressions are written ahead as, on the engine thread before its
# answers go out (serving.feedback.impression_batch): the candidates' served scores and raw
# feature rows as two columns wrapped around the engine's arrays without a copy, and the
# per-request values (time, ids, how many candidates each) once, as JSON in the schema's
# metadata under RECORD_REQUESTS. It costs five Arrow calls whatever the batch's size; the
# journal built per batch took about twenty (`python -m bench.log_record` measures both).
# `journal_from_records` turns many records at once, in the writer's thread, into one journal.
RECORD_REQUESTS = b"relay.requests"
IMPRESSION_RECORD = pa.schema(
    [("score", pa.float32()), ("features", pa.list_(pa.float64(), N_RAW_FEATURES))]
)
_RECORD_FIELDS = ("ts", *_REQUEST_COLUMNS)


def impression_record(raw_order: tuple[str, ...]) -> pa.Schema:
    """The write-ahead record schema for feature rows whose columns are `raw_order`."""
    order = impression_journal(raw_order).field("features").metadata
    at = IMPRESSION_RECORD.get_field_index("features")
    return IMPRESSION_RECORD.set(at, IMPRESSION_RECORD.field(at).with_metadata(order))


def record_requests(
    sizes: Sequence[int], requests: Sequence[tuple[float, str, str, str, str, str]]
) -> dict[bytes, bytes]:
    """A record's schema metadata: each request's candidate count and its values (_RECORD_FIELDS)."""
    return {RECORD_REQUESTS: orjson.dumps({"sizes": sizes, "requests": requests})}


def journal_from_records(records: Sequence[pa.Table | pa.RecordBatch]) -> pa.Table:
    """Write-ahead records (IMPRESSION_RECORD) as one IMPRESSION_JOURNAL table, in their order.

    A candidate's rank is where its score puts it among its request's candidates (1 = first;
    ties in the order they came). Raises ValueError for a record whose requests do not account
    for its rows exactly (only a bug writes one).
    """
    sizes: list[int] = []
    values: list[list[Any]] = []
    scores: list[pa.Array] = []
    features: list[pa.Array] = []
    columns = None
    for record in records:
        meta = orjson.loads((record.schema.metadata or {}).get(RECORD_REQUESTS, b"null"))
        order = record.schema.field("features").metadata
        if not isinstance(meta, dict) or sum(meta["sizes"]) != record.num_rows:
            raise ValueError(
                f"an impressions record whose requests do not add up to its {record.num_rows} rows"
            )
        if len(meta["requests"]) != len(meta["sizes"]) or (columns not in (None, order)):
            raise ValueError("impressions records that disagree on their requests or columns")
        columns = order
        sizes += meta["sizes"]
        values += meta["requests"]
        for name, out in (("score", scores), ("features", features)):
            column = record.column(name)
            out.extend(column.chunks if isinstance(column, pa.ChunkedArray) else [column])
    schema = IMPRESSION_JOURNAL.set(
        IMPRESSION_JOURNAL.get_field_index("features"),
        IMPRESSION_JOURNAL.field("features").with_metadata(columns),
    )
    if not values:
        return schema.empty_table()
    counts = np.asarray(sizes, dtype=np.int64)
    owner = np.repeat(np.arange(len(values), dtype=np.int32), counts)
    score = pa.chunked_array(scores, pa.float32()).combine_chunks()
    ranked = np.lexsort((-score.to_numpy().astype(np.float64), owner))  # stable, by request
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    rank = np.empty(len(owner), dtype=np.uint16)
    rank[ranked] = np.arange(1, len(owner) + 1) - starts
    owners = pa.array(owner, pa.int32())
    per_request = list(zip(*values, strict=True))
    ts_ms = np.round(np.asarray(per_request[0], dtype=np.float64) * 1000).astype(np.int64)
    arrays: dict[str, pa.Array] = {
        "ts": pa.array(np.repeat(ts_ms, counts)).view(schema.field("ts").type),
        "rank": pa.array(rank),
        "score": score,
        "features": pa.chunked_array(features, schema.field("features").type).combine_chunks(),
    }
    for name, column in zip(_RECORD_FIELDS[1:], per_request[1:], strict=True):
        arrays[name] = pa.DictionaryArray.from_arrays(owners, pa.array(column, pa.string()))
    return pa.table([arrays[n] for n in schema.names], schema=schema)


def impressions_from_journal(journal: pa.Table) -> pa.Table:
    """IMPRESSION_JOURNAL rows as IMPRESSIONS rows: dictionaries decoded, features split."""
    meta = journal.schema.field("features").metadata or {}
    names = meta.get(b"columns", b"").decode().split(",")
    if len(names) != N_RAW_FEATURES:
        raise ValueError("an impressions journal without the names of its feature columns")
    raw = journal.column("features").combine_chunks().flatten().to_numpy()
    raw = raw.reshape(-1, N_RAW_FEATURES)
    at = {name: j for j, name in enumerate(names)}
    columns: dict[str, Any] = {n: journal.column(n) for n in ("ts", "rank", "score")}
    for name in _REQUEST_COLUMNS:
        columns[name] = pc.cast(journal.column(name), pa.string())
    for c in CATEGORICAL:  # whole numbers the worker accepted: exact in uint64
        columns[c.name] = pa.array(raw[:, at[c.name]].astype(np.uint64))
    for d in DENSE:  # rounded to float32, as the row-wise writer rounded them
        columns[d.name] = pa.array(raw[:, at[d.name]].astype(np.float32))
    return pa.table([columns[n] for n in IMPRESSIONS.schema.names], schema=IMPRESSIONS.schema)


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
    journal=IMPRESSION_JOURNAL,
    from_journal=impressions_from_journal,
    record=IMPRESSION_RECORD,
    from_records=journal_from_records,
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

# One row per request stable answered that the canary slot also scored in shadow
# (serving.shadow); the columns and their order are the shadow_pairs table's (migration 5).
SHADOW_PAIRS = LogTable(
    "shadow_pairs",
    pa.schema(
        [
            ("ts", pa.timestamp("ms", tz="UTC")),
            ("request_id", pa.string()),
            ("user_id", pa.uint64()),
            ("stable_version", pa.string()),
            ("candidate_version", pa.string()),
            ("stable_latency_ms", pa.float32()),
            ("shadow_latency_ms", pa.float32()),
            ("shadow_error", pa.string()),
            ("candidates", pa.uint16()),
            ("stable_top_k", pa.list_(pa.uint64())),
            ("shadow_top_k", pa.list_(pa.uint64())),
        ]
    ),
    key=("request_id",),
    subdir="shadow_pairs",
)
SHADOW_PAIR_COLUMNS: tuple[str, ...] = tuple(SHADOW_PAIRS.schema.names)
