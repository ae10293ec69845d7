"""The durable log path's writer: rows and columnar batches written ahead, then segments or inserts.

On the request path a row costs one record copied into the worker's memory-mapped write-ahead
file (`logstore.wal`) before the answer is sent, so a killed worker loses no answered request's
row; an engine batch's impressions are one columnar record (`append_columns`), written on the
engine's thread before the batch's answers are delivered. Off the request path, every flush
interval (or every `batch_rows` rows) the file is rotated: its rows become one immutable
segment in the spool folder (temp name, fsync, rename) named after the file, and only then is
the file emptied for reuse. By default (RELAY_SERVING_LOG_SEGMENTER=copy) the segment is the
file's records copied as they are by the kernel (`copy_segment`), decoded by whoever ingests.
With `process` a low-priority sibling process (`logstore.segmenter`) encodes an LZ4 Arrow
segment, so the encoding never holds the worker's GIL; the writer's thread waits for it, and
writes the segment itself if the segmenter fails, or while it is behind (more than
SEGMENTER_MAX_BEHIND rotated files waiting: at saturation a niced process on a busy core gets
too little CPU to keep up, and the rows would otherwise pile up into back-pressure).
A serving worker never opens chdb (one process per chdb path); whichever
process owns the log store calls `ingest_spool` before reading. With a ClickHouse server the
worker inserts each rotated file's rows directly and spools only while the server is
unreachable, draining the spool once it answers. Formats: `logstore.segments`; names, recovery
and exactly-once ingestion: `logstore.ingest`.

No row is dropped: a spool above its size cap is reported loudly (error log, `over_cap`, which
the worker turns into a metric and not-ready) and keeps accepting rows; a write-ahead file that
cannot be written keeps rows in memory and says so (`wal_error`, not-ready). Rows written ahead
but not yet out are counted (`pending`): a worker whose writer falls behind turns new requests
away while it is over its limit (serving.worker), rather than grow memory without bound.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa

from logstore import wal
from logstore.ingest import (
    IngestReport,
    LogServer,
    WalRecovery,
    ingest_spool,
    recover_wals,
    wal_id,
)
from logstore.log_tables import LogTable
from logstore.record_copy import copy_segment
from logstore.segmenter import Segmenter
from logstore.segments import (
    COLUMNS,
    INFERENCE_LOGS,
    INGESTING_SUFFIX,
    INSERTING_SUFFIX,
    LATER_COLUMNS,
    RECORDS_SEGMENT_SUFFIX,
    SCHEMA,
    SEGMENT_SUFFIX,
    TABLE,
    WAL_SUFFIX,
    LogRow,
    SpoolBacklog,
    SpoolWriter,
    decode_rows,
    decode_table,
    encode_columns,
    read_segment,
    rows_to_table,
    segment_table,
    stored_form,
    write_segment,
)
from logstore.wal import WalFile

__all__ = [  # the log path's names, importable from here as before the split
    "COLUMNS",
    "INFERENCE_LOGS",
    "INGESTING_SUFFIX",
    "INSERTING_SUFFIX",
    "LATER_COLUMNS",
    "RECORDS_SEGMENT_SUFFIX",
    "SCHEMA",
    "SEGMENT_SUFFIX",
    "TABLE",
    "WAL_SUFFIX",
    "IngestReport",
    "LogRow",
    "LogServer",
    "RequestLogWriter",
    "SpoolBacklog",
    "SpoolWriter",
    "WalRecovery",
    "WriterStats",
    "decode_rows",
    "decode_table",
    "encode_columns",
    "ingest_spool",
    "read_segment",
    "recover_wals",
    "rows_to_table",
    "wal_id",
    "write_segment",
]

log = logging.getLogger("logstore.spool")


# Rotated files waiting behind the one being written above which the writer's own thread writes
# the segment instead of the segmenter: the segmenter is not keeping up (a starved niced process
# on a saturated core), and only the worker's fair share of the CPU drains the backlog in time.
SEGMENTER_MAX_BEHIND = 1


@dataclass
class WriterStats:
    """Running totals of where rows went."""

    rows_inserted: int = 0
    rows_spooled: int = 0
    rows_drained: int = 0  # spooled earlier, inserted once the server answered
    insert_failures: int = 0
    spool_failures: int = 0
    wal_failures: int = 0  # rows the write-ahead file could not take (kept in memory)
    segments_copied: int = 0  # spool segments copied from their write-ahead files as records
    segments_by_segmenter: int = 0  # ... the segmenter process wrote
    segments_by_writer: int = 0  # ... the writer's own thread encoded (no other way, or behind)


@dataclass
class _Batch:
    """Rows bound for one segment or insert, and the write-ahead file holding them (None: none)."""

    segment_id: str
    wal: WalFile | None
    rows: list[Sequence[Any]] = field(default_factory=list)
    parts: list[pa.RecordBatch] = field(default_factory=list)  # columnar records, in order
    count: int = 0  # rows, in `rows` and in `parts`

    def table(self, table: LogTable) -> pa.Table:
        """Every row of the batch as one table of `table`'s schema (off the request path)."""
        return segment_table(self.rows, self.parts, table)

    def stored(self, table: LogTable) -> pa.Table:
        """The batch as its segment holds it (`logstore.segments.stored_form`)."""
        return stored_form(self.rows, self.parts, table)

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
        segmenter: Segmenter | None = None,
        copy_segments: bool = False,
    ) -> None:
        self.spool = spool
        self._copy_segments = copy_segments  # RELAY_SERVING_LOG_SEGMENTER=copy
        self._segmenter = segmenter  # RELAY_SERVING_LOG_SEGMENTER=process
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
        self.pending = 0  # rows written ahead (or kept in memory) and not yet out

    @property
    def buffered(self) -> int:
        """Rows not yet in a segment or ClickHouse (in a write-ahead file, or only in memory)."""
        return self.pending

    def append(self, row: Sequence[Any]) -> None:
        """Write one row ahead and queue it; on the request path, before the answer is sent."""
        self._write_ahead(orjson.dumps(row), (row,))

    def append_group(self, rows: Sequence[Sequence[Any]]) -> None:
        """Write several rows ahead as one record (they survive all or none) and queue them."""
        if rows:
            self._write_ahead(orjson.dumps(rows), rows)  # a list of rows; decode_rows tells

    def append_columns(self, batch: pa.RecordBatch) -> None:
        """Write a columnar batch ahead as one record (all its rows or none) and queue it.

        `batch` is in the table's schema, its journal's or its record's (`LogTable.journal`,
        `LogTable.record`); it is kept by reference until it is written out, so the caller must
        not change its buffers.
        """
        if batch.num_rows:
            self._write_ahead(encode_columns(batch), (), batch)

    def _write_ahead(
        self, payload: bytes, rows: Sequence[Sequence[Any]], part: pa.RecordBatch | None = None
    ) -> None:
        n = len(rows) if part is None else part.num_rows
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
                self.stats.wal_failures += n
            elif self._sync_each_record:  # on the disk before the answer, not only in the cache
                batch.wal.sync_tail(len(payload) + wal.HEADER.size)
            if part is None:
                batch.rows.extend(rows)
            else:
                batch.parts.append(part)
            batch.count += n
            self.pending += n
            if batch.count >= self._batch_rows:
                self._sealed.append(batch)
                self._open = None
                self._wake.set()  # write it out now, not at the next tick

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
        if last is not None and not last.count:
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
                self._write(batch, behind=len(batches) - i - 1)
            except Exception:
                # Server and disk both refused: keep the rows for the next flush, never drop them.
                with self._lock:
                    self._sealed[:0] = batches[i:]
                raise
        if not batches:
            self.spool.rescan_if_due()

    def _rotate(self) -> None:
        with self._lock:
            current = self._open
            if current is None or not current.count:
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
            self._wake.clear()  # a seal or close that comes during the flush wakes it again
            try:
                self.flush()
            except Exception:  # keep the thread alive; the rows are retried below
                log.exception("request-log flush failed")
        self.flush()

    def _write(self, batch: _Batch, behind: int = 0) -> None:
        """Write one rotated batch out; `behind`: rotated batches of this flush waiting after it."""
        server = self._server_or_none()
        if server is not None:
            held = batch.wal
            if held is not None and not held.path.name.endswith(INSERTING_SUFFIX):
                # From here on, recovery must ask ClickHouse whether these rows arrived.
                held.rename(held.path.with_name(held.path.name + INSERTING_SUFFIX))
            try:
                server.insert_arrow(self.spool.table.name, batch.table(self.spool.table))
            except Exception as exc:  # any failure: the rows go to the spool instead
                self.stats.insert_failures += 1
                self._mark_down(exc)
            else:
                self.stats.rows_inserted += batch.count
                self._done(batch)
                try:
                    self._drain(server)
                except Exception as exc:  # the batch is in: never write it again
                    self._mark_down(exc)
                return
        if self._copied(batch) or self._segmented(batch, behind):
            return
        try:
            self.spool.write(batch.stored(self.spool.table), batch.segment_id)
        except Exception:
            self.stats.spool_failures += 1
            raise
        # Only after the segment exists: a crash in between leaves both, and recovery then
        # deletes the write-ahead file alone.
        self._done(batch)
        self.stats.rows_spooled += batch.count
        self.stats.segments_by_writer += 1

    def _copied(self, batch: _Batch) -> bool:
        """Whether the batch's write-ahead file was copied, records as they are, into a segment.

        The kernel moves the bytes and the thread holds no GIL meanwhile; decoding them is left
        to whoever ingests (`logstore.segments.read_segment`). Rows in memory only (no file)
        are encoded here instead.
        """
        held = batch.wal
        if not self._copy_segments or held is None:
            return False
        name = f"{batch.segment_id}{RECORDS_SEGMENT_SUFFIX}"
        try:
            final = copy_segment(self.spool.dir, name, held.fd, held.used)
        except OSError:
            self.stats.spool_failures += 1
            raise  # the file and its rows stay; flush() keeps the batch for the next try
        self.spool.added(final)
        self._done(batch)
        self.stats.rows_spooled += batch.count
        self.stats.segments_copied += 1
        return True

    def _segmented(self, batch: _Batch, behind: int) -> bool:
        """Whether the segmenter process wrote the batch's segment from its write-ahead file."""
        held = batch.wal
        if self._segmenter is None or held is None:  # rows in memory only: written here
            return False
        if behind + len(self._sealed) > SEGMENTER_MAX_BEHIND:  # it is not keeping up
            return False
        if not self._segmenter.segment(
            self.spool.dir, self.spool.table, batch.segment_id, held.fd, held.used, batch.count
        ):
            return False
        self.spool.added(self.spool.dir / f"{batch.segment_id}{SEGMENT_SUFFIX}")
        self._done(batch)
        self.stats.rows_spooled += batch.count
        self.stats.segments_by_segmenter += 1
        return True

    def _done(self, batch: _Batch) -> None:
        with self._lock:
            self.pending -= batch.count
        self._reuse(batch)

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
