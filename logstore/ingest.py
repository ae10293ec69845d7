"""Recovery and ingestion of a spool folder: dead writers' files to segments, segments to tables.

Exactly once across crashes, by file names: `<id>.wal` (rows not yet anywhere else),
`<id>.wal.inserting` (an INSERT of them may have landed), `<id>.arrow` or `<id>.records` (a
finished segment, encoded or the write-ahead records copied as they are; `.parquet` from older
workers), `<id>.arrow.ingesting` and the like (claimed by an ingester, or recovered
from an `.inserting` file: its rows are inserted only if absent). A segment is never ingested
while a write-ahead file of the same id exists, and a write-ahead file whose segment exists is
only deleted. A dead worker's files (`recover_wals`, run by every worker at start and before
every ingestion) become segments, their torn last record dropped.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from logstore import wal
from logstore.log_tables import LogTable
from logstore.segments import (
    INFERENCE_LOGS,
    INGESTING_SUFFIX,
    INSERTING_SUFFIX,
    SEGMENT_SUFFIX,
    SEGMENT_SUFFIXES,
    WAL_SUFFIX,
    decode_table,
    is_segment,
    log,
    read_segment,
    segment_id_of,
    write_segment,
)
from relay.errors import LogStoreError


class LogServer(Protocol):
    """The part of a clickhouse-connect client the log path uses."""

    def insert_arrow(self, table: str, arrow_table: pa.Table) -> Any: ...

    def query(self, query: str, parameters: dict[str, Any] | None = None) -> Any: ...


def wal_id(name: str) -> str | None:
    """The segment id of a write-ahead file's name, None for any other file."""
    for suffix in (WAL_SUFFIX + INSERTING_SUFFIX, WAL_SUFFIX):
        if name.endswith(suffix) and not name.startswith("."):
            return name[: -len(suffix)]
    return None


def has_wal(directory: Path, segment_id: str) -> bool:
    return any(
        (directory / f"{segment_id}{WAL_SUFFIX}{tail}").exists() for tail in ("", INSERTING_SUFFIX)
    )


def _has_segment(directory: Path, segment_id: str) -> bool:
    return any(
        (directory / f"{segment_id}{suffix}{tail}").exists()
        for suffix in SEGMENT_SUFFIXES
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
            _remove_if_abandoned(path)
            continue
        fd = wal.claim(path)
        if fd is None:
            continue  # a live worker's, or already recovered by someone else
        try:
            if not _has_segment(spool_dir, segment_id):  # else: rotated, only not yet deleted
                recovered, count, dropped = decode_table(wal.read_all(fd), table)
                if count:
                    # An .inserting file's rows may already be in ClickHouse: as a claimed
                    # segment they are inserted only if absent.
                    tail = INGESTING_SUFFIX if path.name.endswith(INSERTING_SUFFIX) else ""
                    write_segment(spool_dir, f"{segment_id}{SEGMENT_SUFFIX}{tail}", recovered)
                rows += count
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


def _remove_if_abandoned(path: Path) -> None:
    """Delete a temporary file a writer died filling: `.tmp-<id>.wal` or `.tmp-<segment>`.

    `WalFile.create` locks a write-ahead file before it reserves its pages, and rows are
    appended only after the rename to its real name; `write_segment` locks a segment before its
    first byte and renames it before it unlocks, and the segment's rows stay in their
    write-ahead file until it is renamed. So a non-empty temporary file whose lock is free was
    left by a writer killed mid-way, holds no row that is not elsewhere, and would otherwise
    stay forever. An empty one may be a live writer's, opened and not yet locked: it is left.
    """
    name = path.name
    if not name.startswith(wal.CREATING_PREFIX):
        return
    inner = name[len(wal.CREATING_PREFIX) :]
    if wal_id(inner) is None and not is_segment(inner.removesuffix(INGESTING_SUFFIX)):
        return
    fd = wal.claim(path)
    if fd is None:
        return  # its creator is alive (or it was removed meanwhile)
    try:
        if os.fstat(fd).st_size:
            path.unlink(missing_ok=True)
            log.info("removed %s, a temporary file its writer died filling (no rows)", path)
    finally:
        os.close(fd)


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
    rows = recovered = 0
    for leftover in sorted(spool_dir.glob(f"*{INGESTING_SUFFIX}")):
        if leftover.name.startswith(".") or has_wal(spool_dir, segment_id_of(leftover.name)):
            continue
        found = read_segment(leftover, table)
        if not _already_inserted(client, found, table):
            _insert(client, found, leftover, table)
            rows += found.num_rows
        leftover.unlink()
        recovered += 1
    batch = _ClaimedBatch(client, table)
    for segment in sorted(p for p in spool_dir.iterdir() if is_segment(p.name)):
        if has_wal(spool_dir, segment_id_of(segment.name)):
            continue
        claim = segment.with_name(segment.name + INGESTING_SUFFIX)
        try:
            os.rename(segment, claim)  # atomic: of two ingesters, one wins each segment
        except FileNotFoundError:
            continue
        batch.add(claim)
    batch.insert()
    return IngestReport(batch.segments, rows + batch.rows, recovered)


class _ClaimedBatch:
    """Claimed segments read and inserted together, a block at a time."""

    def __init__(self, client: LogServer, table: LogTable) -> None:
        self.client, self.table = client, table
        self.claimed: list[Path] = []
        self.parts: list[pa.Table] = []
        self.pending = 0  # rows claimed, not yet inserted
        self.segments = self.rows = 0

    def add(self, claim: Path) -> None:
        self.claimed.append(claim)
        self.parts.append(read_segment(claim, self.table))
        self.pending += self.parts[-1].num_rows
        if self.pending >= INGEST_BATCH_ROWS or len(self.claimed) >= INGEST_BATCH_SEGMENTS:
            self.insert()

    def insert(self) -> None:
        # A failed INSERT leaves the batch's segments claimed: the next call finds each one
        # among the leftovers, sees it absent and inserts it.
        if not self.claimed:
            return
        rows = pa.concat_tables(self.parts)
        _insert(self.client, rows, self.claimed[0], self.table, len(self.claimed))
        for path in self.claimed:
            path.unlink()
        self.segments, self.rows = self.segments + len(self.claimed), self.rows + self.pending
        self.pending = 0
        self.claimed.clear()
        self.parts.clear()


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
