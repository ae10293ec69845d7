"""Inference-log rows, written off the request path: spool segments, direct inserts, ingestion.

A serving worker never opens chdb (one process per chdb path). It writes immutable Parquet
segments into a spool folder (temp name, fsync, rename), and whichever process owns the log
store calls `ingest_spool` before reading. With a ClickHouse server the worker inserts
directly and spools only while the server is unreachable, draining the spool once it answers.

No row is dropped: a spool above its size cap is reported loudly (error log, `over_cap`, which
the worker turns into a metric and not-ready) and keeps accepting rows. Ingestion is
exactly-once across crashes: a segment is renamed to `*.ingesting` before its single-block
INSERT, and a leftover `*.ingesting` file is inserted again only if its rows are absent.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from relay.errors import LogStoreError

log = logging.getLogger("logstore.spool")

TABLE = "inference_logs"
SEGMENT_SUFFIX = ".parquet"
INGESTING_SUFFIX = ".ingesting"

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
    ]
)
COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)

# One inference_logs row, in COLUMNS order; ts is Unix seconds (time.time()).
LogRow = tuple[
    float, str, int, str, str, str, str, float, float, float, float, float, int, int, int, str
]


class LogServer(Protocol):
    """The part of a clickhouse-connect client the log path uses."""

    def insert_arrow(self, table: str, arrow_table: pa.Table) -> Any: ...

    def query(self, query: str, parameters: dict[str, Any] | None = None) -> Any: ...


def rows_to_table(rows: Sequence[LogRow]) -> pa.Table:
    """Rows as an Arrow table with the inference_logs column types."""
    columns: list[Sequence[Any]] = list(zip(*rows, strict=True)) if rows else [[]] * len(COLUMNS)
    ts_ms = [round(t * 1000) for t in columns[0]]
    arrays = [pa.array(ts_ms, type=pa.int64()).cast(SCHEMA.field("ts").type)]
    arrays += [
        pa.array(col, type=SCHEMA.field(i).type) for i, col in enumerate(columns[1:], start=1)
    ]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


@dataclass(frozen=True)
class SpoolBacklog:
    """Finished segments waiting for ingestion, and their size."""

    segments: int
    bytes: int


class SpoolWriter:
    """Writes immutable segments into a spool folder and watches its size against a cap."""

    def __init__(self, spool_dir: Path, max_bytes: int, prefix: str) -> None:
        self.dir = spool_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.prefix = prefix
        self._seq = 0
        self._last_alarm = 0.0
        self.over_cap = False
        self.backlog = self.scan()

    def write(self, rows: Sequence[LogRow]) -> Path:
        """Write rows as one segment (temp name, fsync, rename) and return its path."""
        self._seq += 1
        name = f"{self.prefix}-{time.time_ns()}-{self._seq:06d}{SEGMENT_SUFFIX}"
        final = self.dir / name
        tmp = self.dir / f".tmp-{name}"
        try:
            with open(tmp, "wb") as f:
                pq.write_table(rows_to_table(rows), f, compression="zstd")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(self.dir)
        self.check_cap()
        return final

    def scan(self) -> SpoolBacklog:
        """Segments not yet ingested (including ones mid-ingestion) and their bytes."""
        count = size = 0
        with os.scandir(self.dir) as entries:
            for entry in entries:
                if entry.name.startswith(".") or not entry.is_file():
                    continue
                if entry.name.endswith((SEGMENT_SUFFIX, INGESTING_SUFFIX)):
                    count += 1
                    size += entry.stat().st_size
        return SpoolBacklog(count, size)

    def check_cap(self) -> SpoolBacklog:
        """Rescan the spool; log an error on crossing the cap and every minute while above it."""
        self.backlog = self.scan()
        over = self.backlog.bytes > self.max_bytes
        now = time.monotonic()
        if over and (not self.over_cap or now - self._last_alarm > 60):
            log.error(
                "inference-log spool %s holds %d bytes in %d segments, over its cap of %d: "
                "nothing is ingesting it; rows are still kept, the worker reports not-ready",
                self.dir,
                self.backlog.bytes,
                self.backlog.segments,
                self.max_bytes,
            )
            self._last_alarm = now
        elif self.over_cap and not over:
            log.warning("inference-log spool %s is back under its cap", self.dir)
        self.over_cap = over
        return self.backlog


@dataclass(frozen=True)
class IngestReport:
    """What one ingest_spool call moved into ClickHouse."""

    segments: int
    rows: int
    recovered: int  # segments a crashed ingester had left half-way, finished now


def ingest_spool(client: LogServer, spool_dir: Path) -> IngestReport:
    """Insert every finished segment into inference_logs, each exactly once, then delete it."""
    if not spool_dir.exists():
        return IngestReport(0, 0, 0)
    segments = rows = recovered = 0
    for leftover in sorted(spool_dir.glob(f"*{INGESTING_SUFFIX}")):
        table = pq.read_table(leftover, schema=SCHEMA)
        if not _already_inserted(client, table):
            _insert(client, table, leftover)
            rows += table.num_rows
        leftover.unlink()
        recovered += 1
    for segment in sorted(spool_dir.glob(f"*{SEGMENT_SUFFIX}")):
        if segment.name.startswith("."):
            continue
        claimed = segment.with_name(segment.name + INGESTING_SUFFIX)
        try:
            os.rename(segment, claimed)  # atomic: of two ingesters, one wins each segment
        except FileNotFoundError:
            continue
        table = pq.read_table(claimed, schema=SCHEMA)
        _insert(client, table, claimed)
        claimed.unlink()
        segments += 1
        rows += table.num_rows
    return IngestReport(segments, rows, recovered)


def _insert(client: LogServer, table: pa.Table, path: Path) -> None:
    # One block per segment: ClickHouse applies a block whole or not at all, which is what
    # lets a crashed ingestion be checked afterwards by looking for the segment's rows.
    try:
        client.insert_arrow(TABLE, table)
    except Exception as exc:  # the driver raises several types; all mean "not inserted"
        raise LogStoreError(f"could not insert spool segment {path}: {exc}") from exc


def _already_inserted(client: LogServer, table: pa.Table) -> bool:
    if table.num_rows == 0:
        return True
    ts = table.column("ts")
    ids = table.column("request_id")
    found = client.query(
        "SELECT count() FROM inference_logs "
        "WHERE ts >= {lo:DateTime64(3, 'UTC')} AND ts <= {hi:DateTime64(3, 'UTC')} "
        "AND request_id IN {ids:Array(String)}",
        parameters={
            "lo": pc.min(ts).as_py(),
            "hi": pc.max(ts).as_py(),
            "ids": sorted({ids[0].as_py(), ids[-1].as_py()}),
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


class RequestLogWriter:
    """Buffers rows in memory and writes them from a background thread every `flush_s`.

    With `connect_server` (a ClickHouse server DSN) rows are inserted directly and spooled only
    when the insert fails; without it (embedded chdb) every batch becomes a spool segment.
    """

    def __init__(
        self,
        spool: SpoolWriter,
        *,
        connect_server: Callable[[], LogServer] | None,
        flush_s: float,
        batch_rows: int,
    ) -> None:
        self.spool = spool
        self._connect_server = connect_server
        self._server: LogServer | None = None
        self._server_down_since: float | None = None
        self._flush_s = flush_s
        self._batch_rows = batch_rows
        self._rows: list[LogRow] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="request-log", daemon=True)
        self.stats = WriterStats()

    @property
    def buffered(self) -> int:
        return len(self._rows)

    def append(self, row: LogRow) -> None:
        """Queue one row (called on the request path: a list append, nothing more)."""
        self._rows.append(row)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Write everything still buffered and stop the thread."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        else:
            self.flush()

    def flush(self) -> None:
        """Write out what is buffered now, in batches of at most batch_rows."""
        # Swapping the list is atomic under the GIL, so appends never wait for a write.
        rows, self._rows = self._rows, []
        for start in range(0, len(rows), self._batch_rows):
            try:
                self._write(rows[start : start + self._batch_rows])
            except Exception:
                # Server and disk both refused: keep the rows for the next flush, never drop them.
                self._rows[:0] = rows[start:]
                raise
        if not rows:
            self.spool.check_cap()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._flush_s)
            try:
                self.flush()
            except Exception:  # keep the thread alive; the rows are retried below
                log.exception("request-log flush failed")
        self.flush()

    def _write(self, rows: list[LogRow]) -> None:
        server = self._server_or_none()
        if server is not None:
            try:
                server.insert_arrow(TABLE, rows_to_table(rows))
                self.stats.rows_inserted += len(rows)
                self._drain(server)
                return
            except Exception as exc:  # any failure: the rows go to the spool instead
                self.stats.insert_failures += 1
                self._mark_down(exc)
        try:
            self.spool.write(rows)
        except Exception:
            self.stats.spool_failures += 1
            raise
        self.stats.rows_spooled += len(rows)

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
        report = ingest_spool(server, self.spool.dir)
        self.stats.rows_drained += report.rows
        if self._server_down_since is not None:
            log.warning("ClickHouse is back; drained %d spooled rows", report.rows)
        self._server_down_since = None
        self.spool.check_cap()


def connect_for_reading(dsn: str, spool_dir: Path) -> Any:
    """A client for reading inference logs that include every row the fleet has logged so far.

    Embedded (chdb): the workers spool their rows and the reader ingests them first. With a
    ClickHouse server the workers insert directly (draining their own spool), so nothing to do.
    """
    from logstore.client import connect

    client = connect(dsn)
    if dsn.startswith("chdb://"):
        ingest_spool(client, spool_dir)
    return client
