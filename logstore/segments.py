"""The durable log path's formats: write-ahead records, spool segments, and the spool's size.

A write-ahead record (`logstore.wal`) holds either rows as JSON (one row, or a group of rows
that survive together: `RequestLogWriter.append`, `append_group`) or a columnar batch as an
Arrow IPC stream (`append_columns`: an engine batch's impressions, one record per batch). A
record tells which it is by its first bytes: an IPC stream starts with the 0xFFFFFFFF
continuation marker, JSON with `[`. A columnar record may be in a table's *journal* schema
(`LogTable.journal`), a compact form that `LogTable.from_journal` turns into the table's rows,
or its *record* schema (`LogTable.record`), cheaper to build on the request path, which the
writer turns into the journal form (`LogTable.from_records`) before a segment is written.

A spool segment is one Arrow IPC file (LZ4 frames), written to a temporary name, fsynced and
renamed, so it appears whole or not at all. Arrow IPC is a copy of the columns' buffers: writing
it costs a memcpy and LZ4, where Parquet's encoders cost ~20x more CPU on the worker's own
core (4.2 against 0.22 ms per 4,000 impressions rows, measured with `time.thread_time`).
Segments that older workers wrote as Parquet are still read and ingested.

A *records* segment (`.records`, RELAY_SERVING_LOG_SEGMENTER=copy, the default) is a sealed
write-ahead file's records byte for byte: the serving worker copies them in the kernel
(`logstore.record_copy.copy_segment`: copy_file_range, no GIL held, no Arrow call), fsyncs and renames, and whoever
ingests decodes them (`read_segment`) off the serving path. It is larger on disk than an LZ4
segment; the worker's CPU per request is what it saves (bench.serving, docs/serving.md).
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from logstore import wal
from logstore.log_tables import LogTable

log = logging.getLogger("logstore.spool")  # one logger for the whole durable log path

TABLE = "inference_logs"
SEGMENT_SUFFIX = ".arrow"
RECORDS_SEGMENT_SUFFIX = ".records"  # a sealed write-ahead file's records, as they were written
LEGACY_SEGMENT_SUFFIX = ".parquet"  # what workers before the columnar log path wrote
SEGMENT_SUFFIXES = (SEGMENT_SUFFIX, RECORDS_SEGMENT_SUFFIX, LEGACY_SEGMENT_SUFFIX)
INGESTING_SUFFIX = ".ingesting"
WAL_SUFFIX = ".wal"
INSERTING_SUFFIX = ".inserting"  # after WAL_SUFFIX: its rows were handed to a server INSERT
_IPC_MARKER = b"\xff\xff\xff\xff"  # an Arrow IPC stream's first message starts with it
_WRITE_OPTIONS = ipc.IpcWriteOptions(compression="lz4")
# Given explicitly: without options pyarrow reads two environment variables per writer, a
# tenth of a small batch's record cost.
_RECORD_OPTIONS = ipc.IpcWriteOptions()

SCHEMA = pa.schema(
    [
        ("ts", pa.timestamp("ms", tz="UTC")),
        ("request_id", pa.string()),
        ("user_id", pa.uint64()),
        ("session_id", pa.string()),
        ("slot", pa.string()),
        ("model_version", pa.string()),
        ("lineage_id", pa.string()),
        ("latency_ms", pa.float32()),
        ("queue_ms", pa.float32()),
        ("preprocess_ms", pa.float32()),
        ("compute_ms", pa.float32()),
        ("postprocess_ms", pa.float32()),
        ("batch_size", pa.uint16()),
        ("input_bytes", pa.uint32()),
        ("status", pa.uint16()),
        ("error_code", pa.string()),
        ("rows", pa.uint32()),  # migration 3: the request's candidate rows
        ("trace_id", pa.string()),  # migration 3: 32 hex digits, the request's trace
    ]
)
COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)
# Columns added after rows were first written: a segment or write-ahead record from a worker
# that predates them lacks them, and gets these values (ClickHouse's column defaults).
LATER_COLUMNS: dict[str, Any] = {"rows": 0, "trace_id": ""}

# One inference_logs row, in COLUMNS order; ts is Unix seconds (time.time()).
LogRow = tuple[
    float,
    str,
    int,
    str,
    str,
    str,
    str,
    float,
    float,
    float,
    float,
    float,
    int,
    int,
    int,
    str,
    int,
    str,
]

INFERENCE_LOGS = LogTable(TABLE, SCHEMA, ("request_id",), later=tuple(LATER_COLUMNS.items()))


def rows_to_table(rows: Sequence[Sequence[Any]], table: LogTable = INFERENCE_LOGS) -> pa.Table:
    """Rows as an Arrow table with the table's column types (inference_logs by default).

    The table's time column comes as Unix seconds (time.time()). Rows that lack the table's
    later columns (made by code that predates them) get their defaults.
    """
    schema = table.schema
    if rows and len(rows[0]) < len(schema):
        rows = [table.complete(tuple(row)) for row in rows]
    columns: list[Sequence[Any]] = (
        list(zip(*rows, strict=True)) if rows else [[]] * len(schema.names)
    )
    at = schema.get_field_index(table.time_column)
    arrays = [
        _time_array(col, schema.field(i).type) if i == at else pa.array(col, schema.field(i).type)
        for i, col in enumerate(columns)
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _time_array(seconds: Sequence[float], type_: pa.DataType) -> pa.Array:
    """Unix seconds as the time column's type (milliseconds): rounded, never truncated."""
    return pa.array([round(t * 1000) for t in seconds], type=pa.int64()).cast(type_)


def encode_columns(batch: pa.RecordBatch) -> bytes:
    """One columnar write-ahead record: `batch` as a self-describing Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema, options=_RECORD_OPTIONS) as writer:
        writer.write_batch(batch)
    return cast(bytes, sink.getvalue().to_pybytes())


def journaled(parts: Sequence[pa.Table | pa.RecordBatch], table: LogTable) -> list[pa.Table]:
    """Parts as tables, in order, each run of write-ahead records turned into one journal table.

    A run at once: building the journal costs the same few dozen Arrow calls for one record as
    for a thousand, and a writer's file holds records only.
    """
    tables: list[pa.Table] = []
    for is_record, run in itertools.groupby(parts, key=lambda p: table.is_record(p.schema)):
        if is_record:
            assert table.from_records is not None  # is_record: the table has a record form
            tables.append(table.from_records(list(run)))
        else:
            tables += [p if isinstance(p, pa.Table) else pa.Table.from_batches([p]) for p in run]
    return tables


def as_table(parts: Sequence[pa.Table | pa.RecordBatch], table: LogTable) -> pa.Table:
    """Columnar parts (in the table's schema, its journal's or its record's) as one table."""
    tables = journaled(parts, table)
    if tables and all(table.is_journal(t.schema) for t in tables):  # expanded all together
        return table.expand(pa.concat_tables(tables))
    tables = [table.expand(t) if table.is_journal(t.schema) else t for t in tables]
    tables = [t.select(table.schema.names).cast(table.schema) for t in tables]
    return pa.concat_tables(tables) if tables else table.schema.empty_table()


def segment_table(
    rows: Sequence[Sequence[Any]],
    parts: Sequence[pa.Table | pa.RecordBatch],
    table: LogTable = INFERENCE_LOGS,
) -> pa.Table:
    """Rows and columnar parts, rows first, as one table of `table`'s schema."""
    if not parts:
        return rows_to_table(rows, table)
    columnar = as_table(parts, table)
    return pa.concat_tables([rows_to_table(rows, table), columnar]) if rows else columnar


def stored_form(
    rows: Sequence[Sequence[Any]], parts: Sequence[pa.RecordBatch], table: LogTable
) -> pa.Table:
    """What a segment holds: journal tables (records turned into one), else rows.

    Keeping the journal form costs the writer little; expanding it into the table's rows is
    left to whoever ingests, off the serving worker's core.
    """
    forms = [table.is_journal(p.schema) or table.is_record(p.schema) for p in parts]
    if parts and not rows and all(forms):
        # An IPC file holds one dictionary per column: the tables' are merged into one, and
        # the tables into one record batch. Small engine batches (one or two requests each)
        # made a file of hundreds of tiny LZ4 frames: 83 µs a batch, against 28 µs combined,
        # and a file 24 times the size (500 one-request batches, `time.thread_time`).
        return pa.concat_tables(journaled(parts, table)).unify_dictionaries().combine_chunks()
    return segment_table(rows, parts, table)


def decode_records(
    data: bytes, table: LogTable = INFERENCE_LOGS, *, each_record: bool = False
) -> tuple[list[Sequence[Any]], list[pa.Table], int]:
    """A write-ahead file's records: its JSON rows, its columnar parts, and the torn tail dropped.

    Columnar parts stay in the form they were written in (the table's, its journal's or its
    record's), as `stored_form` takes them; with `each_record`, a part in the record form is
    turned into a journal table on its own, which checks its requests against its rows, and a
    part that fails the check ends what is read, as an undecodable record does.
    """
    payloads, torn = wal.parse(data)
    rows: list[Sequence[Any]] = []
    parts: list[pa.Table] = []
    for i, payload in enumerate(payloads):
        try:
            if payload.startswith(_IPC_MARKER):
                part = ipc.open_stream(payload).read_all()
                if each_record and table.from_records is not None and table.is_record(part.schema):
                    part = table.from_records([part])
                parts.append(part)
            else:
                rows.extend(_json_rows(payload, table))
        except (orjson.JSONDecodeError, pa.ArrowInvalid, ValueError, KeyError, TypeError):
            # only a bug writes this
            log.error("undecodable write-ahead record %d: dropping it and what follows", i)
            torn += sum(len(p) + wal.HEADER.size for p in payloads[i:])
            break
    return rows, parts, torn


def decode_table(data: bytes, table: LogTable = INFERENCE_LOGS) -> tuple[pa.Table, int, int]:
    """A write-ahead file's records as one table, its row count, and the torn tail dropped."""
    rows, parts, torn = decode_records(data, table, each_record=True)
    found = segment_table(rows, parts, table)
    return found, found.num_rows, torn


def decode_rows(data: bytes, table: LogTable = INFERENCE_LOGS) -> tuple[list[LogRow], int]:
    """The JSON rows of a write-ahead file's bytes, and the bytes of torn tail dropped after them.

    A row written by a worker that predates `table`'s later columns gets their defaults.
    Columnar records are `decode_table`'s; here they end the rows read, as a bad record does.
    """
    payloads, torn = wal.parse(data)
    decoded: list[LogRow] = []
    for i, payload in enumerate(payloads):
        try:
            decoded.extend(cast(list[LogRow], _json_rows(payload, table)))
        except orjson.JSONDecodeError:
            log.error("undecodable write-ahead record %d: dropping it and what follows", i)
            return decoded, torn + sum(len(p) + wal.HEADER.size for p in payloads[i:])
    return decoded, torn


def _json_rows(payload: bytes, table: LogTable) -> list[tuple[Any, ...]]:
    value = orjson.loads(payload)
    rows = value if value and isinstance(value[0], list) else [value]  # append_group's
    return [table.complete(tuple(row)) for row in rows]


def read_segment(path: Path, table: LogTable = INFERENCE_LOGS) -> pa.Table:
    """A segment as a `table` table; columns it predates are filled with their defaults."""
    if LEGACY_SEGMENT_SUFFIX in path.name:
        found = pq.read_table(path, schema=table.schema)
    elif RECORDS_SEGMENT_SUFFIX in path.name:
        found = _records_table(path, table)
    else:
        with pa.OSFile(str(path), "rb") as f:
            found = ipc.open_file(f).read_all()
        if table.is_journal(found.schema):
            found = table.expand(found)
        found = _with_later_columns(found, table)
    for name, default in table.later:
        column = found.column(name)
        if column.null_count:
            filled = pc.fill_null(column, pa.scalar(default, table.schema.field(name).type))
            found = found.set_column(found.schema.get_field_index(name), name, filled)
    return found


def _records_table(path: Path, table: LogTable) -> pa.Table:
    """A records segment's rows. Its records were whole when copied, so a torn or undecodable
    byte is a bug or a damaged disk: it raises, naming the segment, and is never dropped."""
    rows, parts, torn = decode_records(path.read_bytes(), table)
    if torn:
        raise ValueError(f"records segment {path}: {torn} bytes of its records do not decode")
    return segment_table(rows, parts, table)


def _with_later_columns(found: pa.Table, table: LogTable) -> pa.Table:
    for name, _ in table.later:
        if name not in found.column_names:
            found = found.append_column(
                table.schema.field(name), pa.nulls(found.num_rows, table.schema.field(name).type)
            )
    return found.select(table.schema.names).cast(table.schema)


def write_segment(
    directory: Path,
    name: str,
    rows: Sequence[Sequence[Any]] | pa.Table,
    table: LogTable = INFERENCE_LOGS,
) -> Path:
    """`rows` (or a table) as the Arrow IPC file `directory/name`: whole or not at all.

    It is written as `.tmp-<name>`, locked from before its first byte until after its rename,
    so a non-empty temporary file nobody locks was left by a writer that died mid-write (its
    rows are still in their write-ahead file) and recovery deletes it (`logstore.ingest`).
    """
    found = rows if isinstance(rows, pa.Table) else rows_to_table(rows, table)
    final = directory / name
    tmp = directory / f"{wal.CREATING_PREFIX}{name}"
    try:
        with open(tmp, "wb") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            with ipc.new_file(f, found.schema, options=_WRITE_OPTIONS) as writer:
                writer.write_table(found)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, final)  # still locked: the lock is dropped when the file closes
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(directory)
    return final


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_segment(name: str) -> bool:
    """A finished segment's name (new or legacy format), not yet claimed."""
    return not name.startswith(".") and name.endswith(SEGMENT_SUFFIXES)


def segment_id_of(name: str) -> str:
    """The id of a segment's file name, claimed or not."""
    name = name.removesuffix(INGESTING_SUFFIX)
    for suffix in SEGMENT_SUFFIXES:
        name = name.removesuffix(suffix)
    return name


@dataclass(frozen=True)
class SpoolBacklog:
    """Finished segments waiting for ingestion, and their size."""

    segments: int
    bytes: int


# A full rescan of the spool folder lists and stats every segment (~2 ms per 1,000 on this
# host), on the writer's thread, holding the GIL. With ClickHouse down, or with nothing yet
# ingesting, the backlog grows to thousands of segments, and a rescan at every rotation made
# each rotation slower than the last. So a write adds its own segment to the backlog, and the
# folder is rescanned (to see what ingesters removed) only every RESCAN_MIN_S, or, for a big
# backlog, no more often than RESCAN_COST_SHARE of the time: the cap is crossed the moment a
# write crosses it; going back under it is seen at the next rescan.
RESCAN_MIN_S = 1.0
RESCAN_COST_SHARE = 0.01


class SpoolWriter:
    """Writes immutable segments into a spool folder and watches its size against a cap."""

    def __init__(
        self, spool_dir: Path, max_bytes: int, prefix: str, table: LogTable = INFERENCE_LOGS
    ) -> None:
        self.table = table
        self.dir = spool_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.prefix = prefix
        self._seq = itertools.count(1)  # next() is atomic: ids are drawn from two threads
        self._last_alarm = 0.0
        self.over_cap = False
        self._next_rescan = 0.0
        self.backlog = self.scan()

    def next_id(self) -> str:
        """A fresh segment id, unique across workers and restarts; names sort by time."""
        return f"{self.prefix}-{time.time_ns()}-{next(self._seq):06d}"

    def write(
        self, rows: Sequence[Sequence[Any]] | pa.Table, segment_id: str | None = None
    ) -> Path:
        """Write rows (or a table) as one segment (temp name, fsync, rename); its path."""
        name = f"{segment_id or self.next_id()}{SEGMENT_SUFFIX}"
        final = write_segment(self.dir, name, rows, self.table)
        self.added(final)
        return final

    def added(self, segment: Path) -> None:
        """Count a segment just written into the backlog; rescan the folder when one is due.

        Never raises: the segment is written, and a failed rescan must not make its rows be
        written again.
        """
        try:
            size = segment.stat().st_size
        except FileNotFoundError:  # already ingested
            pass
        else:
            self.backlog = SpoolBacklog(self.backlog.segments + 1, self.backlog.bytes + size)
        try:
            self.rescan_if_due()
        except OSError as exc:
            log.warning("could not rescan spool %s after writing %s: %s", self.dir, segment, exc)

    def rescan_if_due(self) -> SpoolBacklog:
        """The backlog, rescanned from the folder if the last rescan is old enough; judged
        against the cap either way."""
        if time.monotonic() >= self._next_rescan:
            return self.check_cap()
        return self._judge()

    def scan(self) -> SpoolBacklog:
        """Segments not yet ingested (including ones mid-ingestion) and their bytes."""
        count = size = 0
        with os.scandir(self.dir) as entries:
            for entry in entries:
                if entry.name.startswith(".") or not entry.is_file():
                    continue
                if entry.name.endswith((*SEGMENT_SUFFIXES, INGESTING_SUFFIX)):
                    try:
                        size += entry.stat().st_size
                    except FileNotFoundError:  # claimed or ingested while we looked: gone
                        continue
                    count += 1
        return SpoolBacklog(count, size)

    def check_cap(self) -> SpoolBacklog:
        """Rescan the spool; log an error on crossing the cap and every minute while above it."""
        started = time.monotonic()
        self.backlog = self.scan()
        took = time.monotonic() - started
        self._next_rescan = started + max(RESCAN_MIN_S, took / RESCAN_COST_SHARE)
        return self._judge()

    def _judge(self) -> SpoolBacklog:
        over = self.backlog.bytes > self.max_bytes
        now = time.monotonic()
        if over and (not self.over_cap or now - self._last_alarm > 60):
            log.error(
                "%s spool %s holds %d bytes in %d segments, over its cap of %d: "
                "nothing is ingesting it; rows are still kept, the worker reports not-ready",
                self.table.name,
                self.dir,
                self.backlog.bytes,
                self.backlog.segments,
                self.max_bytes,
            )
            self._last_alarm = now
        elif self.over_cap and not over:
            log.warning("%s spool %s is back under its cap", self.table.name, self.dir)
        self.over_cap = over
        return self.backlog
