"""Inference-log rows: a write-ahead file per worker, spool segments, direct inserts, ingestion.

On the request path a row costs one record copied into the worker's memory-mapped write-ahead
file (`logstore.wal`) before the answer is sent, so a killed worker loses no answered request's
row. Off the request path, every flush interval (or every `batch_rows` rows) the file is rotated:
its rows become one immutable Parquet segment in the spool folder (temp name, fsync, rename)
named after the file, and only then is the file deleted. A serving worker never opens chdb (one
process per chdb path); whichever process owns the log store calls `ingest_spool` before
reading. With a ClickHouse server the worker inserts each rotated file's rows directly and
spools only while the server is unreachable, draining the spool once it answers.

Exactly once across crashes, by file names: `<id>.wal` (rows not yet anywhere else),
`<id>.wal.inserting` (an INSERT of them may have landed), `<id>.parquet` (a finished segment),
`<id>.parquet.ingesting` (claimed by an ingester, or recovered from an `.inserting` file: its
rows are inserted only if absent). A segment is never ingested while a write-ahead file of the
same id exists, and a write-ahead file whose segment exists is only deleted. A dead worker's
files (`recover_wals`, run by every worker at start and before every ingestion) become
segments, their torn last record dropped.

No row is dropped: a spool above its size cap is reported loudly (error log, `over_cap`, which
the worker turns into a metric and not-ready) and keeps accepting rows; a write-ahead file that
cannot be written keeps rows in memory and says so (`wal_error`, not-ready).
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from logstore import wal
from logstore.log_tables import LogTable
from logstore.wal import WalFile
from relay.errors import LogStoreError

log = logging.getLogger("logstore.spool")

TABLE = "inference_logs"
SEGMENT_SUFFIX = ".parquet"
INGESTING_SUFFIX = ".ingesting"
WAL_SUFFIX = ".wal"
INSERTING_SUFFIX = ".inserting"  # after WAL_SUFFIX: its rows were handed to a server INSERT

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


class LogServer(Protocol):
    """The part of a clickhouse-connect client the log path uses."""

    def insert_arrow(self, table: str, arrow_table: pa.Table) -> Any: ...

    def query(self, query: str, parameters: dict[str, Any] | None = None) -> Any: ...


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


@dataclass(frozen=True)
class SpoolBacklog:
    """Finished segments waiting for ingestion, and their size."""

    segments: int
    bytes: int


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
        self.backlog = self.scan()

    def next_id(self) -> str:
        """A fresh segment id, unique across workers and restarts; names sort by time."""
        return f"{self.prefix}-{time.time_ns()}-{next(self._seq):06d}"

    def write(self, rows: Sequence[Sequence[Any]], segment_id: str | None = None) -> Path:
        """Write rows as one segment (temp name, fsync, rename) and return its path."""
        name = f"{segment_id or self.next_id()}{SEGMENT_SUFFIX}"
        final = write_segment(self.dir, name, rows, self.table)
        try:  # the segment is written: a failed rescan must not make its rows be written again
            self.check_cap()
        except OSError as exc:
            log.warning("could not rescan spool %s after writing %s: %s", self.dir, name, exc)
        return final

    def scan(self) -> SpoolBacklog:
        """Segments not yet ingested (including ones mid-ingestion) and their bytes."""
        count = size = 0
        with os.scandir(self.dir) as entries:
            for entry in entries:
                if entry.name.startswith(".") or not entry.is_file():
                    continue
                if entry.name.endswith((SEGMENT_SUFFIX, INGESTING_SUFFIX)):
                    try:
                        size += entry.stat().st_size
                    except FileNotFoundError:  # claimed or ingested while we looked: gone
                        continue
                    count += 1
        return SpoolBacklog(count, size)

    def check_cap(self) -> SpoolBacklog:
        """Rescan the spool; log an error on crossing the cap and every minute while above it."""
        self.backlog = self.scan()
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


def read_segment(path: Path, table: LogTable = INFERENCE_LOGS) -> pa.Table:
    """A segment as a `table` table; columns it predates are filled with their defaults."""
    found = pq.read_table(path, schema=table.schema)
    for name, default in table.later:
        column = found.column(name)
        if column.null_count:
            filled = pc.fill_null(column, pa.scalar(default, table.schema.field(name).type))
            found = found.set_column(found.schema.get_field_index(name), name, filled)
    return found


def write_segment(
    directory: Path, name: str, rows: Sequence[Sequence[Any]], table: LogTable = INFERENCE_LOGS
) -> Path:
    """`rows` as the Parquet file `directory/name`, which appears whole or not at all."""
    final = directory / name
    tmp = directory / f".tmp-{name}"
    try:
        with open(tmp, "wb") as f:
            pq.write_table(rows_to_table(rows, table), f, compression="zstd")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(directory)
    return final


def decode_rows(data: bytes, table: LogTable = INFERENCE_LOGS) -> tuple[list[LogRow], int]:
    """The rows of a write-ahead file's bytes, and the bytes of torn tail dropped after them.

    A row written by a worker that predates `table`'s later columns gets their defaults.
    """
    payloads, torn = wal.parse(data)
    decoded: list[LogRow] = []
    for i, payload in enumerate(payloads):
        try:
            value = orjson.loads(payload)
        except orjson.JSONDecodeError:  # only a bug writes this; keep what came before it
            log.error("undecodable write-ahead record %d: dropping it and what follows", i)
            return decoded, torn + sum(len(p) + wal.HEADER.size for p in payloads[i:])
        rows = value if value and isinstance(value[0], list) else [value]  # append_group's
        decoded.extend(cast(LogRow, table.complete(tuple(row))) for row in rows)
    return decoded, torn


def wal_id(name: str) -> str | None:
    """The segment id of a write-ahead file's name, None for any other file."""
    for suffix in (WAL_SUFFIX + INSERTING_SUFFIX, WAL_SUFFIX):
        if name.endswith(suffix) and not name.startswith("."):
            return name[: -len(suffix)]
    return None


def _has_wal(directory: Path, segment_id: str) -> bool:
    return any(
        (directory / f"{segment_id}{WAL_SUFFIX}{tail}").exists() for tail in ("", INSERTING_SUFFIX)
    )


def _has_segment(directory: Path, segment_id: str) -> bool:
    return any(
        (directory / f"{segment_id}{SEGMENT_SUFFIX}{tail}").exists()
        for tail in ("", INGESTING_SUFFIX)
    )


@dataclass(frozen=True)
class WalRecovery:
    """What `recover_wals` found of workers that died."""

    files: int
    rows: int
    torn_bytes: int  # the unfinished last records dropped (requests never answered)


def recover_wals(spool_dir: Path, table: LogTable = INFERENCE_LOGS) -> WalRecovery:
    """Turn every dead worker's write-ahead file into a segment, once; leave live ones alone."""
    if not spool_dir.exists():
        return WalRecovery(0, 0, 0)
    files = rows = torn = 0
    for path in sorted(spool_dir.iterdir()):
        segment_id = wal_id(path.name)
        if segment_id is None:
            continue
        fd = wal.claim(path)
        if fd is None:
            continue  # a live worker's, or already recovered by someone else
        try:
            if not _has_segment(spool_dir, segment_id):  # else: rotated, only not yet deleted
                recovered, dropped = decode_rows(wal.read_all(fd), table)
                if recovered:
                    # An .inserting file's rows may already be in ClickHouse: as a claimed
                    # segment they are inserted only if absent.
                    tail = INGESTING_SUFFIX if path.name.endswith(INSERTING_SUFFIX) else ""
                    name = f"{segment_id}{SEGMENT_SUFFIX}{tail}"
                    write_segment(spool_dir, name, recovered, table)
                rows += len(recovered)
                torn += dropped
            path.unlink(missing_ok=True)
            files += 1
        finally:
            os.close(fd)
    if files:
        log.warning(
            "recovered %d request-log write-ahead file(s) of stopped workers in %s%s: %d rows, "
            "%d bytes of unfinished last records dropped",
            files,
            spool_dir,
            "" if table is INFERENCE_LOGS else f" for the {table.name} table",
            rows,
            torn,
        )
    return WalRecovery(files, rows, torn)


@dataclass(frozen=True)
class IngestReport:
    """What one ingest_spool call moved into ClickHouse."""

    segments: int
    rows: int
    recovered: int  # segments a crashed ingester had left half-way, finished now


# Segments claimed together are inserted as one block (one INSERT, one MergeTree part), which
# ClickHouse applies whole or not at all below its max_insert_block_size (1,048,576 rows). A batch
# stays far below that; a spool of small segments (one per flush, 10 a second per writer at
# 100 ms) is then ingested at the cost of its rows, not of one INSERT per segment.
INGEST_BATCH_ROWS = 200_000
INGEST_BATCH_SEGMENTS = 2_000


def ingest_spool(
    client: LogServer, spool_dir: Path, table: LogTable = INFERENCE_LOGS
) -> IngestReport:
    """Insert every finished segment into its table, each exactly once, then delete it.

    Dead workers' write-ahead files become segments first; a segment whose write-ahead file
    still exists is left for the next call (its writer has not finished rotating it). Segments
    are claimed and inserted in batches, each batch one block: after a crash, each claimed
    segment is looked for on its own (`_already_inserted`), and a batch's are all there or none.
    """
    if not spool_dir.exists():
        return IngestReport(0, 0, 0)
    with _one_ingester(spool_dir):
        return _ingest(client, spool_dir, table)


@contextmanager
def _one_ingester(spool_dir: Path) -> Iterator[None]:
    """Hold the folder's ingestion lock (an flock on the folder itself) while ingesting.

    A live ingester's claimed segments look like a crashed one's leftovers: a second ingester
    would find them absent and insert them, and the first would insert them again. A second
    ingester waits instead; the lock dies with its holder, so a crash never leaves it held.
    """
    fd = os.open(spool_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _ingest(client: LogServer, spool_dir: Path, table: LogTable) -> IngestReport:
    recover_wals(spool_dir, table)
    segments = rows = recovered = 0
    for leftover in sorted(spool_dir.glob(f"*{INGESTING_SUFFIX}")):
        if leftover.name.startswith(".") or _has_wal(
            spool_dir, leftover.name.removesuffix(SEGMENT_SUFFIX + INGESTING_SUFFIX)
        ):
            continue
        found = read_segment(leftover, table)
        if not _already_inserted(client, found, table):
            _insert(client, found, leftover, table)
            rows += found.num_rows
        leftover.unlink()
        recovered += 1
    claimed: list[Path] = []
    parts: list[pa.Table] = []
    pending = 0  # rows claimed, not yet inserted

    def insert_claimed() -> None:
        # A failed INSERT leaves the batch's segments claimed: the next call finds each one
        # among the leftovers above, sees it absent and inserts it.
        nonlocal segments, rows, pending
        if claimed:
            _insert(client, pa.concat_tables(parts), claimed[0], table, len(claimed))
            for path in claimed:
                path.unlink()
            segments, rows, pending = segments + len(claimed), rows + pending, 0
            claimed.clear()
            parts.clear()

    for segment in sorted(spool_dir.glob(f"*{SEGMENT_SUFFIX}")):
        if segment.name.startswith(".") or _has_wal(spool_dir, segment.stem):
            continue
        claim = segment.with_name(segment.name + INGESTING_SUFFIX)
        try:
            os.rename(segment, claim)  # atomic: of two ingesters, one wins each segment
        except FileNotFoundError:
            continue
        claimed.append(claim)
        parts.append(read_segment(claim, table))
        pending += parts[-1].num_rows
        if pending >= INGEST_BATCH_ROWS or len(claimed) >= INGEST_BATCH_SEGMENTS:
            insert_claimed()
    insert_claimed()
    return IngestReport(segments, rows, recovered)


def _insert(
    client: LogServer, rows: pa.Table, path: Path, table: LogTable, segments: int = 1
) -> None:
    # One block per INSERT: ClickHouse applies a block whole or not at all, which is what
    # lets a crashed ingestion be checked afterwards by looking for each segment's rows.
    try:
        client.insert_arrow(table.name, rows)
    except Exception as exc:  # the driver raises several types; all mean "not inserted"
        more = f" (and {segments - 1} more segments of its batch)" if segments > 1 else ""
        raise LogStoreError(f"could not insert spool segment {path}{more}: {exc}") from exc


def _already_inserted(client: LogServer, rows: pa.Table, table: LogTable) -> bool:
    if rows.num_rows == 0:
        return True
    at, time_column = rows.column(table.time_column), table.time_column
    # Table and column names are LogTable constants, never input; values are bound parameters.
    found = client.query(
        f"SELECT count() FROM {table.name} "
        f"WHERE {time_column} >= {{lo:DateTime64(3, 'UTC')}} "
        f"AND {time_column} <= {{hi:DateTime64(3, 'UTC')}} "
        f"AND {table.key_sql()} IN {{ids:Array(String)}}",
        parameters={
            "lo": pc.min(at).as_py(),
            "hi": pc.max(at).as_py(),
            "ids": sorted({table.key_of(rows, 0), table.key_of(rows, rows.num_rows - 1)}),
        },
    ).result_rows[0][0]
    return int(found) > 0


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class WriterStats:
    """Running totals of where rows went."""

    rows_inserted: int = 0
    rows_spooled: int = 0
    rows_drained: int = 0  # spooled earlier, inserted once the server answered
    insert_failures: int = 0
    spool_failures: int = 0
    wal_failures: int = 0  # rows the write-ahead file could not take (kept in memory)


@dataclass
class _Batch:
    """Rows bound for one segment or insert, and the write-ahead file holding them (None: none)."""

    segment_id: str
    wal: WalFile | None
    rows: list[Sequence[Any]] = field(default_factory=list)

    def retire(self) -> None:
        if self.wal is not None:
            self.wal.retire()
            self.wal = None


class RequestLogWriter:
    """Writes each row ahead on the request path; rotates rows into segments or inserts.

    `append` returns once the row is in the operating system's hands (its write-ahead file), so
    callers append before they answer. A background thread rotates the file every `flush_s` (or
    the request path does, every `batch_rows` rows). With `connect_server` (a ClickHouse server
    DSN) a rotated file's rows are inserted directly and spooled only when the insert fails;
    without it (embedded chdb) each becomes a spool segment.
    """

    def __init__(
        self,
        spool: SpoolWriter,
        *,
        connect_server: Callable[[], LogServer] | None,
        flush_s: float,
        batch_rows: int,
        sync_each_record: bool = False,
    ) -> None:
        self.spool = spool
        self._sync_each_record = sync_each_record  # RELAY_SERVING_LOG_FSYNC=request
        self._connect_server = connect_server
        self._server: LogServer | None = None
        self._server_down_since: float | None = None
        self._flush_s = flush_s
        self._batch_rows = batch_rows
        self._lock = threading.Lock()  # the request path and the flusher both rotate
        self._open: _Batch | None = None  # taking rows now
        self._sealed: list[_Batch] = []  # rotated, waiting to be written
        self._spare: WalFile | None = None  # emptied after its rows were written: the next file
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="request-log", daemon=True)
        self.stats = WriterStats()
        self.wal_error: str | None = None  # why rows are in memory only, while they are

    @property
    def buffered(self) -> int:
        """Rows not yet in a segment or ClickHouse (in a write-ahead file, or only in memory)."""
        with self._lock:
            batches = [*self._sealed, *([self._open] if self._open else [])]
            return sum(len(b.rows) for b in batches)

    def append(self, row: Sequence[Any]) -> None:
        """Write one row ahead and queue it; on the request path, before the answer is sent."""
        self._write_ahead(orjson.dumps(row), (row,))

    def append_group(self, rows: Sequence[Sequence[Any]]) -> None:
        """Write several rows ahead as one record (they survive all or none) and queue them.

        A request's impressions are one record: one copy and one lock instead of one per row.
        """
        if rows:
            self._write_ahead(orjson.dumps(rows), rows)  # a list of rows; decode_rows tells

    def _write_ahead(self, payload: bytes, rows: Sequence[Sequence[Any]]) -> None:
        with self._lock:
            batch = self._open
            if batch is None:
                batch = self._open = self._new_batch()
            if batch.wal is not None and not batch.wal.append(payload):
                self._sealed.append(batch)  # that file is full: the row starts the next one
                batch = self._open = self._new_batch()
                if batch.wal is not None and not batch.wal.append(payload):
                    batch.wal.retire()  # a row larger than a whole file: memory only
                    batch.wal = None
            if batch.wal is None:
                self.stats.wal_failures += len(rows)
            elif self._sync_each_record:  # on the disk before the answer, not only in the cache
                batch.wal.sync_tail(len(payload) + wal.HEADER.size)
            batch.rows.extend(rows)
            if len(batch.rows) >= self._batch_rows:
                self._sealed.append(batch)
                self._open = None

    def start(self) -> None:
        """Recover stopped workers' write-ahead files, then start writing in the background."""
        recover_wals(self.spool.dir, self.spool.table)
        self.spool.check_cap()
        self._thread.start()

    def close(self) -> None:
        """Write everything still buffered, stop the thread, delete the empty write-ahead file."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        else:
            self.flush()
        with self._lock:
            last, self._open = self._open, None
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.retire()
        if last is not None and not last.rows:
            last.retire()
        elif last is not None:  # appended after the final flush: leave it to recovery
            self._sealed.append(last)

    def flush(self) -> None:
        """Rotate the write-ahead file, then write every rotated batch out."""
        self._rotate()
        with self._lock:
            batches, self._sealed = self._sealed, []
        for i, batch in enumerate(batches):
            try:
                self._write(batch)
            except Exception:
                # Server and disk both refused: keep the rows for the next flush, never drop them.
                with self._lock:
                    self._sealed[:0] = batches[i:]
                raise
        if not batches:
            self.spool.check_cap()

    def _rotate(self) -> None:
        with self._lock:
            current = self._open
            if current is None or not current.rows:
                return
            spare, self._spare = self._spare, None
        # A new file is slow next to a row: made outside the lock, when there is no spare.
        fresh: _Batch | None = self._batch_in(spare) if spare else self._create_batch()
        with self._lock:
            if self._open is current:
                self._sealed.append(current)
                self._open, fresh = fresh, None
        if fresh is not None:  # the request path rotated meanwhile
            fresh.retire()

    def _new_batch(self) -> _Batch:
        """A batch to take rows (the caller holds the lock): in the spare file if there is one."""
        spare, self._spare = self._spare, None
        return self._batch_in(spare) if spare else self._create_batch()

    def _batch_in(self, wal_file: WalFile) -> _Batch:
        self._wal_works()
        return _Batch(wal_file.path.name.removesuffix(WAL_SUFFIX), wal_file)

    def _create_batch(self) -> _Batch:
        segment_id = self.spool.next_id()
        try:
            wal_file = WalFile.create(self.spool.dir, f"{segment_id}{WAL_SUFFIX}")
        except OSError as exc:
            self._wal_failed(exc)
            return _Batch(segment_id, None)
        self._wal_works()
        return _Batch(segment_id, wal_file)

    def _reuse(self, batch: _Batch) -> None:
        """The batch's rows are safe: its file becomes the spare, or is deleted if one exists."""
        held, batch.wal = batch.wal, None
        if held is None:
            return
        with self._lock:
            wanted = self._spare is None
        if wanted:
            try:
                held.recycle(self.spool.dir / f"{self.spool.next_id()}{WAL_SUFFIX}")
            except OSError:
                wanted = False  # emptied but not renamed: deleted below, as it would have been
        if wanted:
            with self._lock:
                if self._spare is None:
                    self._spare, held = held, None
        if held is not None:
            held.retire()

    def _wal_works(self) -> None:
        if self.wal_error is not None:
            log.warning("request-log write-ahead file works again in %s", self.spool.dir)
            self.wal_error = None

    def _wal_failed(self, exc: OSError) -> None:
        if self.wal_error is None:
            log.error(
                "cannot write the request-log write-ahead file in %s (%s): rows are kept in "
                "memory until it can be written; the worker reports not-ready",
                self.spool.dir,
                exc,
            )
        self.wal_error = f"request-log write-ahead file in {self.spool.dir}: {exc}"

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._flush_s)
            try:
                self.flush()
            except Exception:  # keep the thread alive; the rows are retried below
                log.exception("request-log flush failed")
        self.flush()

    def _write(self, batch: _Batch) -> None:
        server = self._server_or_none()
        if server is not None:
            held = batch.wal
            if held is not None and not held.path.name.endswith(INSERTING_SUFFIX):
                # From here on, recovery must ask ClickHouse whether these rows arrived.
                held.rename(held.path.with_name(held.path.name + INSERTING_SUFFIX))
            try:
                server.insert_arrow(
                    self.spool.table.name, rows_to_table(batch.rows, self.spool.table)
                )
            except Exception as exc:  # any failure: the rows go to the spool instead
                self.stats.insert_failures += 1
                self._mark_down(exc)
            else:
                self.stats.rows_inserted += len(batch.rows)
                self._reuse(batch)
                try:
                    self._drain(server)
                except Exception as exc:  # the batch is in: never write it again
                    self._mark_down(exc)
                return
        try:
            self.spool.write(batch.rows, batch.segment_id)
        except Exception:
            self.stats.spool_failures += 1
            raise
        # Only after the segment exists: a crash in between leaves both, and recovery then
        # deletes the write-ahead file alone.
        self._reuse(batch)
        self.stats.rows_spooled += len(batch.rows)

    def _server_or_none(self) -> LogServer | None:
        if self._connect_server is None:
            return None
        if self._server is None:
            try:
                self._server = self._connect_server()
            except Exception as exc:
                self._mark_down(exc)
                return None
        return self._server

    def _mark_down(self, exc: Exception) -> None:
        if self._server_down_since is None:
            self._server_down_since = time.monotonic()
            log.warning(
                "ClickHouse unreachable, spooling request logs to %s: %s", self.spool.dir, exc
            )
        self._server = None

    def _drain(self, server: LogServer) -> None:
        if self._server_down_since is None and not self.spool.backlog.segments:
            return
        report = ingest_spool(server, self.spool.dir, self.spool.table)
        self.stats.rows_drained += report.rows
        if self._server_down_since is not None:
            log.warning("ClickHouse is back; drained %d spooled rows", report.rows)
        self._server_down_since = None
        self.spool.check_cap()
